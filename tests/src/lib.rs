//! A real local Kubernetes control plane for tests and `make run`: etcd, kube-apiserver and
//! kube-controller-manager built from the Go modules pinned in `tests/k8s-bins/`, started on free
//! loopback ports with generated certificates and RBAC authorization.
//!
//! Every process joins one process group led by a small watchdog that kills the group when the
//! process that started it exits, however it exits (a passing run, a panic, an abort, Ctrl-C).
#![forbid(unsafe_code)]

pub mod cluster;
pub mod container;
pub mod controller;
pub mod fakes;
pub mod fixtures;
pub mod manifest;
pub mod wait;
pub mod webhook;
pub mod yaml11;

pub use cluster::{ControlPlane, Identity};

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
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

/// Serves `body` with status 200 to every request on a free loopback port until the returned task is
/// dropped with the test's runtime (plays the Connectivity service's CA endpoint). Returns its base URL.
pub async fn serve_static(body: String) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-pem-file\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok((url, task))
}
