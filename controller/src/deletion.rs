//! Deletion, a part of the one plan: [`plan_deletion`] decides purely from the CR's finalizers and
//! the gathered facts (blocked while any ServiceMapping exists, otherwise every managed object the
//! operator can prove it created, in every namespace and cluster scope, is removed, then the
//! finalizer); the reconcile carries the steps out in order ([`execute`]).

use std::time::Duration;

use cp_api::reason::Reason;
use cp_api::{ConnectivityProxy, State, names};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use serde_json::Value;

use crate::Error;
use crate::context::Ctx;
use crate::gather::Facts;
use crate::status::{self, Computed, Cond, types};

/// How many mapping names a status message lists.
const LIST_AT_MOST: usize = crate::mappings::NAMES_LISTED;

/// One write of a deletion, in the order carried out.
#[derive(Clone, Debug, PartialEq)]
pub enum DeletionStep {
    /// Write this status.
    WriteStatus(Computed),
    /// Delete every managed object of the CR the operator can prove it created (after the
    /// `Deleting` status is written), each only while it is still the object read; those with its
    /// labels but no proof are left alone (`Kind ns/name`, logged).
    DeleteOwned {
        /// What is deleted.
        objects: Vec<crate::writer::Prune>,
        /// What is left alone.
        left_alone: Vec<String>,
    },
    /// Apply this JSON patch to the CR: it removes the operator's finalizer and keeps every other,
    /// and fails if the finalizers changed meanwhile.
    RemoveFinalizer(Value),
    /// Drop the CR's metrics.
    ForgetMetrics,
}

/// What deleting a CR does.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionPlan {
    /// The writes, in order.
    pub steps: Vec<DeletionStep>,
    /// What follows.
    pub then: Action,
}

/// The deletion of a CR with `finalizers`, from the ServiceMappings and the managed objects in
/// `facts`; a blocked deletion is looked at again after `resync`.
pub fn plan_deletion(finalizers: &[String], facts: &Facts, resync: Duration) -> DeletionPlan {
    let mappings: Vec<&str> = facts.mappings.names().collect();
    if !finalizers.iter().any(|f| f == names::FINALIZER) {
        return DeletionPlan {
            steps: vec![],
            then: Action::await_change(),
        };
    }
    if !mappings.is_empty() {
        // The facts carry the smallest names, sorted, and the count.
        let more = facts.mappings.len().saturating_sub(LIST_AT_MOST);
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
        return DeletionPlan {
            steps: vec![DeletionStep::WriteStatus(computed)],
            // The mapping watch wakes us when they are gone; the resync is the fallback.
            then: Action::requeue(resync),
        };
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
    let remaining: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != names::FINALIZER)
        .collect();
    let path = ["metadata", "finalizers"];
    let patch = crate::desired::body(&json_patch::Patch(vec![
        crate::writer::json_op::test(&path, finalizers),
        crate::writer::json_op::replace(&path, remaining),
    ]));
    DeletionPlan {
        steps: vec![
            DeletionStep::WriteStatus(computed),
            DeletionStep::DeleteOwned {
                objects: facts
                    .owned
                    .iter()
                    .map(|(k, o)| crate::writer::Prune::of(k.0, o))
                    .collect(),
                left_alone: facts.unproven.iter().map(crate::cache::describe).collect(),
            },
            DeletionStep::RemoveFinalizer(patch),
            DeletionStep::ForgetMetrics,
        ],
        then: Action::await_change(),
    }
}

/// Carries out one step.
pub async fn execute(cr: &ConnectivityProxy, ctx: &Ctx, step: &DeletionStep) -> Result<(), Error> {
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    match step {
        DeletionStep::WriteStatus(computed) => status::write(ctx, cr, computed).await?,
        DeletionStep::DeleteOwned {
            objects,
            left_alone,
        } => {
            for o in left_alone {
                tracing::warn!(object = %o, "left alone on deletion: the operator's labels without its ownership proof");
            }
            for p in objects {
                ctx.applier
                    .remove(p.kind, &p.meta, "the ConnectivityProxy is being deleted")
                    .await?;
            }
        }
        DeletionStep::RemoveFinalizer(patch) => {
            let patch: json_patch::Patch = serde_json::from_value(patch.clone())?;
            let api = Api::<ConnectivityProxy>::namespaced(ctx.client.clone(), &ns);
            ctx.applier
                .writer()
                .write(
                    &api,
                    &name,
                    &Patch::Json::<()>(patch),
                    "removing the finalizer",
                )
                .await
                .map_err(|e| Error::kube("removing the finalizer", e))?;
        }
        DeletionStep::ForgetMetrics => {
            ctx.metrics.forget(&ns, &name);
            tracing::info!(namespace = %ns, %name, "every managed object removed; finalizer released");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RESYNC: Duration = Duration::from_secs(600);

    fn finalizers(list: &[&str]) -> Vec<String> {
        list.iter().map(|f| f.to_string()).collect()
    }

    /// Facts with these ServiceMappings and no managed objects.
    fn with_mappings(names: Vec<String>) -> Facts {
        let mut facts = Facts::not_installed(None, Default::default());
        let mappings: Vec<std::sync::Arc<cp_api::ServiceMapping>> = names
            .into_iter()
            .map(|n| {
                std::sync::Arc::new(
                    serde_json::from_value(json!({
                        "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                        "metadata": {"name": n},
                        "spec": {"type": "TCP", "subaccountId": "s", "serviceId": "x", "internalAddress": "h:1"}
                    }))
                    .expect("mapping"),
                )
            })
            .collect();
        facts.mappings = crate::mappings::MappingFacts::of_objects(&mappings, 1);
        facts
    }

    fn status_of(plan: &DeletionPlan) -> &Computed {
        match plan.steps.first() {
            Some(DeletionStep::WriteStatus(c)) => c,
            other => panic!("no status first: {other:?}"),
        }
    }

    #[test]
    fn without_the_finalizer_nothing_is_done() {
        for mappings in [vec![], vec!["m-1".to_string()]] {
            let plan = plan_deletion(
                &finalizers(&["other/finalizer"]),
                &with_mappings(mappings),
                RESYNC,
            );
            assert_eq!(
                plan,
                DeletionPlan {
                    steps: vec![],
                    then: Action::await_change()
                }
            );
        }
    }

    #[test]
    fn service_mappings_block_the_deletion_with_a_warning_naming_at_most_20() {
        let mappings: Vec<String> = (0..25).rev().map(|i| format!("m-{i:02}")).collect();
        let plan = plan_deletion(
            &finalizers(&[names::FINALIZER]),
            &with_mappings(mappings),
            RESYNC,
        );
        assert_eq!(plan.steps.len(), 1, "only the status: {:?}", plan.steps);
        assert_eq!(plan.then, Action::requeue(RESYNC));
        let status = status_of(&plan);
        assert_eq!(status.state, State::Warning);
        assert_eq!(status.reason, Reason::DeletionBlockedByServiceMappings);
        let listed: Vec<String> = (0..20).map(|i| format!("m-{i:02}")).collect();
        assert!(
            status.description.contains(&format!(
                "ServiceMappings exist: {} and 5 more; delete them",
                listed.join(", ")
            )),
            "sorted, at most 20: {}",
            status.description
        );

        let plan = plan_deletion(
            &finalizers(&[names::FINALIZER]),
            &with_mappings(vec!["b".into(), "a".into()]),
            RESYNC,
        );
        let description = &status_of(&plan).description;
        assert!(
            description.contains("exist: a, b; delete them") && !description.contains("more"),
            "{description}"
        );
    }

    #[test]
    fn without_mappings_everything_is_removed_then_only_our_finalizer() {
        let before = finalizers(&["a/first", names::FINALIZER, "z/last"]);
        let mut facts = with_mappings(vec![]);
        let cm: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "kyma-system", "uid": "u-1", "resourceVersion": "7"}
        }))
        .expect("object");
        let key = (
            crate::desired::Kind::ConfigMap,
            Some("kyma-system".to_string()),
            "c".to_string(),
        );
        facts.owned.insert(key, cm.clone());
        facts.unproven.push((
            crate::desired::Kind::Secret,
            Some("kyma-system".into()),
            "s".into(),
        ));
        let plan = plan_deletion(&before, &facts, RESYNC);
        assert_eq!(plan.then, Action::await_change());
        let status = status_of(&plan);
        assert_eq!(
            (status.state, status.reason),
            (State::Deleting, Reason::Deleting)
        );
        assert_eq!(
            plan.steps[1..],
            [
                DeletionStep::DeleteOwned {
                    objects: vec![crate::writer::Prune::of(
                        crate::desired::Kind::ConfigMap,
                        &cm
                    )],
                    left_alone: vec!["Secret kyma-system/s".into()],
                },
                DeletionStep::RemoveFinalizer(json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": before},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a/first", "z/last"]},
                ])),
                DeletionStep::ForgetMetrics,
            ]
        );
        let DeletionStep::RemoveFinalizer(patch) = &plan.steps[2] else {
            panic!("no finalizer patch");
        };
        assert!(serde_json::from_value::<json_patch::Patch>(patch.clone()).is_ok());
    }
}
