//! What the figures were measured on: the machine, the tools' versions, the operator's binaries
//! (static, as the images ship them, or not) and the images' sizes.

use std::process::Command;

use crate::harness::report::met;

/// The machine and the versions of the tools and of what is measured.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        .and_then(|k| k.parse::<u64>().ok())
        .map(|k| format!("{:.1} GiB", k as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let k8s = cp_tests::cluster::k8s_bin_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    format!(
        "## Machine and versions\n\n| | |\n| --- | --- |\n| CPU | {model}, {cores} cores |\n| memory | {mem} |\n\
         | commit | {} |\n| rustc | {} |\n| go | {} |\n| Kubernetes binaries | `{}` |\n| operator | {} (release build) |\n| operator binaries measured | `{}` |\n{}\n",
        commit(),
        cmd_version("rustc", &["-V"]),
        cmd_version("go", &["version"]),
        k8s.rsplit('/').nth(1).unwrap_or(&k8s),
        env!("CARGO_PKG_VERSION"),
        measured_binaries(),
        digests(),
    )
}

/// The commit measured (`git rev-parse HEAD`), saying so when the tree had uncommitted changes.
fn commit() -> String {
    let root = cp_tests::workspace_root();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match (
        git(&["rev-parse", "HEAD"]),
        git(&["status", "--porcelain", "--untracked-files=no"]),
    ) {
        (Some(head), Some(changes)) if changes.is_empty() => format!("`{head}`"),
        (Some(head), Some(_)) => format!("`{head}` with uncommitted changes"),
        _ => "unknown (not a git checkout)".into(),
    }
}

/// A row with the sha256 of each measured binary (`sha256sum`), so that every figure names the bytes
/// it was measured on.
fn digests() -> String {
    let dir = cp_tests::own_bin_dir();
    let bench = std::env::current_exe().unwrap_or_else(|_| dir.join("cp-bench"));
    [
        ("cp-webhook", dir.join("cp-webhook")),
        ("cp-controller", dir.join("cp-controller")),
        ("cp-bench", bench),
    ]
    .iter()
    .map(|(b, path)| {
        let sum = Command::new("sha256sum")
            .arg(path)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .next()
                    .map(String::from)
            })
            .unwrap_or_else(|| "(not found)".into());
        format!("| sha256 of `{b}` | `{sum}` |\n")
    })
    .collect()
}

/// Which operator binaries the load runs start: `make bench` points `CP_BIN_DIR` at the static release
/// binaries `make images` puts into the images (crt-static, fat LTO), the ones a cluster runs.
fn measured_binaries() -> String {
    let dir = cp_tests::own_bin_dir();
    let statically = ["cp-webhook", "cp-controller"].iter().all(|b| {
        std::fs::read(dir.join(b))
            .ok()
            .and_then(|elf| has_interpreter(&elf))
            == Some(false)
    });
    format!(
        "{} ({})",
        dir.display(),
        if statically {
            "static, as the images ship them"
        } else {
            "dynamically linked: not the images' binaries"
        }
    )
}

/// Whether a 64-bit little-endian ELF file names a program interpreter (a `PT_INTERP` program header:
/// the dynamic loader); `None` when it is not such a file. A static-pie binary has none, though glibc's
/// static code still carries the loader's name as text, so the bytes alone do not tell.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let (size, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    let mut interp = false;
    for i in 0..count {
        let at = phoff.checked_add(i.checked_mul(size)?)?;
        let kind = u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?);
        interp |= kind == PT_INTERP;
    }
    Some(interp)
}

fn cmd_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| "not found".into())
}

/// The images `make images` built (goal: each < 20 MB).
pub fn images() -> String {
    let mut out = String::from(
        "## Images\n\n\
         Built by `make images` (static release binaries on an empty base); goal: each < 20 MB.\n\n\
         | image | size | goal |\n| --- | --- | --- |\n",
    );
    for name in ["webhook", "controller"] {
        let image = cp_tests::container::image(name);
        let size =
            cp_tests::container::podman(&["image", "inspect", "--format", "{{.Size}}", &image])
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .trim()
                        .parse::<u64>()
                        .ok()
                });
        match size {
            Some(b) => out.push_str(&format!(
                "| `{image}` | {:.1} MB ({b} bytes) | {} |\n",
                b as f64 / 1e6,
                met(b < 20_000_000)
            )),
            None => out.push_str(&format!(
                "| `{image}` | not built (run `make images`) | |\n"
            )),
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::has_interpreter;

    #[test]
    fn an_elf_file_tells_whether_it_needs_the_dynamic_loader() {
        // Test binaries are linked dynamically.
        let me = std::fs::read(std::env::current_exe().expect("own path")).expect("own binary");
        assert_eq!(has_interpreter(&me), Some(true));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(has_interpreter(b"\x7fELF\x02\x01"), None, "truncated");
        // A header whose program headers are all PT_LOAD (1): no interpreter.
        let mut elf = vec![0u8; 0x40 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(has_interpreter(&elf), Some(false));
        elf[0x40..0x44].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(has_interpreter(&elf), Some(true));
    }
}
