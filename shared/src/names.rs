//! Names of every object, label, annotation and field manager the operator uses, in one place.
//!
//! Existing installations use these names, so they are part of the compatibility contract.

/// API group of both kinds.
pub const GROUP: &str = "connectivityproxy.sap.com";
/// Namespace the module manager installs into.
pub const KYMA_SYSTEM: &str = "kyma-system";
/// Name of the default CR the module manager creates.
pub const DEFAULT_CR_NAME: &str = "connectivity-proxy";
/// Default namespace of the Istio ingress gateway and the tunnel TLS secret.
pub const ISTIO_NAMESPACE: &str = "istio-system";

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "connectivity-proxy-operator";
/// Finalizer on the ConnectivityProxy CR.
pub const FINALIZER: &str = "connectivityproxy.sap.com/finalizer";

/// The value that asks the operator to derive a field.
pub const AUTO_PROVISION: &str = "auto-provision";

// Label and annotation keys are defined in [`crate::keys`]; these were always reachable here too.
pub use crate::keys::{
    ANNOTATION_APPLIED_HASH, APP_LABEL, LABEL_MANAGED_BY, LABEL_MODULE, LABEL_OWNER_NAME,
    LABEL_OWNER_NAMESPACE, LEGACY_DISCLAIMER_ANNOTATION, LEGACY_LABEL_MANAGED_BY,
    LEGACY_MANAGED_BY_VALUE, MANAGED_BY_VALUE, MODULE_VALUE, OPERATOR_ANNOTATION_PREFIX,
};

// NetworkPolicies (the controller renders them; its RBAC writes them by these names), in apply order.
pub const NETWORK_POLICIES: [&str; 8] = [
    "kyma-project.io--connectivity-proxy-operator-deny-all",
    "kyma-project.io--connectivity-proxy-operator-allow-admission",
    "kyma-project.io--connectivity-proxy-operator-allow-metrics",
    "kyma-project.io--connectivity-proxy-operator-allow-egress",
    "kyma-project.io--connectivity-proxy-to-dns",
    "kyma-project.io--connectivity-proxy-deny-all",
    "kyma-project.io--connectivity-proxy-allow-ingress",
    "kyma-project.io--connectivity-proxy-allow-egress",
];

/// Node-local DNS's address on Gardener's nodes (link-local, in the host network, where no pod selector
/// can name it): the module's DNS NetworkPolicy allows port 53 there, and the test node serves DNS there.
pub const NODE_LOCAL_DNS_IP: &str = "169.254.20.10";

// Workload.
pub const STATEFULSET: &str = "connectivity-proxy";
pub const SERVICE: &str = "connectivity-proxy";
pub const SERVICE_TUNNEL: &str = "connectivity-proxy-tunnel";
pub const SERVICE_TUNNEL_HEALTHCHECK: &str = "connectivity-proxy-tunnel-healthcheck";
pub const PRIORITY_CLASS: &str = "connectivity-proxy-priority-class";
/// The proxy's scheduling priority (the admission policy refuses a higher one from the controller).
pub const PRIORITY_CLASS_VALUE: i32 = 2_000_000;

// Configuration.
pub const CONFIGMAP_CONFIG: &str = "connectivity-proxy";
pub const CONFIGMAP_CONFIG_KEY: &str = "connectivity-proxy-config.yml";
pub const CONFIGMAP_INFO: &str = "connectivity-proxy-info";
pub const CONFIGMAP_SERVICE_MAPPINGS: &str = "connectivity-proxy-service-mappings";
pub const CONFIGMAP_SERVICE_MAPPINGS_KEY: &str = "servicemappings";
/// The ConfigMaps the ServiceMappings are split across (shards): the first is the one the proxy has
/// always read, the others exist only once the mappings outgrow it (`cp_api::mapping::shards_for`).
/// Written out, so that RBAC, the admission policy and the pod's projected volume can name each one.
pub const MAPPING_SHARD_CONFIGMAPS: [&str; 16] = [
    CONFIGMAP_SERVICE_MAPPINGS,
    "connectivity-proxy-service-mappings-1",
    "connectivity-proxy-service-mappings-2",
    "connectivity-proxy-service-mappings-3",
    "connectivity-proxy-service-mappings-4",
    "connectivity-proxy-service-mappings-5",
    "connectivity-proxy-service-mappings-6",
    "connectivity-proxy-service-mappings-7",
    "connectivity-proxy-service-mappings-8",
    "connectivity-proxy-service-mappings-9",
    "connectivity-proxy-service-mappings-10",
    "connectivity-proxy-service-mappings-11",
    "connectivity-proxy-service-mappings-12",
    "connectivity-proxy-service-mappings-13",
    "connectivity-proxy-service-mappings-14",
    "connectivity-proxy-service-mappings-15",
];
/// The index of mapping shard ConfigMap `name` in [`MAPPING_SHARD_CONFIGMAPS`] (`None`: not a shard).
pub fn mapping_shard(name: &str) -> Option<usize> {
    MAPPING_SHARD_CONFIGMAPS.iter().position(|n| *n == name)
}

/// The key (and the file in the proxy's `servicemappings` directory) of each shard.
pub const MAPPING_SHARD_KEYS: [&str; 16] = [
    CONFIGMAP_SERVICE_MAPPINGS_KEY,
    "servicemappings-1",
    "servicemappings-2",
    "servicemappings-3",
    "servicemappings-4",
    "servicemappings-5",
    "servicemappings-6",
    "servicemappings-7",
    "servicemappings-8",
    "servicemappings-9",
    "servicemappings-10",
    "servicemappings-11",
    "servicemappings-12",
    "servicemappings-13",
    "servicemappings-14",
    "servicemappings-15",
];
pub const SECRET_SERVICE_KEY: &str = "connectivity-proxy-service-key";
pub const SECRET_SERVICE_KEY_KEY: &str = "service_key";

// Istio.
pub const GATEWAY: &str = "connectivity-proxy-tunnel";
pub const VIRTUAL_SERVICE: &str = "connectivity-proxy-tunnel";
pub const DESTINATION_RULE: &str = "connectivity-proxy-tunnel";
pub const PEER_AUTHENTICATION: &str = "connectivity-proxy";

/// Tunnel port of the Connectivity Proxy.
pub const TUNNEL_PORT: i32 = 8042;

/// TLS secret of the business tunnel for an auto-provisioned `ingress.tls.secretName`.
pub fn tls_secret_name(cr: &str, ns: &str) -> String {
    format!("cp-tls-{cr}-{ns}")
}
/// Companion secret holding the Connectivity service CA (key `cacert`).
pub fn cacert_secret_name(tls_secret: &str) -> String {
    format!("{tls_secret}-cacert")
}
/// BTP ServiceInstance for an auto-provisioned service key.
pub fn service_instance_name(cr: &str, ns: &str) -> String {
    format!("cp-service-instance-{cr}-{ns}")
}
/// BTP ServiceBinding for an auto-provisioned service key.
pub fn service_binding_name(cr: &str, ns: &str) -> String {
    format!("cp-service-binding-{cr}-{ns}")
}
/// Secret the BTP operator writes for the binding.
pub fn binding_secret_name(cr: &str, ns: &str) -> String {
    format!("cp-secret-{cr}-{ns}")
}

/// Whether a user-supplied value asks for auto-provisioning (case-insensitive).
pub fn is_auto_provision(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case(AUTO_PROVISION))
}

/// Labels every managed object carries.
pub fn managed_labels() -> std::collections::BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (LABEL_MODULE.to_string(), MODULE_VALUE.to_string()),
    ]
    .into_iter()
    .collect()
}

// Admission webhook.
pub const MUTATING_WEBHOOK_CONFIG: &str = "connectivity-proxy-operator-mutating";
pub const VALIDATING_WEBHOOK_CONFIG: &str = "connectivity-proxy-operator-validating";
pub const WEBHOOK_SERVICE: &str = "connectivity-proxy-operator-webhook";
pub const WEBHOOK_CERT_SECRET: &str = "connectivity-proxy-webhook-cert";
pub const WEBHOOK_CA_SECRET: &str = "connectivity-proxy-webhook-ca";
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "connectivity-proxy-controller";
pub const WEBHOOK_SERVICE_ACCOUNT: &str = "connectivity-proxy-webhook";

/// Secret (kyma-system) with the key of the operator's ownership proofs; only the controller reads it.
pub const OWNERSHIP_KEY_SECRET: &str = "connectivity-proxy-operator-ownership-key";

/// Secret (in the CR's namespace) with the operator's own CA for the business tunnel.
pub const TUNNEL_CA_SECRET: &str = "connectivity-proxy-tunnel-ca";

/// ConfigMap with the cluster's domain (Gardener).
pub const SHOOT_INFO_NAMESPACE: &str = "kube-system";
pub const SHOOT_INFO: &str = "shoot-info";

/// Istio CRDs the operator needs.
pub const ISTIO_CRDS: [&str; 4] = [
    "gateways.networking.istio.io",
    "virtualservices.networking.istio.io",
    "destinationrules.networking.istio.io",
    "peerauthentications.security.istio.io",
];
/// BTP operator CRDs needed to auto-provision the service key.
pub const BTP_CRDS: [&str; 2] = [
    "serviceinstances.services.cloud.sap.com",
    "servicebindings.services.cloud.sap.com",
];
/// Gardener's certificate CRD: when present, the tunnel certificate is a Gardener Certificate.
pub const GARDENER_CERT_CRD: &str = "certificates.cert.gardener.cloud";
/// cert-manager's certificate CRD.
pub const CERT_MANAGER_CRD: &str = "certificates.cert-manager.io";

/// The most watches the controller keeps open on Secrets it reads but does not manage (a user's
/// service key, a tunnel Secret issued by Gardener or cert-manager); beyond it a Secret is read from
/// the API. A reconcile reads at most four.
pub const MAX_FOREIGN_SECRET_WATCHES: usize = 8;

#[cfg(test)]
mod tests {
    #[test]
    fn legacy_backups_live_in_the_module_namespace() {
        assert_eq!(crate::keys::BACKUP_NAMESPACE, super::KYMA_SYSTEM);
    }

    use super::*;

    #[test]
    fn auto_provision_is_case_insensitive() {
        assert!(is_auto_provision(Some("Auto-Provision")));
        assert!(is_auto_provision(Some("auto-provision")));
        assert!(!is_auto_provision(Some("auto")));
        assert!(!is_auto_provision(None));
    }

    #[test]
    fn derived_names() {
        assert_eq!(
            tls_secret_name("connectivity-proxy", "kyma-system"),
            "cp-tls-connectivity-proxy-kyma-system"
        );
        assert_eq!(cacert_secret_name("x"), "x-cacert");
    }
}
