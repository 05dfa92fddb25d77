//! The controller's view of the ServiceMappings: a compact record per mapping (what the controller
//! publishes and decides from, not the object), kept up to date by the watch one event at a time.
//!
//! Every change costs O(log n): the record is replaced, the duplicate resolution of its key (old and
//! new) is redone among that key's mappings alone, and the published entry moves in and out of one of
//! [`FINE`] name-ordered maps, whose version is bumped. A shard of the proxy's files (`k` shards, a
//! power of two up to [`FINE`]) is the union of the fine maps `f` with `f mod k` = its index; its text is
//! rendered again only when one of them changed since the last rendering, otherwise the same text (the
//! same allocation) is handed out. So a change of one mapping re-renders one shard and leaves every
//! other untouched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use cp_api::mapping::{
    MAPPING_SHARDS_MAX, MappingKey, entry_bytes, entry_text, mapping_key, shard_of,
};
use cp_api::{ServiceMapping, ServiceMappingSpec, names};
use kube::ResourceExt;

use super::Conflict;

/// The finest split: as many name-ordered maps as there can be shards.
pub const FINE: usize = MAPPING_SHARDS_MAX;

/// One ServiceMapping as the controller keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.uid` (empty when absent).
    pub uid: Box<str>,
    /// `metadata.creationTimestamp`.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// The user's spec, as it is.
    pub spec: ServiceMappingSpec,
    /// `status.endpoint`.
    pub endpoint: Option<Box<str>>,
    /// Whether it wears the module's label and the adopted annotation.
    pub taken_over: bool,
    /// Its entry in the proxy's list: the JSON text, rendered once per change of the mapping.
    pub entry: Box<str>,
    /// What the entry adds to a ConfigMap as applied ([`cp_api::mapping::entry_bytes`]).
    pub bytes: usize,
    /// The port of its `internalAddress`, when it names one (the proxy's egress opens it).
    pub port: Option<i32>,
}

/// One shard of the proxy's files as rendered: the JSON list, its hash and its length as a JSON string
/// value, computed once per rendering (a reconcile compares and sizes it without reading it again).
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// The JSON list of the shard's entries.
    pub text: Arc<str>,
    /// [`crate::desired::hash_str`] of the text.
    pub hash: String,
    /// The text's length once escaped as a JSON string (each `"` and `\\` takes two bytes).
    pub escaped_len: usize,
}

impl Shard {
    /// The shard of `text`.
    pub fn of(text: String) -> Self {
        let (hash, escaped_len) = Self::measure(&text);
        Self {
            hash,
            escaped_len,
            text: text.into(),
        }
    }

    /// The hash and escaped length of a shard's text.
    pub fn measure(text: &str) -> (String, usize) {
        let escapes = text.bytes().filter(|b| *b == b'"' || *b == b'\\').count();
        (crate::desired::hash_str(text), text.len() + escapes)
    }

    /// What stands for the text in the plan's desired ConfigMaps and in the caches
    /// ([`super::shard_marker`]).
    pub fn marker(&self) -> String {
        super::shard_marker(&self.hash, self.escaped_len)
    }
}

impl Mapping {
    /// The record of `m`.
    pub fn of(m: &ServiceMapping) -> Self {
        let name = m.name_any();
        Self {
            uid: m.metadata.uid.as_deref().unwrap_or_default().into(),
            created: m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            spec: m.spec.clone(),
            endpoint: m
                .status
                .as_ref()
                .and_then(|s| s.endpoint.as_deref())
                .map(Into::into),
            taken_over: m.labels().get(names::LABEL_MODULE).map(String::as_str)
                == Some(names::MODULE_VALUE)
                && m.annotations()
                    .contains_key(cp_api::keys::ADOPTED_ANNOTATION),
            entry: entry_text(&name, &m.spec).into(),
            bytes: entry_bytes(&name, &m.spec),
            port: cp_api::validation::parse_host_port(&m.spec.internal_address)
                .ok()
                .map(|(_, p)| i32::from(p)),
            name: name.into(),
        }
    }

    /// The mapping's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A reference to the mapping (an Event's subject).
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        use kube::Resource;
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(ServiceMapping::api_version(&()).into_owned()),
            kind: Some(ServiceMapping::kind(&()).into_owned()),
            name: Some(self.name.to_string()),
            uid: (!self.uid.is_empty()).then(|| self.uid.to_string()),
            ..Default::default()
        }
    }

    /// Age order: creationTimestamp (a mapping without one last), then name, then uid.
    fn age(&self) -> Age {
        (
            self.created.is_none(),
            self.created,
            self.name.clone(),
            self.uid.clone(),
        )
    }
}

type Age = (
    bool,
    Option<k8s_openapi::jiff::Timestamp>,
    Arc<str>,
    Box<str>,
);

/// A shard and the versions of the fine maps it was rendered at.
type Rendered = (Vec<u64>, Arc<Shard>);

/// What one event changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Records replaced, added or removed (0 when the event changed nothing the controller keeps).
    pub records: usize,
    /// Published entries added, removed or rewritten (a change of a key's winner moves two).
    pub entries: usize,
    /// Whether a reconcile has something to do about it: false for a change that only brought a
    /// mapping closer to what the controller writes (the echo of its own label or endpoint write).
    pub wakes: bool,
}

/// Every ServiceMapping, as records, with the published ones split into [`FINE`] name-ordered maps.
#[derive(Debug, Default)]
pub struct MappingState {
    by_name: HashMap<Arc<str>, Arc<Mapping>>,
    /// The mappings of each key, oldest first: the first is published.
    by_key: HashMap<MappingKey, BTreeSet<Age>>,
    /// The keys with more than one mapping.
    duplicated: BTreeSet<MappingKey>,
    /// The published mappings by `shard_of(name, FINE)`, each in name order.
    fine: Vec<BTreeMap<Arc<str>, Arc<Mapping>>>,
    /// A counter per fine map, bumped when its entries change.
    versions: Vec<u64>,
    /// The published entries' bytes together.
    bytes: usize,
    /// The ports of the published mappings' internal addresses, each with how many name it.
    ports: BTreeMap<i32, usize>,
    /// Renderings by (shard count, shard): the fine versions they were rendered at and the text.
    rendered: Mutex<HashMap<(usize, usize), Rendered>>,
    /// How many shard texts were rendered (not handed out again) since the start: for tests and the bench.
    renders: std::sync::atomic::AtomicUsize,
    /// The host and port the published mappings' endpoints name, as the last reconcile wrote them.
    expected: Option<(Box<str>, Box<str>)>,
    /// The mappings whose label or endpoint is not yet what the controller writes for them (against
    /// [`Self::expected`]): what a reconcile writes, kept one change at a time so that a reconcile
    /// does not look at every mapping to find the one that needs a write.
    unsettled: BTreeSet<Arc<str>>,
}

impl MappingState {
    /// An empty state.
    pub fn new() -> Self {
        Self {
            fine: vec![BTreeMap::new(); FINE],
            versions: vec![0; FINE],
            ..Self::default()
        }
    }

    /// The state of `mappings` (tests, the migration preview).
    pub fn of<'a>(mappings: impl IntoIterator<Item = &'a ServiceMapping>) -> Self {
        let mut state = Self::new();
        for m in mappings {
            state.apply(m);
        }
        state
    }

    /// How many mappings there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The bytes the published entries take together.
    pub fn published_bytes(&self) -> usize {
        self.bytes
    }

    /// Every mapping's name, unsorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(|n| &**n)
    }

    /// The record of mapping `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Mapping>> {
        self.by_name.get(name)
    }

    /// Every record (published or not), unsorted.
    pub fn records(&self) -> impl Iterator<Item = &Arc<Mapping>> {
        self.by_name.values()
    }

    /// The published records in name order within each fine map.
    pub fn published(&self) -> Vec<Arc<Mapping>> {
        self.fine.iter().flat_map(|f| f.values().cloned()).collect()
    }

    /// The ports the published mappings' service channels dial, sorted.
    pub fn channel_ports(&self) -> Vec<i32> {
        self.ports.keys().copied().collect()
    }

    fn count_port(&mut self, m: &Mapping, add: bool) {
        let Some(port) = m.port else {
            return;
        };
        let n = self.ports.entry(port).or_default();
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.ports.remove(&port);
            }
        }
    }

    /// Whether the record of `name` is published (the oldest of its key).
    pub fn is_published(&self, name: &str) -> bool {
        self.fine[shard_of(name, FINE)].contains_key(name)
    }

    /// The mappings not published because an older one has the same key, sorted by the loser's name.
    pub fn conflicts(&self) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = Vec::new();
        for key in &self.duplicated {
            let Some(ages) = self.by_key.get(key) else {
                continue;
            };
            let mut names = ages.iter().map(|a| &a.2);
            let Some(winner) = names.next().and_then(|n| self.by_name.get(n)) else {
                continue;
            };
            for loser in names.filter_map(|n| self.by_name.get(n)) {
                out.push(Conflict {
                    loser: loser.clone(),
                    winner: winner.clone(),
                });
            }
        }
        out.sort_by(|a, b| a.loser.name.cmp(&b.loser.name));
        out
    }

    /// Records the host and port the endpoints of published mappings name (`status.endpoint`, as the
    /// reconcile writes them): a watch event that only brings a mapping to that endpoint, or only adds
    /// the takeover label, is the echo of the controller's own write and wakes no reconcile.
    pub fn expect_endpoints(&mut self, host: &str, port: i32) {
        let expected = Some((host.into(), port.to_string().into()));
        if self.expected == expected {
            return;
        }
        // Another host or port: every published mapping's endpoint is looked at again (once).
        self.expected = expected;
        let names: Vec<Arc<str>> = self.by_name.keys().cloned().collect();
        for name in names {
            self.resettle(&name);
        }
    }

    /// Puts mapping `name` into [`Self::unsettled`] or takes it out, from its record now.
    fn resettle(&mut self, name: &str) {
        match self.by_name.get(name) {
            Some(m) if !(m.taken_over && self.endpoint_settled(m, self.is_published(name))) => {
                let name = m.name.clone();
                self.unsettled.insert(name);
            }
            _ => {
                self.unsettled.remove(name);
            }
        }
    }

    /// Resettles every mapping of `key` (its published one may have changed).
    fn resettle_key(&mut self, key: &MappingKey) {
        let names: Vec<Arc<str>> = self
            .by_key
            .get(key)
            .map(|ages| ages.iter().map(|a| a.2.clone()).collect())
            .unwrap_or_default();
        for name in names {
            self.resettle(&name);
        }
    }

    /// Up to `at_most` mappings whose label or endpoint the controller still has to write, in name
    /// order, each with whether it is published (it advertises an endpoint only then); and whether
    /// more are left.
    pub fn unsettled(&self, at_most: usize) -> (Vec<(Arc<Mapping>, bool)>, bool) {
        let out: Vec<(Arc<Mapping>, bool)> = self
            .unsettled
            .iter()
            .filter_map(|n| self.by_name.get(n))
            .take(at_most)
            .map(|m| (m.clone(), self.is_published(&m.name)))
            .collect();
        (out, self.unsettled.len() > at_most)
    }

    /// How many mappings the controller still has to label or write the endpoint of.
    pub fn unsettled_count(&self) -> usize {
        self.unsettled.len()
    }

    /// How many mappings are published.
    pub fn published_count(&self) -> usize {
        self.fine.iter().map(BTreeMap::len).sum()
    }

    /// The `at_most` smallest names of all mappings (published or not), sorted: what messages
    /// list, found among the first of each name-ordered map rather than by sorting every name.
    pub fn first_names(&self, at_most: usize) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .fine
            .iter()
            .flat_map(|f| f.keys().take(at_most).cloned())
            .chain(
                self.duplicated
                    .iter()
                    .filter_map(|k| self.by_key.get(k))
                    .flat_map(|ages| ages.iter().skip(1).map(|a| a.2.clone())),
            )
            .collect();
        names.sort();
        names.dedup();
        names.truncate(at_most);
        names
    }

    /// Whether `m`'s endpoint is the one the controller writes for it (none while it is not published).
    fn endpoint_settled(&self, m: &Mapping, published: bool) -> bool {
        match (&m.endpoint, published, &self.expected) {
            (None, false, _) => true,
            (Some(have), true, Some((host, port))) => super::is_endpoint(have, m, host, port),
            _ => false,
        }
    }

    /// Takes in mapping `m` as the watch delivers it (added or changed).
    pub fn apply(&mut self, m: &ServiceMapping) -> Change {
        let record = Arc::new(Mapping::of(m));
        match self.by_name.get(&record.name) {
            Some(r) if **r == *record => return Change::default(),
            // The same place in the same key's order (a status write, another label, an edit of a field
            // outside the key): replaced where it is.
            Some(r)
                if mapping_key(&r.spec) == mapping_key(&record.spec) && r.age() == record.age() =>
            {
                let rewritten = r.entry != record.entry;
                let name = record.name.clone();
                let published = self.is_published(&record.name);
                // Nothing to do about a change that took nothing of the controller's away: the label
                // stayed or came, the endpoint stayed or became the one the controller writes.
                let settled = !rewritten
                    && (record.taken_over || !r.taken_over)
                    && (record.endpoint == r.endpoint || self.endpoint_settled(&record, published));
                self.by_name.insert(record.name.clone(), record.clone());
                let f = shard_of(&record.name, FINE);
                let mut entries = 0;
                if let Some(p) = self.fine[f].get(&record.name).cloned() {
                    self.bytes = self.bytes - p.bytes + record.bytes;
                    self.count_port(&p, false);
                    self.count_port(&record, true);
                    self.fine[f].insert(record.name.clone(), record);
                    if rewritten {
                        self.versions[f] += 1;
                        entries = 1;
                    }
                }
                self.resettle(&name);
                return Change {
                    records: 1,
                    entries,
                    wakes: !settled,
                };
            }
            _ => {}
        }
        let mut change = self.remove(&record.name.clone());
        let key = mapping_key(&record.spec);
        self.by_name.insert(record.name.clone(), record.clone());
        let ages = self.by_key.entry(key.clone()).or_default();
        ages.insert(record.age());
        if ages.len() > 1 {
            self.duplicated.insert(key.clone());
        }
        change.entries += self.publish_oldest(&key);
        self.resettle_key(&key);
        change.records = 1;
        change.wakes = true;
        change
    }

    /// Removes mapping `name` (deleted).
    pub fn delete(&mut self, name: &str) -> Change {
        self.remove(name)
    }

    /// Removes every mapping a (re)listing did not deliver (`listed`: the names it did): those
    /// deleted while the watch was not running, which send no event.
    pub fn remove_unlisted(&mut self, listed: &std::collections::HashSet<String>) -> Change {
        let gone: Vec<Arc<str>> = self
            .by_name
            .keys()
            .filter(|n| !listed.contains(&***n))
            .cloned()
            .collect();
        let mut change = Change::default();
        for name in gone {
            let c = self.remove(&name);
            change.records += c.records;
            change.entries += c.entries;
            change.wakes |= c.wakes;
        }
        change
    }

    fn remove(&mut self, name: &str) -> Change {
        let Some(old) = self.by_name.remove(name) else {
            return Change::default();
        };
        let key = mapping_key(&old.spec);
        let mut entries = 0;
        if let Some(published) = self.unpublish(&old.name) {
            debug_assert!(Arc::ptr_eq(&published, &old));
            entries += 1;
        }
        if let Some(ages) = self.by_key.get_mut(&key) {
            ages.remove(&old.age());
            if ages.len() < 2 {
                self.duplicated.remove(&key);
            }
            if ages.is_empty() {
                self.by_key.remove(&key);
            }
        }
        entries += self.publish_oldest(&key);
        self.unsettled.remove(name);
        self.resettle_key(&key);
        Change {
            records: 1,
            entries,
            wakes: true,
        }
    }

    /// Makes the oldest mapping of `key` the published one (unpublishing the one that was): how many
    /// entries changed.
    fn publish_oldest(&mut self, key: &MappingKey) -> usize {
        let Some(oldest) = self
            .by_key
            .get(key)
            .and_then(|ages| ages.first())
            .and_then(|a| self.by_name.get(&a.2))
            .cloned()
        else {
            return 0;
        };
        let mut changed = 0;
        let others: Vec<Arc<str>> = self.by_key[key]
            .iter()
            .skip(1)
            .map(|a| a.2.clone())
            .filter(|n| self.is_published(n))
            .collect();
        for n in others {
            self.unpublish(&n);
            changed += 1;
        }
        let f = shard_of(&oldest.name, FINE);
        let same = self.fine[f]
            .get(&oldest.name)
            .is_some_and(|p| Arc::ptr_eq(p, &oldest));
        if !same {
            if let Some(previous) = self.fine[f].insert(oldest.name.clone(), oldest.clone()) {
                self.bytes -= previous.bytes;
                self.count_port(&previous, false);
            }
            self.bytes += oldest.bytes;
            self.count_port(&oldest, true);
            self.versions[f] += 1;
            changed += 1;
        }
        changed
    }

    fn unpublish(&mut self, name: &str) -> Option<Arc<Mapping>> {
        let f = shard_of(name, FINE);
        let old = self.fine[f].remove(name)?;
        self.bytes -= old.bytes;
        self.count_port(&old, false);
        self.versions[f] += 1;
        Some(old)
    }

    /// The text of each of `shards` shards (a power of two up to [`FINE`]): the JSON list of its
    /// published entries in name order. A shard none of whose fine maps changed since it was last
    /// rendered is handed out again as it was.
    pub fn shards(&self, shards: usize) -> Vec<Arc<Shard>> {
        let k = shards.clamp(1, FINE).next_power_of_two();
        let mut rendered = self
            .rendered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Renderings for another count are of no further use.
        rendered.retain(|(count, _), _| *count == k);
        (0..k)
            .map(|s| {
                let parts: Vec<usize> = (s..FINE).step_by(k).collect();
                let versions: Vec<u64> = parts.iter().map(|f| self.versions[*f]).collect();
                if let Some((at, text)) = rendered.get(&(k, s))
                    && *at == versions
                {
                    return text.clone();
                }
                let shard = Arc::new(Shard::of(self.render(&parts)));
                self.renders
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                rendered.insert((k, s), (versions, shard.clone()));
                shard
            })
            .collect()
    }

    /// How many shard texts were rendered since the start.
    pub fn renders(&self) -> usize {
        self.renders.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The list of the published entries of fine maps `parts`, merged in name order.
    fn render(&self, parts: &[usize]) -> String {
        let mut entries: Vec<(&Arc<str>, &Arc<Mapping>)> =
            parts.iter().flat_map(|f| self.fine[*f].iter()).collect();
        if parts.len() > 1 {
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        }
        let len: usize = entries.iter().map(|(_, m)| m.entry.len() + 1).sum();
        let mut out = String::with_capacity(len + 2);
        out.push('[');
        for (i, (_, m)) in entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&m.entry);
        }
        out.push(']');
        out
    }
}

#[cfg(test)]
mod tests;
