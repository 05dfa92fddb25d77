//! The project's own test fixtures under `tests/fixtures/` (see its README): minimal third-party CRDs
//! and a legacy installation, written by this project, so a clone with nothing beside it runs and tests;
//! our CRDs from `manifests/`; and builders of the objects tests create (the default CR, ServiceMappings).
//!
//! The builders panic on a broken checkout (a manifest that does not parse): they are test fixtures.

use std::path::PathBuf;

use anyhow::Context;
use cp_api::ConnectivityProxy;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use serde_json::Value;

use crate::manifest;

/// Istio's Gateway, VirtualService, DestinationRule, EnvoyFilter and PeerAuthentication CRDs.
pub const ISTIO_CRDS: &str = "crds/istio.yaml";
/// The BTP service operator's ServiceInstance and ServiceBinding CRDs.
pub const BTP_CRDS: &str = "crds/btp-operator.yaml";
/// Gardener cert-management's Certificate CRD.
pub const GARDENER_CERT_CRD: &str = "crds/gardener-certificate.yaml";
/// cert-manager's Certificate CRD.
pub const CERT_MANAGER_CRD: &str = "crds/cert-manager-certificate.yaml";
/// Everything the legacy reconciler left in a cluster but its ServiceMapping webhook registration
/// ([`LEGACY_WEBHOOK`], applied once the mappings exist, as in a live cluster). Needs the Istio and
/// Gardener Certificate CRDs ([`LEGACY_CRDS`]).
pub const LEGACY_INSTALL: [&str; 10] = [
    "legacy-install/statefulset.yaml",
    "legacy-install/configmap.yaml",
    "legacy-install/configmap-info.yaml",
    "legacy-install/configmap-service-mappings.yaml",
    "legacy-install/workloads.yaml",
    "legacy-install/services.yaml",
    "legacy-install/istio.yaml",
    "legacy-install/secrets.yaml",
    "legacy-install/priorityclass.yaml",
    "legacy-install/gardener-certificate.yaml",
];
/// The legacy ServiceMapping validator's registration (`failurePolicy: Fail`, its Service has no
/// endpoints here: while it exists every ServiceMapping write fails).
pub const LEGACY_WEBHOOK: &str = "legacy-install/webhook.yaml";
/// The third-party CRDs a legacy installation needs.
pub const LEGACY_CRDS: [&str; 3] = [ISTIO_CRDS, BTP_CRDS, GARDENER_CERT_CRD];
/// The legacy configuration ConfigMap alone.
pub const LEGACY_CONFIG: &str = "legacy-install/configmap.yaml";

/// Path of a file under `tests/fixtures/`.
pub fn path(rel: &str) -> PathBuf {
    crate::workspace_root().join("tests/fixtures").join(rel)
}

/// Path of a file under the project's `manifests/`.
pub fn manifest_path(rel: &str) -> PathBuf {
    crate::workspace_root().join("manifests").join(rel)
}

/// The module's default CR as shipped (`manifests/default-cr.yaml`).
pub fn default_cr_path() -> PathBuf {
    manifest_path("default-cr.yaml")
}

/// Our CRDs, under `manifests/`.
pub const OUR_CRDS: [&str; 2] = [
    "crds/connectivityproxies.connectivityproxy.sap.com.yaml",
    "crds/servicemappings.connectivityproxy.sap.com.yaml",
];

/// Applies our CRDs ([`OUR_CRDS`], server-side).
pub async fn apply_our_crds(client: &Client) -> anyhow::Result<()> {
    for f in OUR_CRDS {
        manifest::apply_file(client, &manifest_path(f), None)
            .await
            .with_context(|| format!("applying {f}"))?;
    }
    Ok(())
}

/// Applies our CRDs once per test group (into its shared control plane); panics if they do not apply.
pub async fn install_our_crds(client: &Client) {
    static DONE: crate::group::Slot<()> = crate::group::Slot::new();
    DONE.get_or_init(|| async {
        apply_our_crds(client)
            .await
            .unwrap_or_else(|e| panic!("our CRDs: {e:#}"))
    })
    .await;
}

/// The module's default CR as shipped, metadata included: the first document of
/// [`default_cr_path`], as JSON.
pub fn shipped_default_cr() -> Value {
    let path = default_cr_path();
    let yaml = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_norway::from_str(yaml.split("\n---").next().unwrap_or(&yaml))
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The Kyma default CR named `name`, without a namespace (it takes the one it is created in), as JSON.
pub fn default_cr(name: &str) -> Value {
    let mut v = shipped_default_cr();
    v["metadata"] = serde_json::json!({"name": name});
    v
}

/// [`default_cr`] as a `DynamicObject` (for an `Api<DynamicObject>`).
pub fn default_cr_object(name: &str) -> kube::api::DynamicObject {
    serde_json::from_value(default_cr(name))
        .unwrap_or_else(|e| panic!("the default CR is not an object: {e}"))
}

/// The ConnectivityProxies of namespace `ns` as `DynamicObject`s, through `client`: for objects the
/// typed CR cannot hold (invalid ones admission refuses) and [`default_cr_object`]s.
pub fn dynamic_crs(client: &Client, ns: &str) -> kube::Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::erase::<ConnectivityProxy>(&());
    kube::Api::namespaced_with(client.clone(), ns, &ar)
}

/// The ServiceMappings as `DynamicObject`s, through `client` ([`service_mapping_json`]).
pub fn dynamic_mappings(client: &Client) -> kube::Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::erase::<cp_api::ServiceMapping>(&());
    kube::Api::all_with(client.clone(), &ar)
}

/// [`default_cr`] typed.
pub fn default_connectivity_proxy(name: &str) -> ConnectivityProxy {
    serde_json::from_value(default_cr(name))
        .unwrap_or_else(|e| panic!("the default CR is not a ConnectivityProxy: {e}"))
}

pub use cp_api::testing::{service_mapping, tcp_mapping};

/// A ServiceMapping `name` with `spec` as JSON (apiVersion, kind, metadata.name, spec): for specs the
/// typed [`service_mapping`] cannot hold (the invalid ones admission refuses) and for `DynamicObject`s.
pub fn service_mapping_json(name: &str, spec: Value) -> Value {
    serde_json::json!({"apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {"name": name}, "spec": spec})
}

/// An Opaque Secret `name` (without a namespace: it takes the one it is created in) with
/// `string_data` (a JSON object of strings).
pub fn secret(name: &str, string_data: Value) -> Secret {
    serde_json::from_value(secret_json(name, string_data))
        .unwrap_or_else(|e| panic!("Secret {name}: {e}"))
}

/// [`secret`] as JSON.
pub fn secret_json(name: &str, string_data: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": string_data})
}

/// A ConfigMap `name` (without a namespace) with `data` (a JSON object of strings), as JSON.
pub fn config_map(name: &str, data: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

/// The name of the operator's ConfigMap in kyma-system that names the identities the webhook privileges.
pub const OPERATOR_CONFIG: &str = "connectivity-proxy-operator-config";

/// The operator's ConfigMap `kyma-system/`[`OPERATOR_CONFIG`] with `data` (e.g.
/// `{"privilegedUsers": ..., "privilegedGroups": ...}`), as JSON.
pub fn operator_config(data: Value) -> Value {
    let mut cm = config_map(OPERATOR_CONFIG, data);
    cm["metadata"]["namespace"] = cp_api::names::KYMA_SYSTEM.into();
    cm
}

/// Gardener's ConfigMap `kube-system/shoot-info` naming the cluster's `domain` (none: without one), as
/// JSON.
pub fn shoot_info(domain: Option<&str>) -> Value {
    let data = domain.map(|d| serde_json::json!({"domain": d}));
    let mut cm = config_map(
        cp_api::names::SHOOT_INFO,
        data.unwrap_or(serde_json::json!({})),
    );
    cm["metadata"]["namespace"] = cp_api::names::SHOOT_INFO_NAMESPACE.into();
    cm
}

/// Applies fixture files (server-side) and waits for any CRDs among them to be established.
pub async fn apply(client: &Client, files: &[&str], namespace: Option<&str>) -> anyhow::Result<()> {
    for f in files {
        manifest::apply_file(client, &path(f), namespace)
            .await
            .with_context(|| format!("applying fixture tests/fixtures/{f}"))?;
    }
    Ok(())
}

/// The absolute path of the dashboard form item `item` (its `path`) in a form group at `prefix` (`""`:
/// the top level).
pub fn form_item_path(prefix: &str, item: &Value) -> String {
    let path = item["path"].as_str().unwrap_or_default();
    if prefix.is_empty() {
        path.to_string()
    } else {
        format!("{prefix}.{path}")
    }
}
