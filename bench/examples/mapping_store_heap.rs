//! Heap of 10,000 cached ServiceMappings, for `valgrind --tool=massif`: `mapping_store_heap full|slim|compact`.
//! `full` keeps each mapping as the watch delivers it (managedFields of three managers, labels,
//! annotations, status); `slim` drops managedFields (the controller's cache); `compact` keeps name and
//! spec only (the webhook's cache).

use std::sync::Arc;

use cp_api::ServiceMapping;
use serde_json::json;

fn delivered(i: usize) -> serde_json::Value {
    let name = format!("m-{i:05}");
    let fields = |manager: &str, op: &str, sub: Option<&str>, f: serde_json::Value| {
        json!({"manager": manager, "operation": op, "apiVersion": "connectivityproxy.sap.com/v1",
               "time": "2026-11-29T23:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": f, "subresource": sub})
    };
    json!({
        "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {
            "name": name, "uid": format!("0d7c1f1e-4a55-4cf2-9c3a-{i:012}"), "resourceVersion": format!("{}", 1000 + i),
            "generation": 1, "creationTimestamp": "2026-11-29T23:00:00Z",
            "labels": {"kyma-project.io/module": "connectivity-proxy"},
            "annotations": {"connectivityproxy.sap.com/adopted-by": "connectivity-proxy-operator"},
            "managedFields": [
                fields("bench", "Update", None, json!({"f:spec": {".": {}, "f:internalAddress": {}, "f:serviceId": {}, "f:type": {}}})),
                fields("connectivity-proxy-operator", "Apply", None, json!({"f:metadata": {"f:annotations": {"f:connectivityproxy.sap.com/adopted-by": {}}, "f:labels": {"f:kyma-project.io/module": {}}}})),
                fields("connectivity-proxy-operator", "Apply", Some("status"), json!({"f:status": {"f:endpoint": {}}})),
            ]
        },
        "spec": {"type": "TCP", "serviceId": name, "internalAddress": "h:80"},
        "status": {"endpoint": format!("tcp://cp.example.com:443/{name}")}
    })
}

fn main() -> anyhow::Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "full".into());
    let mut store: Vec<Arc<ServiceMapping>> = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        let mut m: ServiceMapping = serde_json::from_value(delivered(i))?;
        match mode.as_str() {
            "slim" => cp_api::slim_for_cache(&mut m.metadata),
            "compact" => {
                m.metadata = kube::api::ObjectMeta {
                    name: m.metadata.name.take(),
                    ..Default::default()
                };
                m.status = None;
            }
            _ => {}
        }
        store.push(Arc::new(m));
    }
    println!("{mode}: {} mappings cached", store.len());
    Ok(())
}
