//! ServiceMappings: they belong to users. The controller aggregates them into a ConfigMap, marks
//! them as taken over (labels only, never the spec) and writes each one's `status.endpoint`.
//!
//! The webhook refuses a second mapping with the same key, but duplicates can still reach the store
//! (two webhook replicas admitting at once, the webhook down, a mapping edited while its twin was being
//! deleted). [`unique`] resolves them the same way every time: the oldest wins, the others are not
//! published and are reported.

use std::collections::HashMap;
use std::sync::Arc;

use cp_api::mapping::{MappingKey, mapping_key};
use cp_api::{ServiceMapping, names};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::Error;
use crate::desired::Resolved;

/// The aggregated ConfigMap must stay below the 1 MiB object limit; this leaves room for metadata.
pub const MAX_CONFIGMAP_BYTES: usize = cp_api::mapping::MAPPINGS_BUDGET_BYTES;

use cp_api::keys::ADOPTED_ANNOTATION;

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

/// Age order: creationTimestamp (a mapping without one last), then name, then uid.
fn age(m: &ServiceMapping) -> (bool, Option<k8s_openapi::jiff::Timestamp>, String, String) {
    let created = m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (
        created.is_none(),
        created,
        m.name_any(),
        m.metadata.uid.clone().unwrap_or_default(),
    )
}

/// Splits `mappings` into those published (the oldest of each [`MappingKey`], in input order) and
/// the conflicts of the others (sorted by the losing mapping's name). Pure.
pub fn unique(mappings: &[Arc<ServiceMapping>]) -> (Vec<Arc<ServiceMapping>>, Vec<Conflict>) {
    let mut by_age: Vec<(usize, &Arc<ServiceMapping>)> = mappings.iter().enumerate().collect();
    by_age.sort_by_cached_key(|(_, m)| age(m));
    let mut winners: HashMap<MappingKey, &Arc<ServiceMapping>> = HashMap::new();
    let mut published = vec![false; mappings.len()];
    let mut conflicts = Vec::new();
    for (i, m) in by_age {
        match winners.entry(mapping_key(&m.spec)) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(m);
                published[i] = true;
            }
            std::collections::hash_map::Entry::Occupied(e) => conflicts.push(Conflict {
                loser: m.clone(),
                winner: (*e.get()).clone(),
            }),
        }
    }
    conflicts.sort_by_key(|c| c.loser.name_any());
    let published = mappings
        .iter()
        .zip(published)
        .filter(|(_, p)| *p)
        .map(|(m, _)| m.clone())
        .collect();
    (published, conflicts)
}

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
/// [`PARALLEL_WRITES`] mappings at a time; a mapping that is not published (`unpublished`, a
/// duplicate) is taken over too but advertises no endpoint. Returns how many writes it made.
pub async fn reconcile_mappings(
    client: &Client,
    published: &[Arc<ServiceMapping>],
    unpublished: &[Arc<ServiceMapping>],
    resolved: &Resolved,
    port: i32,
) -> Result<usize, Error> {
    use futures::StreamExt;
    let api: Api<ServiceMapping> = Api::all(client.clone());
    let pp = PatchParams::apply(names::FIELD_MANAGER).force();
    // Collected first: a lazy iterator of closures held across the awaits makes the future's
    // lifetimes too general for the controller's `Send` bound.
    // Only the mappings that need a write are handed to the stream: in a steady state with 10,000
    // mappings none does, and a future per mapping cost more than the comparison.
    let mut all: Vec<(Arc<ServiceMapping>, Option<String>)> = Vec::new();
    for m in published {
        let want = endpoint(m, resolved, port);
        if !up_to_date(m, Some(&want)) {
            all.push((m.clone(), Some(want)));
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
            let (api, pp) = (api.clone(), pp.clone());
            async move { reconcile_one(&api, &pp, &m, want).await }
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
    api: &Api<ServiceMapping>,
    pp: &PatchParams,
    m: &ServiceMapping,
    want: Option<String>,
) -> Result<usize, Error> {
    let mut writes = 0;
    let name = m.name_any();
    if !taken_over(m) {
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
    let have = m.status.as_ref().and_then(|s| s.endpoint.as_deref());
    if have == want.as_deref() {
        return Ok(writes);
    }
    let result = match &want {
        Some(want) => {
            let body = json!({"apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                "metadata": {"name": name}, "status": {"endpoint": want}});
            api.patch_status(&name, pp, &Patch::Apply(&body)).await
        }
        // Whoever wrote it (an earlier publication, the legacy operator): a merge patch removes it.
        None => {
            let pp = PatchParams {
                field_manager: Some(names::FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let body = json!({"status": {"endpoint": null}});
            api.patch_status(&name, &pp, &Patch::Merge(&body)).await
        }
    };
    result.map_err(|e| Error::kube(format!("writing the endpoint of ServiceMapping {name}"), e))?;
    Ok(writes + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

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
