//! The webhook benchmarks: `cp-webhook` against the floor (the same server stack answering a
//! precomputed review after reading only the envelope) and a controller-runtime peer in Go doing the
//! same work, each alone on its own core while the load generator runs on the other.
//!
//! Method, as written into BENCHMARKS.md: every server is started pinned to CPU 1 (`taskset`), so
//! tokio and the Go runtime size themselves to one core; the bench pins itself (the load generator)
//! to CPU 0. During a run only the server under test is running: the other two, etcd, the API
//! server and the controller manager are stopped (SIGSTOP) and resumed afterwards. Each cell is run
//! `REPEATS` times, the repeats interleaved (every cell once, then again), and reported as median and
//! range. Server CPU per request is the server's utime + stime over the measured window divided by
//! the requests answered in it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cp_tests::ControlPlane;
use cp_tests::cluster::Options;
use cp_tests::webhook::Webhook;

use crate::load::{self, Mode, Pooled, Stats, Target};
use crate::reviews;

/// Repeats of every cell in a full run.
pub const REPEATS: usize = 5;
/// A run during which the hypervisor gave more than this share of the machine's CPU time to other
/// guests (`steal` in `/proc/stat`), percent, is run again: a latency measured while the core is
/// taken away measures the host's neighbours, not the server.
/// 0.35 % of a 3 s open-loop window on two CPUs is two 10 ms clock ticks: at 2,000 requests per
/// second one more stolen tick can hold back the 1 % of requests a p99 is made of.
pub const STEAL_MAX_PCT: f64 = 0.35;
/// Attempts at one run in a full run; when none stays under [`STEAL_MAX_PCT`], the least-stolen is
/// kept (and its steal shown).
pub const ATTEMPTS: u32 = 6;
/// How long an attempt waits for a quiet moment (a second without steal) before it starts.
const QUIET_WAIT: Duration = Duration::from_secs(30);
/// ServiceMappings in the cluster (and in the webhook's uniqueness index) during the runs.
pub const MAPPINGS: usize = 10_000;
/// Open-loop rates, requests per second.
pub const RATES: [u32; 2] = [500, 2_000];
/// Further open-loop rates in the Deployment's CPU limit, cp-webhook alone: where the knee is (the
/// highest rate with p99 < 1 ms and no throttled period).
pub const KNEE_RATES: [u32; 5] = [3_000, 4_000, 5_000, 6_000, 8_000];
/// The knee's goal, requests per second, for `/mutate` and `/validate` each.
pub const KNEE_GOAL: u32 = 5_000;
/// The load generator's CPU and the server's.
const CLIENT_CPU: &str = "0";
const SERVER_CPU: &str = "1";

/// One server under test.
struct Server {
    name: &'static str,
    addr: String,
    pid: u32,
}

const FLOOR: usize = 0;
const OURS: usize = 1;
const GO: usize = 2;

/// One measured combination of request, load and servers.
struct Cell {
    path: &'static str,
    body: Bytes,
    mode: Mode,
    servers: Vec<usize>,
    /// Run inside the Deployment's CPU limit.
    limited: bool,
    /// What sets the cell's request apart from the others on its path (shown after the load).
    note: &'static str,
}

/// One attempt of one run, kept or not: a row of the attempts CSV.
pub struct Attempt {
    rep: usize,
    attempt: u32,
    cell: usize,
    server: usize,
    kept: bool,
    stats: Stats,
}

/// Everything the section measured, for rendering.
pub struct Results {
    cells: Vec<Cell>,
    names: Vec<&'static str>,
    runs: BTreeMap<(usize, usize), Vec<Stats>>,
    /// Every attempt's latencies, pooled per cell and server.
    pooled: BTreeMap<(usize, usize), Pooled>,
    /// Every attempt, in the order made.
    log: Vec<Attempt>,
    repeats: usize,
    attempts: u32,
    measure: Duration,
    open_measure: Duration,
    pinned: bool,
    limit: Result<u32, String>,
    mappings: usize,
    bodies: Vec<(&'static str, usize)>,
    rss: Option<load::ProcMemory>,
    /// The refusal's message when service channels are switched off with the mappings present.
    off_message: String,
    profile: Result<String, String>,
    gogc: String,
}

/// The attempt to keep: the least stolen (the earliest on a tie).
fn keep(attempts: &[Stats]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, a) in attempts.iter().enumerate() {
        if best.is_none_or(|b| a.steal_pct < attempts[b].steal_pct) {
            best = Some(i);
        }
    }
    best
}

/// Waits until a second passes without steal, or [`QUIET_WAIT`] has passed.
async fn wait_for_quiet() {
    let deadline = tokio::time::Instant::now() + QUIET_WAIT;
    let Ok(mut before) = load::machine_ticks() else {
        return;
    };
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(now) = load::machine_ticks() else {
            return;
        };
        if now.steal == before.steal {
            return;
        }
        before = now;
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Stops processes for the time it lives; resumes them when dropped (also on an error).
struct Paused(Vec<u32>);

impl Paused {
    fn new(pids: Vec<u32>) -> Self {
        for &p in &pids {
            signal(p, "STOP");
        }
        Self(pids)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &p in &self.0 {
            signal(p, "CONT");
        }
    }
}

/// Pins every thread of this process to `cpus`.
fn pin_self(cpus: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("taskset")?;
    anyhow::ensure!(status.success(), "taskset -p failed: {status}");
    Ok(())
}

/// The CPU limit of the webhook Deployment, in millicores, read from its manifest.
fn deployment_cpu_limit() -> anyhow::Result<u32> {
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
struct CpuLimit {
    dir: PathBuf,
}

const CGROUP_CPU: &str = "/sys/fs/cgroup/cpu";

impl CpuLimit {
    fn new(millicores: u32) -> anyhow::Result<Self> {
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

    fn enter(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.dir.display()))
    }

    fn leave(&self, pid: u32) -> anyhow::Result<()> {
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

fn go_peer() -> PathBuf {
    std::env::var_os("CP_GO_PEER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/cp-operator/bench/go-webhook")
        })
}

async fn answer(target: &Target, what: &str) -> anyhow::Result<serde_json::Value> {
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

/// A CPU profile of the Go peer under `/validate` load (`go tool pprof -top`).
async fn go_profile(
    pprof_addr: &str,
    target: &Target,
    pid: u32,
    dir: &std::path::Path,
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

/// Runs the whole section.
pub async fn run(quick: bool) -> anyhow::Result<Results> {
    let cp = tokio::task::spawn_blocking(|| ControlPlane::start(Options::default())).await??;
    let admin = cp.admin().await?;
    cp_tests::fixtures::apply_our_crds(&admin).await?;
    // The mappings exist before the webhook starts (no admission for them: it is not registered);
    // its readiness waits for the first complete listing in its index.
    let mappings = if quick { 2_000 } else { MAPPINGS };
    let all = crate::controller::numbered_mappings(mappings);
    crate::controller::create_mappings(&admin, all).await?;

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let pinned = cores >= 2;
    let wrap: Vec<&str> = if pinned {
        vec!["taskset", "-c", SERVER_CPU]
    } else {
        vec![]
    };
    let rust = Webhook::start_wrapped(&cp, "cp-webhook", &[], &wrap).await?;
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
    let mut floor = Command::new(wrap.first().copied().unwrap_or("env"));
    floor
        // The same allocator settings as cp-webhook's Deployment (the harness starts it with them).
        .envs(cp_tests::manifest::deployment_env(
            "webhook/deployment.yaml",
        )?)
        .args(wrap.iter().skip(1))
        .arg(std::env::current_exe()?)
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
    let mut go = Command::new(wrap.first().copied().unwrap_or("env"));
    go.args(wrap.iter().skip(1)).arg(&go_bin).args([
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
    let servers = [
        Server {
            name: "floor (our server stack, envelope only, precomputed answer)",
            addr: floor_addr,
            pid: cp.pid("floor").context("floor pid")?,
        },
        Server {
            name: "cp-webhook (this operator)",
            addr: rust.url.trim_start_matches("https://").to_string(),
            pid: cp.pid("cp-webhook").context("cp-webhook pid")?,
        },
        Server {
            name: "controller-runtime peer (Go)",
            addr: format!("127.0.0.1:{go_port}"),
            pid: cp.pid("go-webhook").context("go-webhook pid")?,
        },
    ];
    let mutate = Bytes::from(reviews::mutate_create()?);
    let validate = Bytes::from(reviews::validate_update()?);
    let mapping = Bytes::from(reviews::mapping_create("m-new", "m-new")?);
    let target = |server: usize, path: &str, body: &Bytes| Target {
        addr: servers[server].addr.clone(),
        path: path.to_string(),
        body: body.clone(),
        ca_pem: ca_pem.clone(),
        server_name: None,
        dial: None,
    };
    // A fast wrong answer is no result: check every answer before loading a server.
    for (s, server) in servers.iter().enumerate() {
        for (path, body) in [("/mutate", &mutate), ("/validate", &validate)] {
            let v = answer(&target(s, path, body), server.name).await?;
            anyhow::ensure!(
                v["response"]["allowed"] == true
                    && v["response"]["uid"] == reviews::FIXED_UID
                    && (path != "/mutate" || v["response"]["patch"].is_string()),
                "{} {path}: unexpected answer {v}",
                server.name
            );
        }
    }
    let v = answer(
        &target(OURS, "/validate-servicemapping", &mapping),
        "cp-webhook",
    )
    .await?;
    anyhow::ensure!(v["response"]["allowed"] == true, "a new mapping: {v}");
    let duplicate = Bytes::from(reviews::mapping_create("m-dup", "m-00042")?);
    let v = answer(
        &target(OURS, "/validate-servicemapping", &duplicate),
        "cp-webhook",
    )
    .await?;
    anyhow::ensure!(
        v["response"]["allowed"] == false
            && v["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("m-00042 already maps")),
        "the webhook's index must hold the mappings (a duplicate of m-00042 was not refused): {v}"
    );

    // Switching service channels off while the mappings exist: refused, with a message that names a
    // count and three of them, in time independent of how many there are.
    let channels_off = Bytes::from(reviews::validate_channels_off()?);
    let v = answer(&target(OURS, "/validate", &channels_off), "cp-webhook").await?;
    let off_message = v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        v["response"]["allowed"] == false && off_message.contains(&mappings.to_string()),
        "switching service channels off with {mappings} mappings must be refused naming their count: {v}"
    );
    let limit = deployment_cpu_limit()
        .map_err(|e| format!("{e:#}"))
        .and_then(|m| {
            CpuLimit::new(m)
                .map(|l| (m, l))
                .map_err(|e| format!("{e:#}"))
        });
    let mut cells = Vec::new();
    for (path, body) in [("/mutate", &mutate), ("/validate", &validate)] {
        for c in [1, 16] {
            cells.push(Cell {
                path,
                body: body.clone(),
                mode: Mode::Closed(c),
                servers: vec![FLOOR, OURS, GO],
                limited: false,
                note: "",
            });
        }
    }
    cells.push(Cell {
        path: "/validate-servicemapping",
        body: mapping.clone(),
        mode: Mode::Closed(16),
        servers: vec![FLOOR, OURS],
        limited: false,
        note: "",
    });
    cells.push(Cell {
        path: "/validate",
        body: channels_off.clone(),
        mode: Mode::Closed(16),
        servers: vec![OURS],
        limited: false,
        note: ", service channels switched off (refused)",
    });
    cells.push(Cell {
        path: "/validate",
        body: validate.clone(),
        mode: Mode::Fresh(1),
        servers: vec![FLOOR, OURS, GO],
        limited: false,
        note: "",
    });
    if limit.is_ok() {
        for (path, body) in [("/mutate", &mutate), ("/validate", &validate)] {
            for rate in RATES {
                cells.push(Cell {
                    path,
                    body: body.clone(),
                    mode: Mode::Open(rate),
                    servers: vec![FLOOR, OURS, GO],
                    limited: true,
                    note: "",
                });
            }
            for rate in KNEE_RATES {
                cells.push(Cell {
                    path,
                    body: body.clone(),
                    mode: Mode::Open(rate),
                    servers: vec![OURS],
                    limited: true,
                    note: "",
                });
            }
        }
    }
    let (repeats, attempts, warmup, measure, open_measure) = if quick {
        (
            1,
            1,
            Duration::from_millis(200),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
    } else {
        (
            REPEATS,
            ATTEMPTS,
            Duration::from_millis(300),
            Duration::from_secs(2),
            Duration::from_secs(3),
        )
    };
    if pinned {
        pin_self(CLIENT_CPU)?;
    }
    let mut runs: BTreeMap<(usize, usize), Vec<Stats>> = BTreeMap::new();
    let mut pooled: BTreeMap<(usize, usize), Pooled> = BTreeMap::new();
    let mut log: Vec<Attempt> = Vec::new();
    let profile;
    {
        // The control plane sleeps through the admission runs; the servers take turns.
        let plane: Vec<u32> = ["etcd", "kube-apiserver", "kube-controller-manager"]
            .iter()
            .filter_map(|n| cp.pid(n))
            .collect();
        let _plane = Paused::new(plane);
        let _servers = Paused::new(servers.iter().map(|s| s.pid).collect());
        for rep in 0..repeats {
            for (ci, cell) in cells.iter().enumerate() {
                for &si in &cell.servers {
                    let pid = servers[si].pid;
                    let m = if matches!(cell.mode, Mode::Open(_)) {
                        open_measure
                    } else {
                        measure
                    };
                    let mut made: Vec<Stats> = Vec::new();
                    for attempt in 1..=attempts {
                        if attempts > 1 {
                            wait_for_quiet().await;
                        }
                        signal(pid, "CONT");
                        let limited = match (&limit, cell.limited) {
                            (Ok((_, l)), true) => {
                                l.enter(pid)?;
                                Some(l)
                            }
                            _ => None,
                        };
                        let stats = load::run_in(
                            &target(si, cell.path, &cell.body),
                            cell.mode,
                            warmup,
                            m,
                            pid,
                            limited.map(|l| l.dir.clone()),
                        )
                        .await;
                        if let Some(l) = limited {
                            l.leave(pid)?;
                        }
                        signal(pid, "STOP");
                        let stats = stats.with_context(|| {
                            format!("{} {} {}", servers[si].name, cell.path, cell.mode.label())
                        })?;
                        println!(
                            "rep {rep} attempt {attempt} {} {} {}: {stats:?}",
                            servers[si].name,
                            cell.path,
                            cell.mode.label()
                        );
                        let quiet = stats.steal_pct <= STEAL_MAX_PCT;
                        pooled.entry((ci, si)).or_default().add(&stats.latencies.0);
                        made.push(stats);
                        if quiet {
                            break;
                        }
                    }
                    let kept = keep(&made);
                    let n = made.len() as u32;
                    for (i, mut stats) in made.into_iter().enumerate() {
                        // The latencies are pooled; the log keeps the figures.
                        stats.latencies = Default::default();
                        if Some(i) == kept {
                            let mut k = stats.clone();
                            k.attempts = n;
                            runs.entry((ci, si)).or_default().push(k);
                        }
                        log.push(Attempt {
                            rep,
                            attempt: i as u32 + 1,
                            cell: ci,
                            server: si,
                            kept: Some(i) == kept,
                            stats,
                        });
                    }
                }
            }
        }
        signal(servers[GO].pid, "CONT");
        profile = go_profile(
            &pprof_addr,
            &target(GO, "/validate", &validate),
            servers[GO].pid,
            &cp.dir,
        )
        .await
        .map_err(|e| format!("{e:#}"));
        signal(servers[GO].pid, "STOP");
    }
    if pinned {
        pin_self(&format!("0-{}", cores - 1))?;
    }
    let rss = load::process_memory(servers[OURS].pid).ok();
    Ok(Results {
        names: servers.iter().map(|s| s.name).collect(),
        cells,
        runs,
        pooled,
        log,
        repeats,
        attempts,
        measure,
        open_measure,
        pinned,
        limit: limit.map(|(m, _)| m),
        mappings,
        bodies: vec![
            ("/mutate", mutate.len()),
            ("/validate", validate.len()),
            ("/validate-servicemapping", mapping.len()),
        ],
        rss,
        off_message,
        profile,
        gogc: std::env::var("GOGC").unwrap_or_else(|_| "unset (100)".into()),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Median and range of one figure over the repeats.
fn summary(runs: &[Stats], f: impl Fn(&Stats) -> f64, decimals: usize) -> String {
    let v: Vec<f64> = runs.iter().map(f).collect();
    let m = median(v.clone());
    if v.len() < 2 {
        return format!("{m:.decimals$}");
    }
    let (lo, hi) = range(&v);
    format!("{m:.decimals$} ({lo:.decimals$}–{hi:.decimals$})")
}

impl Results {
    fn find(&self, path: &str, mode: Mode, server: usize) -> Option<&Vec<Stats>> {
        let ci = self
            .cells
            .iter()
            .position(|c| c.path == path && c.mode == mode && c.note.is_empty())?;
        self.runs.get(&(ci, server))
    }

    fn med(&self, path: &str, mode: Mode, server: usize, f: impl Fn(&Stats) -> f64) -> f64 {
        self.find(path, mode, server)
            .map(|r| median(r.iter().map(f).collect()))
            .unwrap_or(f64::NAN)
    }

    /// Median figures of our webhook the analysis quotes.
    pub fn summary_line(&self) -> String {
        let cpu = |p: &str, s: usize| self.med(p, Mode::Closed(16), s, |x| x.cpu_us);
        format!(
            "CPU per request at c=16: /mutate {:.1} µs (floor {:.1}, Go {:.1}), /validate {:.1} µs (floor {:.1}, Go {:.1})",
            cpu("/mutate", OURS),
            cpu("/mutate", FLOOR),
            cpu("/mutate", GO),
            cpu("/validate", OURS),
            cpu("/validate", FLOOR),
            cpu("/validate", GO)
        )
    }
}

/// The section of BENCHMARKS.md.
pub fn render(r: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Webhook\n\nHTTPS (TLS 1.3, HTTP/1.1) on loopback. Every server runs pinned to CPU {SERVER_CPU} (`taskset`, from \
         its start: tokio and the Go runtime each size themselves to one core), the load generator to CPU {CLIENT_CPU}{}. \
         During a run only the server under test runs: the other two servers, etcd, the API server and the controller \
         manager are stopped (SIGSTOP). Each cell ran {} time(s), interleaved (every cell once, then again); figures are \
         the median and, in brackets, the range. Closed-loop runs measure {:.0} s after a warm-up; open-loop runs {:.0} s, \
         with the load generator's threads under SCHED_FIFO (`chrt`; the pacing thread above the client's workers) so \
         that its own time slicing does not add to the latency it measures; the servers stay under CFS. \
         **Server CPU per request** is the server's utime + stime (`/proc/<pid>/stat`) over the measured window divided \
         by the requests answered in it. **Steal**: this machine is a virtual machine whose host also runs other \
         guests; `steal` in `/proc/stat` counts the time the hypervisor gave the CPUs to them, during which neither the \
         server nor the load generator runs (a measured 10–30 % of the machine for minutes at a time, with the p99 of \
         every server, the floor's too, in milliseconds then). So each run first waits (up to {:.0} s) for a second \
         without steal, and a run with more than {STEAL_MAX_PCT} % steal in its measured window is run again, up to {} \
         attempts, keeping the least-stolen; the table shows the kept runs' steal and the attempts made (every attempt \
         is in `{ATTEMPTS_CSV}`). The same rule applies to every server.\n",
        if r.pinned {
            ""
        } else {
            " (**not pinned: this machine has one core**)"
        },
        r.repeats,
        r.measure.as_secs_f64(),
        r.open_measure.as_secs_f64(),
        QUIET_WAIT.as_secs_f64(),
        r.attempts,
    );
    let size = |p: &str| r.bodies.iter().find(|b| b.0 == p).map(|b| b.1).unwrap_or(0);
    let _ = writeln!(
        md,
        "Requests: `/mutate` CREATE of the module's default CR without `spec.deployment` ({} bytes; answered with the \
         defaults as a one-operation JSON patch), `/validate` UPDATE of the defaulted CR by a non-privileged user \
         who changes the HTTP proxy port, as `kubectl edit` sends it ({} bytes; allowed after the typed parse with \
         unknown-field rejection, the protected-field check and the cross-field rules), `/validate-servicemapping` CREATE of a new, unique ServiceMapping ({} bytes) with \
         **{} ServiceMappings** in the cluster and in the webhook's uniqueness index (a duplicate of one of them was \
         checked to be refused before the runs).\n",
        size("/mutate"),
        size("/validate"),
        size("/validate-servicemapping"),
        r.mappings,
    );
    let _ = writeln!(
        md,
        "Servers: **floor** is `cp-webhook`'s own server (`cp_webhook::server::router_with` + `serve_tls`: rustls, hyper, \
         axum, the same limits and metrics) whose handler only parses the envelope (uid, kind, operation; the objects \
         skipped with `IgnoredAny`) and answers a precomputed review of the same size; **cp-webhook** is the release \
         binary at its production log level (info, JSON; admitted requests are logged at debug, denials at info); the \
         **Go peer** (`bench/peers/go-webhook`) is controller-runtime's webhook package doing the same work (typed \
         decode rejecting unknown spec fields, the same one-operation patch, protected-field check and cross-field \
         rules, and cp-webhook's two shortcuts: `spec.deployment` compared as text before it is decoded, and only \
         the two fields the rules about a change read parsed from the stored spec), at the same log level as cp-webhook (info, JSON: denials at info, admitted requests at debug, unless started with `--log-admitted-at-info`); GOGC {}, GOMAXPROCS from the CPU affinity (1).\n",
        r.gogc
    );
    let _ = writeln!(
        md,
        "**p99 all attempts** pools the latencies of every attempt of the cell, kept or not, stolen or not; \
         every attempt's figures are in `{ATTEMPTS_CSV}` beside this file. **Throttled** counts the CFS periods \
         (100 ms) of the measured windows in which the server hit the CPU limit (`nr_throttled` of its cgroup's \
         `cpu.stat`), summed over the kept runs, of the periods it ran in.\n"
    );
    let _ = writeln!(
        md,
        "| path | load | server | req/s | p50 µs | p99 µs | p99 all attempts µs | p99.9 µs | CPU µs/request | errors | throttled periods | steal % | attempts |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (ci, cell) in r.cells.iter().enumerate() {
        for &si in &cell.servers {
            let Some(runs) = r.runs.get(&(ci, si)) else {
                continue;
            };
            let load = if cell.limited {
                format!(
                    "{} in {}m CPU",
                    cell.mode.label(),
                    r.limit.as_ref().copied().unwrap_or(0)
                )
            } else {
                cell.mode.label()
            } + cell.note;
            let pooled = r
                .pooled
                .get(&(ci, si))
                .map_or("—".to_string(), |p| p.percentile(0.99).to_string());
            let _ = writeln!(
                md,
                "| `{}` | {load} | {} | {} | {} | {} | {pooled} | {} | {} | {} | {} | {} | {} |",
                cell.path,
                r.names[si],
                summary(runs, |s| s.rps, 0),
                summary(runs, |s| s.p50_us as f64, 0),
                summary(runs, |s| s.p99_us as f64, 0),
                summary(runs, |s| s.p999_us as f64, 0),
                summary(runs, |s| s.cpu_us, 1),
                runs.iter().map(|s| s.errors).sum::<usize>(),
                throttled(runs),
                summary(runs, |s| s.steal_pct, 1),
                runs.iter().map(|s| s.attempts).sum::<u32>(),
            );
        }
    }
    md.push('\n');
    if let Err(e) = &r.limit {
        let _ = writeln!(
            md,
            "**The open-loop runs were skipped**: the Deployment's CPU limit could not be applied ({e}).\n"
        );
    }
    md.push_str(&verdicts(r));
    match &r.profile {
        Ok(top) => {
            let _ = writeln!(
                md,
                "### Where the Go peer spends its CPU\n\n`go tool pprof -top` of a 2 s CPU profile taken during a `/validate` \
                 c=16 run after the measured ones (not part of the figures above):\n\n```\n{}```\n",
                top.lines()
                    .take(24)
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
            );
        }
        Err(e) => {
            let _ = writeln!(md, "The Go peer's CPU profile could not be taken: {e}\n");
        }
    }
    md
}

/// The file beside BENCHMARKS.md with every attempt of every cell.
pub const ATTEMPTS_CSV: &str = "BENCHMARKS-webhook-attempts.csv";

/// Throttled periods of the kept runs, of the periods they ran in; "—" without a CPU limit.
fn throttled(runs: &[Stats]) -> String {
    let t: Vec<load::Throttling> = runs.iter().filter_map(|s| s.throttled).collect();
    if t.is_empty() {
        return "—".into();
    }
    let (n, of) = t
        .iter()
        .fold((0, 0), |(n, of), x| (n + x.throttled, of + x.periods));
    format!("{n} of {of}")
}

/// Every attempt of every cell, kept or not, as CSV.
pub fn attempts_csv(r: &Results) -> String {
    let mut out = String::from(
        "rep,attempt,kept,path,load,cpu_limit_millicores,server,requests,errors,rps,p50_us,p99_us,p999_us,max_us,cpu_us_per_request,steal_pct,cfs_periods,cfs_throttled_periods,cfs_throttled_us\n",
    );
    for a in &r.log {
        let Some(cell) = r.cells.get(a.cell) else {
            continue;
        };
        let s = &a.stats;
        let limit = if cell.limited {
            r.limit.as_ref().map_or(String::new(), |m| m.to_string())
        } else {
            String::new()
        };
        let (periods, thr, thr_us) =
            s.throttled
                .map_or((String::new(), String::new(), String::new()), |t| {
                    (
                        t.periods.to_string(),
                        t.throttled.to_string(),
                        t.throttled_us.to_string(),
                    )
                });
        let _ = writeln!(
            out,
            "{},{},{},{},\"{}{}\",{limit},\"{}\",{},{},{:.0},{},{},{},{},{:.1},{:.2},{periods},{thr},{thr_us}",
            a.rep + 1,
            a.attempt,
            a.kept,
            cell.path,
            cell.mode.label(),
            cell.note,
            r.names.get(a.server).copied().unwrap_or("?"),
            s.requests,
            s.errors,
            s.rps,
            s.p50_us,
            s.p99_us,
            s.p999_us,
            s.max_us,
            s.cpu_us,
            s.steal_pct,
        );
    }
    out
}

/// The knee of `path`: every open-loop rate in the CPU limit with cp-webhook's median p99 and its
/// throttled periods, and the highest rate with p99 < 1 ms and no throttled period.
/// One rung of the knee's ladder: rate, median p99 µs, throttled periods, periods.
type Rung = (u32, f64, u64, u64);

fn knee(r: &Results, path: &str) -> (Vec<Rung>, Option<u32>) {
    let mut rows = Vec::new();
    for (ci, cell) in r.cells.iter().enumerate() {
        let Mode::Open(rate) = cell.mode else {
            continue;
        };
        if cell.path != path || !cell.limited {
            continue;
        }
        let Some(runs) = r.runs.get(&(ci, OURS)) else {
            continue;
        };
        let p99 = median(runs.iter().map(|s| s.p99_us as f64).collect());
        let thr: u64 = runs
            .iter()
            .filter_map(|s| s.throttled)
            .map(|t| t.throttled)
            .sum();
        let periods: u64 = runs
            .iter()
            .filter_map(|s| s.throttled)
            .map(|t| t.periods)
            .sum();
        rows.push((rate, p99, thr, periods));
    }
    rows.sort_by_key(|r| r.0);
    let best = rows
        .iter()
        .filter(|(_, p99, thr, _)| *p99 < 1000.0 && *thr == 0)
        .map(|r| r.0)
        .max();
    (rows, best)
}

fn verdicts(r: &Results) -> String {
    let mut md =
        String::from("### Goals\n\n| Goal | measured (medians) | Met |\n| --- | --- | --- |\n");
    let mut row = |goal: String, measured: String, met: Option<bool>| {
        let verdict = match met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(md, "| {goal} | {measured} | {verdict} |");
    };
    let known = |x: f64| (!x.is_nan()).then_some(x);
    for (path, max) in [("/mutate", 1.3), ("/validate", 2.0)] {
        for c in [1, 16] {
            let mode = Mode::Closed(c);
            let ours = r.med(path, mode, OURS, |s| s.cpu_us);
            let floor = r.med(path, mode, FLOOR, |s| s.cpu_us);
            let ratio = ours / floor;
            row(
                format!("`{path}` server CPU per request ≤ {max}× the floor (c={c})"),
                format!("{ours:.1} µs vs {floor:.1} µs: {ratio:.2}×"),
                known(ratio).map(|x| x <= max),
            );
        }
    }
    for path in ["/mutate", "/validate"] {
        for c in [1, 16] {
            let mode = Mode::Closed(c);
            let ours = r.med(path, mode, OURS, |s| s.cpu_us);
            let go = r.med(path, mode, GO, |s| s.cpu_us);
            let ratio = go / ours;
            row(
                format!("`{path}` ≥ 3× the Go peer's CPU efficiency (c={c})"),
                format!("Go {go:.1} µs vs {ours:.1} µs per request: {ratio:.2}×"),
                known(ratio).map(|x| x >= 3.0),
            );
        }
    }
    for path in ["/mutate", "/validate"] {
        let mode = Mode::Open(2_000);
        let ours = r.med(path, mode, OURS, |s| s.cpu_us);
        let go = r.med(path, mode, GO, |s| s.cpu_us);
        let ratio = go / ours;
        // A server held to its quota in most periods cannot spend more than the limit allows per
        // request: its figure is then a lower bound of what a request costs it, and so is the ratio.
        let (thr, periods) = r
            .find(path, mode, GO)
            .map(|runs| {
                runs.iter()
                    .filter_map(|s| s.throttled)
                    .fold((0, 0), |(t, p), x| (t + x.throttled, p + x.periods))
            })
            .unwrap_or((0, 0));
        let capped = periods > 0 && thr * 2 > periods;
        let measured = if capped {
            format!(
                "Go ≥ {go:.1} µs vs {ours:.1} µs per request: ≥ {ratio:.2}× (the peer was throttled in {thr} of \
                 {periods} periods and fell behind: 500m allows it at most 250 µs per request at this rate, so its \
                 cost per request here is a lower bound)"
            )
        } else {
            format!("Go {go:.1} µs vs {ours:.1} µs per request: {ratio:.2}×")
        };
        row(
            format!(
                "`{path}` ≥ 3× the Go peer's CPU efficiency (open loop 2,000/s in the CPU limit)"
            ),
            measured,
            known(ratio).map(|x| x >= 3.0),
        );
    }
    for path in ["/mutate", "/validate"] {
        let (rows, best) = knee(r, path);
        if rows.is_empty() {
            row(
                format!("`{path}` knee ≥ {KNEE_GOAL}/s in the CPU limit"),
                "not measured".into(),
                None,
            );
            continue;
        }
        let ladder = rows
            .iter()
            .map(|(rate, p99, thr, of)| {
                format!("{rate}/s: p99 {p99:.0} µs, {thr} of {of} periods throttled")
            })
            .collect::<Vec<_>>()
            .join("; ");
        row(
            format!(
                "`{path}` knee (highest open-loop rate with p99 < 1 ms and no throttled period, medians of the runs) ≥ {KNEE_GOAL}/s in the CPU limit"
            ),
            format!(
                "{}: {ladder}",
                best.map_or("below every rate tried".to_string(), |b| format!(
                    "**{b}/s**"
                ))
            ),
            Some(best.is_some_and(|b| b >= KNEE_GOAL)),
        );
    }
    // A latency goal's figure, with the floor's and the kept runs' steal beside it.
    let latency = |path: &str, mode: Mode| {
        let p99 = r.med(path, mode, OURS, |s| s.p99_us as f64);
        let floor = r.med(path, mode, FLOOR, |s| s.p99_us as f64);
        let steal = r.med(path, mode, OURS, |s| s.steal_pct);
        (
            p99,
            format!("{p99:.0} µs (floor {floor:.0} µs; steal {steal:.1} %)"),
        )
    };
    for path in ["/mutate", "/validate"] {
        let (p99, measured) = latency(path, Mode::Open(2_000));
        let limit = r.limit.as_ref().copied().unwrap_or(0);
        row(
            format!(
                "`{path}` open-loop p99 < 1 ms at 2,000 req/s in the Deployment's CPU limit ({limit}m)"
            ),
            measured,
            known(p99).map(|x| x < 1000.0),
        );
    }
    let off = r.cells.iter().position(|c| !c.note.is_empty());
    let off_p99 = off
        .and_then(|ci| r.runs.get(&(ci, OURS)))
        .map(|runs| median(runs.iter().map(|s| s.p99_us as f64).collect()));
    row(
        format!(
            "`/validate` switching service channels off with {} mappings: p99 < 1 ms at c=16, refusal message < 1 KiB",
            r.mappings
        ),
        format!(
            "{}; message {} bytes: \"{}\"",
            off_p99.map_or("not measured".into(), |p| format!("p99 {p:.0} µs")),
            r.off_message.len(),
            r.off_message.replace('|', "\\|")
        ),
        off_p99.map(|p| p < 1000.0 && r.off_message.len() < 1024),
    );
    let (p99, measured) = latency("/validate-servicemapping", Mode::Closed(16));
    row(
        format!(
            "`/validate-servicemapping` p99 < 1 ms at c=16 with {} mappings",
            r.mappings
        ),
        measured,
        known(p99).map(|x| x < 1000.0),
    );
    match &r.rss {
        Some(m) => row(
            format!("webhook memory < 16 MiB with {} mappings", r.mappings),
            format!(
                "anonymous {:.1} MiB (VmRSS {:.1}, peak {:.1}) after the runs",
                m.anon as f64 / 1024.0,
                m.rss as f64 / 1024.0,
                m.hwm as f64 / 1024.0
            ),
            Some(m.anon < 16 * 1024),
        ),
        None => row("webhook memory < 16 MiB".into(), "not read".into(), None),
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steal_pct: f64) -> Stats {
        Stats {
            steal_pct,
            ..Stats::default()
        }
    }

    #[test]
    fn the_least_stolen_attempt_is_kept_and_the_earlier_on_a_tie() {
        assert_eq!(keep(&[]), None);
        assert_eq!(keep(&[run(5.0)]), Some(0));
        assert_eq!(keep(&[run(5.0), run(2.0), run(9.0)]), Some(1));
        assert_eq!(keep(&[run(5.0), run(2.0), run(9.0), run(2.0)]), Some(1));
    }
}
