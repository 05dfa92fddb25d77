//! Phase (e) of the node section: the ServiceMappings grown from the 10,000 of phase (c) to 50,000, on
//! the real node, until the proxy (the stand-in, which reads every shard file of its mappings
//! directory as the proxy's side of the contract says: `docs/user-guide.md`, "How many mappings fit")
//! has all of them; then one mapping at a time: the controller's CPU per change, create → in the
//! ConfigMaps, and create → in the proxy's files.

use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ServiceMapping, names};
use cp_tests::node::Cluster;
use kube::Client;
use kube::api::{Api, PostParams};

use super::memory::{Measured, container_pid};
use crate::harness::mappings::{create_mappings, numbered_mappings, tcp_mapping, watch_shards};
use crate::harness::procfs::process_cpu_us;
use crate::harness::stats::{Percentiles, ms, whole_ms};
use crate::harness::watch::wait_until;

/// The proxy pod whose files are read (the StatefulSet's first).
const PROXY_POD: &str = "connectivity-proxy-0";
/// Goals (stated before measuring, from issue #46): the controller's CPU for a change of one mapping,
/// and create → in the proxy's files, p99.
pub const GOAL_CPU_PER_CHANGE_MS: f64 = 1.0;
pub const GOAL_TO_PROXY_P99_MS: f64 = 1000.0;

/// What the phase measured.
#[derive(Clone, Debug)]
pub struct Scale {
    /// Mappings before and after the growth.
    pub from: usize,
    pub to: usize,
    /// Creating the new ones, ms.
    pub create_ms: u64,
    /// From the last create until the ConfigMaps listed all of them, ms.
    pub aggregated_ms: u64,
    /// From the last create until the proxy stand-in read all of them from its files, ms.
    pub proxy_ms: u64,
    /// From the last create until every mapping had its endpoint and the takeover label, ms.
    pub adopted_ms: u64,
    /// Shard ConfigMaps then.
    pub shards: usize,
    /// Files the proxy read them from.
    pub proxy_files: usize,
    /// One more mapping at a time: create → in the ConfigMaps.
    pub one_to_configmap: Percentiles,
    /// The controller's CPU per such change (its idle rate taken off), ms.
    pub cpu_per_change_ms: f64,
    /// The controller's idle CPU rate before, ms/s.
    pub idle_ms_per_s: f64,
    /// create → in the proxy's files, for a few of them.
    pub one_to_proxy: Percentiles,
}

/// What the stand-in last logged it read: (channels, files).
fn proxy_reads(cluster: &Cluster) -> anyhow::Result<Option<(usize, usize)>> {
    Ok(cluster
        .standin_log(PROXY_POD)?
        .iter()
        .find(|v| v["event"] == "mappings")
        .and_then(|v| {
            Some((
                v["channels"].as_u64()? as usize,
                v["files"].as_u64()? as usize,
            ))
        }))
}

/// Waits until the stand-in has read `n` channels; returns when it saw them and from how many files.
async fn proxy_has(
    cluster: &Cluster,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<(Instant, usize)> {
    let deadline = Instant::now() + timeout;
    loop {
        let read = proxy_reads(cluster)?;
        if let Some((channels, files)) = read
            && channels == n
        {
            return Ok((Instant::now(), files));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the proxy stand-in did not read {n} mappings within {timeout:?}: it last read {read:?} (channels, files)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Grows the mappings from `from` to `to` and measures; `samples` single changes for the CPU figure,
/// `proxy_samples` of them followed into the proxy's files.
pub async fn measure(
    cluster: &Cluster,
    admin: &Client,
    controller: &Measured,
    (from, to): (usize, usize),
    (samples, proxy_samples): (usize, usize),
) -> anyhow::Result<Scale> {
    let ns: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let mut shards = watch_shards(ns.clone());
    let mut adopted = crate::harness::watch::watch_count(
        Api::<ServiceMapping>::all(admin.clone()),
        crate::harness::mappings::adopted,
    );
    let entries = |v: &Option<(usize, usize)>| v.map(|(e, _)| e);
    wait_until(
        &mut shards,
        "the mapping ConfigMaps",
        Duration::from_secs(60),
        |v| entries(v) == Some(from),
    )
    .await?;
    // The kubelet refreshes ConfigMap volumes on its pod sync (every minute by default).
    proxy_has(cluster, from, Duration::from_secs(300)).await?;

    let more: Vec<ServiceMapping> = numbered_mappings(to).into_iter().skip(from).collect();
    let t0 = Instant::now();
    create_mappings(admin, more)
        .await
        .context("creating the mappings up to {to}")?;
    let created = Instant::now();
    let budget = Duration::from_secs(120) + Duration::from_millis(5 * to as u64);
    let (at, _) = wait_until(
        &mut shards,
        &format!("{to} mappings in the ConfigMaps"),
        budget,
        |v| entries(v) == Some(to),
    )
    .await?;
    let aggregated_ms = whole_ms(at.saturating_duration_since(created));
    let (seen, proxy_files) = proxy_has(cluster, to, Duration::from_secs(600)).await?;
    let proxy_ms = whole_ms(seen.saturating_duration_since(created));
    // Every mapping taken over before the controller counts as idle: the single changes are measured
    // against a quiet controller.
    let (at, _) = wait_until(
        &mut adopted,
        &format!("{to} mappings adopted"),
        Duration::from_secs(900),
        |n| *n == to,
    )
    .await?;
    let adopted_ms = whole_ms(at.saturating_duration_since(created));
    let mut count = 0;
    for name in names::MAPPING_SHARD_CONFIGMAPS {
        if ns.get_opt(name).await?.is_some() {
            count += 1;
        }
    }

    // One at a time: CPU per change (the idle rate measured first) and create → in the ConfigMaps.
    let pid = container_pid(controller)?;
    let idle = Duration::from_secs(5);
    let c0 = process_cpu_us(pid)?;
    tokio::time::sleep(idle).await;
    let idle_ms_per_s = (process_cpu_us(pid)? - c0) as f64 / 1000.0 / idle.as_secs_f64();
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let (c1, w0) = (process_cpu_us(pid)?, Instant::now());
    let mut latencies = Vec::with_capacity(samples);
    for i in 1..=samples {
        let name = format!("scale-one-{i:03}");
        let t = Instant::now();
        api.create(&PostParams::default(), &tcp_mapping(&name))
            .await
            .with_context(|| format!("creating ServiceMapping {name}"))?;
        let (at, _) = wait_until(
            &mut shards,
            &format!("{name} in the ConfigMaps"),
            Duration::from_secs(60),
            |v| entries(v) == Some(to + i),
        )
        .await?;
        latencies.push(ms(at.saturating_duration_since(t)));
        // The controller's follow-up (the endpoint, the takeover label) is part of the change.
        wait_adopted(&api, &name).await?;
    }
    let window = w0.elapsed().as_secs_f64();
    let spent_ms = (process_cpu_us(pid)? - c1) as f64 / 1000.0;
    let cpu_per_change_ms = ((spent_ms - idle_ms_per_s * window) / samples as f64).max(0.0);

    // A few followed into the proxy's files.
    let mut to_proxy = Vec::with_capacity(proxy_samples);
    for i in 1..=proxy_samples {
        let name = format!("scale-file-{i:03}");
        let n = to + samples + i;
        let t = Instant::now();
        api.create(&PostParams::default(), &tcp_mapping(&name))
            .await
            .with_context(|| format!("creating ServiceMapping {name}"))?;
        let (seen, _) = proxy_has(cluster, n, Duration::from_secs(300)).await?;
        to_proxy.push(ms(seen.saturating_duration_since(t)));
    }
    Ok(Scale {
        from,
        to,
        create_ms: whole_ms(created.duration_since(t0)),
        aggregated_ms,
        proxy_ms,
        adopted_ms,
        shards: count,
        proxy_files,
        one_to_configmap: Percentiles::of(&latencies),
        cpu_per_change_ms,
        idle_ms_per_s,
        one_to_proxy: Percentiles::of(&to_proxy),
    })
}

/// Waits until mapping `name` has its endpoint (the controller's last write for a new mapping).
async fn wait_adopted(api: &Api<ServiceMapping>, name: &str) -> anyhow::Result<()> {
    cp_tests::wait::until(
        &format!("{name} adopted"),
        Duration::from_secs(60),
        || async {
            let m = api.get(name).await.map_err(|e| e.to_string())?;
            Ok(crate::harness::mappings::adopted(&m).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))
}

/// The phase's table.
pub fn render(s: &Scale) -> String {
    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    let mut out = format!(
        "### {} ServiceMappings on the node\n\n\
         The mappings grown from {} to {} (`m-…` of type TCP, {} in flight through the webhook), until the proxy \
         stand-in had read all of them from its files (it logs how many channels it read from how many files; \
         it reads `servicemappings` and every shard `servicemappings-<n>` of its mappings directory, as the proxy's \
         side of the contract says). Then {} more, one at a time, each waited for in the ConfigMaps and until \
         the controller had written its endpoint: the controller's CPU (`/proc/<pid>/stat` of its container) \
         over them, less its idle rate, per change; and {} more followed into the proxy's files.\n\n",
        s.to,
        s.from,
        s.to,
        crate::harness::mappings::IN_FLIGHT,
        s.one_to_configmap.samples,
        s.one_to_proxy.samples,
    );
    out.push_str("| Measure | value | Goal | Verdict |\n|---|---:|---|---|\n");
    out.push_str(&format!(
        "| creating {} mappings, s | {:.1} | — | — |\n",
        s.to - s.from,
        s.create_ms as f64 / 1000.0
    ));
    out.push_str(&format!(
        "| last create → all {} in the ConfigMaps, ms | {} | — | — |\n",
        s.to, s.aggregated_ms
    ));
    out.push_str(&format!(
        "| shard ConfigMaps then / files the proxy read them from | {} / {} | — | — |\n",
        s.shards, s.proxy_files
    ));
    out.push_str(&format!(
        "| last create → the proxy read all {}, ms | {} | — | — |\n",
        s.to, s.proxy_ms
    ));
    out.push_str(&format!(
        "| last create → all {} labelled and with `status.endpoint`, ms | {} | — | — |\n",
        s.to, s.adopted_ms
    ));
    out.push_str(&format!(
        "| one more mapping: create → in the ConfigMaps, p50 / p99 / max ms ({} samples) | {:.0} / {:.0} / {:.0} | — | — |\n",
        s.one_to_configmap.samples, s.one_to_configmap.p50_ms, s.one_to_configmap.p99_ms, s.one_to_configmap.max_ms
    ));
    out.push_str(&format!(
        "| controller CPU per one-mapping change, ms (idle rate {:.2} ms/s taken off) | {:.2} | ≤ {GOAL_CPU_PER_CHANGE_MS:.0} ms | {} |\n",
        s.idle_ms_per_s,
        s.cpu_per_change_ms,
        verdict(s.cpu_per_change_ms <= GOAL_CPU_PER_CHANGE_MS)
    ));
    out.push_str(&format!(
        "| one more mapping: create → in the proxy's files, p50 / p99 / max ms ({} samples) | {:.0} / {:.0} / {:.0} | p99 ≤ {GOAL_TO_PROXY_P99_MS:.0} ms | {} |\n\n",
        s.one_to_proxy.samples,
        s.one_to_proxy.p50_ms,
        s.one_to_proxy.p99_ms,
        s.one_to_proxy.max_ms,
        verdict(s.one_to_proxy.p99_ms <= GOAL_TO_PROXY_P99_MS)
    ));
    out.push_str(
        "A mapping reaches the proxy's files when the kubelet next refreshes the pod's ConfigMap volumes: at its \
         periodic pod sync (every minute by default, `syncFrequency`, the node here as a Gardener node) or when the \
         pod object changes. After each shard write the controller sets the annotation \
         `connectivityproxy.sap.com/mappings-written` on the proxy's pods, so the kubelet syncs them at once. The \
         stand-in looks at its volume's `..data` link every 50 ms and reads the files when it changed.\n\n",
    );
    out
}
