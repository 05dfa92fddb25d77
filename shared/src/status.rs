//! The module status contract shared by Kyma modules: a state, a description and conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Status of a ConnectivityProxy (written by the controller only).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// Processing, Ready, Error, Warning or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// What the state means right now and, when the user must act, what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions, each with a CamelCase reason and the generation it was computed from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// `spec.deployment` fields that hold a value other than this release's default: operator upgrades
    /// keep them (every other field moves to the new release's default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_deployment_fields: Vec<String>,
}

/// Module state as defined by Kyma's lifecycle manager.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum State {
    /// Being installed or updated.
    Processing,
    /// Installed and healthy.
    Ready,
    /// Failed; the description says why.
    Error,
    /// Installed but needs the user: missing dependency, blocked deletion, duplicate CR, invalid config.
    Warning,
    /// Being removed.
    Deleting,
}

impl State {
    /// All states, for metrics that export one series per state.
    pub const ALL: [State; 5] = [
        State::Processing,
        State::Ready,
        State::Error,
        State::Warning,
        State::Deleting,
    ];

    /// The state as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Processing => "Processing",
            State::Ready => "Ready",
            State::Error => "Error",
            State::Warning => "Warning",
            State::Deleting => "Deleting",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
