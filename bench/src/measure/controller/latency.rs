//! How fast the controller reacts: a CR edit until the ConfigMap and the StatefulSet show it, and a
//! deleted managed object until it is back.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ConnectivityProxy, names};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde::Serialize;
use serde_json::json;

use crate::harness::report::{list_ms, yes_no};
use crate::harness::stats::{Percentiles, ms};
use crate::harness::watch::{wait_until, watch_one};
use crate::measure::controller::common::{CR, NS};

/// Edit → applied goal (p99, both the ConfigMap and the StatefulSet updated), issue #33.
const EDIT_P99_GOAL_MS: f64 = 50.0;
/// Drift repair goal (each sample), issue #33.
const DRIFT_GOAL_MS: f64 = 100.0;

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

/// How fast the controller puts back a managed object someone deleted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DriftRepair {
    /// Kind and name of the deleted object.
    pub object: String,
    /// Delete → the re-created object (a new uid) delivered by the bench's watch, per sample.
    pub ms: Vec<f64>,
}

pub async fn edit_latency(admin: &Client, edits: usize) -> anyhow::Result<EditLatency> {
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
        // The ConfigMap first, then the StatefulSet: the moment each showed the new port.
        let mut seen = [t0; 2];
        for (at, (w, object)) in seen.iter_mut().zip([
            (&mut info, format!("ConfigMap {}", names::CONFIGMAP_INFO)),
            (&mut sts, format!("StatefulSet {}", names::STATEFULSET)),
        ]) {
            let what = format!("edit {i}: port {port} in {object}");
            (*at, _) = wait_until(w, &what, timeout, |v| *v == Some(Some(port))).await?;
        }
        let [cm, st] = seen.map(|at| at.saturating_duration_since(t0));
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

/// Deletes each object `samples` times and times its return: the managed caches' watches wake the
/// reconcile, so the repair does not wait for the resync.
pub async fn drift_repair(admin: &Client, samples: usize) -> anyhow::Result<Vec<DriftRepair>> {
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

/// The edit table.
pub fn render_edit(e: &EditLatency) -> String {
    let mut s = String::new();
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
    s
}

/// The drift-repair table.
pub fn render_drift(drift: &[DriftRepair]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Drift repair\n\n\
         A managed object deleted by an admin, {} times each; from the delete until the bench's own watch \
         delivers the re-created object (a new uid). The controller's caches watch every managed kind, so the \
         repair does not wait for the resync (600 s).\n",
        drift.first().map(|d| d.ms.len()).unwrap_or(0)
    );
    let _ = writeln!(s, "| Deleted | ms each | max ms | Goal | Met |");
    let _ = writeln!(s, "|---|---|---:|---|---|");
    for d in drift {
        let max = d.ms.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | ≤ {DRIFT_GOAL_MS:.0} ms each | {} |",
            d.object,
            list_ms(&d.ms),
            max,
            yes_no(!d.ms.is_empty() && max <= DRIFT_GOAL_MS)
        );
    }
    s.push('\n');
    s
}
