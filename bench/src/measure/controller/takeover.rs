//! Taking over a legacy reconciler installation: the controller started last, on a cluster the
//! legacy reconciler left, until every mapping is taken over and the CR is Ready.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ConnectivityProxy, ServiceMapping, State, names};
use cp_tests::ControlPlane;
use cp_tests::controller::ControllerProcess;
use cp_tests::fixtures::default_connectivity_proxy;
use cp_tests::legacy::{self, MappingSnapshot};
use cp_tests::webhook::Webhook;
use cp_tests::webhook::admission_active;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::harness::mappings::create_mappings;
use crate::harness::stats::ms;
use crate::harness::watch::{wait_until, watch_count, watch_one};
use crate::measure::controller::common::{
    CONTROLLER_PROCESS, CR, CrView, NS, WEBHOOK_PROCESS, play_until_ready,
};

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

/// A legacy installation with `5 + extra` ServiceMappings; returns uid and spec of each mapping.
async fn legacy_cluster(admin: &Client, extra: usize) -> anyhow::Result<MappingSnapshot> {
    cp_tests::fixtures::apply_our_crds(admin).await?;
    legacy::install(admin).await?;
    let mappings = (0..5 + extra).map(legacy::mapping).collect();
    let (created, _) = create_mappings(admin, mappings).await?;
    legacy::register_webhook(admin).await?;
    Ok(legacy::snapshot(created))
}

/// Takes over a legacy installation with `5 + extra` ServiceMappings on the fresh control plane `cp`.
pub async fn takeover(cp: &ControlPlane, extra: usize) -> anyhow::Result<Takeover> {
    let admin = cp.admin().await?;
    let before = legacy_cluster(&admin, extra).await?;
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

/// The takeover table.
pub fn render(t: &Takeover) -> String {
    let mut s = String::new();
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
