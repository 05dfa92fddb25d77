//! The admission load against one webhook pod on the node (context for the memory figures, not a
//! goal): an open loop of `/mutate` at 2,000/s, dialled inside the node's network namespace, the
//! containers' cgroups sampled meanwhile.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cp_api::names;
use cp_tests::node::Cluster;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::Api;
use time::OffsetDateTime;

use crate::harness::load::{self, Dial, Mode, Target};
use crate::harness::procfs::{CgroupMemory, Throttling};
use crate::measure::node::memory::{
    Measured, Phase, Sample, container_pid, kubelet_summary, kubelet_ws, sample_phase,
};

/// The webhook container's HTTPS port (`https-webhook` in the bundle).
const WEBHOOK_PORT: u16 = 9443;
/// The name the API server verifies the webhook's serving certificate against (its Service's DNS name).
const WEBHOOK_SERVER_NAME: &str = "connectivity-proxy-operator-webhook.kyma-system.svc";
/// The admission rate of the load phase.
const LOAD_RATE: u32 = 2_000;

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
    pub throttled: Option<Throttling>,
    /// Whether the load generator (this process) was a debug build.
    pub debug_client: bool,
}

/// (b): the open-loop load against the measured webhook pod (connections dialled inside the node's
/// namespace), the cgroups sampled every 100 ms meanwhile. Adds the "during" and "after"
/// rows; a load that cannot run is reported, not fatal.
pub async fn load_phase(
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
    let dial: Dial = std::sync::Arc::new(move || {
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
    let cfs_before = cpu_cgroup.as_deref().and_then(|d| Throttling::read(d).ok());
    let started = OffsetDateTime::now_utc();
    let outcome = match load::probe(&target).await {
        Ok((true, _)) => load::run(&target, Mode::Open(LOAD_RATE), warmup, measure, pid)
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
        (Some(a), Some(d)) => Throttling::read(d).ok().map(|b| b.since(a)),
        _ => None,
    };
    let _ = stop_tx.send(());
    let max = sampler.await.context("the memory sampler")?;
    let summary = kubelet_summary(admin).await?;
    let during = |m: &Measured, mem: CgroupMemory| -> anyhow::Result<Sample> {
        let now = CgroupMemory::read(&m.cgroup)?;
        // Only a kubelet sample taken while the load ran counts for this row.
        let kubelet = kubelet_ws(&summary, m).filter(|(_, at)| *at >= started && *at <= ended);
        Ok(Sample::of(
            m,
            mem,
            now.max_usage,
            kubelet,
            OffsetDateTime::now_utc(),
        ))
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
fn load_target(addr: String, dial: Dial, body: Bytes, ca_pem: String) -> Target {
    Target {
        addr,
        path: "/mutate".into(),
        body,
        ca_pem,
        server_name: Some(WEBHOOK_SERVER_NAME.into()),
        dial: Some(dial),
    }
}

/// The load's paragraph.
pub fn render(outcome: &Result<LoadFigures, String>) -> String {
    let mut s = String::new();
    s.push_str("### The admission load (context, not a goal)\n\n");
    match outcome {
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
