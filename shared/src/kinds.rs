//! Every kind of object the controller manages: group, version, plural, scope and the CRD it needs.
//! In cp-api because the tests and the tools name them too (without the controller's library).

use kube::api::ApiResource;

use crate::names;

/// Where objects of a kind live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// In a namespace.
    Namespaced,
    /// At cluster scope.
    Cluster,
}

/// Every kind the controller manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
    Service,
    StatefulSet,
    PriorityClass,
    Gateway,
    VirtualService,
    DestinationRule,
    PeerAuthentication,
    GardenerCertificate,
    CertManagerCertificate,
    ServiceInstance,
    ServiceBinding,
    NetworkPolicy,
}

impl Kind {
    /// Whether objects of this kind may live in the Istio namespace (the tunnel's TLS Secrets and
    /// their certificate). Nothing else is ever written, watched or listed there: the controller's
    /// RBAC in that namespace grants only these kinds (no workload, no ConfigMap, no Service).
    pub fn in_istio_namespace(self) -> bool {
        matches!(
            self,
            Kind::Secret | Kind::GardenerCertificate | Kind::CertManagerCertificate
        )
    }

    /// Whether the controller lists and watches this kind in the Istio namespace. Secrets are not: the
    /// Istio namespace holds Istio's own CA; the controller reads and writes there only its tunnel's
    /// two Secrets, by name (RBAC `resourceNames`), never the others.
    pub fn listed_in_istio_namespace(self) -> bool {
        self.in_istio_namespace() && self != Kind::Secret
    }

    /// All managed kinds, in apply order.
    pub const ALL: [Kind; 14] = [
        Kind::PriorityClass,
        Kind::NetworkPolicy,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::StatefulSet,
        Kind::Gateway,
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::PeerAuthentication,
        Kind::GardenerCertificate,
        Kind::CertManagerCertificate,
        Kind::ServiceInstance,
        Kind::ServiceBinding,
    ];

    /// Group, version, kind and plural.
    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::ConfigMap => ("", "v1", "ConfigMap", "configmaps"),
            Kind::Secret => ("", "v1", "Secret", "secrets"),
            Kind::Service => ("", "v1", "Service", "services"),
            Kind::StatefulSet => ("apps", "v1", "StatefulSet", "statefulsets"),
            Kind::NetworkPolicy => (
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
            ),
            Kind::PriorityClass => (
                "scheduling.k8s.io",
                "v1",
                "PriorityClass",
                "priorityclasses",
            ),
            Kind::Gateway => ("networking.istio.io", "v1", "Gateway", "gateways"),
            Kind::VirtualService => (
                "networking.istio.io",
                "v1",
                "VirtualService",
                "virtualservices",
            ),
            Kind::DestinationRule => (
                "networking.istio.io",
                "v1",
                "DestinationRule",
                "destinationrules",
            ),
            Kind::PeerAuthentication => (
                "security.istio.io",
                "v1",
                "PeerAuthentication",
                "peerauthentications",
            ),
            Kind::GardenerCertificate => (
                "cert.gardener.cloud",
                "v1alpha1",
                "Certificate",
                "certificates",
            ),
            Kind::CertManagerCertificate => {
                ("cert-manager.io", "v1", "Certificate", "certificates")
            }
            Kind::ServiceInstance => (
                "services.cloud.sap.com",
                "v1",
                "ServiceInstance",
                "serviceinstances",
            ),
            Kind::ServiceBinding => (
                "services.cloud.sap.com",
                "v1",
                "ServiceBinding",
                "servicebindings",
            ),
        };
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version,
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    /// Whether objects of this kind live in a namespace or at cluster scope.
    pub fn scope(self) -> Scope {
        match self {
            Kind::PriorityClass => Scope::Cluster,
            _ => Scope::Namespaced,
        }
    }

    /// The CRD this kind needs, if it is not built into Kubernetes.
    pub fn crd(self) -> Option<&'static str> {
        match self {
            Kind::Gateway => Some(names::ISTIO_CRDS[0]),
            Kind::VirtualService => Some(names::ISTIO_CRDS[1]),
            Kind::DestinationRule => Some(names::ISTIO_CRDS[2]),
            Kind::PeerAuthentication => Some(names::ISTIO_CRDS[3]),
            Kind::GardenerCertificate => Some(names::GARDENER_CERT_CRD),
            Kind::CertManagerCertificate => Some(names::CERT_MANAGER_CRD),
            Kind::ServiceInstance => Some(names::BTP_CRDS[0]),
            Kind::ServiceBinding => Some(names::BTP_CRDS[1]),
            _ => None,
        }
    }
}
