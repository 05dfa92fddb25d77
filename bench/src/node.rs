//! Memory and start-up of the operator's two pods as the kubelet sees them, on the project's real node
//! ([`cp_tests::node::Cluster`]: control plane, containerd, kubelet, kube-proxy in a network namespace,
//! the images of `make images`).
//!
//! Start-up counts from `kubectl apply --server-side` of the bundle (images already on the node) until
//! each Deployment's first pod is Ready and the Deployment is Available. Memory is read at the
//! container level two ways: from the container's cgroup (v1 memory controller under the kubelet's
//! cgroup root `/<run id>`), working set = `memory.usage_in_bytes` − `total_inactive_file` exactly as
//! cAdvisor computes it, peak = `memory.max_usage_in_bytes`; and from the kubelet's summary API
//! (`/api/v1/nodes/<node>/proxy/stats/summary`, `workingSetBytes`), which is a cached cAdvisor
//! sample (its age is reported). Phases: idle after the default CR is Ready; during and after an
//! open-loop 2,000 admissions/s against one webhook pod; with 10,000 ServiceMappings aggregated; after
//! the pods were deleted and their replacements are Ready with the mappings still present.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::node::{Cluster, NODE_NAME, ready_pods};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use time::OffsetDateTime;

use crate::load::{Mode, Target};

const WEBHOOK_DEPLOYMENT: &str = "connectivity-proxy-operator-webhook";
const CONTROLLER_DEPLOYMENT: &str = "connectivity-proxy-operator-controller";
const WEBHOOK_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-webhook";
const CONTROLLER_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-controller";
const WEBHOOK_CONTAINER: &str = "webhook";
const CONTROLLER_CONTAINER: &str = "controller";
/// The webhook container's HTTPS port (`https-webhook` in the bundle).
const WEBHOOK_PORT: u16 = 9443;
/// The name the API server verifies the webhook's serving certificate against (its Service's DNS name).
const WEBHOOK_SERVER_NAME: &str = "connectivity-proxy-operator-webhook.kyma-system.svc";
/// The podman image label saying which build profile an image was built with.
const BUILD_PROFILE_LABEL: &str = "io.kyma-project.cp-operator.build-profile";

/// Goals, stated before measuring.
const GOAL_WEBHOOK_READY_MS: u64 = 5_000;
const GOAL_CONTROLLER_READY_MS: u64 = 5_000;
const GOAL_CR_READY_MS: u64 = 30_000;
const MIB: u64 = 1024 * 1024;
const GOAL_WEBHOOK_BYTES: u64 = 12 * MIB;
const GOAL_CONTROLLER_BYTES: u64 = 32 * MIB;

/// The admission rate of the load phase.
const LOAD_RATE: u32 = 2_000;

/// Times from the bundle's apply, ms.
#[derive(Clone, Debug, Default)]
pub struct StartUp {
    /// The first webhook pod Ready.
    pub webhook_pod_ready_ms: u64,
    /// The webhook Deployment Available with all its replicas.
    pub webhook_available_ms: u64,
    /// The controller pod Ready.
    pub controller_pod_ready_ms: u64,
    /// The controller Deployment Available.
    pub controller_available_ms: u64,
    /// Webhook replicas.
    pub webhook_replicas: i32,
    /// From the default CR's apply until it is Ready (includes the node's fd-limit fix, see render).
    pub cr_ready_ms: Option<u64>,
}

/// One container's memory at one moment.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Pod name.
    pub pod: String,
    /// Working set from the cgroup (usage − total_inactive_file), bytes.
    pub cgroup_ws: u64,
    /// `memory.usage_in_bytes`.
    pub usage: u64,
    /// `memory.max_usage_in_bytes` of the container's cgroup (since the container started).
    pub peak: u64,
    /// The kubelet's `workingSetBytes` for the container, when it had a sample for the phase.
    pub kubelet_ws: Option<u64>,
    /// How old the kubelet's sample was when the cgroup was read, s (negative: taken after it).
    pub kubelet_age_s: Option<f64>,
}

/// One phase's row for both containers.
#[derive(Clone, Debug)]
pub struct Phase {
    /// What the phase is.
    pub name: String,
    /// ServiceMappings present.
    pub mappings: usize,
    /// The measured webhook container.
    pub webhook: Sample,
    /// The controller container.
    pub controller: Sample,
}

/// The admission load's outcome (context, not a goal).
#[derive(Clone, Debug)]
pub struct LoadFigures {
    /// Requested rate, /s.
    pub rate: u32,
    /// Measured window, s.
    pub measure_s: f64,
    /// Achieved rate, /s.
    pub rps: f64,
    /// Requests in the window.
    pub requests: usize,
    /// Failed requests in the window.
    pub errors: usize,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// Webhook CPU per completed request, µs.
    pub cpu_us: f64,
    /// Connections the load generator added because all open ones were busy.
    pub extra_connections: usize,
    /// CFS periods of the measured window in which the webhook container hit its CPU limit, of all.
    pub throttled: Option<crate::load::Throttling>,
    /// Whether the load generator (this process) was a debug build.
    pub debug_client: bool,
}

/// Everything the section shows.
#[derive(Clone, Debug)]
pub struct NodeFigures {
    /// Quick mode (fewer mappings, a shorter load).
    pub quick: bool,
    /// Build profile label and image id of the webhook and controller images measured.
    pub images: Vec<(String, String, String)>,
    /// Start-up from the bundle's apply.
    pub start: StartUp,
    /// Memory per phase.
    pub phases: Vec<Phase>,
    /// The load, or why it could not run.
    pub load: Result<LoadFigures, String>,
    /// ServiceMappings created.
    pub mappings: usize,
    /// Creating them took, ms.
    pub mappings_create_ms: u64,
    /// From the last create until the controller's ConfigMap held them all, ms.
    pub mappings_aggregated_ms: u64,
    /// After deleting the pods (with the mappings present): the first new webhook pod Ready, ms.
    pub restart_webhook_ready_ms: u64,
    /// The new controller pod Ready, ms.
    pub restart_controller_ready_ms: u64,
    /// Seconds waited for things to settle before each idle reading.
    pub settle_s: u64,
}

/// A container being measured: its pod and cgroup.
#[derive(Clone, Debug)]
struct Measured {
    pod: String,
    container: &'static str,
    cgroup: PathBuf,
}

/// The cgroup (v1 memory controller) figures of one directory.
#[derive(Clone, Copy, Debug, Default)]
struct CgroupMemory {
    usage: u64,
    inactive_file: u64,
    max_usage: u64,
}

impl CgroupMemory {
    fn read(dir: &Path) -> anyhow::Result<Self> {
        let num = |f: &str| -> anyhow::Result<u64> {
            let p = dir.join(f);
            std::fs::read_to_string(&p)
                .with_context(|| format!("reading {}", p.display()))?
                .trim()
                .parse::<u64>()
                .with_context(|| format!("{}: not a number", p.display()))
        };
        let stat_path = dir.join("memory.stat");
        let stat = std::fs::read_to_string(&stat_path)
            .with_context(|| format!("reading {}", stat_path.display()))?;
        let inactive_file = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file ")?.trim().parse().ok())
            .with_context(|| format!("{}: no total_inactive_file", stat_path.display()))?;
        Ok(Self {
            usage: num("memory.usage_in_bytes")?,
            inactive_file,
            max_usage: num("memory.max_usage_in_bytes")?,
        })
    }

    /// cAdvisor's working set: usage minus inactive file pages, never below zero.
    fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }
}

/// Measures the section on a node of its own (started and stopped here).
pub async fn run(quick: bool) -> anyhow::Result<NodeFigures> {
    let images = image_builds()?;
    let cluster = tokio::task::spawn_blocking(|| {
        std::thread::spawn(|| Cluster::start_in(None, false))
            .join()
            .map_err(|_| anyhow::anyhow!("the node's start panicked"))
    })
    .await
    .context("starting the node")???;
    let result = measure(&cluster, quick, images).await;
    // The node's processes end with the cluster (also on failure); its drop blocks, so not on a worker.
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .context("stopping the node")?;
    result
}

async fn measure(
    cluster: &Cluster,
    quick: bool,
    images: Vec<(String, String, String)>,
) -> anyhow::Result<NodeFigures> {
    let settle = Duration::from_secs(if quick { 10 } else { 20 });
    let n_mappings = if quick { 1_000 } else { 10_000 };
    let (load_warmup, load_measure) = if quick {
        (Duration::from_secs(1), Duration::from_secs(3))
    } else {
        (Duration::from_secs(2), Duration::from_secs(10))
    };
    let admin = cluster.cp.admin().await?;
    cluster
        .prepare_kyma()
        .await
        .context("preparing the cluster")?;

    // 1. Start-up.
    let mut start = install_timed(cluster, &admin).await?;
    let cr_applied = Instant::now();
    cluster
        .apply_default_cr()
        .await
        .context("applying the default CR")?;
    cluster
        .fit_fd_limit_to_node(names::DEFAULT_CR_NAME)
        .await
        .context("fitting the proxy's fd limit to the node")?;
    wait_cr_ready(&admin, Duration::from_secs(180)).await?;
    start.cr_ready_ms = Some(ms(cr_applied.elapsed()));

    let run_id = cluster.netns.name.clone();
    let mut webhook = measured(&admin, &run_id, WEBHOOK_PODS, WEBHOOK_CONTAINER, None).await?;
    let mut controller =
        measured(&admin, &run_id, CONTROLLER_PODS, CONTROLLER_CONTAINER, None).await?;
    let mut phases = Vec::new();

    // (a) Idle.
    tokio::time::sleep(settle).await;
    phases.push(
        sample_phase(
            &admin,
            "(a) idle, default CR Ready",
            0,
            &webhook,
            &controller,
        )
        .await?,
    );

    // (b) The admission load against one webhook pod.
    let load = load_phase(
        cluster,
        &admin,
        &webhook,
        &controller,
        load_warmup,
        load_measure,
        &mut phases,
    )
    .await?;

    // (c) ServiceMappings.
    let list = crate::controller::numbered_mappings(n_mappings);
    let t0 = Instant::now();
    crate::controller::create_mappings(&admin, list)
        .await
        .context("creating the ServiceMappings")?;
    let mappings_create_ms = ms(t0.elapsed());
    let t1 = Instant::now();
    wait_aggregated(&admin, n_mappings).await?;
    let mappings_aggregated_ms = ms(t1.elapsed());
    tokio::time::sleep(settle).await;
    phases.push(
        sample_phase(
            &admin,
            &format!("(c) {n_mappings} ServiceMappings aggregated, settled"),
            n_mappings,
            &webhook,
            &controller,
        )
        .await?,
    );

    // (d) Both operator pods replaced, the mappings still present.
    let old: BTreeSet<String> = pod_names(&admin, WEBHOOK_PODS)
        .await?
        .into_iter()
        .chain(pod_names(&admin, CONTROLLER_PODS).await?)
        .collect();
    let t0 = Instant::now();
    for selector in [WEBHOOK_PODS, CONTROLLER_PODS] {
        cluster
            .kubectl_run(&[
                "delete",
                "pod",
                "-n",
                names::KYMA_SYSTEM,
                "-l",
                selector,
                "--wait=false",
            ])
            .with_context(|| format!("deleting the pods {selector}"))?;
    }
    let (restart_webhook_ready_ms, restart_controller_ready_ms) =
        wait_replacements(&admin, &old, t0, start.webhook_replicas).await?;
    webhook = measured(&admin, &run_id, WEBHOOK_PODS, WEBHOOK_CONTAINER, Some(&old)).await?;
    controller = measured(
        &admin,
        &run_id,
        CONTROLLER_PODS,
        CONTROLLER_CONTAINER,
        Some(&old),
    )
    .await?;
    tokio::time::sleep(settle).await;
    phases.push(
        sample_phase(
            &admin,
            &format!("(d) pods replaced, {n_mappings} mappings, settled"),
            n_mappings,
            &webhook,
            &controller,
        )
        .await?,
    );

    Ok(NodeFigures {
        quick,
        images,
        start,
        phases,
        load,
        mappings: n_mappings,
        mappings_create_ms,
        mappings_aggregated_ms,
        restart_webhook_ready_ms,
        restart_controller_ready_ms,
        settle_s: settle.as_secs(),
    })
}

/// The build profile label and image id of the webhook's and the controller's podman images (the ones
/// the node loads).
fn image_builds() -> anyhow::Result<Vec<(String, String, String)>> {
    let version = env!("CARGO_PKG_VERSION");
    let mut out = Vec::new();
    for image in ["cp-webhook", "cp-controller"] {
        let name = format!("localhost/{image}:{version}");
        let o = Command::new("podman")
            .args(["--runtime=runc", "image", "inspect", &name])
            .output()
            .context("running podman image inspect")?;
        if !o.status.success() {
            bail!(
                "podman has no image {name} (`make images` builds it): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        let v: Value = serde_json::from_slice(&o.stdout)
            .with_context(|| format!("podman image inspect {name}: not JSON"))?;
        let profile = v[0]["Labels"][BUILD_PROFILE_LABEL]
            .as_str()
            .unwrap_or("(no build-profile label)")
            .to_string();
        let id: String = v[0]["Id"]
            .as_str()
            .unwrap_or("?")
            .chars()
            .take(12)
            .collect();
        out.push((name, profile, id));
    }
    Ok(out)
}

/// Applies the bundle as the module manager does and times each Deployment's first Ready pod and its
/// availability (polled every 100 ms).
async fn install_timed(cluster: &Cluster, admin: &Client) -> anyhow::Result<StartUp> {
    let bundle = cp_tests::workspace_root().join("manifests/connectivity-proxy-operator.yaml");
    let t0 = Instant::now();
    cluster
        .kubectl_run(&[
            "apply",
            "--server-side",
            "--field-manager=module-manager",
            "-f",
            &bundle.display().to_string(),
        ])
        .context("applying the bundle")?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let mut times: [[Option<u64>; 2]; 2] = [[None; 2]; 2];
    let mut webhook_replicas = 0;
    let deadline = t0 + Duration::from_secs(180);
    loop {
        for (i, (deployment, selector)) in [
            (WEBHOOK_DEPLOYMENT, WEBHOOK_PODS),
            (CONTROLLER_DEPLOYMENT, CONTROLLER_PODS),
        ]
        .into_iter()
        .enumerate()
        {
            if times[i][0].is_none() && !ready_pods(admin, selector).await?.is_empty() {
                times[i][0] = Some(ms(t0.elapsed()));
            }
            if times[i][1].is_none()
                && let Some(d) = deployments.get_opt(deployment).await?
            {
                let want = d.spec.replicas.unwrap_or(1);
                if i == 0 {
                    webhook_replicas = want;
                }
                let generation = d.metadata.generation.unwrap_or(0);
                let st = d.status.unwrap_or_default();
                if st.observed_generation.unwrap_or(0) >= generation
                    && st.available_replicas.unwrap_or(0) >= want
                    && st.updated_replicas.unwrap_or(0) >= want
                {
                    times[i][1] = Some(ms(t0.elapsed()));
                }
            }
        }
        if let [[Some(a), Some(b)], [Some(c), Some(d)]] = times {
            return Ok(StartUp {
                webhook_pod_ready_ms: a,
                webhook_available_ms: b,
                controller_pod_ready_ms: c,
                controller_available_ms: d,
                webhook_replicas,
                cr_ready_ms: None,
            });
        }
        if Instant::now() > deadline {
            bail!(
                "the operator's Deployments not available within 180 s ({times:?}):\n{}",
                cluster.pods_summary(names::KYMA_SYSTEM)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the default CR is Ready at its current generation.
async fn wait_cr_ready(admin: &Client, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until("the default CR Ready", timeout, || {
        let api = api.clone();
        async move {
            let c = api
                .get(names::DEFAULT_CR_NAME)
                .await
                .map_err(|e| e.to_string())?;
            let st = c.status.clone().unwrap_or_default();
            let current = st.observed_generation == c.metadata.generation;
            if st.state == Some(State::Ready) && current {
                Ok(Some(()))
            } else {
                Err(format!(
                    "{:?} (generation current: {current}) {:?}",
                    st.state, st.description
                ))
            }
        }
    })
    .await
}

async fn pod_names(admin: &Client, selector: &str) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing pods {selector}"))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// The first Ready pod of `selector` (not in `exclude`), its container `container` and that
/// container's memory cgroup under the kubelet's root `/<run_id>`.
async fn measured(
    admin: &Client,
    run_id: &str,
    selector: &str,
    container: &'static str,
    exclude: Option<&BTreeSet<String>>,
) -> anyhow::Result<Measured> {
    let pod = ready_pods(admin, selector)
        .await?
        .into_iter()
        .find(|p| exclude.is_none_or(|old| !old.contains(&p.name_any())))
        .with_context(|| format!("no Ready pod {selector}"))?;
    let name = pod.name_any();
    let uid = pod
        .metadata
        .uid
        .clone()
        .with_context(|| format!("pod {name} without a uid"))?;
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .with_context(|| format!("pod {name}: no containerd id for container {container}"))?
        .to_string();
    let kubepods = Path::new("/sys/fs/cgroup/memory")
        .join(run_id)
        .join("kubepods");
    let pod_dir = find_dir(&kubepods, &format!("pod{uid}"), 3)
        .or_else(|| find_dir(&kubepods, &format!("pod{}", uid.replace('-', "_")), 3))
        .with_context(|| {
            format!(
                "no cgroup of pod {name} (uid {uid}) under {}",
                kubepods.display()
            )
        })?;
    let cgroup = pod_dir.join(&id);
    anyhow::ensure!(
        cgroup.is_dir(),
        "no cgroup {} of container {name}/{container}",
        cgroup.display()
    );
    Ok(Measured {
        pod: name,
        container,
        cgroup,
    })
}

/// The directory named `name` under `root`, at most `depth` levels down.
fn find_dir(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    let dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    if let Some(hit) = dirs
        .iter()
        .find(|p| p.file_name().is_some_and(|f| f == name))
    {
        return Some(hit.clone());
    }
    if depth == 0 {
        return None;
    }
    dirs.iter().find_map(|d| find_dir(d, name, depth - 1))
}

/// The host pid of the container's (first) process, from its cgroup.
fn container_pid(m: &Measured) -> anyhow::Result<u32> {
    let procs = m.cgroup.join("cgroup.procs");
    std::fs::read_to_string(&procs)
        .with_context(|| format!("reading {}", procs.display()))?
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("{}: no process", procs.display()))
}

/// The kubelet's summary of this node, through the API server.
async fn kubelet_summary(admin: &Client) -> anyhow::Result<Value> {
    let req = http::Request::get(format!("/api/v1/nodes/{NODE_NAME}/proxy/stats/summary"))
        .body(Vec::new())
        .context("building the summary request")?;
    let text = admin
        .request_text(req)
        .await
        .context("reading the kubelet's stats/summary")?;
    serde_json::from_str(&text).context("the kubelet's stats/summary: not JSON")
}

/// The kubelet's working set of container `m` and the time of its sample.
fn kubelet_ws(summary: &Value, m: &Measured) -> Option<(u64, OffsetDateTime)> {
    let pod = summary["pods"].as_array()?.iter().find(|p| {
        p["podRef"]["name"] == m.pod.as_str() && p["podRef"]["namespace"] == names::KYMA_SYSTEM
    })?;
    let c = pod["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == m.container)?;
    let ws = c["memory"]["workingSetBytes"].as_u64()?;
    let at = OffsetDateTime::parse(
        c["memory"]["time"].as_str()?,
        &time::format_description::well_known::Rfc3339,
    )
    .ok()?;
    Some((ws, at))
}

fn sample(m: &Measured, summary: Option<&Value>) -> anyhow::Result<Sample> {
    let mem = CgroupMemory::read(&m.cgroup)?;
    let now = OffsetDateTime::now_utc();
    let kubelet = summary.and_then(|s| kubelet_ws(s, m));
    Ok(Sample {
        pod: m.pod.clone(),
        cgroup_ws: mem.working_set(),
        usage: mem.usage,
        peak: mem.max_usage,
        kubelet_ws: kubelet.map(|k| k.0),
        kubelet_age_s: kubelet.map(|k| (now - k.1).as_seconds_f64()),
    })
}

/// Both containers now: waits (up to 30 s) until the kubelet has a sample of both taken after this
/// call began, then reads the cgroups.
async fn sample_phase(
    admin: &Client,
    name: &str,
    mappings: usize,
    webhook: &Measured,
    controller: &Measured,
) -> anyhow::Result<Phase> {
    let since = OffsetDateTime::now_utc();
    let deadline = Instant::now() + Duration::from_secs(30);
    let summary = loop {
        let s = kubelet_summary(admin).await?;
        let fresh = [webhook, controller]
            .iter()
            .all(|m| kubelet_ws(&s, m).is_some_and(|(_, at)| at >= since));
        if fresh || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    Ok(Phase {
        name: name.to_string(),
        mappings,
        webhook: sample(webhook, Some(&summary))?,
        controller: sample(controller, Some(&summary))?,
    })
}

/// (b): the open-loop load against the measured webhook pod (connections dialled inside the node's
/// namespace), the cgroups sampled every 100 ms meanwhile. Adds the "during" and "after"
/// rows; a load that cannot run is reported, not fatal.
async fn load_phase(
    cluster: &Cluster,
    admin: &Client,
    webhook: &Measured,
    controller: &Measured,
    warmup: Duration,
    measure: Duration,
    phases: &mut Vec<Phase>,
) -> anyhow::Result<Result<LoadFigures, String>> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let ip: IpAddr = pods
        .get(&webhook.pod)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .with_context(|| format!("pod {} without an IP", webhook.pod))?
        .parse()
        .context("the webhook pod's IP")?;
    // Connections are opened from inside the node's namespace (a thread entering it per connection)
    // and then driven from here: the pod's address is reachable only there.
    let netns = cluster.netns.clone();
    let pod_addr = SocketAddr::new(ip, WEBHOOK_PORT);
    let dial: crate::load::Dial = std::sync::Arc::new(move || {
        netns.run(move || {
            std::net::TcpStream::connect(pod_addr)
                .with_context(|| format!("connecting to {pod_addr} in the node's namespace"))
        })
    });
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let ca_pem = secrets
        .get(names::WEBHOOK_CA_SECRET)
        .await
        .context("reading the webhook CA Secret")?
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .context("the webhook CA Secret has no ca.crt")?;
    let target = load_target(
        pod_addr.to_string(),
        dial,
        Bytes::from(crate::reviews::mutate_create()?),
        ca_pem,
    );
    let pid = container_pid(webhook)?;
    // The container's `cpu` cgroup: the same path as its memory one, under the cpu controller.
    let cpu_cgroup = webhook
        .cgroup
        .strip_prefix("/sys/fs/cgroup/memory")
        .map(|rel| Path::new("/sys/fs/cgroup/cpu").join(rel))
        .ok();

    // Sampler: the max working set of both containers while the load runs.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (w, c) = (webhook.clone(), controller.clone());
    let sampler = tokio::spawn(async move {
        let mut max = [CgroupMemory::default(); 2];
        loop {
            for (i, m) in [&w, &c].into_iter().enumerate() {
                if let Ok(mem) = CgroupMemory::read(&m.cgroup)
                    && mem.working_set() >= max[i].working_set()
                {
                    max[i] = mem;
                }
            }
            tokio::select! {
                _ = &mut stop_rx => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        max
    });
    // Throttling over the whole load run, read outside it: a load that exhausts descriptors must not
    // lose the figure.
    let cfs_before = cpu_cgroup
        .as_deref()
        .and_then(|d| crate::load::Throttling::read(d).ok());
    let started = OffsetDateTime::now_utc();
    let outcome = match crate::load::probe(&target).await {
        Ok((true, _)) => crate::load::run(&target, Mode::Open(LOAD_RATE), warmup, measure, pid)
            .await
            .map_err(|e| format!("{e:#}")),
        Ok((false, body)) => Err(format!(
            "the webhook answered the probe with an error: {}",
            String::from_utf8_lossy(&body)
        )),
        Err(e) => Err(format!("the probe request failed: {e:#}")),
    };
    let ended = OffsetDateTime::now_utc();
    let throttled = match (cfs_before, cpu_cgroup.as_deref()) {
        (Some(a), Some(d)) => crate::load::Throttling::read(d).ok().map(|b| b.since(a)),
        _ => None,
    };
    let _ = stop_tx.send(());
    let max = sampler.await.context("the memory sampler")?;
    let summary = kubelet_summary(admin).await?;
    let during = |m: &Measured, mem: CgroupMemory| -> anyhow::Result<Sample> {
        let now = CgroupMemory::read(&m.cgroup)?;
        // Only a kubelet sample taken while the load ran counts for this row.
        let kubelet = kubelet_ws(&summary, m).filter(|(_, at)| *at >= started && *at <= ended);
        Ok(Sample {
            pod: m.pod.clone(),
            cgroup_ws: mem.working_set(),
            usage: mem.usage,
            peak: now.max_usage,
            kubelet_ws: kubelet.map(|k| k.0),
            kubelet_age_s: kubelet.map(|k| (OffsetDateTime::now_utc() - k.1).as_seconds_f64()),
        })
    };
    phases.push(Phase {
        name: format!(
            "(b) during {LOAD_RATE} admissions/s (max of 100 ms samples; peak at the end)"
        ),
        mappings: 0,
        webhook: during(webhook, max[0])?,
        controller: during(controller, max[1])?,
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    phases.push(sample_phase(admin, "(b) 5 s after the load", 0, webhook, controller).await?);
    Ok(outcome.map(|s| LoadFigures {
        rate: LOAD_RATE,
        measure_s: measure.as_secs_f64(),
        rps: s.rps,
        requests: s.requests,
        errors: s.errors,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        cpu_us: s.cpu_us,
        extra_connections: s.extra_connections,
        throttled,
        debug_client: cfg!(debug_assertions),
    }))
}

/// What the load generator sends to the webhook pod. The pod's serving certificate names the webhook
/// Service ([`WEBHOOK_SERVER_NAME`]), not 127.0.0.1: the load generator must verify that name.
fn load_target(addr: String, dial: crate::load::Dial, body: Bytes, ca_pem: String) -> Target {
    Target {
        addr,
        path: "/mutate".into(),
        body,
        ca_pem,
        server_name: Some(WEBHOOK_SERVER_NAME.into()),
        dial: Some(dial),
    }
}

/// Waits until the controller's ConfigMap lists `n` mappings.
async fn wait_aggregated(admin: &Client, n: usize) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let timeout = Duration::from_secs(60) + Duration::from_millis(15 * n as u64);
    cp_tests::wait::until(
        &format!(
            "{n} mappings in ConfigMap {}",
            names::CONFIGMAP_SERVICE_MAPPINGS
        ),
        timeout,
        || {
            let cms = cms.clone();
            async move {
                let cm = cms
                    .get_opt(names::CONFIGMAP_SERVICE_MAPPINGS)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no ConfigMap yet")?;
                let text = cm
                    .data
                    .and_then(|d| d.get(names::CONFIGMAP_SERVICE_MAPPINGS_KEY).cloned())
                    .unwrap_or_default();
                let entries = serde_json::from_str::<Vec<Value>>(&text)
                    .map(|v| v.len())
                    .unwrap_or(0);
                if entries == n {
                    Ok(Some(()))
                } else {
                    Err(format!("{entries} entries"))
                }
            }
        },
    )
    .await
}

/// Waits until new pods replaced the deleted ones: the first new webhook pod Ready and the Deployment
/// at `replicas` new Ready pods, the new controller pod Ready. Returns (webhook, controller) ms from
/// `t0` to their first new Ready pod.
async fn wait_replacements(
    admin: &Client,
    old: &BTreeSet<String>,
    t0: Instant,
    replicas: i32,
) -> anyhow::Result<(u64, u64)> {
    let deadline = t0 + Duration::from_secs(180);
    let (mut webhook, mut controller, mut all_webhooks) = (None, None, false);
    loop {
        let new = |pods: Vec<Pod>| {
            pods.into_iter()
                .filter(|p| !old.contains(&p.name_any()))
                .count()
        };
        let w = new(ready_pods(admin, WEBHOOK_PODS).await?);
        let c = new(ready_pods(admin, CONTROLLER_PODS).await?);
        if webhook.is_none() && w > 0 {
            webhook = Some(ms(t0.elapsed()));
        }
        if controller.is_none() && c > 0 {
            controller = Some(ms(t0.elapsed()));
        }
        all_webhooks = all_webhooks || w >= usize::try_from(replicas).unwrap_or(1);
        if let (Some(w), Some(c), true) = (webhook, controller, all_webhooks) {
            return Ok((w, c));
        }
        if Instant::now() > deadline {
            bail!(
                "the replacement pods not Ready within 180 s (webhook {webhook:?}, controller {controller:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// The section in Markdown.
pub fn render(f: &NodeFigures) -> String {
    let mut s = String::from("## Memory and start-up as the kubelet sees them (real node)\n\n");
    let builds: Vec<String> = f
        .images
        .iter()
        .map(|(name, profile, id)| format!("`{name}` (build profile `{profile}`, image {id})"))
        .collect();
    s.push_str(&format!(
        "The operator as the node runs it: `cp_tests::node::Cluster` (control plane, containerd, kubelet, \
         kube-proxy in a network namespace of the run, cgroup v1, cgroupfs driver), the bundle applied as \
         the module manager does, the images of `make images`: {}.{}\n\n",
        builds.join(", "),
        if f.quick {
            " **Quick mode**: 1,000 mappings and a 3 s load instead of 10,000 and 10 s."
        } else {
            ""
        }
    ));

    s.push_str("### Start → Ready\n\n");
    s.push_str(
        "From `kubectl apply --server-side` of the bundle (images already on the node), polled every \
         100 ms. The webhook's readiness waits for its serving certificate, which the controller issues.\n\n",
    );
    s.push_str("| What | Measured | Goal | Verdict |\n|---|---:|---:|---|\n");
    let st = &f.start;
    s.push_str(&format!(
        "| webhook: first pod Ready | {} ms | < {} ms | {} |\n",
        st.webhook_pod_ready_ms,
        GOAL_WEBHOOK_READY_MS,
        verdict(st.webhook_pod_ready_ms < GOAL_WEBHOOK_READY_MS)
    ));
    s.push_str(&format!(
        "| webhook: Deployment Available ({} replicas) | {} ms | | |\n",
        st.webhook_replicas, st.webhook_available_ms
    ));
    s.push_str(&format!(
        "| controller: pod Ready | {} ms | < {} ms | {} |\n",
        st.controller_pod_ready_ms,
        GOAL_CONTROLLER_READY_MS,
        verdict(st.controller_pod_ready_ms < GOAL_CONTROLLER_READY_MS)
    ));
    s.push_str(&format!(
        "| controller: Deployment Available | {} ms | | |\n",
        st.controller_available_ms
    ));
    if let Some(cr) = st.cr_ready_ms {
        s.push_str(&format!(
            "| default CR Ready (from its apply) | {cr} ms | < {GOAL_CR_READY_MS} ms | {} |\n",
            verdict(cr < GOAL_CR_READY_MS)
        ));
    }
    s.push_str(&format!(
        "| after deleting the pods, {} mappings present: first new webhook pod Ready | {} ms | | |\n",
        f.mappings, f.restart_webhook_ready_ms
    ));
    s.push_str(&format!(
        "| after deleting the pods: new controller pod Ready | {} ms | | |\n\n",
        f.restart_controller_ready_ms
    ));
    s.push_str(
        "The default CR's time includes this node's peculiarity: its hard open-files limit is below the \
         proxy's default, so the proxy's init container fails until a privileged user lowers \
         `maxFileDescriptorCount` (`Cluster::fit_fd_limit_to_node`, done at once after the apply, once the \
         controller has recorded its defaults), and the proxy pod restarts.\n\n",
    );

    s.push_str("### Working set and peak\n\n");
    s.push_str(&format!(
        "Per container. *cgroup*: `memory.usage_in_bytes − total_inactive_file` of the container's cgroup \
         (what cAdvisor and the kubelet compute), read at the end of the phase; *kubelet*: \
         `workingSetBytes` from the kubelet's summary API through the API server, a cached cAdvisor sample \
         (cAdvisor refreshes it every 10–15 s; the section waits for one taken after the phase's reading \
         began, its age at the cgroup read in brackets; — when none was taken in the phase's window); *peak*: `memory.max_usage_in_bytes` of the container's cgroup since the container \
         started (cache included), so the restarted pods' peak is their own. Settled = {} s after the \
         phase's action. Goals: webhook < 12 MiB, controller < 32 MiB at 10,000 mappings, peaks included; \
         the verdict takes the largest of the three figures.{}\n\n",
        f.settle_s,
        if f.mappings < 10_000 {
            format!(
                " This run had {} mappings, so the verdicts are against the 10,000-mapping goal with fewer.",
                f.mappings
            )
        } else {
            String::new()
        }
    ));
    s.push_str(
        "| Phase | Container (pod) | Working set, cgroup | Working set, kubelet (age) | Peak | Goal | Verdict |\n\
         |---|---|---:|---:|---:|---:|---|\n",
    );
    for p in &f.phases {
        for (label, x, goal) in [
            ("webhook", &p.webhook, GOAL_WEBHOOK_BYTES),
            ("controller", &p.controller, GOAL_CONTROLLER_BYTES),
        ] {
            let kubelet = match (x.kubelet_ws, x.kubelet_age_s) {
                (Some(ws), Some(age)) => format!("{} ({age:.0} s)", mib(ws)),
                _ => "—".into(),
            };
            let worst = x.cgroup_ws.max(x.peak).max(x.kubelet_ws.unwrap_or(0));
            s.push_str(&format!(
                "| {} | {label} (`{}`) | {} | {kubelet} | {} | < {} | {} |\n",
                p.name,
                x.pod,
                mib(x.cgroup_ws),
                mib(x.peak),
                mib(goal),
                verdict(worst < goal)
            ));
        }
    }
    s.push_str(&format!(
        "\nThe {} ServiceMappings were created through the webhook (validated) in {} ms; the controller's \
         ConfigMap `{}` listed them all {} ms after the last create.\n\n",
        f.mappings,
        f.mappings_create_ms,
        names::CONFIGMAP_SERVICE_MAPPINGS,
        f.mappings_aggregated_ms
    ));

    s.push_str("### The admission load (context, not a goal)\n\n");
    match &f.load {
        Ok(l) => {
            s.push_str(&format!(
                "Open loop at {}/s of `/mutate` (the default CR's create) for {:.0} s against one webhook \
                 pod (its IP, port {WEBHOOK_PORT}; each connection opened from inside the node's network \
                 namespace and driven from the bench; TLS verified against the webhook CA under the \
                 Service's name; 16 kept-alive connections, more opened when all are busy): {:.0}/s achieved, \
                 {} requests answered 200, {} errors, p50 {:.2} ms, p99 {:.2} ms, {} connections added, \
                 {:.0} µs of webhook CPU per answered request.",
                l.rate,
                l.measure_s,
                l.rps,
                l.requests,
                l.errors,
                l.p50_us as f64 / 1000.0,
                l.p99_us as f64 / 1000.0,
                l.extra_connections,
                l.cpu_us
            ));
            if let Some(t) = l.throttled {
                s.push_str(&format!(
                    " Over the whole run (warm-up included) the webhook container (CPU limit 500m) was \
                     throttled in {} of {} CFS periods ({} ms in all).",
                    t.throttled,
                    t.periods,
                    t.throttled_us / 1000
                ));
            }
            s.push_str(
                " When the pod falls behind, the open loop opens a new connection for each further \
                 request; all come from one source address, so the webhook closes those beyond its \
                 per-source cap (32) at once: errors then are refusals by the webhook or requests it \
                 shed past its deadlines.",
            );
            if l.debug_client {
                s.push_str(" The load generator was a debug build.");
            }
            s.push('\n');
        }
        Err(e) => s.push_str(&format!(
            "The load could not run: {e}. The rows of phase (b) show the pods without it.\n"
        )),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn working_set_is_usage_minus_inactive_file() {
        let dir = std::env::temp_dir().join(format!("cp-bench-node-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), "10485760\n").unwrap();
        std::fs::write(dir.join("memory.max_usage_in_bytes"), "20971520\n").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "cache 4096\ninactive_file 1\ntotal_inactive_file 2097152\n",
        )
        .unwrap();
        let m = CgroupMemory::read(&dir).unwrap();
        assert_eq!(m.working_set(), 8 * MIB);
        assert_eq!(m.max_usage, 20 * MIB);
        std::fs::write(dir.join("memory.stat"), "cache 1\n").unwrap();
        assert!(CgroupMemory::read(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kubelet_sample_is_found_by_pod_and_container() {
        let m = Measured {
            pod: "p".into(),
            container: "webhook",
            cgroup: PathBuf::new(),
        };
        let s = json!({"pods": [{"podRef": {"name": "p", "namespace": "kyma-system"},
            "containers": [{"name": "webhook", "memory": {"time": "2026-01-01T00:00:00Z", "workingSetBytes": 42}}]}]});
        assert_eq!(kubelet_ws(&s, &m).map(|k| k.0), Some(42));
        assert!(kubelet_ws(&json!({}), &m).is_none());
    }
}
