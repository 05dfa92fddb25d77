//! Deletion: blocked while ServiceMappings exist, otherwise every managed object in every namespace
//! and cluster scope is removed, then the finalizer.

use cp_api::reason::Reason;
use cp_api::{ConnectivityProxy, State, names};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;

use crate::Error;
use crate::context::Ctx;
use crate::status::{self, Computed, Cond, types};

/// How many mapping names a status message lists.
const LIST_AT_MOST: usize = 20;

/// Reconciles a CR that is being deleted.
pub async fn reconcile_deletion(cr: &ConnectivityProxy, ctx: &Ctx) -> Result<Action, Error> {
    if !cr.finalizers().iter().any(|f| f == names::FINALIZER) {
        return Ok(Action::await_change());
    }
    let mut mappings: Vec<String> = ctx.mappings.state().iter().map(|m| m.name_any()).collect();
    if !mappings.is_empty() {
        mappings.sort();
        let more = mappings.len().saturating_sub(LIST_AT_MOST);
        let mut listed = mappings
            .iter()
            .take(LIST_AT_MOST)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            listed.push_str(&format!(" and {more} more"));
        }
        let msg = format!(
            "deletion is blocked while ServiceMappings exist: {listed}; delete them (kubectl delete servicemappings --all) to continue"
        );
        let computed = Computed::blocked(
            State::Warning,
            vec![],
            Cond::failed(
                types::INSTALLED,
                Reason::DeletionBlockedByServiceMappings,
                msg,
            ),
        );
        status::write(ctx, cr, &computed).await?;
        // The mapping watch wakes us when they are gone; the resync is the fallback.
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let computed = Computed::blocked(
        State::Deleting,
        vec![],
        Cond::failed(
            types::INSTALLED,
            Reason::Deleting,
            "removing every managed object",
        ),
    );
    status::write(ctx, cr, &computed).await?;
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    for (kind, obj) in ctx
        .cache
        .owned(
            &ctx.available_kinds(),
            cr,
            &crate::desired::object_namespaces(cr),
        )
        .await?
    {
        ctx.applier
            .delete(kind, obj.namespace().as_deref(), &obj.name_any())
            .await?;
    }
    let remaining: Vec<String> = cr
        .finalizers()
        .iter()
        .filter(|f| *f != names::FINALIZER)
        .cloned()
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": cr.finalizers()},
        {"op": "replace", "path": "/metadata/finalizers", "value": remaining},
    ]))?;
    Api::<ConnectivityProxy>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|e| Error::kube("removing the finalizer", e))?;
    ctx.metrics.forget(&ns, &name);
    tracing::info!(namespace = %ns, %name, "every managed object removed; finalizer released");
    Ok(Action::await_change())
}
