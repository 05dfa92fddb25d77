//! A small HTTPS load generator and the server-CPU meter.
//!
//! Three ways to load a server: closed loop (`c` keep-alive HTTP/1.1 connections, each with one
//! request in flight), closed loop on fresh connections (every request opens its own TCP + TLS 1.3
//! connection, full handshake, no resumption: the rarely-called webhook), and open loop (requests
//! sent at a fixed rate from a pacing thread whatever the answers do; latency counts from the
//! scheduled send time, so a stalled server cannot hide its queue). Every latency is kept for exact
//! percentiles. The server's CPU time over the measured window comes from `/proc/<pid>/stat`
//! (utime + stime of all its threads, [`crate::harness::procfs`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::TlsConnector;

use crate::harness::procfs::{Throttling, machine_ticks, process_cpu_us};
use crate::harness::stats::nearest_rank;

/// How a run loads the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `c` kept-alive connections, one request in flight on each.
    Closed(usize),
    /// `c` clients, each request on a new connection (TCP + full TLS handshake).
    Fresh(usize),
    /// A fixed rate in requests per second, latency from the scheduled send time.
    Open(u32),
}

impl Mode {
    /// Short label for tables.
    pub fn label(self) -> String {
        match self {
            Mode::Closed(c) => format!("c={c}"),
            Mode::Fresh(c) => format!("new TLS per request, c={c}"),
            Mode::Open(r) => format!("open loop {r}/s"),
        }
    }
}

/// One load run's result.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests completed in the measured window.
    pub requests: usize,
    /// Requests that failed or got a non-200 answer in the measured window.
    pub errors: usize,
    /// Requests per second in the measured window.
    pub rps: f64,
    /// Latency percentiles in microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest request.
    pub max_us: u64,
    /// Server CPU time (user + system) per completed request, µs.
    pub cpu_us: f64,
    /// Connections the open loop had to add because every open one was busy.
    pub extra_connections: usize,
    /// Share of the machine's CPU time the hypervisor gave to other guests during the measured
    /// window (`steal` in `/proc/stat`), percent.
    pub steal_pct: f64,
    /// Attempts the bench made at this run (it repeats runs with steal); 1 from [`run`].
    pub attempts: u32,
    /// CFS periods of the measured window in which the server's cgroup was throttled, and the
    /// periods it ran in (`cpu.stat`), when the run had a CPU limit.
    pub throttled: Option<Throttling>,
    /// Every latency of the measured window, µs, sorted.
    pub latencies: Samples,
}

/// A run's latencies, µs, sorted; shown as their count (a run's log line stays one line).
#[derive(Clone, Default)]
pub struct Samples(pub Arc<Vec<u32>>);

impl std::fmt::Debug for Samples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} samples", self.0.len())
    }
}

/// What to send where.
#[derive(Clone)]
pub struct Target {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// Request path.
    pub path: String,
    /// Request body.
    pub body: Bytes,
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// The name the server's certificate is verified against; `None`: 127.0.0.1.
    pub server_name: Option<String>,
    /// Opens the TCP connection instead of connecting to `addr` from here: a server in another
    /// network namespace (a pod on the test node) is dialled from inside it.
    pub dial: Option<Dial>,
}

/// Opens a TCP connection to the server (blocking; run off the async threads).
pub type Dial = Arc<dyn Fn() -> anyhow::Result<std::net::TcpStream> + Send + Sync>;

/// A client TLS configuration trusting `ca_pem`; `resume` allows session resumption.
fn connector(ca_pem: &str, resume: bool) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(TlsConnector::from(Arc::new(config)))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: &Target, tls: &TlsConnector) -> anyhow::Result<Sender> {
    let tcp = match &target.dial {
        Some(dial) => {
            let dial = dial.clone();
            let std = tokio::task::spawn_blocking(move || dial()).await??;
            std.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(std)?
        }
        None => tokio::net::TcpStream::connect(&target.addr).await?,
    };
    tcp.set_nodelay(true)?;
    let name =
        ServerName::try_from(target.server_name.as_deref().unwrap_or("127.0.0.1"))?.to_owned();
    let stream = tls.connect(name, tcp).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request and its answer; `Ok(false)` for a non-200 answer.
pub async fn send(sender: &mut Sender, target: &Target) -> anyhow::Result<(bool, Bytes)> {
    let req = http::Request::post(&target.path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(target.body.clone()))?;
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    let ok = resp.status() == http::StatusCode::OK;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((ok, body))
}

/// One request on a fresh connection, to check what a server answers before loading it.
pub async fn probe(target: &Target) -> anyhow::Result<(bool, Bytes)> {
    let tls = connector(&target.ca_pem, true)?;
    let mut sender = connect(target, &tls).await?;
    send(&mut sender, target).await
}

/// The load generator under SCHED_FIFO while an open loop runs: its threads at priority 40, the pacing
/// thread above them at 50. Under CFS, the pacing thread and the client's tokio workers share their
/// core by time slices, so a send or an answer's read can wait for another thread's slice: up to a
/// millisecond added to the measured latency of every server alike. Real-time, each runs as soon as
/// it is woken. The servers stay as deployed (CFS, in the Deployment's CPU limit). Every thread of
/// the process goes back to SCHED_OTHER on drop.
pub struct Realtime {
    applied: bool,
}

impl Realtime {
    /// Raises every thread of this process (best effort; `applied` says whether it worked).
    pub fn load_generator() -> Self {
        let tids = own_threads();
        let applied = !tids.is_empty() && tids.iter().all(|t| chrt(&["-f", "-p", "40", t]));
        if !applied {
            eprintln!(
                "the load generator could not get SCHED_FIFO (chrt); latency figures include its own scheduling"
            );
        }
        Realtime { applied }
    }

    /// Whether every thread got SCHED_FIFO.
    pub fn applied(&self) -> bool {
        self.applied
    }
}

impl Drop for Realtime {
    fn drop(&mut self) {
        // Threads started meanwhile inherited the policy: reset them all.
        for t in own_threads() {
            chrt(&["-o", "-p", "0", &t]);
        }
    }
}

fn own_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn chrt(args: &[&str]) -> bool {
    std::process::Command::new("chrt")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The calling thread's id.
fn own_tid() -> Option<String> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    Some(link.file_name()?.to_str()?.to_string())
}

/// Latencies and errors of the measured window.
#[derive(Default)]
struct Window {
    lat: Vec<u32>,
    errors: usize,
}

impl Window {
    /// A request of the window: its latency when it was answered 200, else an error.
    fn record(&mut self, ok: bool, latency: Duration) {
        if ok {
            self.lat.push(latency.as_micros() as u32);
        } else {
            self.errors += 1;
        }
    }
}

/// Loads `target` in `mode`: `warmup` unmeasured, then `measure`; the server's CPU is read from
/// `/proc/<server_pid>` at the start and the end of the measured window.
pub async fn run(
    target: &Target,
    mode: Mode,
    warmup: Duration,
    measure: Duration,
    server_pid: u32,
) -> anyhow::Result<Stats> {
    run_in(target, mode, warmup, measure, server_pid, None).await
}

/// [`run`] of a server in the `cpu` cgroup `cgroup` (its CPU limit): the run's throttled periods
/// over the measured window are read from the cgroup's `cpu.stat`.
pub async fn run_in(
    target: &Target,
    mode: Mode,
    warmup: Duration,
    measure: Duration,
    server_pid: u32,
    cgroup: Option<std::path::PathBuf>,
) -> anyhow::Result<Stats> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + measure;
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        let a = process_cpu_us(server_pid);
        let ticks_a = machine_ticks();
        let cfs_a = cgroup.as_deref().map(Throttling::read).transpose();
        tokio::time::sleep_until(end.into()).await;
        let b = process_cpu_us(server_pid);
        let ticks_b = machine_ticks();
        let cfs_b = cgroup.as_deref().map(Throttling::read).transpose();
        let throttled = match (cfs_a?, cfs_b?) {
            (Some(a), Some(b)) => Some(b.since(a)),
            _ => None,
        };
        Ok::<_, anyhow::Error>((b?.saturating_sub(a?), ticks_b?.since(ticks_a?), throttled))
    });
    let (window, extra_connections) = match mode {
        Mode::Closed(c) => (closed(target, c, false, measure_from, end).await?, 0),
        Mode::Fresh(c) => (closed(target, c, true, measure_from, end).await?, 0),
        Mode::Open(rate) => open(target, rate, start, measure_from, end).await?,
    };
    let (cpu_us, steal_pct, throttled) = cpu.await??;
    let mut all = window.lat;
    all.sort_unstable();
    let pct = |p: f64| nearest_rank(all.len(), p).map_or(0, |i| u64::from(all[i]));
    Ok(Stats {
        requests: all.len(),
        errors: window.errors,
        rps: all.len() as f64 / measure.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        max_us: all.last().map(|v| u64::from(*v)).unwrap_or(0),
        cpu_us: cpu_us as f64 / all.len().max(1) as f64,
        extra_connections,
        steal_pct,
        attempts: 1,
        throttled,
        latencies: Samples(Arc::new(all)),
    })
}

/// Closed loop: `concurrency` clients, each sending its next request when the last one answered.
async fn closed(
    target: &Target,
    concurrency: usize,
    fresh: bool,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<Window> {
    let tls = connector(&target.ca_pem, !fresh)?;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut sender = if fresh {
            None
        } else {
            Some(connect(target, &tls).await?)
        };
        let (target, tls) = (target.clone(), tls.clone());
        tasks.push(tokio::spawn(async move {
            let mut w = Window {
                lat: Vec::with_capacity(1 << 16),
                errors: 0,
            };
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let ok = match sender.as_mut() {
                    Some(s) => matches!(send(s, &target).await, Ok((true, _))),
                    None => match connect(&target, &tls).await {
                        Ok(mut s) => matches!(send(&mut s, &target).await, Ok((true, _))),
                        Err(_) => false,
                    },
                };
                let t1 = Instant::now();
                if t0 >= measure_from && t1 <= end {
                    w.record(ok, t1 - t0);
                }
                if !ok && !fresh {
                    // Reconnect after a failure (the server may have closed the connection).
                    match connect(&target, &tls).await {
                        Ok(s) => sender = Some(s),
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            }
            w
        }));
    }
    let mut all = Window::default();
    for t in tasks {
        let w = t.await?;
        all.lat.extend(w.lat);
        all.errors += w.errors;
    }
    Ok(all)
}

/// Open loop: a pacing thread schedules request `i` at `start + i / rate` and hands it to the
/// runtime; each request takes an idle kept-alive connection (opening another when all are busy)
/// and its latency counts from its scheduled time.
async fn open(
    target: &Target,
    rate: u32,
    start: Instant,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<(Window, usize)> {
    const POOL: usize = 16;
    let tls = connector(&target.ca_pem, true)?;
    let mut idle = Vec::with_capacity(POOL);
    for _ in 0..POOL {
        idle.push(connect(target, &tls).await?);
    }
    let idle = Arc::new(Mutex::new(idle));
    let window = Arc::new(Mutex::new(Window::default()));
    let extra = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // CP_BENCH_FIFO=0 leaves the load generator under CFS (to see what real-time scheduling changes).
    let realtime = std::env::var("CP_BENCH_FIFO").map_or(true, |v| v != "0");
    let fifo = realtime.then(Realtime::load_generator);
    let realtime = fifo.as_ref().is_some_and(Realtime::applied);
    let handle = tokio::runtime::Handle::current();
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let (target, shared) = (target.clone(), (idle, window.clone(), extra.clone()));
    let pacer = std::thread::spawn(move || {
        if realtime && let Some(tid) = own_tid() {
            // Above the client's workers: a send is never late for their sake.
            chrt(&["-f", "-p", "50", &tid]);
        }
        let mut spawned = Vec::new();
        let mut due = start;
        while due < end {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let (target, tls) = (target.clone(), tls.clone());
            let (idle, window, extra) = (shared.0.clone(), shared.1.clone(), shared.2.clone());
            spawned.push(handle.spawn(async move {
                let taken = idle.lock().ok().and_then(|mut v| v.pop());
                let sender = match taken {
                    Some(s) => Ok(s),
                    None => {
                        extra.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        connect(&target, &tls).await
                    }
                };
                let (ok, back) = match sender {
                    Ok(mut s) => {
                        let ok = matches!(send(&mut s, &target).await, Ok((true, _)));
                        (ok, ok.then_some(s))
                    }
                    Err(_) => (false, None),
                };
                let t1 = Instant::now();
                if let Some(s) = back
                    && let Ok(mut v) = idle.lock()
                {
                    v.push(s);
                }
                if due >= measure_from
                    && due < end
                    && let Ok(mut w) = window.lock()
                {
                    w.record(ok, t1 - due);
                }
            }));
            due += interval;
        }
        spawned
    });
    let spawned = tokio::task::spawn_blocking(move || pacer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the pacing thread panicked"))?;
    for t in spawned {
        t.await?;
    }
    drop(fifo);
    let w = std::mem::take(
        &mut *window
            .lock()
            .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?,
    );
    Ok((w, extra.load(std::sync::atomic::Ordering::Relaxed)))
}
