//! Controller figures: edit→apply latency, API requests when idle and per reconcile, resident memory
//! of the webhook and the controller idle and with many ServiceMappings, aggregation time, and the
//! takeover of a legacy reconciler installation.
//!
//! Everything runs against a real local control plane ([`ControlPlane`]) that audits every request,
//! with the release binaries of the webhook and the controller running as their own ServiceAccounts.
//! Moments are taken from watch events (the bench's own watches), never from polling with sleeps.

use std::collections::{BTreeMap, HashSet};
use std::fmt::{Debug, Write as _};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use cp_api::{ConnectivityProxy, ServiceMapping, State, names};
use cp_tests::cluster::{AuditWrite, Options, ensure_namespace};
use cp_tests::controller::{CONTROLLER_USER, ControllerProcess};
use cp_tests::fakes::StandIns;
use cp_tests::fixtures::{default_connectivity_proxy, service_mapping};
use cp_tests::legacy::{self, MappingSnapshot};
use cp_tests::wait::admission_active;
use cp_tests::webhook::{Webhook, http_get};
use cp_tests::{ControlPlane, manifest};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;

use crate::load::{ProcMemory, process_memory};

const NS: &str = names::KYMA_SYSTEM;
const CR: &str = names::DEFAULT_CR_NAME;
const DOMAIN: &str = "bench.kyma.example.com";
const SUBACCOUNT: &str = "11111111-2222-3333-4444-555555555555";
const SUBDOMAIN: &str = "bench-subdomain";
const WEBHOOK_USER: &str = "system:serviceaccount:kyma-system:connectivity-proxy-webhook";
const WEBHOOK_PROCESS: &str = "cp-webhook";
const CONTROLLER_PROCESS: &str = "cp-controller";
use cp_api::keys::{ADOPTED_ANNOTATION, MIGRATION_ANNOTATION};
const TOUCH_ANNOTATION: &str = "bench.connectivityproxy.sap.com/touch";
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
const RECONCILE_SERIES: &str = "cp_controller_reconcile_total{";
/// Goals from the issue.
/// Anonymous memory goals, idle and with the mappings (issue #18).
const WEBHOOK_GOAL_MIB: (f64, f64) = (10.0, 16.0);
const CONTROLLER_GOAL_MIB: (f64, f64) = (20.0, 40.0);
/// Edit → applied goal (p99, both the ConfigMap and the StatefulSet updated), issue #33.
const EDIT_P99_GOAL_MS: f64 = 50.0;
/// Drift repair goal (each sample), issue #33.
const DRIFT_GOAL_MS: f64 = 100.0;
/// One new mapping → in the aggregated ConfigMap with 10,000 present, p99 goal (issue #33).
const ONE_MAPPING_P99_GOAL_MS: f64 = 500.0;
/// Goals of our choosing, stated before the first measurement (issue #33, item 6): controller CPU
/// per reconcile in which nothing changed, without and with the 10,000 mappings, and per idle hour.
const RECONCILE_CPU_GOAL_MS: f64 = 5.0;
const RECONCILE_CPU_GOAL_MS_MAPPINGS: f64 = 25.0;
const IDLE_CPU_GOAL_S_PER_HOUR: f64 = 10.0;
/// Concurrent ServiceMapping creations.
const IN_FLIGHT: usize = 16;

/// Latency percentiles of a series of samples, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    pub fn of(samples: &[f64]) -> Self {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let rank = |p: f64| {
            let n = v.len();
            let i = ((p * n as f64).ceil() as usize).saturating_sub(1);
            v.get(i.min(n.saturating_sub(1))).copied().unwrap_or(0.0)
        };
        Self {
            samples: v.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Time from a CR edit (`spec.config.servers.proxy.http.port`) until the change is visible.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EditLatency {
    /// ConfigMap `connectivity-proxy-info` has the new `onpremise_proxy_http_port`.
    pub config_map: Percentiles,
    /// The StatefulSet's `http-proxy` container port is the new port.
    pub stateful_set: Percentiles,
    /// Both (the later of the two).
    pub both: Percentiles,
}

/// Requests of one verb on one resource (and object name, where it matters).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestCount {
    pub verb: String,
    pub resource: String,
    /// Empty when counted over every object.
    pub name: String,
    pub count: usize,
}

/// The controller's (and the webhook's) API requests over an idle window after Ready.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IdleRequests {
    pub window_secs: f64,
    /// Lease renewals (leader election): writes on `leases`.
    pub lease_writes: usize,
    /// Reads of the Lease before each renewal.
    pub lease_reads: usize,
    /// Every other write, by verb, resource and name.
    pub other_writes: Vec<RequestCount>,
    /// get/list on anything but leases.
    pub reads: usize,
    /// Those reads by verb and resource.
    pub read_counts: Vec<RequestCount>,
    /// Watch requests that completed (and were re-established) in the window.
    pub watches: usize,
    pub webhook_writes: usize,
    pub webhook_reads: usize,
    pub webhook_watches: usize,
    /// ServiceMappings in the cluster during the window.
    pub mappings: usize,
    /// CPU (user + system) of the controller and the webhook over the window, ms.
    pub controller_cpu_ms: f64,
    pub webhook_cpu_ms: f64,
}

impl IdleRequests {
    /// `n` requests over the window, per minute.
    pub fn per_minute(&self, n: usize) -> f64 {
        if self.window_secs > 0.0 {
            n as f64 * 60.0 / self.window_secs
        } else {
            0.0
        }
    }

    /// Writes other than Lease renewals.
    pub fn other_write_count(&self) -> usize {
        self.other_writes.iter().map(|r| r.count).sum()
    }
}

/// One full reconcile, triggered by an annotation change on the CR (no new generation).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileRequests {
    /// Requests of the first triggered reconcile by verb and resource (leases and watches excluded).
    pub requests: Vec<RequestCount>,
    /// Total requests (leases and watches excluded) of each triggered reconcile.
    pub totals: Vec<usize>,
    /// Writes among them, per triggered reconcile.
    pub writes: Vec<usize>,
    /// Reconciles the controller counted in each window (1 = the trigger caused exactly one).
    pub reconciles: Vec<u64>,
    /// Trigger to completion (the reconcile counter increased), per triggered reconcile.
    pub durations_ms: Vec<f64>,
    /// Lease requests that fell into the windows (not part of the reconcile).
    pub lease_requests: usize,
    /// Watch requests that completed in the windows (not part of the reconcile).
    pub watch_requests: usize,
}

/// Memory of one process: anonymous resident memory (`RssAnon`, what the process allocated; file
/// pages of its binary excluded), KiB.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    pub process: String,
    /// After Ready, idle.
    pub idle_kib: u64,
    /// With the ServiceMappings aggregated and adopted.
    pub loaded_kib: u64,
    /// After a restart with the mappings still there, once settled.
    pub restarted_kib: u64,
    /// VmRSS (anonymous + file pages) with the mappings, for comparison.
    pub loaded_rss_kib: u64,
    /// VmHWM (peak resident) before the restart.
    pub peak_kib: u64,
    pub idle_goal_mib: f64,
    pub loaded_goal_mib: f64,
}

impl Memory {
    pub fn met(&self) -> bool {
        let kib = |mib: f64| (mib * 1024.0) as u64;
        self.idle_kib < kib(self.idle_goal_mib)
            && self.loaded_kib < kib(self.loaded_goal_mib)
            && self.restarted_kib < kib(self.loaded_goal_mib)
    }
}

/// Creating many ServiceMappings and the controller catching up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Aggregation {
    pub mappings: usize,
    /// Creating all of them through the API server (and the webhook), `IN_FLIGHT` at a time.
    pub create_secs: f64,
    pub create_per_sec: f64,
    /// Creations retried after a transient error.
    pub create_retries: usize,
    /// From the last creation to ConfigMap `connectivity-proxy-service-mappings` listing all of them.
    pub aggregated_ms: f64,
    /// From the last creation to every mapping labelled, annotated and with its `status.endpoint`;
    /// `None` when that took longer than `adopt_wait_secs`.
    pub adopted_ms: Option<f64>,
    /// How long the bench waits for that after the last creation.
    pub adopt_wait_secs: f64,
    /// Mappings adopted when the bench stopped waiting (all of them unless `adopted_ms` is `None`).
    pub adopted: usize,
    /// Size of the aggregated ConfigMap value.
    pub config_map_bytes: usize,
}

/// Taking over a legacy reconciler installation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Takeover {
    /// ServiceMappings the legacy installation had.
    pub mappings: usize,
    /// Controller process start to its `/readyz` (caches synced).
    pub started_ms: f64,
    /// Controller start to `connectivityproxy.sap.com/legacy-migration: done`.
    pub migrated_ms: f64,
    /// Controller start to every mapping taken over (module label; uid, spec and user labels kept).
    pub adopted_ms: f64,
    /// Controller start to the CR Ready (BTP operator and StatefulSet readiness played by the bench).
    pub ready_ms: f64,
}

/// Controller CPU for reconciles in which nothing changed: a burst of annotation touches.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileCpu {
    /// ServiceMappings in the cluster meanwhile.
    pub mappings: usize,
    /// Reconciles the controller counted in the burst.
    pub reconciles: u64,
    /// Controller CPU (user + system) over the burst, ms, its idle rate taken off.
    pub cpu_ms: f64,
    /// The idle rate measured just before, ms CPU per second.
    pub idle_ms_per_s: f64,
    pub goal_ms: f64,
}

impl ReconcileCpu {
    pub fn per_reconcile(&self) -> f64 {
        self.cpu_ms / self.reconciles.max(1) as f64
    }
}

/// Everything [`run`] measures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ControllerFigures {
    pub quick: bool,
    pub edit: EditLatency,
    pub idle: IdleRequests,
    pub reconcile: ReconcileRequests,
    pub drift: Vec<DriftRepair>,
    pub memory: Vec<Memory>,
    pub aggregation: Aggregation,
    /// One more mapping at a time, with the aggregated ones present: create → in the ConfigMap.
    pub one_mapping: Percentiles,
    pub reconcile_cpu: Vec<ReconcileCpu>,
    pub takeover: Takeover,
    /// Wall time of the whole run.
    pub elapsed_secs: f64,
}

struct Sizes {
    edits: usize,
    /// Single mapping creations timed with the many present.
    one_mappings: usize,
    /// Annotation touches per CPU burst.
    touches: usize,
    idle: Duration,
    reconciles: usize,
    mappings: usize,
    /// How long to wait for every new mapping to be adopted (the controller writes each one twice).
    adopt_wait: Duration,
    legacy_mappings: usize,
}

fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes {
            edits: 20,
            one_mappings: 10,
            touches: 20,
            idle: Duration::from_secs(20),
            reconciles: 3,
            mappings: 2_000,
            adopt_wait: Duration::from_secs(45),
            legacy_mappings: 200,
        }
    } else {
        Sizes {
            edits: 100,
            one_mappings: 100,
            touches: 100,
            // Longer than the resync (600 s), so a resync falls into the window. CP_BENCH_IDLE_SECS
            // shortens it for a trial run (the table then says it is shorter than the resync).
            idle: Duration::from_secs(
                std::env::var("CP_BENCH_IDLE_SECS")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(11 * 60),
            ),
            reconciles: 5,
            mappings: 10_000,
            adopt_wait: Duration::from_secs(90),
            legacy_mappings: 1_000,
        }
    }
}

/// Starts its own ControlPlane (audit_reads: true), the webhook and the controller from the binaries in
/// `cp_tests::own_bin_dir()`, measures, stops everything.
pub async fn run(quick: bool) -> anyhow::Result<ControllerFigures> {
    let started = Instant::now();
    let sizes = sizes(quick);
    let mut figures = ControllerFigures {
        quick,
        ..Default::default()
    };

    let cp = start_control_plane().await?;
    let result = main_phase(&cp, &sizes, &mut figures).await;
    stop_control_plane(cp).await;
    result?;

    let cp = start_control_plane().await?;
    let result = takeover_phase(&cp, &sizes).await;
    stop_control_plane(cp).await;
    figures.takeover = result.context("legacy takeover")?;

    figures.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(figures)
}

async fn start_control_plane() -> anyhow::Result<ControlPlane> {
    // `ControlPlane::start` runs a runtime of its own: start it on a plain thread.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ControlPlane::start(Options {
            audit_reads: true,
            // CP_KEEP_DIR keeps the logs (the processes', the audit log) after the run.
            keep_dir: std::env::var_os("CP_KEEP_DIR").is_some(),
            ..Default::default()
        }));
    });
    rx.await
        .context("the thread starting the control plane died")?
        .context("starting the local control plane")
}

async fn stop_control_plane(cp: ControlPlane) {
    // Stopping waits for the processes to exit: off the async threads.
    let _ = tokio::task::spawn_blocking(move || drop(cp)).await;
}

async fn main_phase(
    cp: &ControlPlane,
    sizes: &Sizes,
    figures: &mut ControllerFigures,
) -> anyhow::Result<()> {
    let admin = cp.admin().await?;
    install_prerequisites(&admin, DOMAIN).await?;
    // As in production: the controller issues the webhook's serving certificate (for 127.0.0.1 here)
    // and injects its CA into the webhook configurations; resync and leader election at their defaults.
    let ctrl = ControllerProcess::start(cp, CONTROLLER_PROCESS, &["--webhook-ips=127.0.0.1"])
        .await
        .context("starting the controller")?;
    let wh =
        Webhook::start_from_secret(cp, WEBHOOK_PROCESS, &["--privileged-groups=system:masters"])
            .await
            .context("starting the webhook")?;
    wh.register(&admin).await?;
    admission_active(&admin).await?;

    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let cr_watch = watch_one(crs.clone(), CR, CrView::of);
    crs.create(&PostParams::default(), &default_connectivity_proxy(CR))
        .await
        .context("creating the default CR")?;
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    settle(&ctrl).await?;

    let wh_idle = memory(cp, WEBHOOK_PROCESS)?;
    let ctrl_idle = memory(cp, CONTROLLER_PROCESS)?;

    figures.reconcile = reconcile_requests(cp, &ctrl, &crs, sizes.reconciles).await?;
    figures
        .reconcile_cpu
        .push(reconcile_cpu(cp, &ctrl, &crs, sizes.touches, 0, RECONCILE_CPU_GOAL_MS).await?);
    figures.drift = drift_repair(&admin, sizes.reconciles).await?;
    settle(&ctrl).await?;
    figures.edit = edit_latency(&admin, sizes.edits).await?;
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    settle(&ctrl).await?;

    figures.aggregation = aggregate(&admin, sizes.mappings, sizes.adopt_wait).await?;
    settle(&ctrl).await?;
    figures.one_mapping = one_mapping_latency(&admin, sizes.mappings, sizes.one_mappings).await?;
    let present = sizes.mappings + sizes.one_mappings;
    settle(&ctrl).await?;
    figures.reconcile_cpu.push(
        reconcile_cpu(
            cp,
            &ctrl,
            &crs,
            sizes.touches,
            present,
            RECONCILE_CPU_GOAL_MS_MAPPINGS,
        )
        .await?,
    );
    // Steady state with the mappings: requests, writes and CPU of an idle window (issue #33).
    settle(&ctrl).await?;
    figures.idle = idle_requests(cp, sizes.idle).await?;
    figures.idle.mappings = present;
    let wh_loaded = memory(cp, WEBHOOK_PROCESS)?;
    let ctrl_loaded = memory(cp, CONTROLLER_PROCESS)?;
    // Restarted with the mappings in place: what a rollout or an eviction leaves.
    cp.terminate_process(CONTROLLER_PROCESS, Duration::from_secs(30))?;
    let ctrl = ControllerProcess::start(cp, CONTROLLER_PROCESS, &["--webhook-ips=127.0.0.1"])
        .await
        .context("restarting the controller")?;
    settle(&ctrl).await?;
    let ctrl_restarted = memory(cp, CONTROLLER_PROCESS)?;
    cp.terminate_process(WEBHOOK_PROCESS, Duration::from_secs(30))?;
    Webhook::start_from_secret(cp, WEBHOOK_PROCESS, &["--privileged-groups=system:masters"])
        .await
        .context("restarting the webhook")?;
    let wh_restarted = memory(cp, WEBHOOK_PROCESS)?;
    let entry = |process: &str,
                 idle: &ProcMemory,
                 loaded: &ProcMemory,
                 restarted: &ProcMemory,
                 goal: (f64, f64)| Memory {
        process: process.into(),
        idle_kib: idle.anon,
        loaded_kib: loaded.anon,
        restarted_kib: restarted.anon,
        loaded_rss_kib: loaded.rss,
        peak_kib: loaded.hwm,
        idle_goal_mib: goal.0,
        loaded_goal_mib: goal.1,
    };
    figures.memory = vec![
        entry(
            "webhook",
            &wh_idle,
            &wh_loaded,
            &wh_restarted,
            WEBHOOK_GOAL_MIB,
        ),
        entry(
            "controller",
            &ctrl_idle,
            &ctrl_loaded,
            &ctrl_restarted,
            CONTROLLER_GOAL_MIB,
        ),
    ];
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Setup.

/// Our CRDs, Istio's and the BTP operator's, the namespaces, and shoot-info with `domain`.
async fn install_prerequisites(admin: &Client, domain: &str) -> anyhow::Result<()> {
    cp_tests::fixtures::apply_our_crds(admin).await?;
    cp_tests::fixtures::apply(
        admin,
        &[cp_tests::fixtures::ISTIO_CRDS, cp_tests::fixtures::BTP_CRDS],
        None,
    )
    .await?;
    for ns in [NS, names::ISTIO_NAMESPACE] {
        ensure_namespace(admin, ns).await?;
    }
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": names::SHOOT_INFO, "namespace": names::SHOOT_INFO_NAMESPACE},
        "data": {"domain": domain}});
    manifest::apply_object(admin, serde_json::from_value(cm)?, None)
        .await
        .context("writing shoot-info")?;
    Ok(())
}

/// What the bench follows of the CR.
#[derive(Clone, Debug, Default, PartialEq)]
struct CrView {
    migration: Option<String>,
    state: Option<State>,
    reasons: Vec<String>,
    description: Option<String>,
}

impl CrView {
    fn of(cr: &ConnectivityProxy) -> Self {
        let status = cr.status.clone().unwrap_or_default();
        Self {
            migration: cr.annotations().get(MIGRATION_ANNOTATION).cloned(),
            state: status.state,
            reasons: status.conditions.iter().map(|c| c.reason.clone()).collect(),
            description: status.description,
        }
    }
}

/// Plays the SAP BTP service operator and the StatefulSet controller with its kubelets, driven by
/// the CR's status as watched, until the CR is Ready.
async fn play_until_ready(
    admin: &Client,
    mut cr: watch::Receiver<(Instant, Option<CrView>)>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let stand_ins = StandIns::new(admin, NS, CR, Some((SUBACCOUNT, SUBDOMAIN)));
    let mut last_error = String::new();
    loop {
        let CrView {
            state,
            reasons,
            description,
            ..
        } = cr.borrow_and_update().1.clone().unwrap_or_default();
        if state == Some(State::Ready) {
            return Ok(());
        }
        stand_ins
            .play_btp_operator(&reasons)
            .await
            .context("playing the SAP BTP service operator")?;
        if let Err(e) = stand_ins.mark_statefulset_ready(&reasons).await {
            last_error = format!("; marking the StatefulSet ready: {e:#}");
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{NS}/{CR} not Ready within {timeout:?}: {state:?}, {description:?}, reasons {reasons:?}{last_error}"
            );
        }
        // React to the next status change; look again after a while in case nothing changes.
        tokio::select! {
            r = cr.changed() => r.map_err(|_| anyhow!("the watch of {NS}/{CR} ended"))?,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watching.

/// The latest value derived from a watch, with the moment its event arrived. The watch stops when
/// this is dropped.
struct Watched<T> {
    rx: watch::Receiver<(Instant, T)>,
    task: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Folds the events of a watch into `state`; whenever `step` yields a value that differs from the
/// last one, publishes it with the arrival time of its event.
fn watch_fold<K, S, T, F>(
    api: Api<K>,
    cfg: watcher::Config,
    mut state: S,
    initial: T,
    mut step: F,
) -> Watched<T>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Send + 'static,
    T: PartialEq + Send + Sync + 'static,
    F: FnMut(&mut S, watcher::Event<K>) -> Option<T> + Send + 'static,
{
    let (tx, rx) = watch::channel((Instant::now(), initial));
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let Ok(event) = event else { continue };
            if let Some(v) = step(&mut state, event) {
                tx.send_if_modified(|cur| {
                    if cur.1 == v {
                        false
                    } else {
                        *cur = (at, v);
                        true
                    }
                });
            }
        }
    });
    Watched { rx, task }
}

/// `f` of one named object (`None` while it does not exist).
fn watch_one<K, T>(
    api: Api<K>,
    name: &str,
    f: impl Fn(&K) -> T + Send + 'static,
) -> Watched<Option<T>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watch_fold(api, cfg, (), None, move |_, event| match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some(Some(f(&o))),
        watcher::Event::Delete(_) => Some(None),
        _ => None,
    })
}

/// How many objects satisfy `pred` right now.
fn watch_count<K>(api: Api<K>, pred: impl Fn(&K) -> bool + Send + 'static) -> Watched<usize>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watch_fold(
        api,
        watcher::Config::default(),
        HashSet::<String>::new(),
        0,
        move |set, event| {
            match event {
                watcher::Event::Init => set.clear(),
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    if pred(&o) {
                        set.insert(o.name_any());
                    } else {
                        set.remove(&o.name_any());
                    }
                }
                watcher::Event::Delete(o) => {
                    set.remove(&o.name_any());
                }
                watcher::Event::InitDone => {}
            }
            Some(set.len())
        },
    )
}

/// Waits until the watched value satisfies `pred`; returns it with the arrival time of its event.
async fn wait_until<T: Clone + Debug>(
    w: &mut Watched<T>,
    what: &str,
    timeout: Duration,
    mut pred: impl FnMut(&T) -> bool,
) -> anyhow::Result<(Instant, T)> {
    let seen = tokio::time::timeout(timeout, w.rx.wait_for(|(_, v)| pred(v)))
        .await
        .map(|r| r.map(|seen| seen.clone()));
    match seen {
        Ok(Ok(seen)) => Ok(seen),
        Ok(Err(_)) => bail!("the watch for {what} ended"),
        Err(_) => bail!(
            "timed out after {timeout:?} waiting for {what}; last seen: {:?}",
            w.rx.borrow().1
        ),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------------------------------------
// The controller's metrics and memory.

/// Reconciles the controller counted, whatever their result.
async fn reconciles(ctrl: &ControllerProcess) -> anyhow::Result<u64> {
    let (code, body) = http_get(&ctrl.metrics_addr, "/metrics")
        .await
        .context("reading the controller's metrics")?;
    anyhow::ensure!(code == 200, "controller /metrics answered {code}");
    Ok(body
        .lines()
        .filter(|l| l.starts_with(RECONCILE_SERIES))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Waits until the controller has not reconciled for a second.
async fn settle(ctrl: &ControllerProcess) -> anyhow::Result<()> {
    let quiet = Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = reconciles(ctrl).await?;
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        if Instant::now() > deadline {
            bail!("the controller kept reconciling for 30 s after Ready");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reconciles(ctrl).await?;
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(())
}

/// RssAnon, VmRSS and VmHWM of the control-plane process `name`.
fn memory(cp: &ControlPlane, name: &str) -> anyhow::Result<ProcMemory> {
    let pid = cp
        .pid(name)
        .with_context(|| format!("{name} is not running"))?;
    process_memory(pid)
}

// ---------------------------------------------------------------------------------------------
// Figures.

async fn edit_latency(admin: &Client, edits: usize) -> anyhow::Result<EditLatency> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let mut info = watch_one(cms, names::CONFIGMAP_INFO, |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("onpremise_proxy_http_port"))
            .and_then(|p| p.parse::<i64>().ok())
    });
    let stss: Api<StatefulSet> = Api::namespaced(admin.clone(), NS);
    let mut sts = watch_one(stss, names::STATEFULSET, sts_http_port);
    let initial = Duration::from_secs(15);
    wait_until(&mut info, "the info ConfigMap", initial, |v| v.is_some()).await?;
    wait_until(&mut sts, "the StatefulSet", initial, |v| v.is_some()).await?;

    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let (mut cm_ms, mut sts_ms, mut both_ms) = (Vec::new(), Vec::new(), Vec::new());
    let timeout = Duration::from_secs(20);
    for i in 0..edits {
        let port = 20100 + (i % 2) as i64;
        let edit = json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": port}}}}}});
        let t0 = Instant::now();
        crs.patch(CR, &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .with_context(|| format!("edit {i}: setting the HTTP proxy port to {port}"))?;
        let (at_cm, _) = wait_until(
            &mut info,
            &format!(
                "edit {i}: port {port} in ConfigMap {}",
                names::CONFIGMAP_INFO
            ),
            timeout,
            |v| *v == Some(Some(port)),
        )
        .await?;
        let (at_sts, _) = wait_until(
            &mut sts,
            &format!(
                "edit {i}: port {port} in StatefulSet {}",
                names::STATEFULSET
            ),
            timeout,
            |v| *v == Some(Some(port)),
        )
        .await?;
        let cm = at_cm.saturating_duration_since(t0);
        let st = at_sts.saturating_duration_since(t0);
        cm_ms.push(ms(cm));
        sts_ms.push(ms(st));
        both_ms.push(ms(cm.max(st)));
    }
    Ok(EditLatency {
        config_map: Percentiles::of(&cm_ms),
        stateful_set: Percentiles::of(&sts_ms),
        both: Percentiles::of(&both_ms),
    })
}

/// The `http-proxy` container port of the proxy container.
fn sts_http_port(s: &StatefulSet) -> Option<i64> {
    s.spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "connectivity-proxy")?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some("http-proxy"))
        .map(|p| i64::from(p.container_port))
}

fn is_write(r: &AuditWrite) -> bool {
    WRITE_VERBS.contains(&r.verb.as_str())
}

fn is_lease(r: &AuditWrite) -> bool {
    r.resource == "leases"
}

fn is_read(r: &AuditWrite) -> bool {
    r.verb == "get" || r.verb == "list"
}

/// Counts by verb, resource and (if `by_name`) name, most frequent first.
fn count_requests<'a>(
    reqs: impl Iterator<Item = &'a AuditWrite>,
    by_name: bool,
) -> Vec<RequestCount> {
    let mut counts: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in reqs {
        let name = if by_name {
            r.name.clone()
        } else {
            String::new()
        };
        *counts
            .entry((r.verb.clone(), r.resource.clone(), name))
            .or_default() += 1;
    }
    let mut out: Vec<RequestCount> = counts
        .into_iter()
        .map(|((verb, resource, name), count)| RequestCount {
            verb,
            resource,
            name,
            count,
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.count));
    out
}

async fn idle_requests(cp: &ControlPlane, window: Duration) -> anyhow::Result<IdleRequests> {
    let offset = cp.audit_offset();
    let cpu = |name: &str| -> anyhow::Result<u64> {
        let pid = cp
            .pid(name)
            .with_context(|| format!("{name} is not running"))?;
        crate::load::process_cpu_us(pid)
    };
    let (ctrl_cpu, wh_cpu) = (cpu(CONTROLLER_PROCESS)?, cpu(WEBHOOK_PROCESS)?);
    let started = Instant::now();
    // The window itself: nothing happens in it but what the processes do by themselves.
    tokio::time::sleep(window).await;
    let window_secs = started.elapsed().as_secs_f64();
    let controller_cpu_ms = cpu(CONTROLLER_PROCESS)?.saturating_sub(ctrl_cpu) as f64 / 1e3;
    let webhook_cpu_ms = cpu(WEBHOOK_PROCESS)?.saturating_sub(wh_cpu) as f64 / 1e3;
    let reqs = cp.audit_requests_since(offset)?;
    let ctrl: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == CONTROLLER_USER).collect();
    let wh: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == WEBHOOK_USER).collect();
    Ok(IdleRequests {
        window_secs,
        lease_writes: ctrl.iter().filter(|r| is_lease(r) && is_write(r)).count(),
        lease_reads: ctrl.iter().filter(|r| is_lease(r) && is_read(r)).count(),
        other_writes: count_requests(
            ctrl.iter().filter(|r| !is_lease(r) && is_write(r)).copied(),
            true,
        ),
        reads: ctrl.iter().filter(|r| !is_lease(r) && is_read(r)).count(),
        read_counts: count_requests(
            ctrl.iter().filter(|r| !is_lease(r) && is_read(r)).copied(),
            false,
        ),
        watches: ctrl.iter().filter(|r| r.verb == "watch").count(),
        webhook_writes: wh.iter().filter(|r| is_write(r)).count(),
        webhook_reads: wh.iter().filter(|r| is_read(r)).count(),
        webhook_watches: wh.iter().filter(|r| r.verb == "watch").count(),
        mappings: 0,
        controller_cpu_ms,
        webhook_cpu_ms,
    })
}

/// Controller CPU per reconcile in which nothing changed: its idle rate over 5 s, then `touches`
/// annotation changes on the CR 50 ms apart; the CPU from the first touch until the controller
/// counted that many reconciles (or 10 s after the last touch), less the idle rate over that time,
/// divided by the reconciles counted. CPU comes from `/proc/<pid>/stat` (10 ms ticks: a burst of
/// 100 keeps the rounding under a few percent).
async fn reconcile_cpu(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    crs: &Api<ConnectivityProxy>,
    touches: usize,
    mappings: usize,
    goal_ms: f64,
) -> anyhow::Result<ReconcileCpu> {
    let pid = cp
        .pid(&ctrl.name)
        .with_context(|| format!("{} is not running", ctrl.name))?;
    settle(ctrl).await?;
    let idle_from = (Instant::now(), crate::load::process_cpu_us(pid)?);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_to = (Instant::now(), crate::load::process_cpu_us(pid)?);
    let idle_ms_per_s = idle_to.1.saturating_sub(idle_from.1) as f64
        / 1e3
        / idle_to.0.duration_since(idle_from.0).as_secs_f64();
    let before = reconciles(ctrl).await?;
    let (t0, cpu0) = (Instant::now(), crate::load::process_cpu_us(pid)?);
    for i in 0..touches {
        let touch =
            json!({"metadata": {"annotations": {TOUCH_ANNOTATION: format!("cpu-{mappings}-{i}")}}});
        crs.patch(CR, &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .context("annotating the CR")?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while reconciles(ctrl).await? < before + touches as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (t1, cpu1) = (Instant::now(), crate::load::process_cpu_us(pid)?);
    let counted = reconciles(ctrl).await?.saturating_sub(before);
    let raw_ms = cpu1.saturating_sub(cpu0) as f64 / 1e3;
    let cpu_ms = (raw_ms - idle_ms_per_s * t1.duration_since(t0).as_secs_f64()).max(0.0);
    Ok(ReconcileCpu {
        mappings,
        reconciles: counted,
        cpu_ms,
        idle_ms_per_s,
        goal_ms,
    })
}

/// With `present` mappings aggregated: `samples` more created one at a time, each timed from its
/// create call until the bench's watch sees the aggregated ConfigMap list it.
async fn one_mapping_latency(
    admin: &Client,
    present: usize,
    samples: usize,
) -> anyhow::Result<Percentiles> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let mut aggregated = watch_one(cms, names::CONFIGMAP_SERVICE_MAPPINGS, |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get(names::CONFIGMAP_SERVICE_MAPPINGS_KEY))
            .and_then(|v| serde_json::from_str::<Vec<serde::de::IgnoredAny>>(v).ok())
            .map(|v| v.len())
            .unwrap_or(0)
    });
    wait_until(
        &mut aggregated,
        &format!("{present} mappings in the ConfigMap"),
        Duration::from_secs(30),
        |v| *v == Some(present),
    )
    .await?;
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let mut out = Vec::with_capacity(samples);
    for i in 1..=samples {
        let name = format!("one-{i:04}");
        let m = service_mapping(
            &name,
            json!({"type": "TCP", "serviceId": name, "internalAddress": "h:80"}),
        );
        let t0 = Instant::now();
        api.create(&PostParams::default(), &m)
            .await
            .with_context(|| format!("creating ServiceMapping {name}"))?;
        let (at, _) = wait_until(
            &mut aggregated,
            &format!("{name} in ConfigMap {}", names::CONFIGMAP_SERVICE_MAPPINGS),
            Duration::from_secs(60),
            |v| *v == Some(present + i),
        )
        .await?;
        out.push(ms(at.saturating_duration_since(t0)));
    }
    Ok(Percentiles::of(&out))
}

async fn reconcile_requests(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    crs: &Api<ConnectivityProxy>,
    samples: usize,
) -> anyhow::Result<ReconcileRequests> {
    let mut out = ReconcileRequests::default();
    for i in 0..samples {
        settle(ctrl).await?;
        let before = reconciles(ctrl).await?;
        let offset = cp.audit_offset();
        let touch = json!({"metadata": {"annotations": {TOUCH_ANNOTATION: format!("{i}")}}});
        let t0 = Instant::now();
        crs.patch(CR, &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .context("annotating the CR")?;
        let deadline = t0 + Duration::from_secs(10);
        while reconciles(ctrl).await? <= before {
            if Instant::now() > deadline {
                bail!("no reconcile within 10 s of annotating the CR");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = t0.elapsed();
        // Let the audit log catch up with the reconcile's last response, then see whether it caused
        // another one.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let count = reconciles(ctrl).await?.saturating_sub(before);
        let reqs = cp.audit_requests_since(offset)?;
        let mine: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == CONTROLLER_USER).collect();
        let counted: Vec<&AuditWrite> = mine
            .iter()
            .filter(|r| !is_lease(r) && r.verb != "watch")
            .copied()
            .collect();
        out.lease_requests += mine.iter().filter(|r| is_lease(r)).count();
        out.watch_requests += mine.iter().filter(|r| r.verb == "watch").count();
        if i == 0 {
            out.requests = count_requests(counted.iter().copied(), false);
        }
        out.totals.push(counted.len());
        out.writes
            .push(counted.iter().filter(|r| is_write(r)).count());
        out.reconciles.push(count);
        out.durations_ms.push(ms(took));
    }
    Ok(out)
}

/// How fast the controller puts back a managed object someone deleted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DriftRepair {
    /// Kind and name of the deleted object.
    pub object: String,
    /// Delete → the re-created object (a new uid) delivered by the bench's watch, per sample.
    pub ms: Vec<f64>,
}

/// Deletes each object `samples` times and times its return: the managed caches' watches wake the
/// reconcile, so the repair does not wait for the resync.
async fn drift_repair(admin: &Client, samples: usize) -> anyhow::Result<Vec<DriftRepair>> {
    use kube::api::{DeleteParams, GroupVersionKind};
    let tls = names::tls_secret_name(CR, NS);
    let gateway = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.istio.io", "v1", "Gateway"),
        "gateways",
    );
    let secret =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
    let targets = [
        (
            format!("Secret {}/{tls}", names::ISTIO_NAMESPACE),
            Api::<DynamicObject>::namespaced_with(admin.clone(), names::ISTIO_NAMESPACE, &secret),
            tls.clone(),
        ),
        (
            format!("Gateway {NS}/{}", names::GATEWAY),
            Api::<DynamicObject>::namespaced_with(admin.clone(), NS, &gateway),
            names::GATEWAY.to_string(),
        ),
    ];
    let mut out = Vec::new();
    for (what, api, name) in targets {
        let mut w = watch_one(api.clone(), &name, |o: &DynamicObject| {
            o.metadata.uid.clone()
        });
        let mut ms_all = Vec::new();
        for _ in 0..samples {
            let (_, uid) = wait_until(&mut w, &what, Duration::from_secs(30), |v| {
                matches!(v, Some(Some(_)))
            })
            .await?;
            let old = uid.flatten();
            let t0 = Instant::now();
            api.delete(&name, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting {what}"))?;
            let (at, _) = wait_until(
                &mut w,
                &format!("{what} re-created"),
                Duration::from_secs(30),
                |v| matches!(v, Some(Some(u)) if Some(u) != old.as_ref()),
            )
            .await?;
            ms_all.push(ms(at.saturating_duration_since(t0)));
        }
        out.push(DriftRepair {
            object: what,
            ms: ms_all,
        });
    }
    Ok(out)
}

/// ServiceMappings `m-00001` … `m-<n>` of type TCP, each with its name as serviceId: what every
/// section of the bench creates.
pub fn numbered_mappings(n: usize) -> Vec<ServiceMapping> {
    (1..=n)
        .map(|i| {
            let name = format!("m-{i:05}");
            service_mapping(
                &name,
                json!({"type": "TCP", "serviceId": name, "internalAddress": "h:80"}),
            )
        })
        .collect()
}

/// Creates the mappings, `IN_FLIGHT` at a time, retrying transient failures; returns the created
/// objects (uid and spec as stored) and how many retries it took.
pub async fn create_mappings(
    admin: &Client,
    mappings: Vec<ServiceMapping>,
) -> anyhow::Result<(Vec<ServiceMapping>, usize)> {
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let results: Vec<anyhow::Result<(ServiceMapping, usize)>> = futures::stream::iter(mappings)
        .map(|m| {
            let api = api.clone();
            async move {
                let name = m.name_any();
                let mut attempt = 0;
                loop {
                    match api.create(&PostParams::default(), &m).await {
                        Ok(created) => return Ok((created, attempt)),
                        // An earlier attempt went through after all.
                        Err(kube::Error::Api(e)) if e.code == 409 && attempt > 0 => {
                            let got = api.get(&name).await.with_context(|| {
                                format!("reading ServiceMapping {name} after a retry")
                            })?;
                            return Ok((got, attempt));
                        }
                        // Transient (a timeout, a webhook restart): counted, not reported one by one.
                        Err(_) if attempt < 4 => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                        }
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("creating ServiceMapping {name}")));
                        }
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut created = Vec::with_capacity(results.len());
    let mut retries = 0;
    for r in results {
        let (m, attempts) = r?;
        created.push(m);
        retries += attempts;
    }
    Ok((created, retries))
}

async fn aggregate(admin: &Client, n: usize, adopt_wait: Duration) -> anyhow::Result<Aggregation> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let mut aggregated = watch_one(cms, names::CONFIGMAP_SERVICE_MAPPINGS, |cm: &ConfigMap| {
        let value = cm
            .data
            .as_ref()
            .and_then(|d| d.get(names::CONFIGMAP_SERVICE_MAPPINGS_KEY));
        let entries = value
            .and_then(|v| serde_json::from_str::<Vec<serde::de::IgnoredAny>>(v).ok())
            .map(|v| v.len())
            .unwrap_or(0);
        (entries, value.map(String::len).unwrap_or(0))
    });
    let mut adopted = watch_count(Api::<ServiceMapping>::all(admin.clone()), |m| {
        m.labels().get(names::LABEL_MODULE).map(String::as_str) == Some(names::MODULE_VALUE)
            && m.annotations().contains_key(ADOPTED_ANNOTATION)
            && m.status
                .as_ref()
                .and_then(|s| s.endpoint.as_ref())
                .is_some()
    });
    wait_until(
        &mut aggregated,
        "the service-mappings ConfigMap",
        Duration::from_secs(15),
        |v| v.is_some(),
    )
    .await?;

    let mappings = numbered_mappings(n);
    let t0 = Instant::now();
    let (_, retries) = create_mappings(admin, mappings).await?;
    let created_at = Instant::now();
    let create_secs = created_at.duration_since(t0).as_secs_f64();

    let budget = Duration::from_secs(60) + Duration::from_millis(15 * n as u64);
    let (at, (_, bytes)) = match wait_until(
        &mut aggregated,
        &format!(
            "{n} mappings in ConfigMap {}",
            names::CONFIGMAP_SERVICE_MAPPINGS
        ),
        budget,
        |v| v.is_some_and(|(entries, _)| entries == n),
    )
    .await?
    {
        (at, Some(v)) => (at, v),
        (_, None) => bail!("the service-mappings ConfigMap disappeared"),
    };
    let aggregated_ms = ms(at.saturating_duration_since(created_at));
    let adopted_ms = match wait_until(
        &mut adopted,
        &format!("{n} mappings adopted"),
        adopt_wait.saturating_sub(created_at.elapsed()),
        |c| *c == n,
    )
    .await
    {
        Ok((at, _)) => Some(ms(at.saturating_duration_since(created_at))),
        // Reported as a count: the wait is capped to bound the run.
        Err(_) => None,
    };
    let adopted_count = adopted.rx.borrow().1;
    Ok(Aggregation {
        mappings: n,
        create_secs,
        create_per_sec: if create_secs > 0.0 {
            n as f64 / create_secs
        } else {
            0.0
        },
        create_retries: retries,
        aggregated_ms,
        adopted_ms,
        adopt_wait_secs: adopt_wait.as_secs_f64(),
        adopted: adopted_count,
        config_map_bytes: bytes,
    })
}

// ---------------------------------------------------------------------------------------------
// Legacy takeover.

/// A legacy installation with `5 + extra` ServiceMappings; returns uid and spec of each mapping.
async fn legacy_cluster(admin: &Client, extra: usize) -> anyhow::Result<MappingSnapshot> {
    cp_tests::fixtures::apply_our_crds(admin).await?;
    legacy::install(admin).await?;
    let mappings = (0..5 + extra).map(legacy::mapping).collect();
    let (created, _) = create_mappings(admin, mappings).await?;
    legacy::register_webhook(admin).await?;
    Ok(legacy::snapshot(created))
}

async fn takeover_phase(cp: &ControlPlane, sizes: &Sizes) -> anyhow::Result<Takeover> {
    let admin = cp.admin().await?;
    let before = legacy_cluster(&admin, sizes.legacy_mappings).await?;
    // The test webhook serves a certificate of its own here: the controller under test starts last.
    let wh = Webhook::start(cp, WEBHOOK_PROCESS, &["--privileged-groups=system:masters"])
        .await
        .context("starting the webhook")?;
    wh.register(&admin).await?;
    admission_active(&admin).await?;
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    crs.create(&PostParams::default(), &default_connectivity_proxy(CR))
        .await
        .context("creating the default CR")?;

    let mut cr = watch_one(crs.clone(), CR, CrView::of);
    let total = before.len();
    let mut adopted = watch_count(Api::<ServiceMapping>::all(admin.clone()), |m| {
        m.labels().get(names::LABEL_MODULE).map(String::as_str) == Some(names::MODULE_VALUE)
    });
    wait_until(&mut cr, "the default CR", Duration::from_secs(15), |c| {
        c.is_some()
    })
    .await?;
    wait_until(
        &mut adopted,
        "the legacy mappings listed",
        Duration::from_secs(15),
        |_| true,
    )
    .await?;

    let t0 = Instant::now();
    ControllerProcess::start(cp, CONTROLLER_PROCESS, &["--manage-webhook-certs=false"])
        .await
        .context("starting the controller")?;
    let started_ms = ms(t0.elapsed());
    // The SAP BTP service operator and the kubelets do their part as soon as the controller asks.
    let player = {
        let (admin, rx) = (admin.clone(), cr.rx.clone());
        tokio::spawn(async move { play_until_ready(&admin, rx, Duration::from_secs(120)).await })
    };
    let budget = Duration::from_secs(60) + Duration::from_millis(20 * total as u64);
    let result = async {
        let (migrated, _) = wait_until(&mut cr, "the legacy migration to be done", budget, |c| {
            c.as_ref()
                .is_some_and(|c| c.migration.as_deref() == Some("done"))
        })
        .await?;
        let (all_adopted, _) = wait_until(
            &mut adopted,
            &format!("{total} legacy mappings taken over"),
            budget.saturating_sub(t0.elapsed()),
            |c| *c == total,
        )
        .await?;
        let (ready, _) = wait_until(
            &mut cr,
            "the CR to be Ready",
            budget.saturating_sub(t0.elapsed()),
            |c| c.as_ref().is_some_and(|c| c.state == Some(State::Ready)),
        )
        .await?;
        anyhow::Ok((migrated, all_adopted, ready))
    }
    .await;
    let played = if player.is_finished() {
        player.await.ok()
    } else {
        player.abort();
        None
    };
    let (migrated, all_adopted, ready) = match (result, played) {
        (Ok(r), _) => r,
        (Err(e), Some(Err(p))) => return Err(e.context(format!("playing the others: {p:#}"))),
        (Err(e), _) => return Err(e),
    };
    verify_takeover(&admin, &before).await?;
    Ok(Takeover {
        mappings: total,
        started_ms,
        migrated_ms: ms(migrated.saturating_duration_since(t0)),
        adopted_ms: ms(all_adopted.saturating_duration_since(t0)),
        ready_ms: ms(ready.saturating_duration_since(t0)),
    })
}

/// Nothing was lost: every mapping kept its uid, spec and user labels, and the legacy objects are gone.
async fn verify_takeover(admin: &Client, before: &MappingSnapshot) -> anyhow::Result<()> {
    let now: BTreeMap<String, ServiceMapping> = Api::<ServiceMapping>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .context("listing the mappings after the takeover")?
        .items
        .into_iter()
        .map(|m| (m.name_any(), m))
        .collect();
    for (name, (uid, spec)) in before {
        let m = now
            .get(name)
            .with_context(|| format!("ServiceMapping {name} is gone after the takeover"))?;
        anyhow::ensure!(
            m.uid().as_deref() == Some(uid.as_str()),
            "ServiceMapping {name} was recreated"
        );
        anyhow::ensure!(
            &serde_json::to_value(&m.spec)? == spec,
            "ServiceMapping {name} spec changed"
        );
        anyhow::ensure!(
            m.labels().get("owner").map(String::as_str) == Some("team-erp"),
            "ServiceMapping {name} lost its user label"
        );
    }
    for (group, kind, plural, name) in [
        (
            "networking.istio.io",
            "Gateway",
            "gateways",
            "kyma-gateway-cc",
        ),
        (
            "networking.istio.io",
            "VirtualService",
            "virtualservices",
            "cc-proxy",
        ),
        (
            "apps",
            "Deployment",
            "deployments",
            "connectivity-proxy-sm-operator",
        ),
    ] {
        let ar = ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: format!("{group}/v1"),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &ar);
        anyhow::ensure!(
            api.get_opt(name).await?.is_none(),
            "legacy {kind} {name} is still there"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Rendering.

fn yes_no(met: bool) -> &'static str {
    if met { "yes" } else { "**no**" }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn list(v: &[impl std::fmt::Display]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Markdown section(s) for BENCHMARKS.md: a table per figure with the raw numbers, the goal and
/// whether it is met.
pub fn render(f: &ControllerFigures) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Controller\n");
    let _ = writeln!(
        s,
        "A local control plane (etcd, kube-apiserver, kube-controller-manager) auditing every request; the release \
         binaries of the webhook and the controller run as their own ServiceAccounts with the manifests' RBAC, \
         the controller with its defaults (resync 600 s, leader election with a 15 s Lease) issuing the webhook's \
         certificate. The bench plays the SAP BTP service operator and the StatefulSet controller with its kubelets. \
         Moments are taken when the bench's own watch delivers the change.{} Whole run: {:.0} s.\n",
        if f.quick {
            " **Quick run**: fewer edits, mappings and a shorter idle window than the issue asks for."
        } else {
            ""
        },
        f.elapsed_secs
    );

    // 1. Edit latency.
    let e = &f.edit;
    let _ = writeln!(
        s,
        "### CR edit → ConfigMap and StatefulSet updated\n\n\
         {} edits of `spec.config.servers.proxy.http.port` (alternating values), one at a time; each waits until \
         ConfigMap `{}` has the new `onpremise_proxy_http_port` and the StatefulSet's `http-proxy` container \
         port is the new port.\n",
        e.both.samples,
        names::CONFIGMAP_INFO
    );
    let _ = writeln!(s, "| Until | p50 ms | p99 ms | max ms | Goal | Met |");
    let _ = writeln!(s, "|---|---:|---:|---:|---|---|");
    for (what, p) in [
        ("ConfigMap updated", &e.config_map),
        ("StatefulSet updated", &e.stateful_set),
    ] {
        let _ = writeln!(
            s,
            "| {what} | {:.1} | {:.1} | {:.1} | — | — |",
            p.p50_ms, p.p99_ms, p.max_ms
        );
    }
    let _ = writeln!(
        s,
        "| **both updated** | {:.1} | {:.1} | {:.1} | p99 ≤ {EDIT_P99_GOAL_MS:.0} ms | {} |",
        e.both.p50_ms,
        e.both.p99_ms,
        e.both.max_ms,
        yes_no(e.both.samples > 0 && e.both.p99_ms <= EDIT_P99_GOAL_MS)
    );
    s.push('\n');

    // 2. Idle requests.
    let i = &f.idle;
    let others = i.other_write_count();
    let _ = writeln!(
        s,
        "### API requests per idle minute, with {} ServiceMappings\n\n\
         After Ready, with the mappings aggregated and adopted, {:.0} s without any change{}, scaled to one minute and one hour. Requests by the controller's \
         ServiceAccount (and, for comparison, the webhook's); the leader-election Lease is counted on its own rows.\n",
        i.mappings,
        i.window_secs,
        if i.window_secs > 600.0 {
            " (longer than the controller's 600 s resync, so the resync's reconcile is in the window)"
        } else {
            " (**shorter than the 600 s resync**: a quick run)"
        }
    );
    let _ = writeln!(
        s,
        "| Requests | in window | per minute | per hour | Goal | Met |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---|---|");
    let _ = writeln!(
        s,
        "| controller writes besides Lease renewals | {others} | {:.1} | {:.0} | 0 per hour | {} |",
        i.per_minute(others),
        i.per_minute(others) * 60.0,
        yes_no(others == 0)
    );
    let _ = writeln!(
        s,
        "| controller Lease renewals (writes) | {} | {:.1} | {:.0} | leader election only | — |",
        i.lease_writes,
        i.per_minute(i.lease_writes),
        i.per_minute(i.lease_writes) * 60.0
    );
    let _ = writeln!(
        s,
        "| controller Lease reads | {} | {:.1} | {:.0} | — | — |",
        i.lease_reads,
        i.per_minute(i.lease_reads),
        i.per_minute(i.lease_reads) * 60.0
    );
    let _ = writeln!(
        s,
        "| controller other reads (get/list) | {} | {:.1} | {:.0} | — | — |",
        i.reads,
        i.per_minute(i.reads),
        i.per_minute(i.reads) * 60.0
    );
    for c in &i.read_counts {
        let _ = writeln!(
            s,
            "| &nbsp;&nbsp;{} {} | {} | {:.1} | {:.0} | — | — |",
            c.verb,
            c.resource,
            c.count,
            i.per_minute(c.count),
            i.per_minute(c.count) * 60.0
        );
    }
    let _ = writeln!(
        s,
        "| controller watches re-established | {} | {:.1} | {:.0} | — | — |",
        i.watches,
        i.per_minute(i.watches),
        i.per_minute(i.watches) * 60.0
    );
    let _ = writeln!(
        s,
        "| webhook writes / reads / watches | {} / {} / {} | {:.1} / {:.1} / {:.1} | {:.0} / {:.0} / {:.0} | 0 writes | {} |",
        i.webhook_writes,
        i.webhook_reads,
        i.webhook_watches,
        i.per_minute(i.webhook_writes),
        i.per_minute(i.webhook_reads),
        i.per_minute(i.webhook_watches),
        i.per_minute(i.webhook_writes) * 60.0,
        i.per_minute(i.webhook_reads) * 60.0,
        i.per_minute(i.webhook_watches) * 60.0,
        yes_no(i.webhook_writes == 0)
    );
    let hour = |ms: f64| {
        if i.window_secs > 0.0 {
            ms / 1e3 * 3600.0 / i.window_secs
        } else {
            0.0
        }
    };
    let _ = writeln!(
        s,
        "| controller CPU (user + system), s | {:.2} | {:.3} | {:.1} | ≤ {IDLE_CPU_GOAL_S_PER_HOUR:.0} s per hour | {} |",
        i.controller_cpu_ms / 1e3,
        hour(i.controller_cpu_ms) / 60.0,
        hour(i.controller_cpu_ms),
        yes_no(i.window_secs > 0.0 && hour(i.controller_cpu_ms) <= IDLE_CPU_GOAL_S_PER_HOUR)
    );
    let _ = writeln!(
        s,
        "| webhook CPU (user + system), s | {:.2} | {:.3} | {:.1} | — | — |",
        i.webhook_cpu_ms / 1e3,
        hour(i.webhook_cpu_ms) / 60.0,
        hour(i.webhook_cpu_ms),
    );
    if !i.other_writes.is_empty() {
        let _ = writeln!(s, "\nThe controller's other writes in the window:\n");
        for r in &i.other_writes {
            let _ = writeln!(s, "- {} × {} {} {}", r.count, r.verb, r.resource, r.name);
        }
    }
    s.push('\n');

    // 3. Requests per reconcile.
    let r = &f.reconcile;
    let _ = writeln!(
        s,
        "### API requests per full reconcile\n\n\
         {} reconciles, each triggered by an annotation change on the Ready CR (no new generation, every step \
         runs), counted from the trigger until the controller's reconcile counter increased (plus 300 ms for the \
         audit log). Leases and watches are not part of a reconcile and are listed separately.\n",
        r.totals.len()
    );
    let _ = writeln!(s, "| Requests of the first reconcile | count |");
    let _ = writeln!(s, "|---|---:|");
    for c in &r.requests {
        let _ = writeln!(s, "| {} {} | {} |", c.verb, c.resource, c.count);
    }
    let _ = writeln!(s, "\n| Measure | value | Goal | Met |");
    let _ = writeln!(s, "|---|---|---|---|");
    let _ = writeln!(
        s,
        "| requests per reconcile | {} | 1 (the quorum GET of the CR) | {} |",
        list(&r.totals),
        yes_no(r.totals.iter().all(|t| *t == 1))
    );
    let _ = writeln!(
        s,
        "| writes per reconcile (nothing changed) | {} | 0 | {} |",
        list(&r.writes),
        yes_no(r.writes.iter().all(|w| *w == 0))
    );
    let _ = writeln!(
        s,
        "| reconciles per trigger | {} | 1 | {} |",
        list(&r.reconciles),
        yes_no(r.reconciles.iter().all(|c| *c == 1))
    );
    let _ = writeln!(
        s,
        "| trigger → reconcile done, ms | {} | — | — |",
        list(
            &r.durations_ms
                .iter()
                .map(|d| format!("{d:.1}"))
                .collect::<Vec<_>>()
        )
    );
    let _ = writeln!(
        s,
        "| Lease / watch requests in the windows (excluded) | {} / {} | — | — |",
        r.lease_requests, r.watch_requests
    );
    s.push('\n');

    // 3a. CPU per reconcile.
    let _ = writeln!(
        s,
        "### Controller CPU per reconcile\n\n\
         Reconciles in which nothing changed, each triggered by an annotation change on the Ready CR, 50 ms apart; \
         the controller's CPU (user + system, `/proc/<pid>/stat`) from the first change until it counted as many \
         reconciles, less its idle rate measured over the 5 s before, divided by the reconciles counted. Goals \
         chosen before the first measurement.\n"
    );
    let _ = writeln!(
        s,
        "| ServiceMappings present | reconciles | CPU ms | idle rate ms/s | CPU per reconcile ms | Goal | Met |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---|---|");
    for c in &f.reconcile_cpu {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {:.2} | ≤ {:.0} ms | {} |",
            c.mappings,
            c.reconciles,
            c.cpu_ms,
            c.idle_ms_per_s,
            c.per_reconcile(),
            c.goal_ms,
            yes_no(c.reconciles > 0 && c.per_reconcile() <= c.goal_ms)
        );
    }
    s.push('\n');

    // 3b. Drift repair.
    let _ = writeln!(
        s,
        "### Drift repair\n\n\
         A managed object deleted by an admin, {} times each; from the delete until the bench's own watch \
         delivers the re-created object (a new uid). The controller's caches watch every managed kind, so the \
         repair does not wait for the resync (600 s).\n",
        f.drift.first().map(|d| d.ms.len()).unwrap_or(0)
    );
    let _ = writeln!(s, "| Deleted | ms each | max ms | Goal | Met |");
    let _ = writeln!(s, "|---|---|---:|---|---|");
    for d in &f.drift {
        let max = d.ms.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | ≤ {DRIFT_GOAL_MS:.0} ms each | {} |",
            d.object,
            list(&d.ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>()),
            max,
            yes_no(!d.ms.is_empty() && max <= DRIFT_GOAL_MS)
        );
    }
    s.push('\n');

    // 4. Memory.
    let a = &f.aggregation;
    let _ = writeln!(
        s,
        "### Memory\n\n\
         Anonymous resident memory (`RssAnon` in `/proc/<pid>/status`: what the process allocated, the binary's file \
         pages excluded): idle after Ready; after {} ServiceMappings were created through the API server and the \
         webhook and aggregated and adopted by the controller; and after each process was restarted (SIGTERM, \
         started again, settled) with the mappings still in the cluster. VmRSS with the mappings and the peak \
         (VmHWM) before the restart for comparison.\n",
        a.mappings
    );
    let _ = writeln!(
        s,
        "| Process | idle MiB | with {n} mappings MiB | restarted with {n} MiB | VmRSS with them MiB | peak MiB | Goal (idle / with mappings) | Met |",
        n = a.mappings
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---|");
    for m in &f.memory {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | < {:.0} / < {:.0} MiB | {} |",
            m.process,
            mib(m.idle_kib),
            mib(m.loaded_kib),
            mib(m.restarted_kib),
            mib(m.loaded_rss_kib),
            mib(m.peak_kib),
            m.idle_goal_mib,
            m.loaded_goal_mib,
            yes_no(m.met())
        );
    }
    s.push('\n');

    // 5. Aggregation.
    let _ = writeln!(
        s,
        "### Aggregating {} ServiceMappings\n\n\
         Mappings `m-00001`… of type TCP created by an admin client, {IN_FLIGHT} in flight, each admitted by the \
         webhook; times from the last creation.\n",
        a.mappings
    );
    let _ = writeln!(s, "| Measure | value | Goal | Met |");
    let _ = writeln!(s, "|---|---:|---|---|");
    let _ = writeln!(
        s,
        "| creating them, s | {:.1} ({:.0}/s, {} retries) | — | — |",
        a.create_secs, a.create_per_sec, a.create_retries
    );
    let _ = writeln!(
        s,
        "| last creation → all in ConfigMap `{}`, ms | {:.0} | none set (reported) | — |",
        names::CONFIGMAP_SERVICE_MAPPINGS,
        a.aggregated_ms
    );
    let adopted = match a.adopted_ms {
        Some(v) => format!("{v:.0}"),
        None => format!(
            "not within {:.0} s: {} of {} by then",
            a.adopt_wait_secs, a.adopted, a.mappings
        ),
    };
    let _ = writeln!(
        s,
        "| last creation → all labelled and with `status.endpoint`, ms | {adopted} | none set (reported) | — |"
    );
    let o = &f.one_mapping;
    let _ = writeln!(
        s,
        "| then one more at a time ({} samples): create → in the ConfigMap, p50 / p99 / max ms | {:.0} / {:.0} / {:.0} | p99 ≤ {ONE_MAPPING_P99_GOAL_MS:.0} ms | {} |",
        o.samples,
        o.p50_ms,
        o.p99_ms,
        o.max_ms,
        yes_no(o.samples > 0 && o.p99_ms <= ONE_MAPPING_P99_GOAL_MS)
    );
    let _ = writeln!(
        s,
        "| aggregated ConfigMap value, KiB | {:.0} | < 960 (fits the object limit) | {} |",
        a.config_map_bytes as f64 / 1024.0,
        yes_no(a.config_map_bytes < 960 * 1024)
    );
    s.push('\n');

    // 6. Takeover.
    let t = &f.takeover;
    let _ = writeln!(
        s,
        "### Taking over a legacy installation with {} ServiceMappings\n\n\
         A fresh control plane with the legacy reconciler's objects (reference fixtures plus Gateway, \
         VirtualService, sm-operator Deployment) and {} legacy ServiceMappings; the default CR exists and the \
         webhook runs (with a certificate of its own, so the controller runs with `--manage-webhook-certs=false`) \
         before the controller starts. Times from the controller's start. Afterwards every mapping still has its \
         uid, spec and user labels, and the legacy objects are gone (checked).\n",
        t.mappings, t.mappings
    );
    let _ = writeln!(s, "| Until | ms | Goal | Met |");
    let _ = writeln!(s, "|---|---:|---|---|");
    let _ = writeln!(
        s,
        "| controller ready (caches synced) | {:.0} | — | — |",
        t.started_ms
    );
    let _ = writeln!(
        s,
        "| `legacy-migration: done` | {:.0} | none set (reported) | — |",
        t.migrated_ms
    );
    let _ = writeln!(
        s,
        "| all {} mappings taken over | {:.0} | none set (reported) | — |",
        t.mappings, t.adopted_ms
    );
    let _ = writeln!(
        s,
        "| CR Ready (includes the played BTP operator and kubelets) | {:.0} | none set (reported) | — |",
        t.ready_ms
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!(
            (p.samples, p.p50_ms, p.p99_ms, p.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        let p = Percentiles::of(&[3.0, 1.0, 2.0]);
        assert_eq!((p.p50_ms, p.p99_ms, p.max_ms), (2.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[]).max_ms, 0.0);
    }

    #[test]
    fn renders_every_figure() {
        let text = render(&ControllerFigures::default());
        for heading in [
            "CR edit",
            "idle minute",
            "full reconcile",
            "Memory",
            "Aggregating",
            "legacy installation",
        ] {
            assert!(text.contains(heading), "{heading} missing");
        }
    }
}
