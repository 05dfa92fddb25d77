//! What a legacy reconciler installation holds (data only): every object the cp-mod-migrator's cleaner
//! removes, in the order the takeover handles them, and what happens to each.

use cp_api::names;
use kube::api::ApiResource;

/// Where an object of a legacy kind lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The CR's namespace (`kyma-system`).
    CrNamespace,
    /// A fixed namespace.
    Namespace(&'static str),
    /// Cluster-scoped.
    Cluster,
}

/// What the takeover does with a legacy object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Removed; the operator creates its own where it needs one.
    Delete,
    /// Same name as the operator's object: relabelled as the operator's and then applied over, not
    /// deleted and re-created.
    Adopt,
    /// The user's service key in shared tenant mode: kept and referenced by the CR; otherwise backed up
    /// and removed.
    ServiceKey,
}

/// One kind of legacy object.
#[derive(Clone, Copy, Debug)]
pub struct LegacyKind {
    /// API group (`""` for core).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Resource (plural).
    pub plural: &'static str,
    /// Where its objects live.
    pub scope: Scope,
    /// Names of the legacy objects.
    pub names: &'static [&'static str],
    /// What the takeover does with them.
    pub action: Action,
}

impl LegacyKind {
    /// The dynamic API resource.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: if self.group.is_empty() {
                self.version.into()
            } else {
                format!("{}/{}", self.group, self.version)
            },
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    /// The namespace of its objects for a CR in `cr_namespace` (`None`: cluster-scoped).
    pub fn namespace<'a>(&self, cr_namespace: &'a str) -> Option<&'a str> {
        match self.scope {
            Scope::CrNamespace => Some(cr_namespace),
            Scope::Namespace(n) => Some(n),
            Scope::Cluster => None,
        }
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    scope: Scope,
    names: &'static [&'static str],
    action: Action,
) -> LegacyKind {
    LegacyKind {
        group,
        version,
        kind,
        plural,
        scope,
        names,
        action,
    }
}

const WATCHER: &str = "connectivity-proxy-restart-watcher";
const SM_OPERATOR: &str = "connectivity-proxy-sm-operator";
const ISTIO: Scope = Scope::Namespace(names::ISTIO_NAMESPACE);
const OWN: Scope = Scope::CrNamespace;

/// The legacy ServiceMapping validator: first, because with its Service gone every mapping write fails.
pub const LEGACY_WEBHOOK: &str = "webhook-secret";

/// Every legacy object, in takeover order: group, version, kind, plural, where, names, what happens.
#[rustfmt::skip]
pub const LEGACY_KINDS: &[LegacyKind] = &[
    kind("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "validatingwebhookconfigurations", Scope::Cluster, &[LEGACY_WEBHOOK], Action::Delete),
    kind("apps", "v1", "StatefulSet", "statefulsets", OWN, &[names::STATEFULSET], Action::Delete),
    kind("apps", "v1", "Deployment", "deployments", OWN, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("", "v1", "Service", "services", OWN, &["connectivity-proxy", "connectivity-proxy-smv", "connectivity-proxy-tunnel", "connectivity-proxy-tunnel-0", "connectivity-proxy-tunnel-healthcheck"], Action::Delete),
    kind("", "v1", "ConfigMap", "configmaps", OWN, &[names::CONFIGMAP_CONFIG, names::CONFIGMAP_INFO, names::CONFIGMAP_SERVICE_MAPPINGS], Action::Adopt),
    kind("", "v1", "Secret", "secrets", OWN, &["connectivity-sm-operator-secrets-tls"], Action::Delete),
    kind("", "v1", "Secret", "secrets", OWN, &[LEGACY_SERVICE_KEY], Action::ServiceKey),
    kind("", "v1", "Secret", "secrets", ISTIO, &["cc-certs", "cc-certs-cacert"], Action::Delete),
    kind("cert.gardener.cloud", "v1alpha1", "Certificate", "certificates", ISTIO, &["cc-certs"], Action::Delete),
    kind("networking.istio.io", "v1", "Gateway", "gateways", OWN, &["kyma-gateway-cc"], Action::Delete),
    kind("networking.istio.io", "v1", "VirtualService", "virtualservices", OWN, &["cc-proxy", "cc-proxy-healthcheck"], Action::Delete),
    kind("networking.istio.io", "v1", "DestinationRule", "destinationrules", OWN, &["connectivity-proxy-tunnel-0", "connectivity-proxy"], Action::Delete),
    kind("security.istio.io", "v1", "PeerAuthentication", "peerauthentications", OWN, &["enable-permissive-mode-for-cp"], Action::Delete),
    kind("networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters", ISTIO, &["connectivity-proxy-custom-protocol"], Action::Delete),
    kind("", "v1", "ServiceAccount", "serviceaccounts", OWN, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", OWN, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("rbac.authorization.k8s.io", "v1", "Role", "roles", OWN, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", Scope::Cluster, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", Scope::Cluster, &[WATCHER, SM_OPERATOR], Action::Delete),
    kind("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", Scope::Cluster, &[names::PRIORITY_CLASS], Action::Adopt),
];

/// The legacy service-key Secret (the user's key in shared tenant mode).
pub const LEGACY_SERVICE_KEY: &str = "connectivity-proxy-service-key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_webhook_goes_first_and_every_object_is_listed_once() {
        assert_eq!(LEGACY_KINDS[0].names, &[LEGACY_WEBHOOK]);
        let mut seen = std::collections::BTreeSet::new();
        for k in LEGACY_KINDS {
            for n in k.names {
                assert!(
                    seen.insert((k.kind, format!("{:?}", k.scope), *n)),
                    "{} {n} twice",
                    k.kind
                );
            }
        }
        // The 35 objects PRODUCT.md lists under "What a legacy installation holds".
        assert_eq!(seen.len(), 35);
    }
}
