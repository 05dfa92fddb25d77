//! ServiceMappings: they belong to users. The controller aggregates them into a ConfigMap, marks
//! them as taken over (labels only, never the spec) and writes each one's `status.endpoint`.

use std::sync::Arc;

use cp_api::{ServiceMapping, names};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::Error;
use crate::desired::Resolved;

/// The aggregated ConfigMap must stay below the 1 MiB object limit; this leaves room for metadata.
pub const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024 - 64 * 1024;

/// Annotation recording that the operator took a mapping over.
pub const ADOPTED_ANNOTATION: &str = "connectivityproxy.sap.com/adopted-by";

/// Where on-premise systems reach a mapping: `<protocol>://<tunnel host>:<port>/<serviceId>`.
pub fn endpoint(m: &ServiceMapping, resolved: &Resolved, port: i32) -> String {
    format!(
        "{}://{}:{port}/{}",
        m.spec.kind.as_str().to_lowercase(),
        resolved.external_host,
        m.spec.service_id
    )
}

/// How many mapping writes run at once: adoption of thousands of mappings is bound by round trips.
const PARALLEL_WRITES: usize = 16;

/// Labels a mapping as taken over and writes its endpoint, each only when it differs, up to
/// [`PARALLEL_WRITES`] mappings at a time. Returns how many writes it made.
pub async fn reconcile_mappings(
    client: &Client,
    mappings: &[Arc<ServiceMapping>],
    resolved: &Resolved,
    port: i32,
) -> Result<usize, Error> {
    use futures::StreamExt;
    let api: Api<ServiceMapping> = Api::all(client.clone());
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    let results: Vec<Result<usize, Error>> = futures::stream::iter(mappings.iter().cloned())
        .map(|m| {
            let (api, pp) = (api.clone(), pp.clone());
            let resolved = resolved.clone();
            async move { reconcile_one(&api, &pp, &m, &resolved, port).await }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    results.into_iter().sum()
}

async fn reconcile_one(
    api: &Api<ServiceMapping>,
    pp: &PatchParams,
    m: &ServiceMapping,
    resolved: &Resolved,
    port: i32,
) -> Result<usize, Error> {
    let mut writes = 0;
    let name = m.name_any();
    let labelled = m.labels().get(names::LABEL_MODULE).map(String::as_str)
        == Some(names::MODULE_VALUE)
        && m.annotations().contains_key(ADOPTED_ANNOTATION);
    if !labelled {
        // Only metadata: the spec stays the user's.
        let body = json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": name,
                "labels": {names::LABEL_MODULE: names::MODULE_VALUE},
                "annotations": {ADOPTED_ANNOTATION: names::MANAGED_BY_VALUE}},
        });
        api.patch(&name, pp, &Patch::Apply(&body))
            .await
            .map_err(|e| Error::kube(format!("taking over ServiceMapping {name}"), e))?;
        writes += 1;
    }
    let want = endpoint(m, resolved, port);
    if m.status.as_ref().and_then(|s| s.endpoint.as_deref()) != Some(want.as_str()) {
        let body = json!({"apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": name}, "status": {"endpoint": want}});
        api.patch_status(&name, pp, &Patch::Apply(&body))
            .await
            .map_err(|e| {
                Error::kube(format!("writing the endpoint of ServiceMapping {name}"), e)
            })?;
        writes += 1;
    }
    Ok(writes)
}
