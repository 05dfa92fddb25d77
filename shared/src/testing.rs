//! Test objects, built one way for every crate's tests and the benchmarks (feature `testing`): the
//! module's default CR, CRs from a spec, ServiceMappings. No test writes a whole CR spec by hand; a test
//! states only what differs from [`default_spec_json`].
//!
//! These builders panic on an invalid object: they are for tests.

use serde_json::{Value, json};

use crate::{ConnectivityProxy, ConnectivityProxySpec, ServiceMapping, names};

/// Name of the module's CR.
pub const CR_NAME: &str = "connectivity-proxy";

/// The module's default CR's spec (`manifests/default-cr.yaml`), as JSON: every value the operator
/// can derive is `auto-provision`.
pub fn default_spec_json() -> Value {
    crate::defaults::kyma_default_spec()
}

/// [`default_spec_json`] typed.
pub fn default_spec() -> ConnectivityProxySpec {
    spec(default_spec_json())
}

/// A spec from JSON.
pub fn spec(v: Value) -> ConnectivityProxySpec {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("test spec {v}: {e}"))
}

/// [`default_spec_json`] with the JSON merge patch `patch` applied (RFC 7386: `null` removes).
pub fn default_spec_with(patch: Value) -> Value {
    let mut v = default_spec_json();
    json_patch::merge(&mut v, &patch);
    v
}

/// The default spec with an inline service key in `secretData` and the Secret name of the CRD's
/// default (a user-provided key rather than an auto-provisioned binding).
pub fn spec_with_key(secret_data: &str) -> Value {
    default_spec_with(
        json!({"secretConfig": {"integration": {"connectivityService": {
        "secretName": names::SECRET_SERVICE_KEY, "secretData": secret_data}}}}),
    )
}

/// `kyma-system/connectivity-proxy` (uid `u-1`) with `spec`.
pub fn cr(spec: Value) -> ConnectivityProxy {
    named_cr(names::KYMA_SYSTEM, CR_NAME, spec)
}

/// A ConnectivityProxy `namespace/name` with `spec`, as JSON and as a client sends it (no uid).
pub fn cr_json(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ConnectivityProxy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec
    })
}

/// A ConnectivityProxy `namespace/name` (uid `u-1`) with `spec`.
pub fn named_cr(namespace: &str, name: &str, spec: Value) -> ConnectivityProxy {
    let mut v = cr_json(namespace, name, spec);
    v["metadata"]["uid"] = json!("u-1");
    serde_json::from_value(v).unwrap_or_else(|e| panic!("test CR {namespace}/{name}: {e}"))
}

/// The module's default CR, `kyma-system/connectivity-proxy`.
pub fn default_cr() -> ConnectivityProxy {
    cr(default_spec_json())
}

/// A ServiceMapping named `name` with `spec` (JSON, e.g. `{"type": "TCP", "serviceId": ...}`).
pub fn service_mapping(name: &str, spec: Value) -> ServiceMapping {
    let typed = serde_json::from_value(spec.clone())
        .unwrap_or_else(|e| panic!("ServiceMapping spec {spec}: {e}"));
    ServiceMapping::new(name, typed)
}

/// A TCP ServiceMapping `name` for service id `service_id` in subaccount `sub`, pointing at
/// `<service_id>.default.svc:8080`.
pub fn tcp_mapping(name: &str, sub: &str, service_id: &str) -> ServiceMapping {
    service_mapping(
        name,
        json!({"type": "TCP", "subaccountId": sub, "serviceId": service_id,
               "internalAddress": format!("{service_id}.default.svc:8080")}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped default CR is the builders' default CR.
    #[test]
    fn the_shipped_default_cr_is_the_builders() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/default-cr.yaml");
        let text = std::fs::read_to_string(path).expect("manifests/default-cr.yaml");
        let shipped: Value = serde_norway::from_str(&text).expect("default-cr.yaml is YAML");
        assert_eq!(shipped["spec"], default_spec_json());
        assert_eq!(shipped["metadata"]["name"], CR_NAME);
        assert_eq!(shipped["metadata"]["namespace"], names::KYMA_SYSTEM);
    }

    #[test]
    fn default_spec_with_merges_and_removes() {
        let v =
            default_spec_with(json!({"config": {"tenantMode": "shared", "subaccountId": null}}));
        assert_eq!(v["config"]["tenantMode"], "shared");
        assert!(v["config"].get("subaccountId").is_none());
        assert_eq!(v["config"]["subaccountSubdomain"], names::AUTO_PROVISION);
    }
}
