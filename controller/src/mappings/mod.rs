//! ServiceMappings: they belong to users. The controller aggregates them into a ConfigMap, marks
//! them as taken over (labels only, never the spec) and writes each one's `status.endpoint`.
//!
//! The webhook refuses a second mapping with the same key, but duplicates can still reach the store
//! (two webhook replicas admitting at once, the webhook down, a mapping edited while its twin was being
//! deleted). [`unique`] resolves them the same way every time: the oldest wins, the others are not
//! published and are reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use cp_api::ServiceMapping;
use cp_api::names;
use kube::api::{Api, DynamicObject, Patch};

use crate::Error;
use crate::desired::{Kind, Resolved};
use crate::writer::Partial;

pub mod state;
pub mod watch;

pub use state::{Mapping, MappingState, Shard};

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
    pub loser: Arc<Mapping>,
    /// The older mapping published under the same key.
    pub winner: Arc<Mapping>,
}

impl Conflict {
    /// What is wrong and what to do, naming both mappings (never their content beyond the key).
    pub fn message(&self) -> String {
        let (loser, winner) = (self.loser.name(), self.winner.name());
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

/// The mapping shard ConfigMaps are written at most at about this many bytes per second: at 50,000
/// mappings the shards are megabytes, and a burst of new mappings (thousands a second through the
/// webhook) would otherwise rewrite all of them on every reconcile, each rewrite a new revision in
/// etcd. After a write of `b` bytes the next waits `b / SHARD_WRITE_BYTES_PER_SECOND` (none after a
/// small one: a single new mapping at 10,000 waits about a tenth of a second at most).
pub const SHARD_WRITE_BYTES_PER_SECOND: usize = 4 * 1024 * 1024;

/// When the mapping shards were last written and how many bytes: the pause before the next write.
#[derive(Debug, Default)]
pub struct ShardWrites(std::sync::Mutex<Option<(std::time::Instant, usize)>>);

impl ShardWrites {
    /// Records a write of `bytes` of shards at `at`.
    pub fn record(&self, at: std::time::Instant, bytes: usize) {
        if let Ok(mut last) = self.0.lock() {
            *last = Some((at, bytes));
        }
    }

    /// How long shard writes still wait at `now` (`None`: they may go out).
    pub fn hold(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let (at, bytes) = (*self.0.lock().ok()?)?;
        let pause =
            std::time::Duration::from_secs_f64(bytes as f64 / SHARD_WRITE_BYTES_PER_SECOND as f64);
        (at + pause)
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
    }
}

/// How many names of mappings the facts carry for messages (a blocked deletion lists up to 20).
pub const NAMES_LISTED: usize = 20;

/// The ServiceMappings as a reconcile decides from them: taken from the [`MappingState`] the watch
/// keeps (`gather`), the shards already split for the count the live shard ConfigMaps call for. Counts
/// and a few names, not the mappings: at 50,000 a reconcile must not copy them all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MappingFacts {
    /// How many mappings are published (the oldest of each key).
    pub published: usize,
    /// The mappings left out because an older one has the same key, sorted by the loser's name.
    pub conflicts: Vec<Conflict>,
    /// The [`NAMES_LISTED`] smallest names of all mappings, published or not, sorted.
    pub first_names: Vec<Arc<str>>,
    /// The bytes of the published entries together ([`cp_api::mapping::entry_bytes`] summed).
    pub bytes: usize,
    /// Each shard ([`cp_api::mapping::shards_for`] of [`Self::bytes`] and the live count).
    pub shards: Vec<Arc<Shard>>,
    /// The ports the published mappings' service channels dial, sorted.
    pub channel_ports: Vec<i32>,
    /// How long writes of the shard ConfigMaps still wait ([`ShardWrites`]): meanwhile the live
    /// shards stay as they are (neither written nor pruned) and the reconcile comes back after it.
    pub hold: Option<std::time::Duration>,
}

impl MappingFacts {
    /// The facts of `state`, split for `live` shard ConfigMaps existing now.
    pub fn of(state: &MappingState, live: usize) -> Self {
        let bytes = state.published_bytes();
        let count = cp_api::mapping::shards_for(bytes, live);
        Self {
            published: state.published_count(),
            conflicts: state.conflicts(),
            first_names: state.first_names(NAMES_LISTED),
            bytes,
            shards: state.shards(count),
            channel_ports: state.channel_ports(),
            hold: None,
        }
    }

    /// The facts of `mappings` with `live` shard ConfigMaps (tests; the controller keeps a state).
    pub fn of_objects(mappings: &[Arc<cp_api::ServiceMapping>], live: usize) -> Self {
        Self::of(&MappingState::of(mappings.iter().map(|m| &**m)), live)
    }

    /// How many mappings exist, published or not.
    pub fn len(&self) -> usize {
        self.published + self.conflicts.len()
    }

    /// Whether none exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The [`NAMES_LISTED`] smallest names of all mappings, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.first_names.iter().map(|n| &**n)
    }
}

/// How a marker starts: a control character, so that no JSON list (what a shard's text is) is one.
const MARKER_PREFIX: &str = "\u{1}cp-shard:";

/// What stands for a shard's text (hash `hash`, `escaped_len` bytes as a JSON string) in the plan's
/// desired ConfigMaps and in the controller's caches: at 50,000 mappings the shards are megabytes,
/// and a reconcile would otherwise copy and compare all of them to find the one that changed. The
/// text itself is put in only when a shard is written ([`with_text`]); [`slim_shard`] turns what
/// the API server holds into the same marker, so an edit of a shard's text by anyone else differs.
pub fn shard_marker(hash: &str, escaped_len: usize) -> String {
    format!("{MARKER_PREFIX}{hash}:{escaped_len}")
}

/// Whether `text` is a [`shard_marker`] (never to be written).
pub fn is_marker(text: &str) -> bool {
    text.starts_with(MARKER_PREFIX)
}

/// The shard key (`servicemappings[-<n>]`) of ConfigMap `name`, when it is a mapping shard.
fn shard_key(name: &str) -> Option<&'static str> {
    names::mapping_shard(name).map(|i| names::MAPPING_SHARD_KEYS[i])
}

/// A mapping shard ConfigMap as the caches keep it: its text replaced by its [`shard_marker`]
/// (computed once per watch event, not per reconcile). Any other object is left as it is.
pub fn slim_shard(kind: Kind, o: &mut DynamicObject) {
    use kube::ResourceExt;
    if kind != Kind::ConfigMap {
        return;
    }
    let Some(key) = shard_key(&o.name_any()) else {
        return;
    };
    if let Some(v) = o.data.get_mut("data").and_then(|d| d.get_mut(key))
        && let Some(text) = v.as_str()
        && !is_marker(text)
    {
        let (hash, len) = Shard::measure(text);
        *v = serde_json::Value::String(shard_marker(&hash, len));
    }
}

/// Desired object `d` with the text of `shard` in place of its marker: what is written.
pub fn with_text(d: &crate::desired::Desired, text: &str) -> crate::desired::Desired {
    let mut d = d.clone();
    if let Some(key) = shard_key(&d.name)
        && let Some(v) = d.body.get_mut("data").and_then(|x| x.get_mut(key))
    {
        *v = serde_json::Value::String(text.to_string());
    }
    d
}

/// Whether `d` still holds a marker where its text belongs (a body that must never be written).
pub fn holds_marker(d: &crate::desired::Desired) -> bool {
    d.kind == Kind::ConfigMap
        && shard_key(&d.name).is_some_and(|key| d.body["data"][key].as_str().is_some_and(is_marker))
}

/// The digest of mapping shard ConfigMap `d` from the hash its [`Shard`] was rendered with, without
/// reading the text again (at 50,000 mappings the shards are megabytes; a change of one mapping
/// renders one): the hash of the object without its data and the shard's hash; `None` for any other
/// object, or a body that does not hold the shard's text.
pub fn shard_digest(
    d: &crate::desired::Desired,
    shards: &[Arc<Shard>],
) -> Option<crate::apply::Digest> {
    if d.kind != Kind::ConfigMap {
        return None;
    }
    let i = names::mapping_shard(&d.name)?;
    let (shard, key) = (shards.get(i)?, names::MAPPING_SHARD_KEYS[i]);
    let body = d.body.as_object()?;
    let data = body.get("data")?.as_object()?;
    let text = data.get(key)?.as_str()?;
    if data.len() != 1 || text != shard.marker() {
        return None;
    }
    let rest: serde_json::Map<String, serde_json::Value> = body
        .iter()
        .filter(|(k, _)| *k != "data")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let rest = serde_json::Value::Object(rest).to_string();
    // `{...,"data":{"<key>":"<escaped text>"}}`: the rest, the comma, the data object around the text.
    let len = rest.len() + r#","data":{"":""}"#.len() + key.len() + shard.escaped_len;
    Some(crate::apply::Digest {
        len,
        hash: crate::desired::hash_str(&format!("{rest}{key}{}", shard.hash)),
    })
}

/// The mapping shard ConfigMaps of namespace `ns` among `owned` (the highest index plus one; one
/// at least): the count [`cp_api::mapping::shards_for`] starts from, so that it does not flap.
pub fn live_shards(owned: &BTreeMap<crate::cache::Key, DynamicObject>, ns: &str) -> usize {
    names::MAPPING_SHARD_CONFIGMAPS
        .iter()
        .rposition(|n| owned.contains_key(&(Kind::ConfigMap, Some(ns.to_string()), n.to_string())))
        .map_or(1, |i| i + 1)
}

/// Where on-premise systems reach a mapping: `<protocol>://<tunnel host>:<port>/<serviceId>`.
pub fn endpoint(m: &Mapping, resolved: &Resolved, port: i32) -> String {
    endpoint_on(m, &resolved.external_host, port)
}

fn endpoint_on(m: &Mapping, host: &str, port: i32) -> String {
    format!(
        "{}://{host}:{port}/{}",
        m.spec.kind.as_str().to_lowercase(),
        m.spec.service_id
    )
}

/// Whether `have` is the [`endpoint`] of `m` on `host` and `port`.
pub(super) fn is_endpoint(have: &str, m: &Mapping, host: &str, port: &str) -> bool {
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

/// How many mappings one reconcile takes over or writes the endpoint of: tens of thousands of new
/// mappings are done over several short reconciles, each of which publishes the mappings created
/// meanwhile, rather than in one that takes minutes.
pub const MAPPINGS_PER_RECONCILE: usize = 1024;

/// Labels the mappings of `unsettled` (from [`MappingState::unsettled`], each with whether it is
/// published) as taken over and writes their endpoints, each only when it differs, up to
/// [`PARALLEL_WRITES`] mappings at a time; a mapping that is not published (a duplicate) is taken
/// over too but advertises no endpoint. Returns how many writes it made.
pub async fn reconcile_mappings(
    writer: &crate::writer::Writer,
    unsettled: Vec<(Arc<Mapping>, bool)>,
    resolved: &Resolved,
    port: i32,
) -> Result<usize, Error> {
    use futures::StreamExt;
    let api: Api<ServiceMapping> = Api::all(writer.client().clone());
    // Collected first: a lazy iterator of closures held across the awaits makes the future's
    // lifetimes too general for the controller's `Send` bound. The state chose them as unsettled;
    // `reconcile_one` writes only the part (label, endpoint) that differs.
    let all: Vec<(Arc<Mapping>, Option<String>)> = unsettled
        .into_iter()
        .map(|(m, published)| {
            let want = published.then(|| endpoint(&m, resolved, port));
            (m, want)
        })
        .collect();
    let results: Vec<Result<usize, Error>> = futures::stream::iter(all)
        .map(|(m, want)| {
            let api = api.clone();
            async move { reconcile_one(writer, &api, &m, want).await }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    results.into_iter().sum::<Result<usize, Error>>()
}

async fn reconcile_one(
    writer: &crate::writer::Writer,
    api: &Api<ServiceMapping>,
    m: &Mapping,
    want: Option<String>,
) -> Result<usize, Error> {
    let mut writes = 0;
    let name = m.name();
    if !m.taken_over {
        // Only metadata: the spec stays the user's.
        let meta = kube::api::ObjectMeta {
            labels: Some([(names::LABEL_MODULE.into(), names::MODULE_VALUE.into())].into()),
            annotations: Some([(ADOPTED_ANNOTATION.into(), names::MANAGED_BY_VALUE.into())].into()),
            ..Default::default()
        };
        let body = Partial::<Endpoint>::of::<ServiceMapping>(name, meta, None);
        writer
            .write(
                api,
                name,
                &Patch::Apply(&body),
                "taking the ServiceMapping over",
            )
            .await
            .map_err(|e| Error::kube(format!("taking over ServiceMapping {name}"), e))?;
        writes += 1;
    }
    if m.endpoint.as_deref() == want.as_deref() {
        return Ok(writes);
    }
    let body = Partial::of::<ServiceMapping>(
        name,
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
        .write_part(api, crate::writer::Part::Status, name, &patch, why)
        .await;
    result.map_err(|e| Error::kube(format!("writing the endpoint of ServiceMapping {name}"), e))?;
    Ok(writes + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(name: &str, created: Option<&str>, uid: &str, service: &str) -> ServiceMapping {
        let mut meta = json!({"name": name, "uid": uid});
        if let Some(c) = created {
            meta["creationTimestamp"] = json!(c);
        }
        serde_json::from_value(json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": meta,
            "spec": {"type": "TCP", "subaccountId": "sub", "serviceId": service,
                "internalAddress": "a:1"}
        }))
        .expect("mapping")
    }

    /// The caches keep a shard's marker, not its megabytes of text; it is the marker the plan renders
    /// for the same text, another text's differs, and only a shard's key is touched.
    #[test]
    fn a_cached_shard_holds_the_marker_of_its_text_and_a_written_one_the_text() {
        let text = r#"[{"name":"a","type":"TCP"}]"#;
        let shard = Shard::of(text.to_string());
        let cm = |name: &str, key: &str, value: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "kyma-system"}, "data": {key: value}}))
            .expect("cm")
        };
        let mut live = cm(
            names::MAPPING_SHARD_CONFIGMAPS[1],
            names::MAPPING_SHARD_KEYS[1],
            text,
        );
        slim_shard(Kind::ConfigMap, &mut live);
        let held = live.data["data"][names::MAPPING_SHARD_KEYS[1]]
            .as_str()
            .expect("marker");
        assert_eq!(held, shard.marker());
        assert!(is_marker(held) && !is_marker(text));
        let again = live.clone();
        slim_shard(Kind::ConfigMap, &mut live);
        assert_eq!(live, again, "a marker stays");
        let mut edited = cm(
            names::MAPPING_SHARD_CONFIGMAPS[1],
            names::MAPPING_SHARD_KEYS[1],
            "[]",
        );
        slim_shard(Kind::ConfigMap, &mut edited);
        assert_ne!(edited.data, again.data, "another text, another marker");
        for mut other in [
            cm(names::CONFIGMAP_CONFIG, names::MAPPING_SHARD_KEYS[0], text),
            cm(names::CONFIGMAP_SERVICE_MAPPINGS, "other-key", text),
        ] {
            let before = other.clone();
            slim_shard(Kind::ConfigMap, &mut other);
            assert_eq!(other, before);
        }
        let desired = crate::desired::Desired {
            kind: Kind::ConfigMap,
            name: names::MAPPING_SHARD_CONFIGMAPS[1].into(),
            namespace: Some("kyma-system".into()),
            body: serde_json::json!({"data": {names::MAPPING_SHARD_KEYS[1]: shard.marker()}}),
        };
        assert!(holds_marker(&desired));
        let written = with_text(&desired, &shard.text);
        assert!(!holds_marker(&written));
        assert_eq!(written.body["data"][names::MAPPING_SHARD_KEYS[1]], text);
    }

    #[test]
    fn an_endpoint_is_recognised_without_formatting_it() {
        let mapping = Mapping::of(&m("a", None, "1", "erp.corp:443"));
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

    #[test]
    fn the_oldest_mapping_of_a_key_wins_then_the_name() {
        let t1 = Some("2026-01-01T00:00:00Z");
        let t2 = Some("2026-01-02T00:00:00Z");
        // (what, mappings, published, (loser, winner) pairs)
        type Case<'a> = (
            &'a str,
            Vec<ServiceMapping>,
            Vec<&'a str>,
            Vec<(&'a str, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "no duplicates",
                vec![m("b", t1, "1", "x"), m("a", t2, "2", "y")],
                vec!["a", "b"],
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
            // Whatever the order they arrive in.
            for order in [false, true] {
                let mut arriving = mappings.clone();
                if order {
                    arriving.reverse();
                }
                let state = MappingState::of(&arriving);
                let mut got: Vec<String> = state
                    .published()
                    .iter()
                    .map(|m| m.name().to_string())
                    .collect();
                got.sort();
                assert_eq!(got, published, "{what}");
                let pairs: Vec<(String, String)> = state
                    .conflicts()
                    .iter()
                    .map(|c| (c.loser.name().to_string(), c.winner.name().to_string()))
                    .collect();
                let want: Vec<(String, String)> = conflicts
                    .iter()
                    .map(|(l, w)| (l.to_string(), w.to_string()))
                    .collect();
                assert_eq!(pairs, want, "{what}");
            }
        }
        let state = MappingState::of(&[m("new", t2, "1", "x"), m("old", t1, "2", "x")]);
        let msg = state.conflicts()[0].message();
        assert!(
            msg.contains("ServiceMapping new is not published")
                && msg.contains("older ServiceMapping old")
                && msg.contains("delete new"),
            "{msg}"
        );
    }

    #[test]
    fn a_shard_write_holds_the_next_for_its_bytes_at_the_rate() {
        let writes = ShardWrites::default();
        let t0 = std::time::Instant::now();
        assert_eq!(writes.hold(t0), None, "nothing written yet");
        writes.record(t0, SHARD_WRITE_BYTES_PER_SECOND / 2);
        let half = std::time::Duration::from_millis(500);
        assert_eq!(writes.hold(t0), Some(half));
        assert_eq!(
            writes.hold(t0 + std::time::Duration::from_millis(200)),
            Some(std::time::Duration::from_millis(300))
        );
        assert_eq!(writes.hold(t0 + half), None);
        assert_eq!(writes.hold(t0 + std::time::Duration::from_secs(5)), None);
    }
}
