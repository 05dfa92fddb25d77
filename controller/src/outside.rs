//! ConnectivityProxy CRs outside the module's namespace. The controller reconciles and caches only the
//! CRs in kyma-system; of every other CR it watches the metadata alone, keeps nothing but its identity
//! (namespace, name, uid, generation — a few hundred bytes, whatever the CR's editor wrote into it) and
//! answers each new generation with the same Warning the plan gives (`OutsideModuleNamespace`). A CR
//! an editor of any namespace creates, with 256 kB of annotations, costs the controller no memory
//! beyond that identity.
//!
//! Those identities are also what the module's own CR names in its status
//! (`ConnectivityProxiesOutsideModuleNamespace`): lifecycle-manager removes the module only once no CR
//! of its CRDs is left in any namespace (kyma-project/lifecycle-manager#3006, PR #3012, after the ADR
//! in kyma-project/community#972), so each such CR silently blocks the module's removal.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cp_api::reason::Reason;
use cp_api::{ConnectivityProxy, State, names};
use futures::StreamExt;
use kube::api::{Api, ObjectMeta, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};

use crate::context::Ctx;
use crate::status::Computed;

/// Namespace and name of a CR.
type Name = (String, String);
/// The uid and generation of a CR last answered.
type Seen = (String, Option<i64>);

/// Watches the metadata of every ConnectivityProxy and gives each one outside kyma-system its
/// Warning status (and Event) once per generation; forgets a CR (and its metrics) when it is deleted.
pub async fn run(ctx: Arc<Ctx>) {
    // `Api<PartialObjectMeta<_>>` lists and watches metadata only (no spec, no status on the wire).
    let api: Api<PartialObjectMeta<ConnectivityProxy>> = Api::all(ctx.client.clone());
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut answered: HashMap<Name, Seen> = HashMap::new();
    // The CRs a re-list has seen so far: a CR deleted while the watch was down is forgotten at its end.
    let mut relisted: Option<HashSet<Name>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => relisted = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(m)) => {
                if let Some(seen) = relisted.as_mut()
                    && let Some(id) = identity(&m.metadata)
                {
                    seen.insert(id);
                }
                note(&ctx, &mut answered, m).await;
            }
            Ok(watcher::Event::InitDone) => {
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<Name> = answered
                    .keys()
                    .filter(|k| !seen.contains(k))
                    .cloned()
                    .collect();
                for (ns, name) in gone {
                    answered.remove(&(ns.clone(), name.clone()));
                    ctx.metrics.forget(&ns, &name);
                }
                let changed = ctx.outside.lock().is_ok_and(|mut known| {
                    let before = known.len();
                    known.retain(|id| seen.contains(id));
                    known.len() != before
                });
                if changed {
                    wake_module_crs(&ctx);
                }
            }
            Ok(watcher::Event::Apply(m)) => note(&ctx, &mut answered, m).await,
            Ok(watcher::Event::Delete(m)) => {
                if let Some((ns, name)) = identity(&m.metadata) {
                    let id = (ns, name);
                    if answered.remove(&id).is_some() {
                        ctx.metrics.forget(&id.0, &id.1);
                    }
                    if ctx.outside.lock().is_ok_and(|mut known| known.remove(&id)) {
                        wake_module_crs(&ctx);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "metadata watch of ConnectivityProxies"),
        }
    }
}

/// Wakes every CR in kyma-system: their status names the CRs outside it, which just changed.
fn wake_module_crs(ctx: &Ctx) {
    for cr in ctx.proxies.state() {
        // A full channel drops the wake-up; the CR's resync is the fallback.
        let _ = ctx
            .wake
            .clone()
            .try_send(kube::runtime::reflector::ObjectRef::from_obj(&*cr));
    }
}

/// Namespace and name of a CR outside kyma-system (`None` for the module's own CRs).
fn identity(meta: &ObjectMeta) -> Option<Name> {
    let ns = meta.namespace.as_deref()?;
    (ns != names::KYMA_SYSTEM).then(|| (ns.to_string(), meta.name.clone().unwrap_or_default()))
}

/// Answers one CR outside kyma-system, unless its current generation was answered already. Only the
/// identity of the event's metadata is kept; the rest (labels, annotations, managed fields) is dropped
/// with the event.
async fn note(
    ctx: &Ctx,
    answered: &mut HashMap<Name, Seen>,
    m: PartialObjectMeta<ConnectivityProxy>,
) {
    let Some(id) = identity(&m.metadata) else {
        return;
    };
    // Known until it is gone, also while it is being deleted (it still blocks the module's removal).
    if ctx
        .outside
        .lock()
        .is_ok_and(|mut known| known.insert(id.clone()))
    {
        wake_module_crs(ctx);
    }
    if m.metadata.deletion_timestamp.is_some() {
        return;
    }
    let seen = (
        m.metadata.uid.clone().unwrap_or_default(),
        m.metadata.generation,
    );
    if answered.get(&id) == Some(&seen) {
        return;
    }
    // The CR as far as the status needs it: identity and generation, no spec, no status (so the
    // status is written and the Event published once per generation).
    let mut cr = ConnectivityProxy::new(&id.1, Default::default());
    cr.metadata = ObjectMeta {
        name: m.metadata.name,
        namespace: m.metadata.namespace,
        uid: m.metadata.uid,
        generation: m.metadata.generation,
        ..ObjectMeta::default()
    };
    let computed = Computed::blocked(
        State::Warning,
        vec![],
        crate::plan::outside_module_namespace(),
    );
    debug_assert_eq!(computed.reason, Reason::OutsideModuleNamespace);
    match crate::status::write(ctx, &cr, &computed).await {
        Ok(()) => {
            answered.insert(id, seen);
        }
        // Not remembered: the next event (or re-list) answers again.
        Err(e) => {
            tracing::warn!(namespace = %id.0, name = %id.1, error = %e, "writing the status of a ConnectivityProxy outside kyma-system")
        }
    }
}
