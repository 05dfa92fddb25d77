//! The status contract: a state, a description and conditions, written only when they change, with
//! an Event on each state change.

use cp_api::reason::Reason;
use cp_api::{ConnectivityProxy, ModuleStatus, State};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::context::Ctx;

/// Condition types, in the order they are evaluated.
pub mod types {
    /// Istio (and, when needed, the BTP operator) are installed.
    pub const DEPENDENCIES: &str = "Dependencies";
    /// The CR is valid and every `auto-provision` value could be resolved.
    pub const CONFIGURATION: &str = "Configuration";
    /// Every managed object is applied.
    pub const INSTALLED: &str = "Installed";
    /// The proxy's StatefulSet is ready.
    pub const READY: &str = "Ready";
}

/// One condition as the controller computes it (without timestamps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// Condition type.
    pub type_: &'static str,
    /// True, False or Unknown.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
}

impl Cond {
    /// A True condition.
    pub fn ok(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "True",
            reason,
            message: message.into(),
        }
    }
    /// A False condition.
    pub fn failed(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "False",
            reason,
            message: message.into(),
        }
    }
    /// An Unknown condition: not evaluated because an earlier one failed.
    pub fn pending(type_: &'static str, after: &str) -> Self {
        Self {
            type_,
            status: "Unknown",
            reason: Reason::NotEvaluated,
            message: format!("waiting for condition {after}"),
        }
    }
}

/// What a reconcile concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Computed {
    /// Module state.
    pub state: State,
    /// Description.
    pub description: String,
    /// Reason of the state (for Events).
    pub reason: Reason,
    /// Conditions.
    pub conditions: Vec<Cond>,
}

impl Computed {
    /// A result whose first failing condition is `failed`, with the later types pending.
    pub fn blocked(state: State, passed: Vec<Cond>, failed: Cond) -> Self {
        let all = [
            types::DEPENDENCIES,
            types::CONFIGURATION,
            types::INSTALLED,
            types::READY,
        ];
        let mut conditions = passed;
        let failed_type = failed.type_;
        let reason = failed.reason;
        let description = failed.message.clone();
        conditions.push(failed);
        let seen: Vec<&str> = conditions.iter().map(|c| c.type_).collect();
        for t in all {
            if !seen.contains(&t) {
                conditions.push(Cond::pending(t, failed_type));
            }
        }
        Self {
            state,
            description,
            reason,
            conditions,
        }
    }
}

/// Builds the status, keeping `lastTransitionTime` of conditions whose status did not change.
pub fn build(cr: &ConnectivityProxy, computed: &Computed, now: Time) -> ModuleStatus {
    let generation = cr.metadata.generation;
    let old = cr.status.clone().unwrap_or_default();
    let conditions = computed
        .conditions
        .iter()
        .map(|c| {
            let previous = old.conditions.iter().find(|o| o.type_ == c.type_);
            let last = match previous {
                Some(p) if p.status == c.status => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: c.type_.into(),
                status: c.status.into(),
                reason: c.reason.into(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect();
    ModuleStatus {
        state: Some(computed.state),
        description: Some(computed.description.clone()),
        observed_generation: generation,
        conditions,
        kept_deployment_fields: crate::upgrade::kept_fields(cr),
    }
}

/// Whether two statuses differ in anything but timestamps.
pub fn differs(a: &ModuleStatus, b: &ModuleStatus) -> bool {
    let strip = |s: &ModuleStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) != strip(b)
}

/// Writes the status if it changed and publishes an Event when the state changed.
pub async fn write(ctx: &Ctx, cr: &ConnectivityProxy, computed: &Computed) -> Result<(), Error> {
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    ctx.metrics.set_state(&ns, &name, Some(computed.state));
    ctx.metrics.set_module_info(
        &ns,
        &name,
        &crate::metrics::ModuleInfo::of(cr, computed.state, computed.reason),
    );
    let status = build(cr, computed, Time(k8s_openapi::jiff::Timestamp::now()));
    let old = cr.status.clone().unwrap_or_default();
    if !differs(&old, &status) {
        return Ok(());
    }
    let api: Api<ConnectivityProxy> = Api::namespaced(ctx.client.clone(), &ns);
    let body =
        crate::writer::Partial::of::<ConnectivityProxy>(&name, Default::default(), Some(status));
    ctx.applier
        .writer()
        .write_part(
            &api,
            crate::writer::Part::Status,
            &name,
            &Patch::Apply(&body),
            &format!(
                "state {:?} ({})",
                computed.state,
                String::from(computed.reason)
            ),
        )
        .await
        .map_err(|e| Error::kube("writing the status", e))?;
    if old.state != Some(computed.state) {
        let type_ = match computed.state {
            State::Warning | State::Error => EventType::Warning,
            _ => EventType::Normal,
        };
        let event = Event {
            type_,
            reason: computed.reason.into(),
            note: Some(truncate(
                &format!("{}: {}", computed.state, computed.description),
                1000,
            )),
            action: "Reconcile".into(),
            secondary: None,
        };
        publish(ctx, &event, &cr.object_ref(&())).await;
    }
    Ok(())
}

/// Publishes a Warning Event on the CR (best effort: never holds up the reconcile).
pub async fn warn(ctx: &Ctx, cr: &ConnectivityProxy, reason: Reason, note: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(truncate(note, 1000)),
        action: "Reconcile".into(),
        secondary: None,
    };
    publish(ctx, &event, &cr.object_ref(&())).await;
}

/// Publishes an Event about `regarding`. Best effort: it never holds up the reconcile.
pub async fn publish(
    ctx: &Ctx,
    event: &Event,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
) {
    match tokio::time::timeout(
        std::time::Duration::from_secs(5),
        ctx.recorder.publish(event, regarding),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "publishing an Event failed"),
        Err(_) => tracing::warn!("publishing an Event timed out"),
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
