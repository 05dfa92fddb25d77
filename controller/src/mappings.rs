//! ServiceMappings: they belong to users. The controller aggregates them into a ConfigMap, marks
//! them as taken over (labels only, never the spec) and writes each one's `status.endpoint`.
//!
//! The webhook refuses a second mapping with the same key, but duplicates can still reach the store
//! (two webhook replicas admitting at once, the webhook down, a mapping edited while its twin was being
//! deleted). [`unique`] resolves them the same way every time: the oldest wins, the others are not
//! published and are reported.

use std::collections::HashMap;
use std::sync::Arc;

use cp_api::mapping::{MappingKeyRef, mapping_key_ref};
use cp_api::{ConnectivityProxy, ServiceMapping, names};
use kube::ResourceExt;
use kube::api::{Api, Patch};

use crate::Error;
use crate::desired::{Kind, Resolved};
use crate::gather::Facts;
use crate::writer::Partial;

/// The aggregated ConfigMap must stay below the 1 MiB object limit; this leaves room for metadata.
pub const MAX_CONFIGMAP_BYTES: usize = cp_api::mapping::MAPPINGS_BUDGET_BYTES;

use cp_api::keys::ADOPTED_ANNOTATION;

/// A ServiceMapping's status as the controller writes it: `None` removes the endpoint.
#[derive(Clone, Debug, serde::Serialize)]
struct Endpoint {
    endpoint: Option<String>,
}

/// A mapping that is not published because an older one has the same key.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    /// The mapping left out.
    pub loser: Arc<ServiceMapping>,
    /// The older mapping published under the same key.
    pub winner: Arc<ServiceMapping>,
}

impl Conflict {
    /// What is wrong and what to do, naming both mappings (never their content beyond the key).
    pub fn message(&self) -> String {
        let (loser, winner) = (self.loser.name_any(), self.winner.name_any());
        let s = &self.winner.spec;
        format!(
            "ServiceMapping {loser} is not published: the older ServiceMapping {winner} has the same type {} \
             subaccountId {:?} serviceId {:?} (compared without case and surrounding whitespace); \
             delete {loser} or change its serviceId",
            s.kind.as_str(),
            s.subaccount_id.as_deref().unwrap_or_default(),
            s.service_id
        )
    }
}

/// Age order: creationTimestamp (a mapping without one last), then name, then uid. Borrowed: a
/// reconcile compares thousands of these.
fn age(m: &ServiceMapping) -> (bool, Option<k8s_openapi::jiff::Timestamp>, &str, &str) {
    let created = m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (
        created.is_none(),
        created,
        name(m),
        m.metadata.uid.as_deref().unwrap_or_default(),
    )
}

fn name(m: &ServiceMapping) -> &str {
    m.metadata
        .name
        .as_deref()
        .or(m.metadata.generate_name.as_deref())
        .unwrap_or_default()
}

/// Splits `mappings` into those published (the oldest of each [`MappingKey`], in input order) and
/// the conflicts of the others (sorted by the losing mapping's name). Pure, and linear in the
/// number of mappings: one pass finds the oldest of each key, nothing is sorted but the conflicts.
///
/// [`MappingKey`]: cp_api::mapping::MappingKey
pub fn unique(mappings: &[Arc<ServiceMapping>]) -> (Vec<Arc<ServiceMapping>>, Vec<Conflict>) {
    let keys: Vec<MappingKeyRef> = mappings.iter().map(|m| mapping_key_ref(&m.spec)).collect();
    let mut oldest: HashMap<&MappingKeyRef, usize> = HashMap::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        match oldest.entry(key) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(i);
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if age(&mappings[i]) < age(&mappings[*e.get()]) {
                    e.insert(i);
                }
            }
        }
    }
    if oldest.len() == mappings.len() {
        return (mappings.to_vec(), Vec::new());
    }
    let mut published = Vec::with_capacity(oldest.len());
    let mut conflicts = Vec::new();
    for (i, (m, key)) in mappings.iter().zip(&keys).enumerate() {
        match oldest.get(key) {
            Some(&w) if w != i => conflicts.push(Conflict {
                loser: m.clone(),
                winner: mappings[w].clone(),
            }),
            _ => published.push(m.clone()),
        }
    }
    conflicts.sort_by(|a, b| name(&a.loser).cmp(name(&b.loser)));
    (published, conflicts)
}

/// The published mappings as the proxy's files: the text of each shard, and their bytes together.
#[derive(Clone, Debug, PartialEq)]
pub struct Shards {
    /// The JSON list of each shard, index by index ([`cp_api::names::MAPPING_SHARD_CONFIGMAPS`]).
    pub texts: Vec<String>,
    /// The bytes of all entries ([`cp_api::mapping::entry_bytes`] summed).
    pub bytes: usize,
}

/// Splits the `published` mappings across as many shards as their size needs, given the shard
/// ConfigMaps of `cr` that exist ([`cp_api::mapping::shards_for`]: the count does not flap).
pub fn shards(cr: &ConnectivityProxy, facts: &Facts, published: &[Arc<ServiceMapping>]) -> Shards {
    let ns = cr.namespace().unwrap_or_else(|| names::KYMA_SYSTEM.into());
    let live = names::MAPPING_SHARD_CONFIGMAPS
        .iter()
        .rposition(|n| {
            let key = (Kind::ConfigMap, Some(ns.clone()), n.to_string());
            facts.owned.contains_key(&key)
        })
        .map_or(1, |i| i + 1);
    let bytes = published
        .iter()
        .map(|m| cp_api::mapping::entry_bytes(name(m), &m.spec))
        .sum();
    let count = cp_api::mapping::shards_for(bytes, live);
    Shards {
        texts: cp_api::mapping::service_mappings_shards(published, count),
        bytes,
    }
}

/// Where on-premise systems reach a mapping: `<protocol>://<tunnel host>:<port>/<serviceId>`.
pub fn endpoint(m: &ServiceMapping, resolved: &Resolved, port: i32) -> String {
    endpoint_on(m, &resolved.external_host, port)
}

fn endpoint_on(m: &ServiceMapping, host: &str, port: i32) -> String {
    format!(
        "{}://{host}:{port}/{}",
        m.spec.kind.as_str().to_lowercase(),
        m.spec.service_id
    )
}

/// Whether `have` is the [`endpoint`] of `m` on `host` and `port`.
fn is_endpoint(have: &str, m: &ServiceMapping, host: &str, port: &str) -> bool {
    let kind = m.spec.kind.as_str();
    let protocol_matches = have
        .get(..kind.len())
        .is_some_and(|p| p.chars().eq(kind.chars().flat_map(char::to_lowercase)));
    protocol_matches
        && have
            .get(kind.len()..)
            .and_then(|r| r.strip_prefix("://"))
            .and_then(|r| r.strip_prefix(host))
            .and_then(|r| r.strip_prefix(':'))
            .and_then(|r| r.strip_prefix(port))
            .and_then(|r| r.strip_prefix('/'))
            == Some(m.spec.service_id.as_str())
}

/// How many mapping writes run at once: adoption of thousands of mappings is bound by round trips.
const PARALLEL_WRITES: usize = 16;

/// Labels a mapping as taken over and writes its endpoint, each only when it differs, up to
/// [`PARALLEL_WRITES`] mappings at a time; a mapping that is not published (`unpublished`, a
/// duplicate) is taken over too but advertises no endpoint. Returns how many writes it made.
pub async fn reconcile_mappings(
    writer: &crate::writer::Writer,
    published: &[Arc<ServiceMapping>],
    unpublished: &[Arc<ServiceMapping>],
    resolved: &Resolved,
    port: i32,
) -> Result<usize, Error> {
    use futures::StreamExt;
    let api: Api<ServiceMapping> = Api::all(writer.client().clone());
    // Collected first: a lazy iterator of closures held across the awaits makes the future's
    // lifetimes too general for the controller's `Send` bound.
    // Only the mappings that need a write are handed to the stream: in a steady state with 10,000
    // mappings none does, and a future per mapping cost more than the comparison.
    // The endpoints are compared piece by piece: formatting 10,000 of them per reconcile to find
    // that none changed cost more than the rest of the comparison.
    let mut all: Vec<(Arc<ServiceMapping>, Option<String>)> = Vec::new();
    let port_text = port.to_string();
    for m in published {
        let current = m.status.as_ref().and_then(|s| s.endpoint.as_deref());
        let advertised =
            current.is_some_and(|have| is_endpoint(have, m, &resolved.external_host, &port_text));
        if !(advertised && taken_over(m)) {
            all.push((m.clone(), Some(endpoint(m, resolved, port))));
        }
    }
    all.extend(
        unpublished
            .iter()
            .filter(|m| !up_to_date(m, None))
            .map(|m| (m.clone(), None)),
    );
    let results: Vec<Result<usize, Error>> = futures::stream::iter(all)
        .map(|(m, want)| {
            let api = api.clone();
            async move { reconcile_one(writer, &api, &m, want).await }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    results.into_iter().sum()
}

/// Whether mapping `m` is taken over (label and annotation) and advertises `want` as its endpoint.
fn up_to_date(m: &ServiceMapping, want: Option<&str>) -> bool {
    taken_over(m) && m.status.as_ref().and_then(|s| s.endpoint.as_deref()) == want
}

fn taken_over(m: &ServiceMapping) -> bool {
    m.labels().get(names::LABEL_MODULE).map(String::as_str) == Some(names::MODULE_VALUE)
        && m.annotations().contains_key(ADOPTED_ANNOTATION)
}

async fn reconcile_one(
    writer: &crate::writer::Writer,
    api: &Api<ServiceMapping>,
    m: &ServiceMapping,
    want: Option<String>,
) -> Result<usize, Error> {
    let mut writes = 0;
    let name = m.name_any();
    if !taken_over(m) {
        // Only metadata: the spec stays the user's.
        let meta = kube::api::ObjectMeta {
            labels: Some([(names::LABEL_MODULE.into(), names::MODULE_VALUE.into())].into()),
            annotations: Some([(ADOPTED_ANNOTATION.into(), names::MANAGED_BY_VALUE.into())].into()),
            ..Default::default()
        };
        let body = Partial::<Endpoint>::of::<ServiceMapping>(&name, meta, None);
        writer
            .write(
                api,
                &name,
                &Patch::Apply(&body),
                "taking the ServiceMapping over",
            )
            .await
            .map_err(|e| Error::kube(format!("taking over ServiceMapping {name}"), e))?;
        writes += 1;
    }
    let have = m.status.as_ref().and_then(|s| s.endpoint.as_deref());
    if have == want.as_deref() {
        return Ok(writes);
    }
    let body = Partial::of::<ServiceMapping>(
        &name,
        Default::default(),
        Some(Endpoint {
            endpoint: want.clone(),
        }),
    );
    // Removing it (whoever wrote it: an earlier publication, the legacy operator) takes a merge patch.
    let (patch, why) = match &want {
        Some(_) => (Patch::Apply(&body), "publishing the endpoint"),
        None => (
            Patch::Merge(&body),
            "not published: the endpoint is removed",
        ),
    };
    let result = writer
        .write_part(api, crate::writer::Part::Status, &name, &patch, why)
        .await;
    result.map_err(|e| Error::kube(format!("writing the endpoint of ServiceMapping {name}"), e))?;
    Ok(writes + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(name: &str, created: Option<&str>, uid: &str, service: &str) -> Arc<ServiceMapping> {
        let mut meta = json!({"name": name, "uid": uid});
        if let Some(c) = created {
            meta["creationTimestamp"] = json!(c);
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                "metadata": meta,
                "spec": {"type": "TCP", "subaccountId": "sub", "serviceId": service,
                    "internalAddress": "a:1"}
            }))
            .expect("mapping"),
        )
    }

    #[test]
    fn an_endpoint_is_recognised_without_formatting_it() {
        let mapping = m("a", None, "1", "erp.corp:443");
        let good = &endpoint_on(&mapping, "cp.example.com", 443);
        assert_eq!(good, "tcp://cp.example.com:443/erp.corp:443");
        assert!(is_endpoint(good, &mapping, "cp.example.com", "443"));
        for bad in [
            "",
            "tcp",
            "TCP://cp.example.com:443/erp.corp:443",
            "http://cp.example.com:443/erp.corp:443",
            "tcp://cp.example.com:4430/erp.corp:443",
            "tcp://cp.example.com:443/erp.corp:4430",
            "tcp://cp.example.org:443/erp.corp:443",
            "tcp://cp.example.com:443/",
            "tcp:/cp.example.com:443/erp.corp:443",
            "tcpé://cp.example.com:443/erp.corp:443",
        ] {
            assert!(
                !is_endpoint(bad, &mapping, "cp.example.com", "443"),
                "{bad:?}"
            );
        }
        assert!(!is_endpoint(good, &mapping, "cp.example.com", "444"));
    }

    fn names_of(ms: &[Arc<ServiceMapping>]) -> Vec<String> {
        ms.iter().map(|m| m.name_any()).collect()
    }

    #[test]
    fn the_oldest_mapping_of_a_key_wins_then_the_name() {
        let t1 = Some("2026-01-01T00:00:00Z");
        let t2 = Some("2026-01-02T00:00:00Z");
        // (what, mappings, published, (loser, winner) pairs)
        type Case<'a> = (
            &'a str,
            Vec<Arc<ServiceMapping>>,
            Vec<&'a str>,
            Vec<(&'a str, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "no duplicates",
                vec![m("b", t1, "1", "x"), m("a", t2, "2", "y")],
                vec!["b", "a"],
                vec![],
            ),
            (
                "older wins over a smaller name",
                vec![m("a", t2, "1", "x"), m("z", t1, "2", "x")],
                vec!["z"],
                vec![("a", "z")],
            ),
            (
                "same second: the name decides",
                vec![m("b", t1, "1", "x"), m("a", t1, "2", "x")],
                vec!["a"],
                vec![("b", "a")],
            ),
            (
                "case and whitespace do not make a key different",
                vec![m("a", t1, "1", "erp"), m("b", t2, "2", " ERP ")],
                vec!["a"],
                vec![("b", "a")],
            ),
            (
                "a mapping without a timestamp is the youngest",
                vec![m("a", None, "1", "x"), m("b", t2, "2", "x")],
                vec!["b"],
                vec![("a", "b")],
            ),
            (
                "three of a key: both younger ones lose to the oldest",
                vec![
                    m("c", t2, "3", "x"),
                    m("b", t1, "2", "x"),
                    m("a", t2, "1", "x"),
                ],
                vec!["b"],
                vec![("a", "b"), ("c", "b")],
            ),
        ];
        for (what, mappings, published, conflicts) in cases {
            let (got, lost) = unique(&mappings);
            assert_eq!(names_of(&got), published, "{what}");
            let pairs: Vec<(String, String)> = lost
                .iter()
                .map(|c| (c.loser.name_any(), c.winner.name_any()))
                .collect();
            let want: Vec<(String, String)> = conflicts
                .iter()
                .map(|(l, w)| (l.to_string(), w.to_string()))
                .collect();
            assert_eq!(pairs, want, "{what}");
            // Whatever the order they arrive in.
            let mut reversed = mappings.clone();
            reversed.reverse();
            let (again, _) = unique(&reversed);
            let mut a = names_of(&again);
            let mut b = names_of(&got);
            a.sort();
            b.sort();
            assert_eq!(a, b, "{what}: order independent");
        }
        let (_, lost) = unique(&[m("new", t2, "1", "x"), m("old", t1, "2", "x")]);
        let msg = lost[0].message();
        assert!(
            msg.contains("ServiceMapping new is not published")
                && msg.contains("older ServiceMapping old")
                && msg.contains("delete new"),
            "{msg}"
        );
    }
}
