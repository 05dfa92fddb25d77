//! Controller test scenarios on the shared control plane: one ConnectivityProxy per cluster is the
//! rule, so tests take turns ([`scenario`]) on a clean cluster with Istio, the BTP operator's CRDs, a
//! shoot-info domain and a running controller; and the steps they drive a CR through.
//!
//! These helpers panic on failure: they are for tests.

use std::time::Duration;

use cp_api::{ConnectivityProxy, State};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{Mutex, MutexGuard};

use crate::controller::ControllerProcess;
use crate::fixtures::{self, install_our_crds};
use crate::shared::control_plane;
use crate::{ControlPlane, manifest};

/// The namespace of the scenarios' CR.
pub const NS: &str = "kyma-system";
/// The cluster's domain in shoot-info.
pub const DOMAIN: &str = "c-123.kyma.example.com";
/// The name of the scenarios' CR (the Kyma default CR's).
pub const CR: &str = "connectivity-proxy";

static SCENARIO: Mutex<()> = Mutex::const_new(());

/// Everything a controller test needs. The test's turn lasts as long as its `Env`: a test that needs
/// only the client keeps it with `let admin = &scenario().await.admin;` (the `Env` lives to the end of
/// the block).
pub struct Env {
    /// The shared control plane.
    pub cp: std::sync::Arc<ControlPlane>,
    /// A cluster-admin client.
    pub admin: Client,
    /// The controller, started once per test binary.
    pub controller: &'static ControllerProcess,
    _turn: MutexGuard<'static, ()>,
}

/// Takes this test's turn, makes sure the cluster is clean, Istio is installed and shoot-info has a
/// domain, and that the controller runs.
pub async fn scenario() -> Env {
    // The group's turn first (it may wait for another group to end), then the scenario's.
    let cp = control_plane();
    let turn = SCENARIO.lock().await;
    let admin = cp.admin().await.expect("admin");
    install_our_crds(&admin).await;
    crate::cluster::ensure_namespace(&admin, NS)
        .await
        .expect("kyma-system");
    crate::cluster::ensure_namespace(&admin, "istio-system")
        .await
        .expect("istio-system");
    install_istio(&admin).await;
    install_btp(&admin).await;
    set_domain(&admin, Some(DOMAIN)).await;
    static CONTROLLER: crate::group::Slot<ControllerProcess> = crate::group::Slot::new();
    let controller = CONTROLLER
        .get_or_init(|| async {
            ControllerProcess::start(
                &control_plane(),
                "cp-controller",
                &["--resync-seconds=3", "--lease-seconds=6"],
            )
            .await
            .expect("controller starts")
        })
        .await;
    clean(&admin).await;
    Env {
        cp,
        admin,
        controller,
        _turn: turn,
    }
}

/// [`scenario`] with the default CR [`CR`] created in [`NS`].
pub async fn scenario_with_cr() -> Env {
    let env = scenario().await;
    create_default_cr(&env.admin, NS, CR).await;
    env
}

/// [`scenario_with_cr`] with the CR made Ready ([`make_ready`]).
pub async fn scenario_ready() -> Env {
    let env = scenario_with_cr().await;
    make_ready(&env.admin, NS, CR).await;
    env
}

/// For a group that runs its own controller: the operator's CRDs, `kyma-system` and the Istio
/// namespace, Istio's and the BTP operator's CRDs, and shoot-info with `domain`.
pub async fn prepare_cluster(admin: &Client, domain: &str) {
    install_our_crds(admin).await;
    for ns in [NS, cp_api::names::ISTIO_NAMESPACE] {
        crate::cluster::ensure_namespace(admin, ns)
            .await
            .expect("namespace");
    }
    install_istio(admin).await;
    install_btp(admin).await;
    set_domain(admin, Some(domain)).await;
}

/// Installs Istio's CRDs.
pub async fn install_istio(admin: &Client) {
    manifest::apply_file(admin, &fixtures::path(fixtures::ISTIO_CRDS), None)
        .await
        .expect("Istio CRDs");
}

/// Installs the BTP service operator's CRDs.
pub async fn install_btp(admin: &Client) {
    manifest::apply_file(admin, &fixtures::path(fixtures::BTP_CRDS), None)
        .await
        .expect("BTP CRDs");
}

/// Writes ConfigMap `kube-system/shoot-info` with `domain` (none: without one).
pub async fn set_domain(admin: &Client, domain: Option<&str>) {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let cm = fixtures::shoot_info(domain);
    let ssa = PatchParams::apply("cp-test").force();
    api.patch(cp_api::names::SHOOT_INFO, &ssa, &Patch::Apply(&cm))
        .await
        .expect("shoot-info");
}

/// Deletes every CR and ServiceMapping and waits until they are gone.
async fn clean(admin: &Client) {
    let maps: Api<cp_api::ServiceMapping> = Api::all(admin.clone());
    let _ = maps
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let all: Api<ConnectivityProxy> = Api::all(admin.clone());
    for cr in all.list(&ListParams::default()).await.expect("list").items {
        let api: Api<ConnectivityProxy> =
            Api::namespaced(admin.clone(), &cr.namespace().unwrap_or_default());
        let _ = api.delete(&cr.name_any(), &DeleteParams::default()).await;
    }
    let what = "no ConnectivityProxy and no ServiceMapping left";
    crate::wait::until(what, Duration::from_secs(30), || async {
        let n = crate::wait::list(&all).await?.items.len();
        let m = crate::wait::list(&maps).await?.items.len();
        Ok((n == 0 && m == 0).then_some(()))
    })
    .await
    .expect("clean cluster");
}

/// Creates the Kyma default CR (webhook-less: the controller uses the release's deployment defaults).
pub async fn create_default_cr(admin: &Client, ns: &str, name: &str) -> ConnectivityProxy {
    Api::<ConnectivityProxy>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &fixtures::default_connectivity_proxy(name),
        )
        .await
        .expect("create CR")
}

/// Deletes the CRDs `crds` (e.g. Istio's), creates the default CR [`CR`] in [`NS`] and waits (15 s)
/// until it is in Warning with `reason`; returns its status description.
pub async fn default_cr_without_crds(admin: &Client, crds: &[&str], reason: &str) -> String {
    for crd in crds {
        crate::manifest::delete_crd(admin, crd)
            .await
            .unwrap_or_else(|e| panic!("delete CRD {crd}: {e:?}"));
    }
    create_default_cr(admin, NS, CR).await;
    cr_warning(admin, reason, 15).await
}

/// Waits (`secs` seconds) until the scenarios' CR ([`NS`]/[`CR`]) is in `state` with `reason` in
/// some condition (`None`: any); returns it.
pub async fn cr_state<'a>(
    admin: &Client,
    state: State,
    reason: impl Into<Option<&'a str>>,
    secs: u64,
) -> ConnectivityProxy {
    let within = Duration::from_secs(secs);
    wait_state(admin, NS, CR, state, reason.into(), within).await
}

/// Waits (`secs` seconds) until the scenarios' CR is in Warning with `reason` ([`cr_state`]); returns
/// its status description.
pub async fn cr_warning<'a>(
    admin: &Client,
    reason: impl Into<Option<&'a str>>,
    secs: u64,
) -> String {
    description(&cr_state(admin, State::Warning, reason, secs).await)
}

/// The CR's status description (empty without one).
pub fn description(cr: &ConnectivityProxy) -> String {
    cr.status
        .as_ref()
        .and_then(|s| s.description.clone())
        .unwrap_or_default()
}

/// Waits until the CR reports `state` with `reason` in some condition; returns it.
pub async fn wait_state(
    admin: &Client,
    ns: &str,
    name: &str,
    state: State,
    reason: Option<&str>,
    within: Duration,
) -> ConnectivityProxy {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), ns);
    crate::wait::until(
        &format!("{ns}/{name} in state {state} ({reason:?})"),
        within,
        || async {
            let cr = api.get(name).await.map_err(|e| e.to_string())?;
            let st = cr.status.clone().unwrap_or_default();
            let reason_ok = reason.is_none_or(|r| st.conditions.iter().any(|c| c.reason == r));
            if st.state == Some(state) && reason_ok {
                Ok(Some(cr))
            } else {
                Err(format!(
                    "status is {:?}: {:?}; conditions {:?}",
                    st.state,
                    st.description,
                    st.conditions
                        .iter()
                        .map(|c| (&c.type_, &c.status, &c.reason))
                        .collect::<Vec<_>>()
                ))
            }
        },
    )
    .await
    .expect("state reached")
}

/// Plays the kubelet and the StatefulSet controller: marks the StatefulSet's replicas ready.
pub async fn mark_statefulset_ready(admin: &Client, ns: &str) {
    let what = "StatefulSet connectivity-proxy ready";
    crate::wait::until(what, Duration::from_secs(10), || async move {
        crate::fakes::mark_statefulset_ready(admin, ns)
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await
    .expect("StatefulSet");
}

/// A ServiceMapping created as admin.
pub async fn create_mapping(admin: &Client, name: &str) {
    let m = fixtures::service_mapping(
        name,
        json!({"type": "TCP", "serviceId": name, "internalAddress": "svc.ns:80"}),
    );
    Api::<cp_api::ServiceMapping>::all(admin.clone())
        .create(&PostParams::default(), &m)
        .await
        .expect("mapping");
}

/// Plays the SAP BTP service operator: marks the CR's ServiceBinding Ready and writes its Secret.
pub async fn play_btp_operator(admin: &Client, ns: &str, cr: &str) {
    crate::fakes::play_btp_operator(admin, ns, cr, SUBACCOUNT, SUBDOMAIN)
        .await
        .expect("BTP operator played");
}

/// The subaccount of the scenarios' service key.
pub const SUBACCOUNT: &str = "11111111-2222-3333-4444-555555555555";
/// The subaccount subdomain of the scenarios' service key.
pub const SUBDOMAIN: &str = "my-subdomain";

/// Plays the BTP operator, and the StatefulSet controller with its kubelets (which observe every
/// new generation of the StatefulSet), until the CR is Ready.
pub async fn make_ready(admin: &Client, ns: &str, cr: &str) {
    play_btp_operator(admin, ns, cr).await;
    play_until_ready(admin, ns, cr).await;
}

/// Plays the StatefulSet controller and its kubelets until the CR is Ready.
pub async fn play_until_ready(admin: &Client, ns: &str, cr: &str) {
    crate::fakes::play_until_ready(admin, ns, cr, None, Duration::from_secs(20))
        .await
        .expect("Ready");
}

/// A user's edit of `spec.config.servers.proxy.http.port` (a merge patch).
pub async fn set_http_port(admin: &Client, ns: &str, cr: &str, port: i64) {
    let edit = json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": port}}}}}});
    edit_cr(
        admin,
        ns,
        cr,
        &edit,
        "edit spec.config.servers.proxy.http.port",
    )
    .await;
}

/// A user's merge patch `edit` of the CR `ns/cr`; panics with `what` if the API server refuses it.
pub async fn edit_cr(
    admin: &Client,
    ns: &str,
    cr: &str,
    edit: &serde_json::Value,
    what: &str,
) -> ConnectivityProxy {
    Api::<ConnectivityProxy>::namespaced(admin.clone(), ns)
        .patch(cr, &PatchParams::default(), &Patch::Merge(edit))
        .await
        .expect(what)
}

/// `onpremise_proxy_http_port` as ConfigMap `connectivity-proxy-info` (of `cms`) publishes it (empty
/// without one).
pub async fn info_http_port(cms: &Api<ConfigMap>) -> Result<String, String> {
    let info = crate::wait::get(cms, "connectivity-proxy-info").await?;
    Ok(info
        .data
        .and_then(|d| d.get("onpremise_proxy_http_port").cloned())
        .unwrap_or_default())
}

/// What ConfigMap `connectivity-proxy-service-mappings` and its shards in `ns` publish: one JSON list
/// of their entries, sorted by name (exactly the first ConfigMap's value while there is one shard;
/// empty without one); a failed read is the `Err` of a wait's check.
pub async fn published_mappings(admin: &Client, ns: &str) -> Result<String, String> {
    use cp_api::names::{MAPPING_SHARD_KEYS, mapping_shard};
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    // One list: the shards, by index.
    let mut shards: Vec<(usize, ConfigMap)> = crate::wait::list(&cms)
        .await?
        .items
        .into_iter()
        .filter_map(|cm| Some((mapping_shard(cm.metadata.name.as_deref()?)?, cm)))
        .collect();
    shards.sort_by_key(|(i, _)| *i);
    if shards.first().map(|(i, _)| *i) != Some(0) {
        return Err(format!(
            "no ConfigMap {} yet",
            cp_api::names::CONFIGMAP_SERVICE_MAPPINGS
        ));
    }
    let mut texts: Vec<String> = shards
        .into_iter()
        .map(|(i, cm)| {
            cm.data
                .unwrap_or_default()
                .remove(MAPPING_SHARD_KEYS[i])
                .unwrap_or_default()
        })
        .collect();
    if texts.len() == 1 {
        return Ok(texts.remove(0));
    }
    let mut entries: Vec<serde_json::Value> = Vec::new();
    for text in &texts {
        let list: Vec<serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| format!("a mapping shard is not a JSON list: {e}"))?;
        entries.extend(list);
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    serde_json::to_string(&entries).map_err(|e| e.to_string())
}

/// The proxy's configuration file `connectivity-proxy-config.yml` in ConfigMap `cm` (empty without
/// one).
pub fn proxy_config_yml(cm: ConfigMap) -> String {
    cm.data
        .unwrap_or_default()
        .get("connectivity-proxy-config.yml")
        .cloned()
        .unwrap_or_default()
}

/// Waits until ConfigMap `connectivity-proxy-info` publishes `port`; while it does not, says which
/// port and generation the CR holds and which generation the controller observed.
pub async fn wait_info_port(
    admin: &Client,
    ns: &str,
    cr: &str,
    port: i64,
    what: &str,
    within: Duration,
) {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), ns);
    crate::wait::until(what, within, || async {
        let got = info_http_port(&cms).await?;
        if got == port.to_string() {
            return Ok(Some(()));
        }
        let c = crs.get(cr).await.map_err(|e| e.to_string())?;
        let spec_port = serde_json::to_value(&c.spec).unwrap_or_default()["config"]["servers"]
            ["proxy"]["http"]["port"]
            .clone();
        Err(format!(
            "onpremise_proxy_http_port is {got:?}; the CR (generation {:?}, observed {:?}) has port {spec_port}",
            c.metadata.generation,
            c.status.and_then(|s| s.observed_generation)
        ))
    })
    .await
    .expect(what);
}

/// The `v1` resource `kind` (plural `plural`) of API group `group` (`""`: the core group).
pub fn v1_resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: if group.is_empty() {
            "v1".into()
        } else {
            format!("{group}/v1")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Waits until the CR's `status.keptDeploymentFields` is `expected` (the fields an upgrade kept).
pub async fn wait_kept_deployment_fields(
    api: &kube::Api<cp_api::ConnectivityProxy>,
    name: &str,
    expected: &[&str],
) -> anyhow::Result<()> {
    crate::wait::until_object(
        api,
        name,
        "the status names the kept fields",
        std::time::Duration::from_secs(60),
        |cr| {
            let kept = cr.status.unwrap_or_default().kept_deployment_fields;
            if kept == expected {
                Ok(Some(()))
            } else {
                Err(format!("{kept:?}"))
            }
        },
    )
    .await
}
