//! The reconcile: [`gather`](crate::gather::gather) the facts, [`plan`](crate::plan::plan) purely,
//! then carry the plan out here — apply what differs, prune, write the status once.

use cp_api::reason::Reason;
use std::sync::Arc;
use std::time::Instant;

use cp_api::ConnectivityProxy;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;

use crate::Error;
use crate::context::Ctx;
use crate::desired::Kind;
use crate::plan::{CrPatch, Install, Plan, Then};
use crate::status;

/// Reconciles one CR, recording metrics; one span per reconcile names the CR and its generation.
#[tracing::instrument(skip_all, fields(namespace = %cr.namespace().unwrap_or_default(), name = %cr.name_any(), generation = ?cr.metadata.generation, action))]
pub async fn reconcile(cr: Arc<ConnectivityProxy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = Instant::now();
    // Right after a start the caches may be empty: an empty mapping list would publish an empty
    // mappings ConfigMap or let a blocked deletion proceed. Nothing is decided before they synced.
    if !ctx.synced.load(std::sync::atomic::Ordering::SeqCst) {
        tracing::info!("caches not synced yet; reconciling once they are");
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    let cr = match current(&cr, &ctx).await {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(Action::await_change()),
        Err(e) => return Err(e),
    };
    // The managed-object caches this CR's prune and deletion read: an object a cache has not listed
    // yet would be left behind by a deletion (the finalizer released) or kept by a prune. A kind
    // whose CRD is absent counts as listed and empty, so a cluster without it does not stall.
    let pending = ctx.cache.unsynced(
        &ctx.available_kinds(),
        &crate::desired::object_namespaces(&cr),
    );
    if !pending.is_empty() {
        tracing::info!(stores = ?pending, "managed-object caches not synced yet; reconciling once they are");
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    let result = install(&cr, &ctx).await;
    let label = match &result {
        Ok(_) => "success",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[label])
        .observe(start.elapsed().as_secs_f64());
    ctx.metrics
        .service_mappings
        .set(ctx.mappings.read().map_or(0, |s| s.len()) as i64);
    tracing::debug!(result = ?result, elapsed = ?start.elapsed(), "reconcile finished");
    if result.is_ok()
        && let Ok(mut f) = ctx.failures.lock()
    {
        f.remove(&failure_key(&cr));
    }
    result
}

fn failure_key(cr: &ConnectivityProxy) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

/// The delay after the `n`-th consecutive failure: 2 s doubling to at most 5 minutes.
pub fn backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_secs(2u64.saturating_mul(1u64 << n.min(8)).min(300))
}

/// The CR as stored now (one quorum read), not as the watch last delivered it: a watch can miss an
/// event when etcd restarts right after a write (seen with kube-apiserver 1.37), and a resync would
/// otherwise reconcile the stale copy forever. `None` when the CR is gone.
async fn current(
    cached: &Arc<ConnectivityProxy>,
    ctx: &Ctx,
) -> Result<Option<Arc<ConnectivityProxy>>, Error> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(ctx.client.clone(), &cached.namespace().unwrap_or_default());
    match api.get_opt(&cached.name_any()).await {
        Ok(Some(fresh)) => {
            if fresh.metadata.generation > cached.metadata.generation {
                tracing::info!(
                    namespace = cached.namespace().unwrap_or_default(),
                    name = cached.name_any(),
                    cached = ?cached.metadata.generation,
                    current = ?fresh.metadata.generation,
                    "the watch was behind; reconciling the current generation"
                );
            }
            Ok(Some(Arc::new(fresh)))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(Error::kube("reading the ConnectivityProxy", e)),
    }
}

/// Requeue with exponential backoff (capped) on consecutive errors; a success resets it.
pub fn error_policy(cr: Arc<ConnectivityProxy>, err: &Error, ctx: Arc<Ctx>) -> Action {
    let n = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(failure_key(&cr)).or_insert(0);
            *n = n.saturating_add(1);
            *n - 1
        })
        .unwrap_or(0);
    let delay = backoff(n);
    tracing::warn!(namespace = cr.namespace().unwrap_or_default(), name = cr.name_any(), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Gather → plan → execute.
async fn install(cr: &ConnectivityProxy, ctx: &Ctx) -> Result<Action, Error> {
    let mut facts = crate::gather::gather(cr, ctx).await?;
    facts.settle_tunnel_keys(cr, &ctx.settings.tunnel);
    let plan = crate::plan::plan(cr, &facts, &ctx.settings);
    let span = tracing::Span::current();
    match plan {
        Plan::Blocked { status, then } => {
            span.record("action", "blocked");
            status::write(ctx, cr, &status).await?;
            match then {
                Then::Requeue(after) => Ok(Action::requeue(after)),
                Then::Fail(msg) => {
                    ctx.metrics
                        .cert_failures
                        .with_label_values(&["tunnel"])
                        .inc();
                    Err(Error::Certificate(msg))
                }
            }
        }
        Plan::UpdateCr(patches) => {
            span.record("action", "update-cr");
            update_cr(cr, ctx, &patches).await?;
            Ok(Action::requeue(crate::plan::NEXT_STEP))
        }
        Plan::Migrate(step) => {
            span.record("action", "migrate");
            let outcome = match crate::migration::execute(&ctx.applier, cr, *step).await {
                Ok(o) => o,
                // A backup name taken by an object the operator cannot prove it wrote: the takeover
                // waits (the legacy installation keeps running) and the status names the object.
                Err(e @ Error::NotOurs(_)) => {
                    let failed = status::Cond::failed(
                        status::types::INSTALLED,
                        Reason::ObjectNotOwned,
                        e.to_string(),
                    );
                    let computed =
                        status::Computed::blocked(cp_api::State::Warning, vec![], failed);
                    status::write(ctx, cr, &computed).await?;
                    return Ok(Action::requeue(crate::plan::OUTSIDE_RECHECK));
                }
                Err(e) => return Err(e),
            };
            if let crate::migration::Outcome::LeftAlone(objects) = &outcome {
                status::warn(
                    ctx,
                    cr,
                    Reason::LegacyLookAlikeLeftAlone,
                    &format!(
                        "the legacy takeover left these objects as they are: they have a legacy name but no mark of the legacy installation (reconciler label or annotation, Helm chart labels), so they may be someone else's: {}. Delete them yourself if they are left-overs of the legacy installation",
                        objects.join(", ")
                    ),
                )
                .await;
            }
            match crate::plan::migration_status(&outcome) {
                Some((computed, after)) => {
                    status::write(ctx, cr, &computed).await?;
                    Ok(Action::requeue(after))
                }
                // The takeover finished in an earlier step: install from fresh facts right away.
                None => Ok(Action::requeue(std::time::Duration::ZERO)),
            }
        }
        Plan::Delete(deletion) => {
            span.record("action", "delete");
            for step in &deletion.steps {
                crate::deletion::execute(cr, ctx, step).await?;
            }
            Ok(deletion.then.clone())
        }
        Plan::Install(install) => {
            span.record("action", "install");
            execute(cr, ctx, &install).await
        }
    }
}

/// Writes the CR itself: the finalizer, this release's defaults.
async fn update_cr(cr: &ConnectivityProxy, ctx: &Ctx, patches: &[CrPatch]) -> Result<(), Error> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
    let writer = ctx.applier.writer();
    for p in patches {
        let (patch, what) = match p {
            CrPatch::Finalizer(v) => (
                Patch::Json::<serde_json::Value>(serde_json::from_value(v.clone())?),
                "adding the finalizer",
            ),
            CrPatch::ReleaseDefaults(v) => (
                Patch::Merge(v.clone()),
                "moving spec.deployment to this release's defaults (fields someone changed are kept)",
            ),
        };
        writer
            .write(&api, &cr.name_any(), &patch, what)
            .await
            .map_err(|e| Error::kube(what, e))?;
    }
    Ok(())
}

/// Applies what differs, prunes what is no longer desired, updates the ServiceMappings, writes the
/// status once.
async fn execute(cr: &ConnectivityProxy, ctx: &Ctx, install: &Install) -> Result<Action, Error> {
    record_tunnel(ctx, install);
    ctx.metrics
        .service_mapping_bytes
        .set(install.mapping_bytes as i64);
    ctx.metrics
        .service_mapping_shards
        .set(install.mapping_shards as i64);
    if let Err(e) = write_objects(ctx, install).await {
        let (computed, after) = crate::plan::apply_failed(install, &e);
        status::write(ctx, cr, &computed).await?;
        return match after {
            Some(after) => Ok(Action::requeue(after)),
            None => Err(e),
        };
    }
    let port = cp_api::validation::external_port(&cr.spec);
    // The endpoints about to be written: their watch events are echoes and wake nobody. The
    // mappings to write come from the state's unsettled set (kept by the watch one change at a
    // time), not from a look at every mapping.
    let (unsettled, left) = {
        let mut state = ctx
            .mappings
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.expect_endpoints(&install.resolved.external_host, port);
        state.unsettled(crate::mappings::MAPPINGS_PER_RECONCILE)
    };
    let mut requeue = install.requeue;
    // More mappings to take over than one reconcile does: the next follows at once.
    if left {
        requeue = requeue.min(std::time::Duration::from_millis(50));
    }
    if let Err(e) = crate::mappings::reconcile_mappings(
        ctx.applier.writer(),
        unsettled,
        &install.resolved,
        port,
    )
    .await
    {
        // No longer woken by the echoes of its own writes, a failed one is retried soon.
        tracing::warn!(error = %e, "updating ServiceMappings");
        requeue = requeue.min(std::time::Duration::from_secs(5));
    }
    report_conflicts(ctx, &install.conflicts).await;
    report_unproven(ctx, cr, &install.unproven).await;
    status::write(ctx, cr, &install.status).await?;
    if install.status.state == cp_api::State::Ready
        && let Err(e) = ctx
            .applier
            .proof()
            .close_adoption(ctx.applier.writer())
            .await
    {
        tracing::warn!(error = %e, "closing the ownership adoption window (retried at the next Ready reconcile)");
    }
    Ok(Action::requeue(requeue))
}

/// A Warning Event naming the objects that wear the operator's labels without its ownership proof,
/// once per set: they are neither written, pruned nor deleted.
async fn report_unproven(ctx: &Ctx, cr: &ConnectivityProxy, unproven: &[String]) {
    let current: std::collections::BTreeSet<String> = unproven.iter().cloned().collect();
    let changed = match ctx.reported_unproven.lock() {
        Ok(mut reported) => {
            let changed = *reported != current;
            *reported = current;
            changed
        }
        Err(_) => false,
    };
    if !changed || unproven.is_empty() {
        return;
    }
    tracing::warn!(objects = %unproven.join(", "), "objects with the operator's labels but no ownership proof left alone");
    status::warn(
        ctx,
        cr,
        Reason::UnprovenObjectLeftAlone,
        &format!(
            "these objects carry the operator's labels but no ownership proof (annotation {}), so the operator did not create them: it neither overwrites, prunes nor deletes them: {}. Remove the labels {} and {} from them if they are yours; delete them if they are left-overs",
            cp_api::keys::OWNERSHIP_PROOF_ANNOTATION,
            unproven.join(", "),
            cp_api::names::LABEL_MANAGED_BY,
            cp_api::names::LABEL_OWNER_NAME,
        ),
    )
    .await;
}

/// A Warning Event on each mapping that is not published, once per (mapping, winner): a steady
/// state writes no Events. A conflict that is resolved and comes back is reported again.
async fn report_conflicts(ctx: &Ctx, conflicts: &[crate::mappings::Conflict]) {
    let id = |c: &crate::mappings::Conflict| {
        let uid = |m: &crate::mappings::Mapping| match &*m.uid {
            "" => m.name().to_string(),
            uid => uid.to_string(),
        };
        (uid(&c.loser), uid(&c.winner))
    };
    let new: Vec<&crate::mappings::Conflict> = match ctx.reported_conflicts.lock() {
        Ok(mut reported) => {
            let current: std::collections::HashSet<_> = conflicts.iter().map(id).collect();
            let new = conflicts
                .iter()
                .filter(|c| !reported.contains(&id(c)))
                .collect();
            *reported = current;
            new
        }
        Err(_) => return,
    };
    for c in new {
        tracing::warn!(mapping = %c.loser.name(), older = %c.winner.name(), "duplicate ServiceMapping not published");
        let event = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: Reason::DuplicateServiceMapping.into(),
            note: Some(status::truncate(&c.message(), 1000)),
            action: "Publish".into(),
            secondary: Some(c.winner.object_ref()),
        };
        status::publish(ctx, &event, &c.loser.object_ref()).await;
    }
}

fn record_tunnel(ctx: &Ctx, install: &Install) {
    if install.tunnel.issued {
        ctx.metrics
            .cert_rotations
            .with_label_values(&["tunnel"])
            .inc();
        tracing::info!(host = %install.resolved.external_host, "business tunnel certificate issued");
    }
    if let Some(pem) = &install.tunnel.leaf_pem {
        crate::certificates::observe(&ctx.metrics, "tunnel", pem);
    }
}

/// Applies the writes in two waves, each wave's writes at once: first what the proxy's pods need
/// before they start (PriorityClass, NetworkPolicies, ConfigMaps, Secrets, Services), then the
/// StatefulSet and everything that follows it in [`Kind::ALL`]'s order. An edit that changes a
/// ConfigMap and the StatefulSet thus costs two round trips, not one per object; a pod the new
/// StatefulSet starts still finds its configuration written. Every write of a wave is waited for,
/// the first error (in apply order) is returned, and the next wave is not started after one.
async fn write_objects(ctx: &Ctx, install: &Install) -> Result<(), Error> {
    let (before, after): (Vec<_>, Vec<_>) = install
        .writes
        .iter()
        .partition(|w| before_workload(w.desired.kind));
    for wave in [before, after] {
        let results = futures::future::join_all(wave.iter().map(|w| write_one(ctx, w))).await;
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    }
    let shards: Vec<&crate::plan::Write> = install
        .writes
        .iter()
        .filter(|w| {
            w.desired.kind == Kind::ConfigMap
                && cp_api::names::mapping_shard(&w.desired.name).is_some()
        })
        .collect();
    if !shards.is_empty() {
        let bytes = shards.iter().map(|w| w.digest.len).sum();
        ctx.shard_writes.record(std::time::Instant::now(), bytes);
        // The proxy's pods are told, so that the kubelet refreshes their files now.
        let written: String = shards
            .iter()
            .map(|w| format!("{}={};", w.desired.name, w.digest.hash))
            .collect();
        let ns = shards[0].desired.namespace.as_deref().unwrap_or_default();
        crate::pods::refresh_mapping_files(
            ctx.applier.writer(),
            ns,
            &crate::desired::hash_str(&written),
        )
        .await;
    }
    for p in &install.prune {
        ctx.applier
            .remove(
                p.kind,
                &p.meta,
                "a managed object that is no longer desired",
            )
            .await?;
    }
    Ok(())
}

/// Whether objects of `kind` go out in the first wave: before the StatefulSet in apply order.
fn before_workload(kind: Kind) -> bool {
    let pos = |k: Kind| Kind::ALL.iter().position(|x| *x == k);
    pos(kind) < pos(Kind::StatefulSet)
}

async fn write_one(ctx: &Ctx, w: &crate::plan::Write) -> Result<(), Error> {
    let body = w.body();
    let d = &*body;
    if let Some(after) = ctx
        .applier
        .apply_with(d, &w.digest, w.confirm_absent, &w.why)
        .await?
    {
        let key = (d.kind, d.namespace.clone(), d.name.clone());
        ctx.cache.wrote(key, w.cached_version.clone(), after);
        ctx.metrics
            .applies
            .with_label_values(&[&d.kind.api_resource().kind])
            .inc();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Kind, before_workload};

    #[test]
    fn what_the_pods_need_goes_out_before_the_statefulset() {
        for k in [
            Kind::PriorityClass,
            Kind::NetworkPolicy,
            Kind::ConfigMap,
            Kind::Secret,
            Kind::Service,
        ] {
            assert!(before_workload(k), "{k:?}");
        }
        for k in [
            Kind::StatefulSet,
            Kind::Gateway,
            Kind::ServiceInstance,
            Kind::ServiceBinding,
        ] {
            assert!(!before_workload(k), "{k:?}");
        }
    }

    use super::backoff;
    use std::time::Duration;

    #[test]
    fn error_backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(2));
        assert_eq!(backoff(1), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(64));
        assert_eq!(backoff(7), Duration::from_secs(256));
        assert_eq!(backoff(8), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
    }
}
