//! What every controller measurement shares: the names of the measured installation, its
//! prerequisites, the stand-ins that bring the CR to Ready, and the controller's reconcile counter.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use cp_api::keys::MIGRATION_ANNOTATION;
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::cluster::ensure_namespace;
use cp_tests::controller::ControllerProcess;
use cp_tests::fakes::StandIns;
use cp_tests::manifest;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::harness::metrics::{metric_sum, scrape};

pub const NS: &str = names::KYMA_SYSTEM;
pub const CR: &str = names::DEFAULT_CR_NAME;
pub const DOMAIN: &str = "bench.kyma.example.com";
const SUBACCOUNT: &str = "11111111-2222-3333-4444-555555555555";
const SUBDOMAIN: &str = "bench-subdomain";
pub const WEBHOOK_USER: &str = "system:serviceaccount:kyma-system:connectivity-proxy-webhook";
pub const WEBHOOK_PROCESS: &str = "cp-webhook";
pub const CONTROLLER_PROCESS: &str = "cp-controller";
const TOUCH_ANNOTATION: &str = "bench.connectivityproxy.sap.com/touch";
const RECONCILE_SERIES: &str = "cp_controller_reconcile_total";

/// Our CRDs, Istio's and the BTP operator's, the namespaces, and shoot-info with `domain`.
pub async fn install_prerequisites(admin: &Client, domain: &str) -> anyhow::Result<()> {
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
pub struct CrView {
    pub migration: Option<String>,
    pub state: Option<State>,
    pub reasons: Vec<String>,
    pub description: Option<String>,
}

impl CrView {
    pub fn of(cr: &ConnectivityProxy) -> Self {
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
pub async fn play_until_ready(
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

/// Changes the bench's annotation on the CR to `value`: a full reconcile without a new generation.
pub async fn touch(crs: &Api<ConnectivityProxy>, value: String) -> anyhow::Result<()> {
    let touch = json!({"metadata": {"annotations": {TOUCH_ANNOTATION: value}}});
    crs.patch(CR, &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .context("annotating the CR")?;
    Ok(())
}

/// Reconciles the controller counted, whatever their result.
pub async fn reconciles(ctrl: &ControllerProcess) -> anyhow::Result<u64> {
    let text = scrape(&ctrl.metrics_addr, "controller").await?;
    Ok(metric_sum(&text, RECONCILE_SERIES) as u64)
}

/// Waits until the controller has not reconciled for a second.
pub async fn settle(ctrl: &ControllerProcess) -> anyhow::Result<()> {
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
