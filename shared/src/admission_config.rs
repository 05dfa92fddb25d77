//! The webhook configurations, built in one place for the manifests, `make run`, the tests and the
//! controller (which keeps their CA bundle current).

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::ObjectMeta;

use crate::names;

/// Where the API server reaches the webhook.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// A Service in the cluster (production).
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
    },
    /// A URL base such as `https://127.0.0.1:9443` (local runs and tests).
    Url(String),
}

impl Endpoint {
    /// The module's webhook Service in `kyma-system`.
    pub fn in_cluster() -> Self {
        Endpoint::Service {
            namespace: names::KYMA_SYSTEM.into(),
            name: names::WEBHOOK_SERVICE.into(),
        }
    }

    fn client_config(&self, path: &str, ca_bundle: Option<&[u8]>) -> WebhookClientConfig {
        let ca_bundle = ca_bundle.map(|c| ByteString(c.to_vec()));
        match self {
            Endpoint::Service { namespace, name } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path.into()),
                    port: Some(443),
                }),
                url: None,
            },
            Endpoint::Url(base) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }
}

/// Seconds the API server waits for an answer.
pub const TIMEOUT_SECONDS: i32 = 5;

fn rule(resource: &str, scope: &str) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![names::GROUP.into()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec![resource.into()]),
        scope: Some(scope.into()),
    }
}

/// The controller's username (its ServiceAccount in `kyma-system`).
pub fn controller_username() -> String {
    format!(
        "system:serviceaccount:{}:{}",
        names::KYMA_SYSTEM,
        names::CONTROLLER_SERVICE_ACCOUNT
    )
}

/// The controller's own writes (finalizers, its annotations, status) are not sent to the webhook: they
/// would be admitted anyway (it is a privileged identity), and with the webhook down a deletion would
/// otherwise hang on the finalizer the controller cannot remove. Evaluated by the API server (CEL).
fn not_the_controller() -> Vec<MatchCondition> {
    vec![MatchCondition {
        name: "not-the-operator-controller".into(),
        expression: format!("request.userInfo.username != '{}'", controller_username()),
    }]
}

/// The defaulting webhook is called on an UPDATE only when `spec.deployment` is missing on either
/// side or changes: an edit that keeps it (the common `kubectl edit` of another field) would be
/// answered with no patch, since the stored object was defaulted when it was admitted. That spares
/// the API server one of its two webhook calls per edit (about 2 ms of its CPU each, measured by
/// `make bench`). A stored `spec.deployment` that lacks a newer release's defaults is moved to them
/// by the controller, not by this webhook.
pub const DEFAULTING_NEEDED: &str = "request.operation != 'UPDATE' || !has(object.spec) || \
     !has(oldObject.spec) || !has(object.spec.deployment) || !has(oldObject.spec.deployment) || \
     object.spec.deployment != oldObject.spec.deployment";

fn defaulting_conditions() -> Vec<MatchCondition> {
    let mut c = not_the_controller();
    c.push(MatchCondition {
        name: "spec-deployment-may-need-defaults".into(),
        expression: DEFAULTING_NEEDED.into(),
    });
    c
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(names::managed_labels()),
        ..Default::default()
    }
}

/// The mutating configuration: ConnectivityProxy defaulting only.
pub fn mutating(endpoint: &Endpoint, ca_bundle: Option<&[u8]>) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: meta(names::MUTATING_WEBHOOK_CONFIG),
        webhooks: Some(vec![MutatingWebhook {
            name: "defaulting.connectivityproxy.sap.com".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: endpoint.client_config("/mutate", ca_bundle),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            reinvocation_policy: Some("IfNeeded".into()),
            match_conditions: Some(defaulting_conditions()),
            rules: Some(vec![rule("connectivityproxies", "Namespaced")]),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            ..Default::default()
        }]),
    }
}

/// The validating configuration: ConnectivityProxy and ServiceMapping.
pub fn validating(endpoint: &Endpoint, ca_bundle: Option<&[u8]>) -> ValidatingWebhookConfiguration {
    let hook = |name: &str, path: &str, resource: &str, scope: &str| ValidatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: endpoint.client_config(path, ca_bundle),
        failure_policy: Some("Fail".into()),
        match_policy: Some("Equivalent".into()),
        match_conditions: Some(not_the_controller()),
        rules: Some(vec![rule(resource, scope)]),
        side_effects: "None".into(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        ..Default::default()
    };
    ValidatingWebhookConfiguration {
        metadata: meta(names::VALIDATING_WEBHOOK_CONFIG),
        webhooks: Some(vec![
            hook(
                "validation.connectivityproxy.sap.com",
                "/validate",
                "connectivityproxies",
                "Namespaced",
            ),
            hook(
                "servicemapping.validation.connectivityproxy.sap.com",
                "/validate-servicemapping",
                "servicemappings",
                "Cluster",
            ),
        ]),
    }
}
