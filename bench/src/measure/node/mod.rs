//! Memory and start-up of the operator's two pods as the kubelet sees them, on the project's real node
//! ([`cp_tests::node::Cluster`]: control plane, containerd, kubelet, kube-proxy in a network namespace,
//! the images of `make images`).
//!
//! [`startup`] times the pods from `kubectl apply --server-side` of the bundle (images already on the
//! node) until each Deployment's first pod is Ready and the Deployment is Available; [`memory`] reads
//! the containers' cgroups and the kubelet's summary API; [`load`] drives the admission load. Phases:
//! idle after the default CR is Ready; during and after an open-loop 2,000 admissions/s against one
//! webhook pod; with 10,000 ServiceMappings aggregated; after the pods were deleted and their
//! replacements are Ready with the mappings still present.

pub mod load;
pub mod memory;
pub mod plot;
pub mod scale;
pub mod startup;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cp_api::names;
use cp_tests::node::Cluster;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::harness::mappings::{aggregated, create_mappings, numbered_mappings};
use crate::harness::plane::with_node;
use crate::harness::stats::whole_ms;
use load::{LoadFigures, load_phase};
use memory::{CONTROLLER_CONTAINER, Phase, WEBHOOK_CONTAINER, measured, sample_phase};
use startup::{
    CONTROLLER_PODS, StartUp, WEBHOOK_PODS, install_timed, pod_names, wait_cr_ready,
    wait_replacements,
};

/// The podman image label saying which build profile an image was built with.
const BUILD_PROFILE_LABEL: &str = "io.kyma-project.cp-operator.build-profile";

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
    /// Phase (e): the mappings grown to 50,000.
    pub scale: scale::Scale,
}

/// Measures the section on a node of its own (started and stopped here).
pub async fn run(quick: bool) -> anyhow::Result<NodeFigures> {
    let images = image_builds()?;
    with_node(async |cluster| measure(cluster, quick, images).await).await
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
    start.cr_ready_ms = Some(whole_ms(cr_applied.elapsed()));

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
    let list = numbered_mappings(n_mappings);
    let t0 = Instant::now();
    create_mappings(&admin, list)
        .await
        .context("creating the ServiceMappings")?;
    let mappings_create_ms = whole_ms(t0.elapsed());
    let t1 = Instant::now();
    wait_aggregated(&admin, n_mappings).await?;
    let mappings_aggregated_ms = whole_ms(t1.elapsed());
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

    // (e) Grown to 50,000 mappings, until the proxy has read them all.
    let (to, samples) = if quick {
        (5_000, (10, 1))
    } else {
        (50_000, (30, 3))
    };
    let scale = scale::measure(cluster, &admin, &controller, (n_mappings, to), samples)
        .await
        .context("phase (e): 50,000 mappings")?;
    tokio::time::sleep(settle).await;
    phases.push(
        sample_phase(
            &admin,
            &format!(
                "(e) {} ServiceMappings, read by the proxy, settled",
                scale.to + samples.0 + samples.1
            ),
            scale.to + samples.0 + samples.1,
            &webhook,
            &controller,
        )
        .await?,
    );

    Ok(NodeFigures {
        quick,
        scale,
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
                // One list: every shard's entries.
                let entries: usize = cms
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .iter()
                    .filter(|cm| names::mapping_shard(&cm.name_any()).is_some())
                    .map(|cm| aggregated(cm).0)
                    .sum();
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

    s.push_str(&startup::render(
        &f.start,
        f.mappings,
        f.restart_webhook_ready_ms,
        f.restart_controller_ready_ms,
    ));
    s.push_str(&memory::render(
        &f.phases,
        f.settle_s,
        f.mappings,
        f.mappings_create_ms,
        f.mappings_aggregated_ms,
    ));
    s.push_str(&format!(
        "Working set against the mappings present, phase by phase: [`{0}`]({0}).\n\n",
        plot::FILE
    ));
    s.push_str(&scale::render(&f.scale));
    s.push_str(&load::render(&f.load));
    s
}
