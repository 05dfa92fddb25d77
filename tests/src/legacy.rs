//! A legacy reconciler installation (the reference fixtures plus the other objects the reconciler
//! left), and the checks that a takeover lost nothing.
//!
//! The `legacy_cluster`, `assert_*`, `wait_*` and other test steps panic on failure: they are for tests.
//! [`install`], [`register_webhook`] and the builders serve the bench too.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use cp_api::{ConnectivityProxy, ServiceMapping};
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::ensure_namespace;
use crate::fixtures::{self, install_our_crds};
use crate::manifest;

/// The namespace of the legacy installation (and of the CR that takes it over).
pub const NS: &str = "kyma-system";
/// The cluster's domain in shoot-info.
pub const DOMAIN: &str = "legacy.kyma.example.com";

/// uid and spec of each ServiceMapping, by name.
pub type MappingSnapshot = BTreeMap<String, (String, serde_json::Value)>;

/// The [`MappingSnapshot`] of `mappings` (as stored: with their uids).
pub fn snapshot(mappings: impl IntoIterator<Item = ServiceMapping>) -> MappingSnapshot {
    mappings
        .into_iter()
        .map(|m| {
            let spec = serde_json::to_value(&m.spec).expect("a ServiceMapping spec is JSON");
            (m.name_any(), (m.uid().unwrap_or_default(), spec))
        })
        .collect()
}

/// The `i`-th ServiceMapping of a legacy installation: an RFC mapping with a user's label.
pub fn mapping(i: usize) -> ServiceMapping {
    let mut m = fixtures::service_mapping(
        &format!("legacy-mapping-{i}"),
        json!({"type": "RFC", "serviceId": format!("erp-{i}"), "subaccountId": "00000000-0000-0000-0000-000000000000",
            "internalAddress": format!("erp-{i}.erp:3300"), "locationIds": ["loc1"]}),
    );
    m.metadata.labels = Some([("owner".to_string(), "team-erp".to_string())].into());
    m
}

/// Installs a legacy installation but its ServiceMappings and its ServiceMapping validator: the
/// third-party CRDs it needs, the namespaces, shoot-info with [`DOMAIN`], the reconciler's objects.
pub async fn install(admin: &Client) -> anyhow::Result<()> {
    fixtures::apply(admin, &fixtures::LEGACY_CRDS, None).await?;
    for ns in [NS, "istio-system"] {
        ensure_namespace(admin, ns).await?;
    }
    manifest::apply_json(admin, fixtures::shoot_info(Some(DOMAIN)), None)
        .await
        .context("shoot-info")?;
    fixtures::apply(admin, &fixtures::LEGACY_INSTALL, Some(NS)).await
}

/// Registers the legacy ServiceMapping validator: as in a live cluster, once the mappings exist.
pub async fn register_webhook(admin: &Client) -> anyhow::Result<()> {
    fixtures::apply(admin, &[fixtures::LEGACY_WEBHOOK], None).await
}

/// How a migration test starts: the shared control plane, a cluster-admin client, and a legacy
/// installation in it ([`legacy_cluster`], whose mappings as they were come third).
pub async fn legacy_control_plane() -> (std::sync::Arc<crate::ControlPlane>, Client, MappingSnapshot)
{
    let cp = crate::shared::control_plane();
    let admin = cp.admin().await.expect("admin");
    let before = legacy_cluster(&admin).await;
    (cp, admin, before)
}

/// Installs our CRDs and a legacy installation with five ServiceMappings; returns the mappings as they
/// were.
pub async fn legacy_cluster(admin: &Client) -> MappingSnapshot {
    install_our_crds(admin).await;
    install(admin)
        .await
        .unwrap_or_else(|e| panic!("legacy installation: {e:#}"));
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let mut created = Vec::new();
    for i in 0..5 {
        created.push(
            api.create(&PostParams::default(), &mapping(i))
                .await
                .expect("legacy mapping"),
        );
    }
    register_webhook(admin)
        .await
        .expect("legacy webhook registration");
    snapshot(created)
}

/// The backup of `ns/name` written by the CR's current takeover.
async fn backup_of(admin: &Client, name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
    let cr: ConnectivityProxy = Api::namespaced(admin.clone(), NS)
        .get("connectivity-proxy")
        .await
        .expect("CR");
    let id = cr
        .annotations()
        .get(cp_api::keys::TAKEOVER_ID_ANNOTATION)
        .cloned()
        .expect("takeover id on the CR");
    let backups: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), cp_api::keys::BACKUP_NAMESPACE);
    let b = backups
        .get(&cp_api::keys::backup_name(name, &id))
        .await
        .unwrap_or_else(|e| panic!("backup of {name} for takeover {id}: {e}"));
    assert_eq!(
        b.annotations()
            .get(cp_api::keys::BACKUP_OF_ANNOTATION)
            .map(String::as_str),
        Some(format!("{NS}/{name}").as_str())
    );
    b
}

/// No object of the legacy installation is left: each object of the legacy fixtures (read from the
/// files, not from the controller's list, so that an object the controller forgets is caught) is gone
/// or (same-name objects) the operator's; in shared tenant mode the user's service key is kept.
pub async fn assert_nothing_legacy_left(admin: &Client, shared_key_kept: bool) {
    use kube::core::GroupVersionKind;
    use kube::discovery::{Scope, pinned_kind};
    let adopted = [
        ("ConfigMap", cp_api::names::CONFIGMAP_CONFIG),
        ("ConfigMap", cp_api::names::CONFIGMAP_INFO),
        ("ConfigMap", cp_api::names::CONFIGMAP_SERVICE_MAPPINGS),
        ("PriorityClass", cp_api::names::PRIORITY_CLASS),
    ];
    let mut left = Vec::new();
    let files = fixtures::LEGACY_INSTALL
        .iter()
        .chain([&fixtures::LEGACY_WEBHOOK]);
    for file in files {
        let text = std::fs::read_to_string(fixtures::path(file)).expect("legacy fixture");
        for o in manifest::parse_documents(&text).expect("legacy fixture parses") {
            let types = o
                .types
                .clone()
                .expect("fixture objects have apiVersion and kind");
            let (group, version) = match types.api_version.split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (String::new(), types.api_version.clone()),
            };
            let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
            let (ar, caps) = pinned_kind(admin, &gvk).await.expect("discovery");
            let name = o.name_any();
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => {
                    Api::namespaced_with(admin.clone(), o.namespace().as_deref().unwrap_or(NS), &ar)
                }
                Scope::Cluster => Api::all_with(admin.clone(), &ar),
            };
            let Some(o) = api.get_opt(&name).await.expect("get") else {
                continue;
            };
            let ours = o
                .labels()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str)
                == Some("connectivity-proxy-operator");
            let legacy_label = o
                .labels()
                .contains_key("reconciler.kyma-project.io/managed-by");
            let ok = if types.kind == "Secret" && name == "connectivity-proxy-service-key" {
                ours || shared_key_kept
            } else if adopted.contains(&(types.kind.as_str(), name.as_str())) {
                ours && !legacy_label
            } else {
                ours
            };
            if !ok {
                left.push(format!("{} {name}", types.kind));
            }
        }
    }
    assert!(left.is_empty(), "legacy objects left: {left:?}");
}

/// Everything the takeover must have achieved.
pub async fn assert_taken_over(admin: &Client, before: &MappingSnapshot, http_port: i64) {
    let cr: ConnectivityProxy = Api::namespaced(admin.clone(), NS)
        .get("connectivity-proxy")
        .await
        .expect("CR");
    let cfg = serde_json::to_value(&cr.spec.config).expect("json");
    assert_eq!(
        cfg["servers"]["businessDataTunnel"]["externalHost"], "cp.legacy.kyma.example.com",
        "legacy host imported"
    );
    assert_eq!(cfg["subaccountId"], "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f");
    assert_eq!(cfg["subaccountSubdomain"], "legacy-subdomain");
    assert_eq!(cfg["servers"]["proxy"]["http"]["port"], http_port);
    assert_eq!(cfg["servers"]["proxy"]["rfcAndLdap"]["port"], 20001);
    assert_eq!(cfg["servers"]["proxy"]["socks5"]["port"], 20004);
    assert_eq!(cfg["servers"]["proxy"]["socks5"]["enabled"], true);
    let ann = cr.annotations();
    assert_eq!(
        ann.get(cp_api::keys::MIGRATION_ANNOTATION)
            .map(String::as_str),
        Some("done")
    );
    assert!(
        ann.contains_key(cp_api::keys::IMPORTED_ANNOTATION),
        "the import is recorded"
    );

    let b = backup_of(admin, "connectivity-proxy").await;
    let original =
        std::fs::read_to_string(fixtures::path(fixtures::LEGACY_CONFIG)).expect("fixture");
    let original: serde_json::Value = serde_norway::from_str(&original).expect("yaml");
    assert_eq!(
        b.data
            .unwrap_or_default()
            .get("connectivity-proxy-config.yml")
            .map(String::as_str),
        original["data"]["connectivity-proxy-config.yml"].as_str(),
        "the backup holds the legacy config byte for byte"
    );
    backup_of(admin, "connectivity-proxy-info").await;

    let mappings: Api<ServiceMapping> = Api::all(admin.clone());
    for (name, (uid, spec)) in before {
        let m = mappings.get(name).await.expect("mapping survives");
        assert_eq!(
            m.uid().as_deref(),
            Some(uid.as_str()),
            "{name} was recreated"
        );
        assert_eq!(
            &serde_json::to_value(&m.spec).expect("json"),
            spec,
            "{name} spec changed"
        );
        assert_eq!(
            m.labels().get("kyma-project.io/module").map(String::as_str),
            Some("connectivity-proxy"),
            "{name} taken over"
        );
        assert_eq!(
            m.labels().get("owner").map(String::as_str),
            Some("team-erp"),
            "{name} user label kept"
        );
    }
    assert_nothing_legacy_left(admin, false).await;
    // ServiceMappings stay writable: the legacy validator (failurePolicy Fail) is gone.
    let fresh = fixtures::service_mapping(
        "after-takeover",
        json!({"type": "TCP", "serviceId": "after-takeover", "subaccountId": "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f",
            "internalAddress": "after.takeover:3300"}),
    );
    mappings
        .create(&PostParams::default(), &fresh)
        .await
        .expect("a ServiceMapping can be created after the takeover");
    mappings
        .delete("after-takeover", &Default::default())
        .await
        .expect("and deleted");
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), NS);
    let sts = sts.get("connectivity-proxy").await.expect("StatefulSet");
    assert_eq!(
        sts.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("connectivity-proxy-operator")
    );
    let cm: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), NS);
    let yml = crate::support::proxy_config_yml(cm.get("connectivity-proxy").await.expect("config"));
    assert!(
        yml.contains("externalHost: cp.legacy.kyma.example.com"),
        "{yml}"
    );
}

/// Creates the module's default CR.
pub async fn create_default_cr(admin: &Client) {
    Api::<ConnectivityProxy>::namespaced(admin.clone(), NS)
        .create(
            &PostParams::default(),
            &fixtures::default_connectivity_proxy("connectivity-proxy"),
        )
        .await
        .expect("create CR");
}

/// A step of the migration, told by the mark it leaves on the CR.
pub type Step = (&'static str, fn(&ConnectivityProxy) -> bool);

/// The migration's steps in order.
pub const STEPS: [Step; 3] = [
    ("migration started", |cr| {
        cr.annotations()
            .contains_key(cp_api::keys::MIGRATION_ANNOTATION)
    }),
    ("configuration imported", |cr| {
        cr.annotations()
            .contains_key(cp_api::keys::IMPORTED_ANNOTATION)
    }),
    ("migration done", |cr| {
        cr.annotations()
            .get(cp_api::keys::MIGRATION_ANNOTATION)
            .map(String::as_str)
            == Some("done")
    }),
];

/// Waits until the CR carries the mark of `step`; while it does not, shows the CR's status.
pub async fn wait_step(admin: &Client, (what, reached): Step, within: Duration) {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    crate::wait::until_object(&api, "connectivity-proxy", what, within, |cr| {
        if reached(&cr) {
            Ok(Some(()))
        } else {
            Err(format!("{:?}", cr.status.and_then(|s| s.description)))
        }
    })
    .await
    .expect(what);
}

/// Waits for the migration to finish, then plays the BTP operator and the kubelet until Ready.
pub async fn finish(admin: &Client) {
    wait_step(admin, STEPS[2], Duration::from_secs(30)).await;
    crate::support::make_ready(admin, NS, "connectivity-proxy").await;
}

/// Rewrites the legacy proxy's configuration file (`connectivity-proxy-config.yml` of ConfigMap
/// `connectivity-proxy`) with `edit` ([`edit_legacy_configmap`]).
pub async fn edit_legacy_config(admin: &Client, edit: impl Fn(&str) -> String) {
    edit_legacy_configmap(
        admin,
        "connectivity-proxy",
        "connectivity-proxy-config.yml",
        edit,
    )
    .await;
}

/// Sets `onpremise_proxy_http_port` of the legacy ConfigMap `connectivity-proxy-info` to `port`
/// ([`edit_legacy_configmap`]).
pub async fn set_legacy_info_port(admin: &Client, port: &str) {
    let key = "onpremise_proxy_http_port";
    edit_legacy_configmap(admin, "connectivity-proxy-info", key, |_| port.into()).await;
}

/// Rewrites the legacy ConfigMap `name`'s `key` with `edit` (the legacy installation changed by hand).
pub async fn edit_legacy_configmap(
    admin: &Client,
    name: &str,
    key: &str,
    edit: impl Fn(&str) -> String,
) {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), NS);
    let cm = api.get(name).await.expect("legacy ConfigMap");
    let old = cm
        .data
        .unwrap_or_default()
        .get(key)
        .cloned()
        .unwrap_or_default();
    let patch = json!({"data": {key: edit(&old)}});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("edit legacy ConfigMap");
}

/// Runs `cp-controller migrate-plan <args>` as an SRE with cluster-admin rights; returns the exit code
/// and stdout, and fails if the run wrote anything (audit log).
pub async fn migrate_plan(cp: &crate::ControlPlane, args: &[&str]) -> (i32, String) {
    let identity = crate::Identity::User {
        name: "sre-preview".into(),
        groups: vec!["system:masters".into()],
    };
    let kubeconfig = cp
        .write_kubeconfig("sre-preview.kubeconfig", &identity)
        .await
        .expect("kubeconfig");
    let offset = cp.audit_offset();
    let bin = crate::own_bin_dir().join("cp-controller");
    let out = tokio::process::Command::new(bin)
        .arg("migrate-plan")
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("cp-controller migrate-plan");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    // A marker write after the run: once the audit log holds it, it holds any write the run made.
    let admin = cp.admin().await.expect("admin");
    let marker = format!("audit-marker-{offset}");
    manifest::apply_json(
        &admin,
        fixtures::config_map(&marker, json!({})),
        Some("default"),
    )
    .await
    .expect("marker");
    let what = "the marker in the audit log";
    let all = crate::wait::until(what, Duration::from_secs(10), || async {
        let w = cp.audit_writes_since(offset).map_err(|e| e.to_string())?;
        Ok(w.iter().any(|w| w.name == marker).then_some(w))
    })
    .await
    .expect("audit log");
    let writes: Vec<_> = all
        .into_iter()
        .filter(|w| w.user == "sre-preview")
        .collect();
    assert!(writes.is_empty(), "migrate-plan wrote: {writes:?}");
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}
