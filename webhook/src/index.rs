//! The ServiceMapping uniqueness index: (type, subaccountId, serviceId) → names, kept current by the
//! watch. Admission asks it in O(1) and never copies the mapping list, however many mappings exist.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cp_api::ServiceMapping;
use cp_api::mapping::{MappingType, mapping_key};
use kube::runtime::watcher::Event;

/// A mapping's identity for uniqueness.
pub type Key = (MappingType, String, String);

/// Names by key and key by name. A name is stored once (shared by both maps); a key almost always
/// has one name, so its names are a small sorted vector, not a tree. Each name also keeps its entry's
/// bytes in the aggregated ConfigMap ([`cp_api::mapping::entry_bytes`]), summed in `bytes`: the budget
/// check is O(1) in the number of mappings.
#[derive(Debug, Default, Clone)]
pub struct MappingIndex {
    by_name: HashMap<Arc<str>, (Key, usize)>,
    by_key: HashMap<Key, Vec<Arc<str>>>,
    bytes: usize,
}

impl MappingIndex {
    /// An index of `mappings` (tests, fuzzing, the bench).
    pub fn of<'a>(mappings: impl IntoIterator<Item = &'a ServiceMapping>) -> Self {
        let mut index = Self::default();
        for m in mappings {
            index.upsert(m);
        }
        index
    }

    /// Adds or updates one mapping (a mapping without a name is ignored).
    pub fn upsert(&mut self, m: &ServiceMapping) {
        let Some(name) = m.metadata.name.as_deref() else {
            return;
        };
        let key = mapping_key(&m.spec);
        let bytes = cp_api::mapping::entry_bytes(name, &m.spec);
        if self.by_name.get(name) == Some(&(key.clone(), bytes)) {
            // Labels, status, finalizers: the key and the entry are unchanged.
            return;
        }
        self.remove(name);
        let name: Arc<str> = Arc::from(name);
        let names = self.by_key.entry(key.clone()).or_default();
        if let Err(at) = names.binary_search(&name) {
            names.insert(at, name.clone());
        }
        self.bytes += bytes;
        self.by_name.insert(name, (key, bytes));
    }

    /// Removes one mapping by name.
    pub fn remove(&mut self, name: &str) {
        if let Some((old, bytes)) = self.by_name.remove(name) {
            self.bytes = self.bytes.saturating_sub(bytes);
            if let Some(names) = self.by_key.get_mut(&old) {
                names.retain(|n| &**n != name);
                if names.is_empty() {
                    self.by_key.remove(&old);
                }
            }
        }
    }

    /// Another mapping than `name` with `key`, if any (the first by name).
    pub fn other_with(&self, key: &Key, name: &str) -> Option<&str> {
        self.by_key
            .get(key)?
            .iter()
            .find(|n| &***n != name)
            .map(|n| &**n)
    }

    /// How many mappings exist.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no mapping exists.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Up to `n` mappings' names (any `n`: for a message that names some), sorted among themselves.
    /// O(n), whatever the number of mappings.
    pub fn some_names(&self, n: usize) -> Vec<String> {
        let mut names: Vec<String> = self.by_name.keys().take(n).map(|k| k.to_string()).collect();
        names.sort();
        names
    }

    /// The bytes the mappings' entries take in the aggregated ConfigMap.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bytes the entry of mapping `name` takes now (0 when it does not exist).
    pub fn bytes_of(&self, name: &str) -> usize {
        self.by_name.get(name).map_or(0, |(_, b)| *b)
    }
}

/// The index shared by the watch (writer) and admission (readers).
#[derive(Debug, Default, Clone)]
pub struct SharedIndex(Arc<RwLock<MappingIndex>>);

impl SharedIndex {
    /// A shared index holding `index`.
    pub fn new(index: MappingIndex) -> Self {
        Self(Arc::new(RwLock::new(index)))
    }

    /// Runs `f` with the current index.
    pub fn read<T>(&self, f: impl FnOnce(&MappingIndex) -> T) -> T {
        match self.0.read() {
            Ok(i) => f(&i),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    fn write(&self, f: impl FnOnce(&mut MappingIndex)) {
        match self.0.write() {
            Ok(mut i) => f(&mut i),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }
}

/// Applies watch events to a [`SharedIndex`]; a re-list builds a fresh index and swaps it in whole.
#[derive(Debug, Default)]
pub struct IndexWriter {
    shared: SharedIndex,
    relisting: Option<MappingIndex>,
}

impl IndexWriter {
    /// A writer of `shared`.
    pub fn new(shared: SharedIndex) -> Self {
        Self {
            shared,
            relisting: None,
        }
    }

    /// Applies one event; returns true when a complete listing has just been swapped in.
    pub fn apply(&mut self, event: &Event<ServiceMapping>) -> bool {
        match event {
            Event::Init => self.relisting = Some(MappingIndex::default()),
            Event::InitApply(m) => self
                .relisting
                .get_or_insert_with(Default::default)
                .upsert(m),
            Event::InitDone => {
                let fresh = self.relisting.take().unwrap_or_default();
                self.shared.write(|i| *i = fresh);
                return true;
            }
            Event::Apply(m) => self.shared.write(|i| i.upsert(m)),
            Event::Delete(m) => {
                if let Some(name) = m.metadata.name.as_deref() {
                    self.shared.write(|i| i.remove(name));
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, service: &str) -> ServiceMapping {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": name},
            "spec": {"type": "RFC", "serviceId": service, "internalAddress": "a:1"}
        }))
        .expect("mapping")
    }

    #[test]
    fn the_watch_keeps_the_index_current_and_a_relist_replaces_it() {
        let shared = SharedIndex::default();
        let mut w = IndexWriter::new(shared.clone());
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(m("a", "s1")));
        assert_eq!(shared.read(|i| i.len()), 0, "not visible before InitDone");
        assert!(w.apply(&Event::InitDone));
        let key = |s: &str| mapping_key(&m("x", s).spec);
        assert_eq!(
            shared.read(|i| i.other_with(&key("s1"), "b").map(String::from)),
            Some("a".into())
        );
        assert_eq!(
            shared.read(|i| i.other_with(&key("s1"), "a").map(String::from)),
            None
        );
        // An update moves the name to its new key.
        w.apply(&Event::Apply(m("a", "s2")));
        assert_eq!(
            shared.read(|i| i.other_with(&key("s1"), "b").map(String::from)),
            None
        );
        assert_eq!(
            shared.read(|i| i.other_with(&key("s2"), "b").map(String::from)),
            Some("a".into())
        );
        w.apply(&Event::Apply(m("b", "s2")));
        w.apply(&Event::Delete(m("a", "s2")));
        assert_eq!(
            shared.read(|i| i.other_with(&key("s2"), "c").map(String::from)),
            Some("b".into())
        );
        assert_eq!(shared.read(|i| i.some_names(10)), vec!["b".to_string()]);
        // A re-list drops whatever the watch missed.
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(m("z", "s9")));
        w.apply(&Event::InitDone);
        assert_eq!(shared.read(|i| i.some_names(10)), vec!["z".to_string()]);
    }

    #[test]
    fn ten_thousand_mappings_are_looked_up_without_a_scan() {
        let all: Vec<ServiceMapping> = (0..10_000)
            .map(|i| m(&format!("m{i}"), &format!("s{i}")))
            .collect();
        let index = MappingIndex::of(&all);
        assert_eq!(index.len(), 10_000);
        let key = mapping_key(&m("x", "s9999").spec);
        assert_eq!(index.other_with(&key, "new"), Some("m9999"));
        assert_eq!(index.other_with(&key, "m9999"), None);
    }
}
