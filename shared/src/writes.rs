//! What the controller writes, kind by kind: the names it renders, the Secret types it uses and what
//! its pods, Services and PriorityClass may ask for. One table, read twice: the controller's renderer
//! is checked against it by tests, and `make manifests` renders it into the ValidatingAdmissionPolicy
//! `connectivity-proxy-operator-controller-writes`, which kube-apiserver enforces on the controller's
//! ServiceAccount. RBAC cannot tell a StatefulSet the controller renders from one that runs a
//! privileged pod as another ServiceAccount, or its Secret from a `service-account-token` Secret the
//! API server would fill with another account's token; the API server can, with this policy: a stolen
//! controller token gets nothing the controller would not write itself.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::kinds::Kind;
use crate::names;

/// The policy's (and its binding's) name.
pub const POLICY: &str = "connectivity-proxy-operator-controller-writes";

/// The controller's ServiceAccount as the API server names its requests.
pub fn controller_user() -> String {
    format!(
        "system:serviceaccount:{}:{}",
        names::KYMA_SYSTEM,
        names::CONTROLLER_SERVICE_ACCOUNT
    )
}

/// A name the controller renders: exactly this, or any name with this prefix and suffix (names
/// derived from the CR's name, or a backup's takeover id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Name {
    /// Exactly this name.
    Exact(&'static str),
    /// Any name that starts with `prefix` and ends with `suffix`, longer than both.
    Affix {
        /// The name's start.
        prefix: &'static str,
        /// The name's end.
        suffix: &'static str,
    },
    /// Any name (a Secret the user names in the CR, which the controller creates from `secretData`):
    /// created only where nothing of that name exists, and updated only while it carries the
    /// operator's `managed-by` label, so it never overwrites an object someone else made.
    New,
}

impl Name {
    /// Whether `name` is one of these.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Name::Exact(n) => name == *n,
            Name::Affix { prefix, suffix } => {
                name.len() > prefix.len() + suffix.len()
                    && name.starts_with(prefix)
                    && name.ends_with(suffix)
            }
            Name::New => true,
        }
    }

    fn cel(&self) -> String {
        match self {
            Name::Exact(n) => format!("request.name == '{n}'"),
            Name::Affix { prefix, suffix } => format!(
                "(request.name.size() > {len} && request.name.startsWith('{prefix}') && request.name.endsWith('{suffix}'))",
                len = prefix.len() + suffix.len()
            ),
            Name::New => "(request.operation == 'CREATE' || variables.ours)".into(),
        }
    }
}

/// One kind's row: the names the controller writes and, for Secrets, each name's type.
#[derive(Clone, Debug)]
pub struct Row {
    /// The kind.
    pub kind: Kind,
    /// Each name, with the Secret type it has (`None` for other kinds).
    pub names: Vec<(Name, Option<&'static str>)>,
}

const OPAQUE: Option<&str> = Some("Opaque");
const TLS: Option<&str> = Some("kubernetes.io/tls");

/// The module's CRs live in `kyma-system`: names derived from the CR end with it.
const CR_NS_SUFFIX: &str = "-kyma-system";

/// Every kind the controller writes, with every name it writes it under.
pub fn table() -> Vec<Row> {
    use Name::{Affix, Exact};
    let row = |kind, names: Vec<Name>| Row {
        kind,
        names: names.into_iter().map(|n| (n, None)).collect(),
    };
    let derived = |prefix| Affix {
        prefix,
        suffix: CR_NS_SUFFIX,
    };
    let tls_secret = derived("cp-tls-");
    vec![
        row(Kind::PriorityClass, vec![Exact(names::PRIORITY_CLASS)]),
        row(
            Kind::NetworkPolicy,
            names::NETWORK_POLICIES.iter().map(|n| Exact(n)).collect(),
        ),
        row(
            Kind::ConfigMap,
            [
                Exact(names::CONFIGMAP_CONFIG),
                Exact(names::CONFIGMAP_INFO),
                backup(names::CONFIGMAP_CONFIG),
                backup(names::CONFIGMAP_INFO),
            ]
            .into_iter()
            // The mapping shards, the first being `connectivity-proxy-service-mappings`.
            .chain(names::MAPPING_SHARD_CONFIGMAPS.iter().map(|n| Exact(n)))
            .collect(),
        ),
        Row {
            kind: Kind::Secret,
            names: vec![
                (Exact(names::SECRET_SERVICE_KEY), OPAQUE),
                (backup(names::SECRET_SERVICE_KEY), OPAQUE),
                (Exact(names::WEBHOOK_CA_SECRET), OPAQUE),
                (Exact(names::WEBHOOK_CERT_SECRET), TLS),
                (Exact(names::TUNNEL_CA_SECRET), OPAQUE),
                (Exact(names::OWNERSHIP_KEY_SECRET), OPAQUE),
                (tls_secret.clone(), TLS),
                (
                    Affix {
                        prefix: "cp-tls-",
                        suffix: "-kyma-system-cacert",
                    },
                    OPAQUE,
                ),
                // The service key from `secretData`, under the name the CR gives it.
                (Name::New, OPAQUE),
            ],
        },
        row(
            Kind::Service,
            vec![
                Exact(names::SERVICE),
                Exact(names::SERVICE_TUNNEL),
                Exact(names::SERVICE_TUNNEL_HEALTHCHECK),
            ],
        ),
        row(Kind::StatefulSet, vec![Exact(names::STATEFULSET)]),
        row(Kind::Gateway, vec![Exact(names::GATEWAY)]),
        row(Kind::VirtualService, vec![Exact(names::VIRTUAL_SERVICE)]),
        row(Kind::DestinationRule, vec![Exact(names::DESTINATION_RULE)]),
        row(
            Kind::PeerAuthentication,
            vec![Exact(names::PEER_AUTHENTICATION)],
        ),
        row(Kind::GardenerCertificate, vec![tls_secret.clone()]),
        row(Kind::CertManagerCertificate, vec![tls_secret]),
        row(Kind::ServiceInstance, vec![derived("cp-service-instance-")]),
        row(Kind::ServiceBinding, vec![derived("cp-service-binding-")]),
    ]
}

/// A takeover's backup of the legacy object `original` (`<original>-backup-<takeover id>`).
fn backup(original: &'static str) -> Name {
    let prefix: &'static str = match original {
        names::CONFIGMAP_CONFIG => "connectivity-proxy-backup-",
        names::CONFIGMAP_INFO => "connectivity-proxy-info-backup-",
        _ => "connectivity-proxy-service-key-backup-",
    };
    Name::Affix { prefix, suffix: "" }
}

/// Whether the table lets the controller write an object of `kind` named `name` (for a Secret, of
/// `secret_type`; `None` means Opaque, as the API server defaults it). `New` names count: this is
/// the renderer's check, which creates such a Secret only where none exists.
pub fn renders(kind: Kind, name: &str, secret_type: Option<&str>) -> bool {
    let ty = secret_type.unwrap_or("Opaque");
    table()
        .iter()
        .filter(|r| r.kind == kind)
        .flat_map(|r| r.names.iter())
        .any(|(n, t)| n.matches(name) && t.is_none_or(|t| t == ty))
}

/// One row as a validation: `true` for other resources, otherwise whether the name (and Secret
/// type) is one the row lists; its message lists them.
fn row_validation(row: &Row) -> Validation {
    let names: Vec<String> = row
        .names
        .iter()
        .map(|(n, t)| match t {
            Some(t) => format!("({} && variables.secretType == '{t}')", n.cel()),
            None => n.cel(),
        })
        .collect();
    let listed: Vec<String> = row
        .names
        .iter()
        .map(|(n, t)| {
            let n = match n {
                Name::Exact(n) => (*n).to_string(),
                Name::Affix { prefix, suffix } => format!("{prefix}*{suffix}"),
                Name::New => "a new name (a service key from secretData)".into(),
            };
            match t {
                Some(t) => format!("{n} ({t})"),
                None => n,
            }
        })
        .collect();
    let ar = row.kind.api_resource();
    validation(
        format!("!{} || {}", is(row.kind), names.join(" || ")),
        &format!(
            "the operator's controller writes {} only as it renders them: {}",
            ar.plural,
            listed.join(", ")
        ),
    )
}

fn is(kind: Kind) -> String {
    let ar = kind.api_resource();
    format!(
        "(request.resource.group == '{}' && request.resource.resource == '{}')",
        ar.group, ar.plural
    )
}

fn validation(expression: String, message: &str) -> Validation {
    Validation {
        expression,
        message: Some(message.into()),
        reason: Some("Forbidden".into()),
        ..Validation::default()
    }
}

fn variable(name: &str, expression: &str) -> Variable {
    Variable {
        name: name.into(),
        expression: expression.into(),
    }
}

/// The ValidatingAdmissionPolicy rendered from [`table`], and the pod, Service and PriorityClass
/// rules of what the controller renders.
pub fn policy() -> ValidatingAdmissionPolicy {
    let rows = table();
    let mut rules: Vec<NamedRuleWithOperations> = Vec::new();
    for row in &rows {
        let ar = row.kind.api_resource();
        let rule = NamedRuleWithOperations {
            api_groups: Some(vec![ar.group.clone()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(vec![ar.plural.clone()]),
            ..NamedRuleWithOperations::default()
        };
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    // The proxy's pods: updated (never created) only to set the mappings annotation.
    rules.push(NamedRuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["*".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec!["pods".into()]),
        ..NamedRuleWithOperations::default()
    });
    let label = |key: &str| {
        format!(
            "request.operation == 'UPDATE' && oldObject.metadata.?labels[?'{key}'].orValue('') == '{}'",
            names::MANAGED_BY_VALUE
        )
    };
    let pod = "object.spec.template.spec";
    let containers = format!("{pod}.containers + {pod}.?initContainers.orValue([])");
    let sts = Kind::StatefulSet;
    let guarded = [
        (
            sts,
            format!("({pod}.?serviceAccountName.orValue('default') == 'default' && {pod}.?serviceAccount.orValue('default') == 'default')"),
            "the operator's controller may run the proxy's pods only as the namespace's default ServiceAccount",
        ),
        (
            sts,
            format!("(!{pod}.?hostNetwork.orValue(false) && !{pod}.?hostPID.orValue(false) && !{pod}.?hostIPC.orValue(false))"),
            "the operator's controller may not run pods in the node's network, PID or IPC namespace",
        ),
        (
            sts,
            format!("{pod}.?volumes.orValue([]).all(v, !has(v.hostPath))"),
            "the operator's controller may not mount a hostPath volume",
        ),
        (
            sts,
            format!("({containers}).all(c, !c.?securityContext.?privileged.orValue(false) && !c.?securityContext.?allowPrivilegeEscalation.orValue(false) && c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))"),
            "the operator's controller may not run privileged containers, containers that may escalate privileges or add capabilities, or bind host ports",
        ),
        (
            Kind::Service,
            "(object.spec.?type.orValue('ClusterIP') == 'ClusterIP' && object.spec.?externalIPs.orValue([]).size() == 0)".to_string(),
            "the operator's controller renders only ClusterIP Services without externalIPs",
        ),
        (
            Kind::PriorityClass,
            format!("(!object.?globalDefault.orValue(false) && object.value <= {})", names::PRIORITY_CLASS_VALUE),
            "the operator's controller may not make its PriorityClass the cluster's default or raise its value",
        ),
    ];
    // Each rule applies to its kind only: `!is(kind) || rule`.
    let validations: Vec<Validation> =
        rows.iter()
            .map(row_validation)
            .chain(guarded.into_iter().map(|(kind, rule, message)| {
                validation(format!("!{} || {rule}", is(kind)), message)
            }))
            .chain([pod_validation()])
            .collect();
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(POLICY.into()),
            labels: Some(names::managed_labels()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "the-operator-controller".into(),
                expression: format!("request.userInfo.username == '{}'", controller_user()),
            }]),
            variables: Some(vec![
                variable(
                    "secretType",
                    "request.resource.resource == 'secrets' ? object.?type.orValue('Opaque') : ''",
                ),
                variable("ours", &label(names::LABEL_MANAGED_BY)),
            ]),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The names of the proxy's pods (its StatefulSet's, `connectivity-proxy-<ordinal>`).
pub const PROXY_POD_PREFIX: &str = "connectivity-proxy-";

/// The proxy's pods: the controller only updates them, only those of its StatefulSet, and changes
/// nothing but [`crate::keys::MAPPINGS_WRITTEN_ANNOTATION`] (no label a NetworkPolicy or Service
/// selects on, no image, no other annotation, finalizer or owner).
fn pod_validation() -> Validation {
    let key = crate::keys::MAPPINGS_WRITTEN_ANNOTATION;
    let same = |field: &str, empty: &str| {
        format!(
            "object.metadata.?{field}.orValue({empty}) == oldObject.metadata.?{field}.orValue({empty})"
        )
    };
    let (new, old) = (
        "object.metadata.?annotations.orValue({})",
        "oldObject.metadata.?annotations.orValue({})",
    );
    let rule = [
        "request.operation == 'UPDATE'".to_string(),
        "request.?subResource.orValue('') == ''".to_string(),
        format!(
            "request.name.startsWith('{PROXY_POD_PREFIX}') && request.name.size() > {}",
            PROXY_POD_PREFIX.len()
        ),
        "object.spec == oldObject.spec".to_string(),
        same("labels", "{}"),
        same("finalizers", "[]"),
        same("ownerReferences", "[]"),
        format!("{new}.all(k, k == '{key}' || (k in {old} && {old}[k] == {new}[k]))"),
        format!("{old}.all(k, k == '{key}' || k in {new})"),
    ]
    .join(" && ");
    validation(
        format!(
            "!(request.resource.group == '' && request.resource.resource == 'pods') || ({rule})"
        ),
        &format!(
            "the operator's controller changes the proxy's pods ({PROXY_POD_PREFIX}<n>) only in their annotation {key}"
        ),
    )
}

/// The binding that makes [`policy`] deny.
pub fn binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(POLICY.into()),
            labels: Some(names::managed_labels()),
            ..ObjectMeta::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: POLICY.into(),
            validation_actions: vec!["Deny".into()],
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_exactly_or_by_prefix_and_suffix() {
        assert!(renders(
            Kind::Secret,
            "cp-tls-connectivity-proxy-kyma-system",
            Some("kubernetes.io/tls")
        ));
        assert!(!renders(
            Kind::Secret,
            "cp-tls-connectivity-proxy-kyma-system",
            Some("kubernetes.io/service-account-token")
        ));
        assert!(!renders(Kind::ConfigMap, "other-module-config", None));
        assert!(renders(
            Kind::ConfigMap,
            "connectivity-proxy-backup-0a1b",
            None
        ));
        assert!(!renders(Kind::Service, "cp-tls--kyma-system", None));
        assert!(!renders(Kind::StatefulSet, "planted", None));
        // A user-named service key: Opaque only.
        assert!(renders(Kind::Secret, "my-key", None));
        assert!(!renders(
            Kind::Secret,
            "my-key",
            Some("kubernetes.io/service-account-token")
        ));
    }

    #[test]
    fn every_kind_the_controller_manages_has_a_row_and_a_match_rule() {
        let p = policy();
        let spec = p.spec.expect("spec");
        let rules = spec
            .match_constraints
            .and_then(|m| m.resource_rules)
            .expect("rules");
        for kind in Kind::ALL {
            assert!(
                table().iter().any(|r| r.kind == kind),
                "{kind:?} has no row"
            );
            let ar = kind.api_resource();
            assert!(
                rules
                    .iter()
                    .any(|r| r.api_groups.as_deref() == Some(&[ar.group.clone()][..])
                        && r.resources.as_deref() == Some(&[ar.plural.clone()][..])),
                "{kind:?} is not matched"
            );
        }
    }
}
