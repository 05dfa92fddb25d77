//! The dependency list `cargo auditable` embeds in a binary (`.dep-v0`), read back with
//! `rust-audit-info` (hack/auditable-tools.sh builds both once into the tools cache): the same data
//! `cargo audit bin` and image scanners read.

use std::path::Path;

/// One package of the embedded list.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Package {
    /// Crate name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Where it came from (`crates.io`, `local`, ...).
    #[serde(default)]
    pub source: String,
    /// `runtime` (linked) or `build` (build scripts and proc-macros only).
    #[serde(default = "runtime")]
    pub kind: String,
}

fn runtime() -> String {
    "runtime".into()
}

#[derive(serde::Deserialize)]
struct Info {
    packages: Vec<Package>,
}

/// The packages `binary` was built from, or why they cannot be read (no list embedded: not built
/// with `cargo auditable`).
pub fn embedded_packages(binary: &Path) -> anyhow::Result<Vec<Package>> {
    let tools = crate::script_bin_dir("CP_AUDITABLE_TOOLS", "hack/auditable-tools.sh")
        .map_err(anyhow::Error::msg)?;
    let out = std::process::Command::new(tools.join("rust-audit-info"))
        .arg(binary)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "rust-audit-info {}: {} (was it built with `cargo auditable`?)",
        binary.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let info: Info = serde_json::from_slice(&out.stdout)?;
    Ok(info.packages)
}
