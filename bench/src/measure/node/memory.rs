//! Memory of the operator's two containers as the kubelet sees it: from the container's cgroup (v1
//! memory controller under the kubelet's cgroup root `/<run id>`: working set = usage −
//! `total_inactive_file` as cAdvisor computes it, peak = `memory.max_usage_in_bytes`) and from the
//! kubelet's summary API (`workingSetBytes`, a cached cAdvisor sample whose age is reported).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::names;
use cp_tests::node::{NODE_NAME, ready_pods};
use kube::{Client, ResourceExt};
use serde_json::Value;
use time::OffsetDateTime;

use crate::harness::procfs::{CgroupMemory, read_text};
use crate::harness::report::{MIB, met_bold, mib};

pub const WEBHOOK_CONTAINER: &str = "webhook";
pub const CONTROLLER_CONTAINER: &str = "controller";
/// Goals at 10,000 mappings, peaks included, stated before measuring; the controller's (issue #46):
/// 12 MiB up to 10,000 mappings, 1 KiB per mapping beyond.
const GOAL_WEBHOOK_BYTES: u64 = 12 * MIB;
const GOAL_CONTROLLER_BYTES: u64 = 12 * MIB;

/// The controller's goal with `mappings` present.
fn controller_goal(mappings: usize) -> u64 {
    GOAL_CONTROLLER_BYTES + 1024 * mappings.saturating_sub(10_000) as u64
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

/// A container being measured: its pod and cgroup.
#[derive(Clone, Debug)]
pub struct Measured {
    pub pod: String,
    pub container: &'static str,
    pub cgroup: PathBuf,
}

/// The first Ready pod of `selector` (not in `exclude`), its container `container` and that
/// container's memory cgroup under the kubelet's root `/<run_id>`.
pub async fn measured(
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
pub fn container_pid(m: &Measured) -> anyhow::Result<u32> {
    let procs = m.cgroup.join("cgroup.procs");
    read_text(&procs)?
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("{}: no process", procs.display()))
}

/// The kubelet's summary of this node, through the API server.
pub async fn kubelet_summary(admin: &Client) -> anyhow::Result<Value> {
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
pub fn kubelet_ws(summary: &Value, m: &Measured) -> Option<(u64, OffsetDateTime)> {
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

impl Sample {
    /// Container `m` with the working set of `mem`, the peak `peak` and the kubelet's sample
    /// `kubelet` (its working set and time), aged at `now`.
    pub fn of(
        m: &Measured,
        mem: CgroupMemory,
        peak: u64,
        kubelet: Option<(u64, OffsetDateTime)>,
        now: OffsetDateTime,
    ) -> Self {
        Self {
            pod: m.pod.clone(),
            cgroup_ws: mem.working_set(),
            usage: mem.usage,
            peak,
            kubelet_ws: kubelet.map(|k| k.0),
            kubelet_age_s: kubelet.map(|k| (now - k.1).as_seconds_f64()),
        }
    }
}

fn sample(m: &Measured, summary: &Value) -> anyhow::Result<Sample> {
    let mem = CgroupMemory::read(&m.cgroup)?;
    let now = OffsetDateTime::now_utc();
    Ok(Sample::of(
        m,
        mem,
        mem.max_usage,
        kubelet_ws(summary, m),
        now,
    ))
}

/// Both containers now: waits (up to 30 s) until the kubelet has a sample of both taken after this
/// call began, then reads the cgroups.
pub async fn sample_phase(
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
        webhook: sample(webhook, &summary)?,
        controller: sample(controller, &summary)?,
    })
}

/// The memory table of `phases`, each read `settle_s` after its action; `mappings` were created in
/// `create_ms` and aggregated `aggregated_ms` after the last create.
pub fn render(
    phases: &[Phase],
    settle_s: u64,
    mappings: usize,
    create_ms: u64,
    aggregated_ms: u64,
) -> String {
    let mut s = String::new();
    s.push_str("### Working set and peak\n\n");
    s.push_str(&format!(
        "Per container. *cgroup*: `memory.usage_in_bytes − total_inactive_file` of the container's cgroup \
         (what cAdvisor and the kubelet compute), read at the end of the phase; *kubelet*: \
         `workingSetBytes` from the kubelet's summary API through the API server, a cached cAdvisor sample \
         (cAdvisor refreshes it every 10–15 s; the section waits for one taken after the phase's reading \
         began, its age at the cgroup read in brackets; — when none was taken in the phase's window); *peak*: `memory.max_usage_in_bytes` of the container's cgroup since the container \
         started (cache included), so the restarted pods' peak is their own. Settled = {} s after the \
         phase's action. Goals: webhook < 12 MiB; controller < 12 MiB up to 10,000 mappings and 1 KiB more per mapping beyond (issue #46), peaks included; \
         the verdict takes the largest of the three figures.{}\n\n",
        settle_s,
        if mappings < 10_000 {
            format!(
                " This run had {} mappings, so the verdicts are against the 10,000-mapping goal with fewer.",
                mappings
            )
        } else {
            String::new()
        }
    ));
    s.push_str(
        "| Phase | Container (pod) | Working set, cgroup | Working set, kubelet (age) | Peak | Goal | Verdict |\n\
         |---|---|---:|---:|---:|---:|---|\n",
    );
    for p in phases {
        for (label, x, goal) in [
            ("webhook", &p.webhook, GOAL_WEBHOOK_BYTES),
            ("controller", &p.controller, controller_goal(p.mappings)),
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
                met_bold(worst < goal)
            ));
        }
    }
    s.push_str(&format!(
        "\nThe {} ServiceMappings were created through the webhook (validated) in {} ms; the controller's \
         ConfigMap `{}` listed them all {} ms after the last create.\n\n",
        mappings,
        create_ms,
        names::CONFIGMAP_SERVICE_MAPPINGS,
        aggregated_ms
    ));

    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
