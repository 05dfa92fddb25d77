//! A real local Kubernetes control plane for tests and `make run`: etcd, kube-apiserver and
//! kube-controller-manager built from the Go modules pinned in `tests/k8s-bins/`, started on free
//! loopback ports with generated certificates and RBAC authorization.
//!
//! Every process joins one process group led by a small watchdog that kills the group when the
//! process that started it exits, however it exits (a passing run, a panic, an abort, Ctrl-C).
#![forbid(unsafe_code)]

pub mod cluster;
pub mod controller;
pub mod manifest;
pub mod wait;
pub mod webhook;

pub use cluster::{ControlPlane, Identity};

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `../shared/reference` beside the project (override with `CP_REFERENCE_DIR`).
pub fn reference_dir() -> PathBuf {
    std::env::var_os("CP_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/reference"))
}

/// Directory of this workspace's own binaries (`cp-webhook`, `cp-controller`): beside the running
/// test executable's `deps/` directory, or `CP_BIN_DIR`.
pub fn own_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CP_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.parent().map(PathBuf::from).unwrap_or(dir)
    } else {
        dir
    }
}
