//! The ServiceMappings every section creates, and what the controller aggregates of them.

use std::time::Duration;

use anyhow::Context;
use cp_api::{ServiceMapping, names};
use cp_tests::fixtures::service_mapping;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Concurrent ServiceMapping creations.
pub const IN_FLIGHT: usize = 16;

/// ServiceMapping `name` of type TCP with its name as serviceId.
pub fn tcp_mapping(name: &str) -> ServiceMapping {
    service_mapping(
        name,
        json!({"type": "TCP", "serviceId": name, "internalAddress": "h:80"}),
    )
}

/// Whether the controller has taken mapping `m` over: its module label and an endpoint in its status
/// (the controller's last writes for a new mapping).
pub fn adopted(m: &ServiceMapping) -> bool {
    m.labels().contains_key(names::LABEL_MODULE)
        && m.status
            .as_ref()
            .and_then(|s| s.endpoint.as_ref())
            .is_some()
}

/// ServiceMappings `m-00001` … `m-<n>` ([`tcp_mapping`]): what every section of the bench creates.
pub fn numbered_mappings(n: usize) -> Vec<ServiceMapping> {
    (1..=n).map(|i| tcp_mapping(&format!("m-{i:05}"))).collect()
}

/// Creates the mappings, [`IN_FLIGHT`] at a time, retrying transient failures; returns the created
/// objects (uid and spec as stored) and how many retries it took.
pub async fn create_mappings(
    admin: &Client,
    mappings: Vec<ServiceMapping>,
) -> anyhow::Result<(Vec<ServiceMapping>, usize)> {
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let results: Vec<anyhow::Result<(ServiceMapping, usize)>> = futures::stream::iter(mappings)
        .map(|m| {
            let api = api.clone();
            async move {
                let name = m.name_any();
                let mut attempt = 0;
                loop {
                    match api.create(&PostParams::default(), &m).await {
                        Ok(created) => return Ok((created, attempt)),
                        // An earlier attempt went through after all.
                        Err(kube::Error::Api(e)) if e.code == 409 && attempt > 0 => {
                            let got = api.get(&name).await.with_context(|| {
                                format!("reading ServiceMapping {name} after a retry")
                            })?;
                            return Ok((got, attempt));
                        }
                        // Transient (a timeout, a webhook restart): counted, not reported one by one.
                        Err(_) if attempt < 4 => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                        }
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("creating ServiceMapping {name}")));
                        }
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut created = Vec::with_capacity(results.len());
    let mut retries = 0;
    for r in results {
        let (m, attempts) = r?;
        created.push(m);
        retries += attempts;
    }
    Ok((created, retries))
}

/// Entries and bytes of the aggregated value in mapping ConfigMap `cm` (the first,
/// `connectivity-proxy-service-mappings`, or a shard; 0 entries while it is missing or not a JSON
/// array).
pub fn aggregated(cm: &ConfigMap) -> (usize, usize) {
    let value = cm.data.as_ref().and_then(|d| d.values().next());
    let entries = value
        .and_then(|v| serde_json::from_str::<Vec<serde::de::IgnoredAny>>(v).ok())
        .map(|v| v.len())
        .unwrap_or(0);
    (entries, value.map(String::len).unwrap_or(0))
}

/// Entries and bytes of all mapping ConfigMaps in `api`'s namespace together (the first,
/// `connectivity-proxy-service-mappings`, and its shards), as a watch sees them; `None` while the
/// first one is missing.
pub fn watch_shards(api: Api<ConfigMap>) -> super::watch::Watched<Option<(usize, usize)>> {
    use kube::runtime::watcher;
    let shards = std::collections::BTreeMap::<String, (usize, usize)>::new();
    super::watch::watch_fold(
        api,
        watcher::Config::default(),
        shards,
        None,
        |shards, event| {
            let is_shard = |cm: &ConfigMap| names::mapping_shard(&cm.name_any()).is_some();
            match event {
                watcher::Event::Init => shards.clear(),
                watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) if is_shard(&cm) => {
                    shards.insert(cm.name_any(), aggregated(&cm));
                }
                watcher::Event::Delete(cm) if is_shard(&cm) => {
                    shards.remove(&cm.name_any());
                }
                _ => return None,
            }
            shards
                .contains_key(names::CONFIGMAP_SERVICE_MAPPINGS)
                .then(|| {
                    shards
                        .values()
                        .fold((0, 0), |(e, b), (e2, b2)| (e + e2, b + b2))
                })
                .map(Some)
                .or(Some(None))
        },
    )
}
