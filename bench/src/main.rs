//! `make bench`: runs every measurement side by side and writes `BENCHMARKS.md`.
//!
//! `cp-bench [--quick] [--out FILE]` measures; `cp-bench floor ADDR CERT KEY` is the floor server it
//! starts as a separate process (`cp_bench::floor`).
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;

/// The floor server runs in this binary: it allocates like cp-webhook (`cp_webhook::memory`), so the
/// two compare on the same allocator. The load generator shares it.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("floor") {
        // As cp-webhook starts.
        if let Err(e) = cp_webhook::memory::no_huge_pages() {
            eprintln!("{e}");
        }
        let [_, addr, cert, key] = args.as_slice() else {
            anyhow::bail!("usage: cp-bench floor ADDR CERT KEY");
        };
        // The same runtime as cp-webhook's `#[tokio::main]`.
        return tokio::runtime::Runtime::new()?.block_on(cp_bench::floor::serve(addr, cert, key));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| cp_tests::workspace_root().join("BENCHMARKS.md"));
    // The webhook and the controller are the release binaries beside this one
    // (`cp_tests::own_bin_dir`); `make bench` sets CP_WEBHOOK_LOG and CP_CONTROLLER_LOG to warn.
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(quick, &out))
}

async fn run(quick: bool, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut md = String::new();
    let only = std::env::var("CP_BENCH_ONLY").unwrap_or_default();
    let webhook = if only.is_empty() || only == "webhook" {
        Some(
            cp_bench::webhook::run(quick)
                .await
                .context("webhook benchmarks")?,
        )
    } else {
        None
    };
    let criterion = criterion_section();
    let controller = if only.is_empty() || only == "controller" {
        Some(
            cp_bench::controller::run(quick)
                .await
                .context("controller benchmarks")?,
        )
    } else {
        None
    };
    let apiserver = if only.is_empty() || only == "apiserver" {
        Some(
            cp_bench::apiserver::run(quick)
                .await
                .context("admission through the API server")?,
        )
    } else {
        None
    };
    let node = if only.is_empty() || only == "node" {
        Some(
            cp_bench::node::run(quick)
                .await
                .context("memory and start-up on the real node")?,
        )
    } else {
        None
    };
    let fleet = if only.is_empty() || only == "fleet" {
        Some(fleet_section(quick).await.context("fleet view")?)
    } else {
        None
    };
    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Written by `make bench` ({}) on {}; the whole run took {:.0} s. Loopback only. Every figure and \
         verdict below comes from this run.\n",
        if quick { "quick mode" } else { "full run" },
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        started.elapsed().as_secs_f64()
    )?;
    md.push_str(&machine());
    md.push_str(&images());
    if let Some(w) = &webhook {
        md.push_str(&cp_bench::webhook::render(w));
    }
    md.push_str(&criterion);
    if let Some(c) = &controller {
        md.push_str(&cp_bench::controller::render(c));
    }
    if let Some(a) = &apiserver {
        md.push_str(&cp_bench::apiserver::render(a));
    }
    if let Some(n) = &node {
        md.push_str(&cp_bench::node::render(n));
    }
    if let Some(f) = &fleet {
        md.push_str(f);
    }
    std::fs::write(out, &md).with_context(|| format!("writing {}", out.display()))?;
    if let Some(w) = &webhook {
        let csv = out.with_file_name(cp_bench::webhook::ATTEMPTS_CSV);
        std::fs::write(&csv, cp_bench::webhook::attempts_csv(w))
            .with_context(|| format!("writing {}", csv.display()))?;
    }
    println!("{md}");
    println!("wrote {}", out.display());
    Ok(())
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
fn images() -> String {
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
                if b < 20_000_000 { "met" } else { "missed" }
            )),
            None => out.push_str(&format!(
                "| `{image}` | not built (run `make images`) | |\n"
            )),
        }
    }
    out.push('\n');
    out
}

fn machine() -> String {
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
         | rustc | {} |\n| go | {} |\n| Kubernetes binaries | `{}` |\n| operator | {} (release build) |\n| operator binaries measured | `{}` |\n\n",
        cmd_version("rustc", &["-V"]),
        cmd_version("go", &["version"]),
        k8s.rsplit('/').nth(1).unwrap_or(&k8s),
        env!("CARGO_PKG_VERSION"),
        measured_binaries(),
    )
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

/// Criterion's estimates from `cargo bench -p cp-bench --bench admission` (run by `make bench` first).
fn criterion_section() -> String {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cp_tests::workspace_root().join("target"));
    let mut md = String::from(
        "## Handler CPU per request (criterion)\n\nDecode the AdmissionReview, review it and encode the answer, \
         without TLS or HTTP (`bench/benches/admission.rs`); and the controller's pure aggregation of 10,000 \
         ServiceMappings into the ConfigMap JSON.\n\n| benchmark | mean | 95% interval |\n| --- | --- | --- |\n",
    );
    for (group, name) in [
        ("handler", "mutate"),
        ("handler", "validate"),
        ("controller", "aggregate_10000_mappings"),
    ] {
        let file = target
            .join("criterion")
            .join(group)
            .join(name)
            .join("new/estimates.json");
        let row = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .map(|v| {
                let ns = |p: &str| v.pointer(p).and_then(|x| x.as_f64()).unwrap_or(0.0);
                format!(
                    "| `{group}/{name}` | {} | {} – {} |",
                    human_ns(ns("/mean/point_estimate")),
                    human_ns(ns("/mean/confidence_interval/lower_bound")),
                    human_ns(ns("/mean/confidence_interval/upper_bound"))
                )
            })
            .unwrap_or_else(|| {
                format!(
                    "| `{group}/{name}` | not run (`{}` missing) | |",
                    file.display()
                )
            });
        md.push_str(&row);
        md.push('\n');
    }
    md.push('\n');
    md
}

fn human_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The fleet dashboard's queries against a real Prometheus (built from its Go module) holding a fleet's
/// series, backfilled with promtool: each panel's query time (goal < 1 s), Grafana's instant query at
/// "now" with every runtime selected, five times each.
async fn fleet_section(quick: bool) -> anyhow::Result<String> {
    const GOAL: f64 = 1.0;
    let runtimes = if quick { 500 } else { 5_000 };
    let dir = std::env::temp_dir().join(format!("cp-bench-fleet-{}", std::process::id()));
    let (prom, backfill) = cp_tests::prometheus::fleet::start(&dir, runtimes).await?;
    let mut rows = String::new();
    let mut worst: f64 = 0.0;
    for (title, expr) in cp_tests::prometheus::fleet::queries()? {
        let mut times = Vec::new();
        let mut series = 0;
        for _ in 0..5 {
            let t = Instant::now();
            series = prom.query(&expr, None).await?.len();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let (median, max) = (times[2], times[4]);
        worst = worst.max(max);
        writeln!(
            rows,
            "| {title} | {series} | {:.1} ms | {:.1} ms | {} |",
            median * 1e3,
            max * 1e3,
            if max < GOAL { "met" } else { "missed" }
        )?;
    }
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "## Fleet view (KCP)\n\n\
         The fleet dashboard (`manifests/monitoring/fleet-dashboard.yaml`) queried by a real Prometheus (built from \
         its Go module by `hack/prom-bins.sh`) holding {runtimes} runtimes' synthetic series ({series} series, \
         {samples} samples over 25 hours: every 15 minutes, every minute in the last hour), backfilled with \
         `promtool tsdb create-blocks-from openmetrics` in {took:.0} s. Each panel's query as Grafana sends it \
         (instant, at now, every runtime selected), five times over HTTP on loopback; goal: < 1 s each. \
         Verdict: {verdict} (slowest {worst:.0} ms).\n\n\
         | panel | series | median | max | goal < 1 s |\n| --- | --- | --- | --- | --- |\n{rows}\n",
        series = backfill.series,
        samples = backfill.samples,
        took = backfill.took.as_secs_f64(),
        verdict = if worst < GOAL { "met" } else { "missed" },
        worst = worst * 1e3,
    ))
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
