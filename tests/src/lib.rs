//! A real local Kubernetes control plane for tests and `make run`: etcd, kube-apiserver and
//! kube-controller-manager built from the Go modules pinned in `tests/k8s-bins/`, started on free
//! loopback ports with generated certificates and RBAC authorization.
//!
//! Every process joins one process group led by a small watchdog that kills the group when the
//! process that started it exits, however it exits (a passing run, a panic, an abort, Ctrl-C).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cluster;
pub mod container;
pub mod controller;
pub mod fakes;
pub mod fixtures;
pub mod group;
pub mod legacy;
pub mod lifecycle;
pub mod manifest;
pub mod neighbours;
pub mod netns;
pub mod node;
pub mod prometheus;
pub mod provenance;
pub mod restart;
pub mod shared;
pub mod support;
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

/// The bin directory one of the `hack/*-bins.sh` scripts prints (it builds the programs into the
/// version-keyed cache on first use), or the directory `env` names when set.
pub(crate) fn script_bin_dir(env: &str, script: &str) -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os(env) {
        return Ok(PathBuf::from(d));
    }
    let script = workspace_root().join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
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

/// The stand-in Connectivity service CA endpoint's TLS identity: a root generated once per test
/// process and a certificate for `localhost` signed by it. Controllers started by the harness trust the
/// root (`--connectivity-ca-trust`), as a private landscape's controller would trust its CA.
pub struct CaEndpointTls {
    /// The root certificate (PEM) the controller is told to trust.
    pub root_pem: String,
    /// The endpoint's certificate and key (PEM).
    pub leaf: cp_certs::Leaf,
}

/// The process-wide [`CaEndpointTls`].
pub fn ca_endpoint_tls() -> anyhow::Result<&'static CaEndpointTls> {
    static TLS: std::sync::OnceLock<CaEndpointTls> = std::sync::OnceLock::new();
    if let Some(t) = TLS.get() {
        return Ok(t);
    }
    let (root, leaf) = stand_in_tls(
        "stand-in Connectivity CA endpoint root",
        "localhost",
        &["localhost", node::CA_ENDPOINT_HOST],
        &[],
        2,
    )?;
    Ok(TLS.get_or_init(|| CaEndpointTls {
        root_pem: root.cert_pem,
        leaf,
    }))
}

/// A CA named `name` (the default key algorithm) valid from `not_before` for `days` days.
pub fn test_ca(
    name: &str,
    not_before: time::OffsetDateTime,
    days: i64,
) -> anyhow::Result<cp_certs::Ca> {
    let not_after = not_before + time::Duration::days(days);
    Ok(cp_certs::Ca::generate(
        name,
        not_before,
        not_after,
        cp_certs::KeyAlgorithm::default(),
    )?)
}

/// The TLS identity of a stand-in the tests serve: a CA `ca_name` and a server certificate `leaf_name`
/// it issued for `dns` and `ips`, from five minutes ago: the CA until `days` days from now, the
/// certificate for `days` days.
pub fn stand_in_tls(
    ca_name: &str,
    leaf_name: &str,
    dns: &[&str],
    ips: &[std::net::IpAddr],
    days: i64,
) -> anyhow::Result<(cp_certs::Ca, cp_certs::Leaf)> {
    let now = time::OffsetDateTime::now_utc();
    let (not_before, not_after) = (
        now - time::Duration::minutes(5),
        now + time::Duration::days(days),
    );
    let ca = cp_certs::Ca::generate(
        ca_name,
        not_before,
        not_after,
        cp_certs::KeyAlgorithm::default(),
    )?;
    let spec =
        cp_certs::LeafSpec::server(leaf_name, dns, ips, not_before, time::Duration::days(days));
    let leaf = ca.issue(&spec)?;
    Ok((ca, leaf))
}

/// Writes the stand-in CA endpoint's root to `dir` and returns the controller argument that trusts it.
pub fn ca_endpoint_trust_arg(dir: &std::path::Path) -> anyhow::Result<String> {
    let path = dir.join("ca-endpoint-root.pem");
    std::fs::write(&path, &ca_endpoint_tls()?.root_pem)?;
    Ok(format!("--connectivity-ca-trust={}", path.display()))
}

/// What the controller is told of the stand-in CA endpoint (as a private landscape would tell it of its
/// own): its root trusted ([`ca_endpoint_trust_arg`]), `localhost` on the CA host list, loopback an
/// allowed network.
pub fn ca_endpoint_args(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    Ok(vec![
        ca_endpoint_trust_arg(dir)?,
        format!("--connectivity-ca-hosts={CA_ENDPOINT_HOSTS}"),
        format!("--connectivity-ca-allowed-networks={CA_ENDPOINT_NETWORKS}"),
    ])
}

/// The stand-in CA endpoint's host, for `--connectivity-ca-hosts`.
pub const CA_ENDPOINT_HOSTS: &str = "localhost";
/// The stand-in CA endpoint's networks (loopback), for `--connectivity-ca-allowed-networks`.
pub const CA_ENDPOINT_NETWORKS: &str = "127.0.0.0/8,::1/128";

/// The service key's `uaadomain` that makes `localhost` the key's own domain (the controller fetches the
/// CA only from a host inside it).
pub const CA_ENDPOINT_UAADOMAIN: &str = "authentication.localhost";

/// Serves `body` over HTTPS (the [`ca_endpoint_tls`] certificate for `localhost`) with status 200 to
/// every request on a free loopback port until the returned task is dropped with the test's runtime
/// (plays the Connectivity service's CA endpoint). Returns its base URL, `https://localhost:<port>`.
pub async fn serve_static(body: String) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let acceptor = ca_endpoint_acceptor()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let url = format!("https://localhost:{}", listener.local_addr()?.port());
    Ok((url, serve_static_on(listener, acceptor, body)))
}

/// The TLS acceptor of the stand-in CA endpoint ([`ca_endpoint_tls`]).
pub fn ca_endpoint_acceptor() -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    tls_acceptor(&ca_endpoint_tls()?.leaf)
}

/// A TLS acceptor serving `leaf` (no client certificates), for the stand-ins the test process serves.
pub fn tls_acceptor(leaf: &cp_certs::Leaf) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use std::sync::Arc;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs =
        CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Runs `serve` on `listener` (made a tokio one) on a thread of its own with a runtime of its own, for
/// stand-ins that serve longer than a test's runtime lives; returns once the thread is spawned.
pub fn serve_on_thread<F, Fut>(
    name: &str,
    listener: std::net::TcpListener,
    serve: F,
) -> std::io::Result<()>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    serve(listener).await;
                }
            });
        })?;
    Ok(())
}

/// Serves `body` over TLS with status 200 to every request on `listener`, until the returned task is
/// dropped with its runtime.
pub fn serve_static_on(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    body: String,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (body, acceptor) = (body.clone(), acceptor.clone());
            tokio::spawn(async move {
                let Ok(Ok(mut s)) =
                    tokio::time::timeout(std::time::Duration::from_secs(5), acceptor.accept(s))
                        .await
                else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-pem-file\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    })
}

/// Plays a Service with several endpoints on loopback: accepts TCP connections on a free port and hands
/// them to `backends` in turn (round robin), copying bytes both ways (TLS stays end to end). Returns its
/// address; it serves until the returned task is dropped with the test's runtime.
pub async fn round_robin(
    backends: Vec<String>,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    anyhow::ensure!(!backends.is_empty(), "no backends");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?.to_string();
    let task = tokio::spawn(async move {
        let mut next = 0usize;
        while let Ok((mut front, _)) = listener.accept().await {
            let backend = backends[next % backends.len()].clone();
            next = next.wrapping_add(1);
            tokio::spawn(async move {
                if let Ok(mut back) = tokio::net::TcpStream::connect(&backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut front, &mut back).await;
                }
            });
        }
    });
    Ok((addr, task))
}
