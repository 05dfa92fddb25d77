//! The three servers under test (the floor, cp-webhook, the controller-runtime peer in Go), each
//! started pinned to the server CPU, checked to answer right before anything is loaded; the
//! Deployment's CPU limit as a cgroup; the Go peer's CPU profile.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cp_tests::ControlPlane;
use cp_tests::webhook::Webhook;

use crate::harness::load::{self, Mode, Target};
use crate::harness::plane::pid;

/// One server under test.
pub struct Server {
    pub name: &'static str,
    pub addr: String,
    pub pid: u32,
}

/// The servers, indexed as `cells::{FLOOR, OURS, GO}`, and what the load generator needs to reach
/// them.
pub struct Servers {
    pub list: [Server; 3],
    /// The CA of the serving certificate all three serve.
    pub ca_pem: String,
    /// Where the Go peer serves its profiles.
    pub pprof_addr: String,
}

impl Servers {
    /// What the load generator sends to `server`.
    pub fn target(&self, server: usize, path: &str, body: &Bytes) -> Target {
        Target {
            addr: self.list[server].addr.clone(),
            path: path.to_string(),
            body: body.clone(),
            ca_pem: self.ca_pem.clone(),
            server_name: None,
            dial: None,
        }
    }
}

fn go_peer() -> PathBuf {
    std::env::var_os("CP_GO_PEER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/cp-operator/bench/go-webhook")
        })
}

/// `program` run by `wrap` (e.g. `taskset -c 1`), or by `env` without one.
fn wrapped(wrap: &[&str], program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(wrap.first().copied().unwrap_or("env"));
    cmd.args(wrap.iter().skip(1)).arg(program);
    cmd
}

/// Starts the three servers in the control plane's process group, each run by `wrap`.
pub async fn start(cp: &ControlPlane, wrap: &[&str]) -> anyhow::Result<Servers> {
    let rust = Webhook::start_wrapped(cp, "cp-webhook", &[], wrap).await?;
    let ca_pem = rust
        .ca
        .as_ref()
        .context("the harness webhook has its own CA")?
        .cert_pem
        .clone();
    let cert = rust.cert_file.display().to_string();
    let key = rust.key_file.display().to_string();
    let floor_port = cp_tests::cluster::free_port()?;
    let floor_addr = format!("127.0.0.1:{floor_port}");
    let mut floor = wrapped(wrap, std::env::current_exe()?);
    floor
        // The same allocator settings as cp-webhook's Deployment (the harness starts it with them).
        .envs(cp_tests::manifest::deployment_env(
            "webhook/deployment.yaml",
        )?)
        .args(["floor", &floor_addr, &cert, &key]);
    cp.spawn_process("floor", &mut floor)?;
    let go_port = cp_tests::cluster::free_port()?;
    let pprof_addr = format!("127.0.0.1:{}", cp_tests::cluster::free_port()?);
    let defaults = cp.dir.join("defaults.json");
    std::fs::write(
        &defaults,
        serde_json::to_vec(cp_api::defaults::deployment_defaults_value())?,
    )?;
    let go_bin = go_peer();
    anyhow::ensure!(
        go_bin.exists(),
        "{} missing: run `bash hack/build-go-peer.sh`",
        go_bin.display()
    );
    let mut go = wrapped(wrap, &go_bin);
    go.args([
        format!("--addr=127.0.0.1:{go_port}"),
        format!("--tls-cert-file={cert}"),
        format!("--tls-key-file={key}"),
        format!("--defaults-file={}", defaults.display()),
        "--privileged-users=system:serviceaccount:kyma-system:connectivity-proxy-controller".into(),
        "--privileged-groups=system:masters".into(),
        // Production settings: info level, JSON lines (as cp-webhook logs).
        "--zap-log-level=info".into(),
        "--zap-encoder=json".into(),
        format!("--pprof-addr={pprof_addr}"),
    ]);
    cp.spawn_process("go-webhook", &mut go)?;
    Ok(Servers {
        list: [
            Server {
                name: "floor (our server stack, envelope only, precomputed answer)",
                addr: floor_addr,
                pid: pid(cp, "floor")?,
            },
            Server {
                name: "cp-webhook (this operator)",
                addr: rust.url.trim_start_matches("https://").to_string(),
                pid: pid(cp, "cp-webhook")?,
            },
            Server {
                name: "controller-runtime peer (Go)",
                addr: format!("127.0.0.1:{go_port}"),
                pid: pid(cp, "go-webhook")?,
            },
        ],
        ca_pem,
        pprof_addr,
    })
}

/// What `target` answers once it answers 200, as JSON.
pub async fn answer(target: &Target, what: &str) -> anyhow::Result<serde_json::Value> {
    let body = cp_tests::wait::until(
        &format!("{what} to answer 200"),
        Duration::from_secs(30),
        || async {
            match load::probe(target).await {
                Ok((true, body)) => Ok(Some(body)),
                Ok((false, body)) => Err(format!("non-200: {}", String::from_utf8_lossy(&body))),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await?;
    serde_json::from_slice(&body).with_context(|| format!("{what}: answer is not JSON"))
}

/// A fast wrong answer is no result: every server allows the CR's `/mutate` (with a patch) and
/// `/validate`.
pub async fn check_answers(
    servers: &Servers,
    mutate: &Bytes,
    validate: &Bytes,
) -> anyhow::Result<()> {
    for (s, server) in servers.list.iter().enumerate() {
        for (path, body) in [("/mutate", mutate), ("/validate", validate)] {
            let v = answer(&servers.target(s, path, body), server.name).await?;
            anyhow::ensure!(
                v["response"]["allowed"] == true
                    && v["response"]["uid"] == crate::reviews::FIXED_UID
                    && (path != "/mutate" || v["response"]["patch"].is_string()),
                "{} {path}: unexpected answer {v}",
                server.name
            );
        }
    }
    Ok(())
}

/// The CPU limit of the webhook Deployment, in millicores, read from its manifest.
pub fn deployment_cpu_limit() -> anyhow::Result<u32> {
    let container = cp_tests::manifest::deployment_container("webhook/deployment.yaml")?;
    let limit = container
        .pointer("/resources/limits/cpu")
        .and_then(|v| v.as_str())
        .context("manifests/webhook/deployment.yaml: no CPU limit")?;
    match limit.strip_suffix('m') {
        Some(m) => Ok(m.parse()?),
        None => Ok((limit.parse::<f64>()? * 1000.0) as u32),
    }
}

/// A cgroup (v1 `cpu` controller) with a CFS quota: the Deployment's CPU limit as the kubelet sets
/// it. Processes are moved in for a run and back out after it.
pub struct CpuLimit {
    pub dir: PathBuf,
}

const CGROUP_CPU: &str = "/sys/fs/cgroup/cpu";

impl CpuLimit {
    pub fn new(millicores: u32) -> anyhow::Result<Self> {
        let dir = PathBuf::from(CGROUP_CPU).join(format!("cp-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let limit = Self { dir };
        std::fs::write(limit.dir.join("cpu.cfs_period_us"), "100000")?;
        std::fs::write(
            limit.dir.join("cpu.cfs_quota_us"),
            (u64::from(millicores) * 100).to_string(),
        )?;
        Ok(limit)
    }

    pub fn enter(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.dir.display()))
    }

    pub fn leave(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(
            PathBuf::from(CGROUP_CPU).join("cgroup.procs"),
            pid.to_string(),
        )
        .with_context(|| format!("moving {pid} out of {}", self.dir.display()))
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A CPU profile of the Go peer under `/validate` load (`go tool pprof -top`).
pub async fn go_profile(
    pprof_addr: &str,
    target: &Target,
    pid: u32,
    dir: &Path,
) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let load = {
        let target = target.clone();
        tokio::spawn(async move {
            load::run(
                &target,
                Mode::Closed(16),
                Duration::from_millis(200),
                Duration::from_secs(3),
                pid,
            )
            .await
        })
    };
    let mut s = tokio::net::TcpStream::connect(pprof_addr).await?;
    s.write_all(b"GET /debug/pprof/profile?seconds=2 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    load.await??;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("pprof: no HTTP header end")?;
    anyhow::ensure!(
        raw.starts_with(b"HTTP/1.0 200") || raw.starts_with(b"HTTP/1.1 200"),
        "pprof answered {}",
        String::from_utf8_lossy(&raw[..split.min(80)])
    );
    let file = dir.join("go-webhook.pprof");
    std::fs::write(&file, &raw[split + 4..])?;
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=15"])
        .arg(go_peer())
        .arg(&file)
        .env("GOTOOLCHAIN", "local")
        .output()
        .context("go tool pprof")?;
    anyhow::ensure!(
        out.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
