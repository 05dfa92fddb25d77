//! What the controller reads, served from watch caches: a steady-state reconcile makes no reads of its
//! own besides the quorum GET of the CR.
//!
//! - **Managed objects**: one reflector store per managed kind and scope (kyma-system, the default Istio
//!   namespace, cluster scope), label-selected on `app.kubernetes.io/managed-by`. Every event also
//!   wakes the CR named in the object's owner labels, so drift anywhere is repaired within seconds.
//! - **Foreign Secrets** the controller reads but does not own (the BTP operator's binding Secret, a
//!   user's service-key Secret, a tunnel Secret issued by Gardener or cert-manager): a watch on exactly
//!   that name, started on first use; it wakes the CR that asked. A watch the last full reconcile did
//!   not read through is closed ([`Cache::release_unread`]), and never more than
//!   [`MAX_FOREIGN_WATCHES`] are open: a CR editor who cycles through names leaves no connection behind.
//! - Anything else, or anything a cache does not hold yet, is read from the API ([`Cache::live`]): a
//!   name absent from the managed cache may still be taken by an object that is not ours, or the cache
//!   may not have listed yet, so absence is always confirmed.

use std::collections::HashMap;
use std::sync::Mutex;

use cp_api::{ConnectivityProxy, names};
use futures::{FutureExt, SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::Error;
use crate::desired::{Kind, Scope};

/// Wakes a CR's reconcile.
pub type Trigger = futures::channel::mpsc::Sender<ObjectRef<ConnectivityProxy>>;

/// The namespaces whose managed objects are cached (where the controller's RoleBindings are).
pub const CACHED_NAMESPACES: [&str; 2] = [names::KYMA_SYSTEM, names::ISTIO_NAMESPACE];

/// The most foreign Secrets watched at once. A reconcile reads at most four (the service key, the
/// tunnel's TLS Secret and CA, the cacert companion); beyond this bound a Secret is read from the API.
pub const MAX_FOREIGN_WATCHES: usize = names::MAX_FOREIGN_SECRET_WATCHES;

/// A watch on one foreign Secret: its store, its task (aborted when the entry is dropped, which
/// closes the watch's connection) and whether the current reconcile read through it.
struct Foreign {
    store: Store<Secret>,
    task: tokio::task::JoinHandle<()>,
    read: bool,
}

impl Drop for Foreign {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Identity of one object: kind, namespace (`None` for cluster scope), name.
pub type Key = (Kind, Option<String>, String);

/// `Kind ns/name` (or `Kind name`).
pub fn describe((kind, ns, name): &Key) -> String {
    let kind = kind.api_resource().kind;
    match ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The controller's read caches.
pub struct Cache {
    client: Client,
    crds: Store<CustomResourceDefinition>,
    managed: HashMap<(Kind, Option<String>), Store<DynamicObject>>,
    foreign: Mutex<HashMap<(String, String), Foreign>>,
    trigger: Trigger,
    /// The operator's own writes the caches have not seen yet: key → the resourceVersion the cache
    /// held when it wrote (`None`: absent). Until the cache moves past it, the object is read from the
    /// API — a watch can miss an event (an etcd restart right after a write), and a stale cache would
    /// otherwise have the same write repeated and the rollout reported forever.
    unseen_writes: Mutex<HashMap<Key, Option<String>>>,
    /// The resourceVersion each of the operator's latest writes produced, until the watch delivers
    /// it: that event is the write's echo, carries nothing the controller did not just decide, and
    /// wakes nobody ([`Echoes`]).
    echoes: std::sync::Arc<Echoes>,
}

/// The resourceVersions the operator's own writes produced, by object, until their watch event
/// arrives. An event with exactly that version is the echo of the write (nothing changed since the
/// controller decided it) and does not wake the CR again; any other version of the object (someone
/// else's write, a status update, a deletion) wakes it as always.
#[derive(Debug, Default)]
pub struct Echoes(Mutex<HashMap<Key, String>>);

impl Echoes {
    /// Records that the operator's write of `key` produced `resource_version`.
    pub fn wrote(&self, key: Key, resource_version: String) {
        if let Ok(mut e) = self.0.lock() {
            e.insert(key, resource_version);
        }
    }

    /// Whether `key` at `resource_version` (a watch event) is the echo of the operator's last write
    /// of it; the record is forgotten at the first event of the object either way.
    pub fn is_echo(&self, key: &Key, resource_version: Option<&str>) -> bool {
        let Ok(mut e) = self.0.lock() else {
            return false;
        };
        match e.remove(key) {
            Some(rv) => Some(rv.as_str()) == resource_version,
            None => false,
        }
    }
}

impl Cache {
    /// Starts one label-selected watch per managed kind and scope; each event wakes the owning CR
    /// through `trigger`, and every (re)list wakes every CR in `proxies`: an object deleted while its
    /// watch was not running (before the first list, or between a broken watch and its re-list) sends no
    /// event, and would otherwise stay missing until the resync. A kind whose CRD is missing is watched
    /// once the CRD appears.
    pub fn start(
        client: Client,
        crds: Store<CustomResourceDefinition>,
        proxies: Store<ConnectivityProxy>,
        trigger: Trigger,
    ) -> Self {
        let managed_cfg = watcher::Config::default().labels(&format!(
            "{}={}",
            names::LABEL_MANAGED_BY,
            names::MANAGED_BY_VALUE
        ));
        let mut managed = HashMap::new();
        let echoes = std::sync::Arc::new(Echoes::default());
        for kind in Kind::ALL {
            let ar = kind.api_resource();
            let scopes: Vec<Option<String>> = match kind.scope() {
                Scope::Namespaced => CACHED_NAMESPACES
                    .iter()
                    .filter(|n| **n == names::KYMA_SYSTEM || kind.listed_in_istio_namespace())
                    .map(|n| Some(n.to_string()))
                    .collect(),
                Scope::Cluster => vec![None],
            };
            for ns in scopes {
                let api = match &ns {
                    Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
                    None => Api::<DynamicObject>::all_with(client.clone(), &ar),
                };
                let writer = reflector::store::Writer::new(ar.clone());
                managed.insert((kind, ns), writer.as_reader());
                let (cfg, trigger, crds, proxies, echoes) = (
                    managed_cfg.clone(),
                    trigger.clone(),
                    crds.clone(),
                    proxies.clone(),
                    echoes.clone(),
                );
                tokio::spawn(async move {
                    // A kind whose CRD is not installed is not watched until it is (a watch would
                    // retry a failing LIST forever); the CRD store is in memory, so waiting costs
                    // no requests. (Not `crds.wait_until_ready()`: in kube-runtime 5.0.0 a Store's
                    // readiness wakes only the task that polled it last — a futures oneshot keeps one
                    // waker — so twenty watchers waiting on it beside the readiness task never wake.)
                    while kind.crd().is_some_and(|c| crd_absent(&crds, c)) {
                        tokio::time::sleep(CRD_RECHECK).await;
                    }
                    let events = reflector::reflector(
                        writer,
                        watcher(api, cfg).modify(move |o| {
                            cp_api::slim_for_cache(o.meta_mut());
                            // A mapping shard's text becomes its marker: the plan compares markers.
                            crate::mappings::slim_shard(kind, o);
                        }),
                    )
                    .default_backoff();
                    forward_managed(events, trigger, proxies, kind, &echoes).await
                });
            }
        }
        Self {
            client,
            crds,
            managed,
            foreign: Mutex::default(),
            trigger,
            unseen_writes: Mutex::default(),
            echoes,
        }
    }

    /// Records a write of the object `key` that the cache held at `before` (its resourceVersion) and
    /// that produced `after`: the watch event at `after` is its echo and wakes nobody.
    pub fn wrote(&self, key: Key, before: Option<String>, after: Option<String>) {
        if let Some(after) = after {
            self.echoes.wrote(key.clone(), after);
        }
        if let Ok(mut w) = self.unseen_writes.lock() {
            w.insert(key, before);
        }
    }

    /// Whether the cached copy (`cached`: its resourceVersion) predates a write of ours; forgets the
    /// write once the cache has moved past it.
    fn behind(&self, key: &Key, cached: Option<&str>) -> bool {
        let Ok(mut w) = self.unseen_writes.lock() else {
            return false;
        };
        match w.get(key) {
            Some(before) if before.as_deref() == cached => true,
            Some(_) => {
                w.remove(key);
                false
            }
            None => false,
        }
    }

    /// The caches that reading `kinds` in `namespaces` needs and that have not listed yet
    /// ([`unsynced_stores`]): while any is listed here, no prune and no deletion is decided.
    pub fn unsynced(&self, kinds: &[Kind], namespaces: &[String]) -> Vec<String> {
        unsynced_stores(&self.managed, |k| self.crd_missing(k), kinds, namespaces)
    }

    fn store(&self, kind: Kind, namespace: Option<&str>) -> Option<&Store<DynamicObject>> {
        self.managed.get(&(kind, namespace.map(String::from)))
    }

    fn crd_missing(&self, kind: Kind) -> bool {
        kind.crd().is_some_and(|crd| crd_absent(&self.crds, crd))
    }

    /// The object as cached, else as read from the API (absence in a cache is always confirmed: the
    /// name may be taken by an object that is not ours). `None` when it does not exist or its kind's
    /// CRD is not installed.
    pub async fn live(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error> {
        let mut key = ObjectRef::new_with(name, kind.api_resource());
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        let cached = self.store(kind, namespace).and_then(|s| s.get(&key));
        let id = (kind, namespace.map(String::from), name.to_string());
        let rv = cached
            .as_ref()
            .and_then(|o| o.metadata.resource_version.clone());
        if let Some(o) = cached.filter(|_| !self.behind(&id, rv.as_deref())) {
            return Ok(Some((*o).clone()));
        }
        if self.crd_missing(kind) {
            return Ok(None);
        }
        crate::writer::read(&self.client, kind, namespace, name).await
    }

    /// A Secret the controller reads, managed or not. Secrets it does not manage are watched by name
    /// from their first read on (the watch wakes `for_cr`); until that watch has listed, the API is read.
    pub async fn secret(
        &self,
        namespace: &str,
        name: &str,
        for_cr: &ConnectivityProxy,
    ) -> Result<Option<Secret>, Error> {
        let key = ObjectRef::new_with(name, Kind::Secret.api_resource()).within(namespace);
        if let Some(o) = self
            .store(Kind::Secret, Some(namespace))
            .and_then(|s| s.get(&key))
        {
            return Ok(Some(typed(&o)?));
        }
        if let Some(store) = self.foreign_store(namespace, name, for_cr)
            && store.wait_until_ready().now_or_never().is_some()
        {
            let cached = store.get(&ObjectRef::new(name).within(namespace));
            let id = (Kind::Secret, Some(namespace.to_string()), name.to_string());
            let rv = cached
                .as_ref()
                .and_then(|s| s.metadata.resource_version.clone());
            // A Secret this operator just wrote is read from the API until the watch has seen it.
            if !self.behind(&id, rv.as_deref()) {
                return Ok(cached.map(|s| (*s).clone()));
            }
        }
        Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 403 => Error::Invalid(format!(
                    "reading Secret {namespace}/{name}: the controller may not read it. Outside {ks} it reads only the tunnel's Secrets it names itself; for a TLS Secret of your own, grant it that name and its Connectivity CA companion: kubectl create role cp-tls -n {namespace} --verb=get,list,watch,create,patch,update,delete --resource=secrets --resource-name={name} --resource-name={name}-cacert && kubectl create rolebinding cp-tls -n {namespace} --role=cp-tls --serviceaccount={ks}:{sa}",
                    ks = names::KYMA_SYSTEM,
                    sa = names::CONTROLLER_SERVICE_ACCOUNT
                )),
                e => Error::kube(format!("reading Secret {namespace}/{name}"), e),
            })
    }

    /// The watch on a foreign Secret, opened on first use and marked as read; `None` (read the API)
    /// when [`MAX_FOREIGN_WATCHES`] are open already.
    fn foreign_store(
        &self,
        namespace: &str,
        name: &str,
        for_cr: &ConnectivityProxy,
    ) -> Option<Store<Secret>> {
        // A poisoned lock only loses the cache: the API is read.
        let mut foreign = self.foreign.lock().ok()?;
        let entry = (namespace.to_string(), name.to_string());
        if let Some(f) = foreign.get_mut(&entry) {
            f.read = true;
            return Some(f.store.clone());
        }
        if foreign.len() >= MAX_FOREIGN_WATCHES {
            tracing::debug!(
                namespace,
                name,
                "reading a Secret from the API: the foreign watches are at their bound"
            );
            return None;
        }
        let (store, writer) = reflector::store::<Secret>();
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let events = reflector::reflector(writer, watcher(api, cfg))
            .default_backoff()
            .touched_objects();
        let cr = ObjectRef::from_obj(for_cr);
        let task = tokio::spawn(forward(
            events,
            self.trigger.clone(),
            "secrets".into(),
            move |_: &Secret| Some(cr.clone()),
        ));
        tracing::info!(
            namespace,
            name,
            "watching a Secret the operator reads but does not manage"
        );
        foreign.insert(
            entry,
            Foreign {
                store: store.clone(),
                task,
                read: true,
            },
        );
        Some(store)
    }

    /// Closes the watch of every foreign Secret the reconcile that just gathered its facts did not
    /// read (only the module's CR reads them: a name no CR names any more is released at its next
    /// reconcile) and starts the next round; returns how many stay open.
    pub fn release_unread(&self) -> usize {
        let Ok(mut foreign) = self.foreign.lock() else {
            return 0;
        };
        foreign.retain(|(namespace, name), f| {
            if !f.read {
                tracing::info!(
                    namespace,
                    name,
                    "no longer watching a Secret no ConnectivityProxy names"
                );
            }
            f.read
        });
        for f in foreign.values_mut() {
            f.read = false;
        }
        foreign.len()
    }

    /// Every managed object of `kinds` that belongs to the CR `owner` (`namespace/name`), in
    /// `namespaces` (namespaced kinds) and cluster scope: from the caches, listed from the API only
    /// for a namespace no cache covers (a non-default Istio namespace).
    ///
    /// Secrets outside the CR's namespace are never listed: the tunnel's two Secrets there are read by
    /// name ([`tunnel_secret_names`]), each through a watch on exactly that name.
    pub async fn owned(
        &self,
        kinds: &[Kind],
        cr: &ConnectivityProxy,
        namespaces: &[String],
    ) -> Result<Vec<(Kind, DynamicObject)>, Error> {
        let (cr_ns, cr_name) = (cr.namespace().unwrap_or_default(), cr.name_any());
        let owner = (cr_ns.as_str(), cr_name.as_str());
        let belongs = |o: &DynamicObject| {
            let l = o.labels();
            crate::desired::is_managed(l)
                && l.get(names::LABEL_OWNER_NAMESPACE).map(String::as_str) == Some(owner.0)
                && l.get(names::LABEL_OWNER_NAME).map(String::as_str) == Some(owner.1)
        };
        let mut out = Vec::new();
        for &kind in kinds {
            let scopes: Vec<Option<&str>> = match kind.scope() {
                // Outside the CR's namespace (the Istio namespace) only the kinds that live there.
                Scope::Namespaced => namespaces
                    .iter()
                    .filter(|n| n.as_str() == owner.0 || kind.in_istio_namespace())
                    .map(|n| Some(n.as_str()))
                    .collect(),
                Scope::Cluster => vec![None],
            };
            for ns in scopes {
                if kind == Kind::Secret
                    && let Some(ns) = ns.filter(|n| *n != owner.0)
                {
                    for name in tunnel_secret_names(cr) {
                        if let Some(secret) = self.secret(ns, &name, cr).await? {
                            let o: DynamicObject =
                                serde_json::from_value(serde_json::to_value(&secret)?)?;
                            if belongs(&o) {
                                out.push((kind, o));
                            }
                        }
                    }
                    continue;
                }
                match self.store(kind, ns) {
                    Some(store) => {
                        let cached: Vec<DynamicObject> = store
                            .state()
                            .iter()
                            .filter(|o| belongs(o))
                            .map(|o| (**o).clone())
                            .collect();
                        let fresh = self.past_own_writes(kind, ns, cached).await?;
                        out.extend(fresh.into_iter().filter(|o| belongs(o)).map(|o| (kind, o)));
                    }
                    None if self.crd_missing(kind) => {}
                    None => out.extend(
                        crate::writer::list_owned(&self.client, kind, ns, owner)
                            .await?
                            .into_iter()
                            .map(|mut o| {
                                crate::mappings::slim_shard(kind, &mut o);
                                (kind, o)
                            }),
                    ),
                }
            }
        }
        Ok(out)
    }
}

impl Cache {
    /// `cached` (one kind and scope) with every object the operator wrote since the cache last saw
    /// it read from the API instead.
    async fn past_own_writes(
        &self,
        kind: Kind,
        ns: Option<&str>,
        mut cached: Vec<DynamicObject>,
    ) -> Result<Vec<DynamicObject>, Error> {
        let pending: Vec<Key> = match self.unseen_writes.lock() {
            Ok(w) => w
                .keys()
                .filter(|k| k.0 == kind && k.1.as_deref() == ns)
                .cloned()
                .collect(),
            Err(_) => vec![],
        };
        for key in pending {
            let pos = cached.iter().position(|o| o.name_any() == key.2);
            let rv = pos.and_then(|i| cached[i].metadata.resource_version.clone());
            if !self.behind(&key, rv.as_deref()) {
                continue;
            }
            if let Some(i) = pos {
                cached.remove(i);
            }
            cached.extend(
                crate::writer::read(&self.client, kind, ns, &key.2)
                    .await?
                    .map(|mut o| {
                        crate::mappings::slim_shard(kind, &mut o);
                        o
                    }),
            );
        }
        Ok(cached)
    }
}

/// The stores among `stores` that reading `kinds` in `namespaces` (and cluster scope) needs and that
/// have not had their first complete listing yet, named for a log line.
///
/// A kind whose CRD is absent counts as synced and empty: its store starts only once the CRD is
/// established (a watch would retry a failing LIST forever), so waiting for it would stall every
/// decision in a cluster without, say, cert-manager; and nothing of that kind can exist. From the
/// moment its CRD is established the kind gates like any other until its store has listed. A
/// namespace no cache covers is listed from the API when read, so it never waits.
pub fn unsynced_stores(
    stores: &HashMap<(Kind, Option<String>), Store<DynamicObject>>,
    crd_absent: impl Fn(Kind) -> bool,
    kinds: &[Kind],
    namespaces: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    for &kind in kinds.iter().filter(|k| !crd_absent(**k)) {
        let scopes: Vec<Option<String>> = match kind.scope() {
            Scope::Namespaced => namespaces.iter().cloned().map(Some).collect(),
            Scope::Cluster => vec![None],
        };
        for ns in scopes {
            let Some(store) = stores.get(&(kind, ns.clone())) else {
                continue;
            };
            if !matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
                let plural = kind.api_resource().plural;
                out.push(match ns {
                    Some(ns) => format!("{plural} in {ns}"),
                    None => plural,
                });
            }
        }
    }
    out
}

/// The Secrets the operator may own in the Istio namespace for `cr`: the tunnel's TLS Secret (when
/// auto-provisioned) and the Connectivity CA companion of the TLS Secret in use.
pub fn tunnel_secret_names(cr: &ConnectivityProxy) -> Vec<String> {
    let tls = cr
        .spec
        .ingress
        .as_ref()
        .and_then(|i| i.tls.as_ref())
        .map(|t| t.secret_name.clone())
        .filter(|n| !names::is_auto_provision(Some(n)));
    match tls {
        Some(user) => vec![names::cacert_secret_name(&user)],
        None => {
            let tls = names::tls_secret_name(&cr.name_any(), &cr.namespace().unwrap_or_default());
            vec![names::cacert_secret_name(&tls), tls]
        }
    }
}

/// How often a managed kind whose CRD is missing looks for it in the CRD store.
const CRD_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

fn crd_absent(crds: &Store<CustomResourceDefinition>, name: &str) -> bool {
    !crds
        .get(&ObjectRef::new(name))
        .is_some_and(|c| established(&c))
}

/// What the controller keeps of a CRD: its names and whether it is established ([`established`]).
/// Every CRD of the cluster is cached, and their OpenAPI schemas are most of their size: Istio's
/// alone are megabytes of JSON, several times that once parsed. Whether a CRD exists and is served
/// is all the controller asks of them.
pub fn slim_crd(crd: &mut CustomResourceDefinition) {
    cp_api::slim_for_cache(&mut crd.metadata);
    crd.metadata.labels = None;
    crd.metadata.annotations = None;
    crd.spec.conversion = None;
    for v in &mut crd.spec.versions {
        v.schema = None;
        v.additional_printer_columns = None;
        v.subresources = None;
        v.selectable_fields = None;
    }
    if let Some(status) = crd.status.as_mut() {
        status.stored_versions = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.retain(|c| c.type_ == "Established");
            for c in conditions.iter_mut() {
                c.message = None;
                c.reason = None;
            }
        }
    }
}

/// Whether a CRD is established (its API is served).
pub fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// A cached managed object as its typed form.
pub fn typed<K: serde::de::DeserializeOwned>(o: &DynamicObject) -> Result<K, Error> {
    Ok(serde_json::from_value(serde_json::to_value(o)?)?)
}

/// Feeds the CR each event belongs to into the controller's trigger channel.
/// Forwards a managed kind's watch events: an object's event wakes its owner CR ([`wakes`]).
async fn forward_managed<S>(
    events: S,
    mut trigger: Trigger,
    proxies: Store<ConnectivityProxy>,
    kind: Kind,
    echoes: &Echoes,
) where
    S: futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
{
    let what = kind.api_resource().plural;
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(o))
                if echoes.is_echo(
                    &(kind, o.namespace(), o.name_any()),
                    o.metadata.resource_version.as_deref(),
                ) =>
            {
                tracing::trace!(kind = %what, name = %o.name_any(), "the echo of an own write");
            }
            Ok(event) => {
                let all = || {
                    proxies
                        .state()
                        .iter()
                        .map(|c| ObjectRef::from_obj(&**c))
                        .collect()
                };
                for cr in wakes(&event, all) {
                    if trigger.send(cr).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(kind = %what, error = %e, "watch of a cached kind"),
        }
    }
}

/// The CRs a managed kind's watch event wakes: the owner of an applied or deleted object; every CR
/// (`all`) when a list completes, since what was deleted while the watch did not run sends no event.
pub fn wakes(
    event: &watcher::Event<DynamicObject>,
    all: impl FnOnce() -> Vec<ObjectRef<ConnectivityProxy>>,
) -> Vec<ObjectRef<ConnectivityProxy>> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            crate::desired::owner_of(o.labels()).into_iter().collect()
        }
        watcher::Event::InitDone => all(),
        watcher::Event::Init => vec![],
    }
}

async fn forward<K, S, F>(events: S, mut trigger: Trigger, what: String, owner: F)
where
    S: futures::Stream<Item = Result<K, watcher::Error>>,
    F: Fn(&K) -> Option<ObjectRef<ConnectivityProxy>>,
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(o) => {
                if let Some(cr) = owner(&o)
                    && trigger.send(cr).await.is_err()
                {
                    return;
                }
            }
            Err(e) => tracing::debug!(kind = %what, error = %e, "watch of a cached kind"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slimmed_crd_still_says_whether_it_is_established_and_keeps_no_schema() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gateways.networking.istio.io", "labels": {"a": "b"}},
            "spec": {"group": "networking.istio.io", "scope": "Namespaced",
                "names": {"plural": "gateways", "kind": "Gateway"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "description": "x".repeat(100_000)}}}]},
            "status": {"storedVersions": ["v1"], "conditions": [
                {"type": "NamesAccepted", "status": "True", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted"}]}
        }))
        .expect("CRD");
        assert!(established(&crd));
        let mut slim = crd.clone();
        slim_crd(&mut slim);
        assert!(established(&slim));
        assert_eq!(slim.metadata.name, crd.metadata.name);
        assert_eq!(slim.spec.names.plural, "gateways");
        let size = serde_json::to_string(&slim).expect("JSON").len();
        assert!(size < 600, "{size} bytes left: {slim:?}");
        let mut pending = crd;
        if let Some(c) = pending.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[1].status = "False".into();
        }
        slim_crd(&mut pending);
        assert!(!established(&pending));
    }

    /// A list that completes wakes every CR: an object deleted before the watch (re)listed sends no
    /// event of its own (the drift test once waited 20 s for a PeerAuthentication for this reason).
    #[test]
    fn a_completed_list_wakes_every_cr_and_an_object_its_owner() {
        let cr = |name: &str| ObjectRef::<ConnectivityProxy>::new(name).within(names::KYMA_SYSTEM);
        let all = || vec![cr("a"), cr("b")];
        assert_eq!(
            wakes(&watcher::Event::InitDone, all),
            vec![cr("a"), cr("b")]
        );
        assert!(wakes(&watcher::Event::Init, all).is_empty());
        let mut owned = DynamicObject::new("x", &Kind::ConfigMap.api_resource());
        owned.metadata.labels = Some(
            [
                (
                    names::LABEL_MANAGED_BY.to_string(),
                    names::MANAGED_BY_VALUE.to_string(),
                ),
                (
                    names::LABEL_OWNER_NAMESPACE.to_string(),
                    names::KYMA_SYSTEM.to_string(),
                ),
                (names::LABEL_OWNER_NAME.to_string(), "a".to_string()),
            ]
            .into(),
        );
        for event in [
            watcher::Event::Apply(owned.clone()),
            watcher::Event::Delete(owned.clone()),
            watcher::Event::InitApply(owned.clone()),
        ] {
            assert_eq!(wakes(&event, all), vec![cr("a")]);
        }
        let foreign = DynamicObject::new("y", &Kind::ConfigMap.api_resource());
        assert!(wakes(&watcher::Event::Delete(foreign), all).is_empty());
    }

    /// The echo of an own write wakes nobody; the next version of the object (someone else's write)
    /// and a version the write did not produce wake as always; the record is used once.
    #[test]
    fn only_the_event_at_the_version_an_own_write_produced_is_its_echo() {
        let echoes = Echoes::default();
        let key: Key = (Kind::ConfigMap, Some(names::KYMA_SYSTEM.into()), "x".into());
        let other: Key = (Kind::ConfigMap, Some(names::KYMA_SYSTEM.into()), "y".into());
        assert!(!echoes.is_echo(&key, Some("5")), "no write recorded");
        echoes.wrote(key.clone(), "5".into());
        assert!(!echoes.is_echo(&other, Some("5")), "another object");
        assert!(echoes.is_echo(&key, Some("5")));
        assert!(!echoes.is_echo(&key, Some("5")), "an echo is taken once");
        echoes.wrote(key.clone(), "7".into());
        assert!(
            !echoes.is_echo(&key, Some("6")),
            "an older or newer version"
        );
        assert!(
            !echoes.is_echo(&key, Some("7")),
            "forgotten at the first event"
        );
        echoes.wrote(key.clone(), "8".into());
        assert!(!echoes.is_echo(&key, None));
    }

    fn listed(writer: &mut reflector::store::Writer<DynamicObject>) {
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    #[test]
    fn no_decision_reads_a_store_that_has_not_listed_unless_its_crd_is_absent() {
        let ks = || Some(names::KYMA_SYSTEM.to_string());
        let mut writers = HashMap::new();
        let mut stores = HashMap::new();
        for key in [
            (Kind::ConfigMap, ks()),
            (Kind::Secret, ks()),
            (Kind::Gateway, Some(names::ISTIO_NAMESPACE.to_string())),
            (Kind::PriorityClass, None),
            (Kind::StatefulSet, ks()),
        ] {
            let w = reflector::store::Writer::<DynamicObject>::new(key.0.api_resource());
            stores.insert(key.clone(), w.as_reader());
            writers.insert(key, w);
        }
        for key in [(Kind::ConfigMap, ks()), (Kind::PriorityClass, None)] {
            listed(writers.get_mut(&key).expect("writer"));
        }
        let namespaces = vec![
            names::KYMA_SYSTEM.to_string(),
            names::ISTIO_NAMESPACE.to_string(),
            // No cache covers it: read from the API, never waited for.
            "istio-ingress".to_string(),
        ];
        let kinds = [
            Kind::ConfigMap,
            Kind::Secret,
            Kind::Gateway,
            Kind::PriorityClass,
        ];
        let istio_absent = |k: Kind| k == Kind::Gateway;
        // The Secret store has not listed: no prune, no deletion. The Gateway store never starts
        // while its CRD is absent: nothing of that kind exists, so it is synced and empty. The
        // StatefulSet store is not read by this decision.
        assert_eq!(
            unsynced_stores(&stores, istio_absent, &kinds, &namespaces),
            vec!["secrets in kyma-system".to_string()]
        );
        // Once the Istio CRDs appear, the Gateway store gates from then on, until it has listed.
        assert_eq!(
            unsynced_stores(&stores, |_| false, &kinds, &namespaces),
            vec![
                "secrets in kyma-system".to_string(),
                "gateways in istio-system".to_string()
            ]
        );
        listed(writers.get_mut(&(Kind::Secret, ks())).expect("writer"));
        listed(
            writers
                .get_mut(&(Kind::Gateway, Some(names::ISTIO_NAMESPACE.to_string())))
                .expect("writer"),
        );
        assert!(unsynced_stores(&stores, |_| false, &kinds, &namespaces).is_empty());
    }
}
