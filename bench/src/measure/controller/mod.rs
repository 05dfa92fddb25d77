//! Controller figures: edit→apply latency and drift repair ([`latency`]), API requests when idle and
//! per reconcile ([`requests`]), CPU per reconcile ([`cpu`]), resident memory of the webhook and the
//! controller idle and with many ServiceMappings ([`memory`]), aggregation time ([`aggregation`]),
//! and the takeover of a legacy reconciler installation ([`takeover`]).
//!
//! Everything runs against a real local control plane (`cp_tests::ControlPlane`) that audits every
//! request, with the release binaries of the webhook and the controller running as their own
//! ServiceAccounts. Moments are taken from watch events (the bench's own watches), never from polling
//! with sleeps.

pub mod actions;
pub mod aggregation;
pub mod common;
pub mod cpu;
pub mod latency;
pub mod memory;
pub mod requests;
pub mod takeover;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::ConnectivityProxy;
use cp_tests::ControlPlane;
use cp_tests::cluster::Options;
use cp_tests::controller::ControllerProcess;
use cp_tests::fixtures::default_connectivity_proxy;
use cp_tests::webhook::Webhook;
use cp_tests::webhook::admission_active;
use kube::api::{Api, PostParams};
use serde::Serialize;

use crate::harness::plane::with_control_plane;
use crate::harness::stats::Percentiles;
use crate::harness::watch::watch_one;
use aggregation::Aggregation;
use common::{
    CONTROLLER_PROCESS, CR, CrView, DOMAIN, NS, WEBHOOK_PROCESS, install_prerequisites,
    play_until_ready, settle,
};
use cpu::{RECONCILE_CPU_GOAL_MS, RECONCILE_CPU_GOAL_MS_MAPPINGS, ReconcileCpu};
use latency::{DriftRepair, EditLatency};
use memory::{CONTROLLER_GOAL_MIB, Memory, WEBHOOK_GOAL_MIB};
use requests::{IdleRequests, ReconcileRequests};
use takeover::Takeover;

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
    /// What a mapping create and a CR edit cost, without and with the many mappings (issue #46, item 3).
    pub actions: Vec<actions::ActionCost>,
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

/// The control plane of each phase: it audits reads too; CP_KEEP_DIR keeps the logs (the
/// processes', the audit log) after the run.
fn plane_options() -> Options {
    Options {
        audit_reads: true,
        keep_dir: std::env::var_os("CP_KEEP_DIR").is_some(),
        ..Default::default()
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
    with_control_plane(plane_options(), async |cp| {
        main_phase(cp, &sizes, &mut figures).await
    })
    .await?;
    figures.takeover = with_control_plane(plane_options(), async |cp| {
        takeover::takeover(cp, sizes.legacy_mappings).await
    })
    .await
    .context("legacy takeover")?;
    figures.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(figures)
}

/// The controller as in production: it issues the webhook's serving certificate (for 127.0.0.1
/// here) and injects its CA into the webhook configurations; resync and leader election at their
/// defaults.
async fn start_controller(cp: &ControlPlane) -> anyhow::Result<ControllerProcess> {
    ControllerProcess::start(cp, CONTROLLER_PROCESS, &["--webhook-ips=127.0.0.1"]).await
}

/// The webhook serving the certificate the controller issued.
async fn start_webhook(cp: &ControlPlane) -> anyhow::Result<Webhook> {
    Webhook::start_from_secret(cp, WEBHOOK_PROCESS, &["--privileged-groups=system:masters"]).await
}

async fn main_phase(
    cp: &ControlPlane,
    sizes: &Sizes,
    figures: &mut ControllerFigures,
) -> anyhow::Result<()> {
    let admin = cp.admin().await?;
    install_prerequisites(&admin, DOMAIN).await?;
    let ctrl = start_controller(cp)
        .await
        .context("starting the controller")?;
    let wh = start_webhook(cp).await.context("starting the webhook")?;
    wh.register(&admin).await?;
    admission_active(&admin).await?;

    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let cr_watch = watch_one(crs.clone(), CR, CrView::of);
    crs.create(&PostParams::default(), &default_connectivity_proxy(CR))
        .await
        .context("creating the default CR")?;
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    settle(&ctrl).await?;

    let wh_idle = memory::read(cp, WEBHOOK_PROCESS)?;
    let ctrl_idle = memory::read(cp, CONTROLLER_PROCESS)?;

    figures.reconcile = requests::reconcile_requests(cp, &ctrl, &crs, sizes.reconciles).await?;
    figures
        .reconcile_cpu
        .push(cpu::reconcile_cpu(cp, &ctrl, &crs, sizes.touches, 0, RECONCILE_CPU_GOAL_MS).await?);
    figures.drift = latency::drift_repair(&admin, sizes.reconciles).await?;
    settle(&ctrl).await?;
    figures.edit = latency::edit_latency(&admin, sizes.edits).await?;
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    settle(&ctrl).await?;

    figures
        .actions
        .extend(actions::costs(cp, &ctrl, 0, "none", 20_100).await?);
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    settle(&ctrl).await?;

    figures.aggregation = aggregation::aggregate(&admin, sizes.mappings, sizes.adopt_wait).await?;
    settle(&ctrl).await?;
    figures.one_mapping =
        aggregation::one_mapping_latency(&admin, sizes.mappings, sizes.one_mappings).await?;
    let present = sizes.mappings + sizes.one_mappings;
    settle(&ctrl).await?;
    figures.reconcile_cpu.push(
        cpu::reconcile_cpu(
            cp,
            &ctrl,
            &crs,
            sizes.touches,
            present,
            RECONCILE_CPU_GOAL_MS_MAPPINGS,
        )
        .await?,
    );
    settle(&ctrl).await?;
    figures
        .actions
        .extend(actions::costs(cp, &ctrl, present, "many", 20_101).await?);
    play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
    // Steady state with the mappings: requests, writes and CPU of an idle window (issue #33).
    settle(&ctrl).await?;
    figures.idle = requests::idle_requests(cp, sizes.idle).await?;
    figures.idle.mappings = present;
    let wh_loaded = memory::read(cp, WEBHOOK_PROCESS)?;
    let ctrl_loaded = memory::read(cp, CONTROLLER_PROCESS)?;
    // Restarted with the mappings in place: what a rollout or an eviction leaves.
    cp.terminate_process(CONTROLLER_PROCESS, Duration::from_secs(30))?;
    let ctrl = start_controller(cp)
        .await
        .context("restarting the controller")?;
    settle(&ctrl).await?;
    let ctrl_restarted = memory::read(cp, CONTROLLER_PROCESS)?;
    cp.terminate_process(WEBHOOK_PROCESS, Duration::from_secs(30))?;
    start_webhook(cp).await.context("restarting the webhook")?;
    let wh_restarted = memory::read(cp, WEBHOOK_PROCESS)?;
    figures.memory = vec![
        Memory::of(
            "webhook",
            &wh_idle,
            &wh_loaded,
            &wh_restarted,
            WEBHOOK_GOAL_MIB,
        ),
        Memory::of(
            "controller",
            &ctrl_idle,
            &ctrl_loaded,
            &ctrl_restarted,
            CONTROLLER_GOAL_MIB,
        ),
    ];
    Ok(())
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
    s.push_str(&latency::render_edit(&f.edit));
    s.push_str(&requests::render_idle(&f.idle));
    s.push_str(&requests::render_reconcile(&f.reconcile));
    s.push_str(&cpu::render(&f.reconcile_cpu));
    s.push_str(&latency::render_drift(&f.drift));
    s.push_str(&memory::render(&f.memory, f.aggregation.mappings));
    s.push_str(&aggregation::render(&f.aggregation, &f.one_mapping));
    s.push_str(&actions::render(&f.actions));
    s.push_str(&takeover::render(&f.takeover));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_figure() {
        let text = render(&ControllerFigures::default());
        for heading in [
            "CR edit",
            "idle minute",
            "full reconcile",
            "Memory",
            "Aggregating",
            "What one user action costs",
            "legacy installation",
        ] {
            assert!(text.contains(heading), "{heading} missing");
        }
    }
}
