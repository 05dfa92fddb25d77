//! The realistic AdmissionReviews every webhook under test answers: the module's default CR.

use serde_json::{Value, json};

/// The module's default CR (`manifests/default-cr.yaml`) as JSON.
pub fn default_cr() -> anyhow::Result<Value> {
    let mut cr = cp_tests::fixtures::shipped_default_cr();
    cr["metadata"]["uid"] = json!("0d7c1f1e-4a55-4cf2-9c3a-6a1b2b4c5d6e");
    cr["metadata"]["creationTimestamp"] = json!("2026-11-01T00:00:00Z");
    Ok(cr)
}

/// The default CR with `spec.deployment` defaulted, as stored after admission.
pub fn defaulted_cr() -> anyhow::Result<Value> {
    let mut cr = default_cr()?;
    cr["spec"]["deployment"] = cp_api::defaults::deployment_defaults_value().clone();
    Ok(cr)
}

/// The uid of every review the bench sends.
pub const FIXED_UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

fn review(operation: &str, object: Value, old: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": "ConnectivityProxy"},
            "resource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": "connectivityproxies"},
            "requestKind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": "ConnectivityProxy"},
            "requestResource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": "connectivityproxies"},
            "name": "connectivity-proxy",
            "namespace": "kyma-system",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" }},
        }
    })
}

/// `/mutate`: a user creates the default CR without `spec.deployment`; the answer is a JSON patch
/// adding the defaults.
pub fn mutate_create() -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&review("CREATE", default_cr()?, None))?)
}

/// `/validate`: a user edits the defaulted CR's spec (`kubectl edit` of the HTTP proxy port, the edit
/// the controller bench makes too) without touching `spec.deployment`; the answer is allowed after
/// the protected-field check, the typed parse with unknown-field rejection and the cross-field rules.
pub fn validate_update() -> anyhow::Result<Vec<u8>> {
    let old = defaulted_cr()?;
    let mut new = old.clone();
    new["spec"]["config"]["servers"]["proxy"] = json!({"http": {"port": 20004}});
    Ok(serde_json::to_vec(&review("UPDATE", new, Some(old)))?)
}

/// `/validate`: a user switches service channels off in the defaulted CR while ServiceMappings
/// exist; the answer is a refusal that names how many and a few of them.
pub fn validate_channels_off() -> anyhow::Result<Vec<u8>> {
    let old = defaulted_cr()?;
    let mut new = old.clone();
    new["spec"]["config"]["serviceChannels"] = json!({"enabled": false});
    Ok(serde_json::to_vec(&review("UPDATE", new, Some(old)))?)
}

/// `/validate-servicemapping`: a user creates ServiceMapping `name` (TCP, serviceId `service_id`).
pub fn mapping_create(name: &str, service_id: &str) -> anyhow::Result<Vec<u8>> {
    let object = json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ServiceMapping",
        "metadata": {"name": name, "uid": "1b0f8c1e-4a55-4cf2-9c3a-6a1b2b4c5d6e", "creationTimestamp": "2026-11-01T00:00:00Z"},
        "spec": {"type": "TCP", "serviceId": service_id, "internalAddress": "backend.default:8080"}
    });
    let mut r = review("CREATE", object, None);
    r["request"]["kind"]["kind"] = json!("ServiceMapping");
    r["request"]["requestKind"]["kind"] = json!("ServiceMapping");
    r["request"]["resource"]["resource"] = json!("servicemappings");
    r["request"]["requestResource"]["resource"] = json!("servicemappings");
    r["request"]["name"] = json!(name);
    r["request"]["namespace"] = Value::Null;
    Ok(serde_json::to_vec(&r)?)
}
