//! Every annotation and label key the operator writes or reads, in one place.
//!
//! The operator's own keys live under [`OPERATOR_ANNOTATION_PREFIX`]; the webhook lets only the
//! operator and privileged identities change them. Existing installations carry these keys, so they
//! are part of the compatibility contract.

/// The domain of the operator's own annotations: written by the operator or a privileged identity only.
pub const OPERATOR_ANNOTATION_PREFIX: &str = "connectivityproxy.sap.com/";

// Labels on every managed object.

/// Label naming the manager of an object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on the operator's objects.
pub const MANAGED_BY_VALUE: &str = "connectivity-proxy-operator";
/// Kyma's module label.
pub const LABEL_MODULE: &str = "kyma-project.io/module";
/// Value of [`LABEL_MODULE`].
pub const MODULE_VALUE: &str = "connectivity-proxy";
/// Label selecting the proxy's pods.
pub const APP_LABEL: &str = "app";
/// Labels recording which CR a managed object belongs to (owner references cannot cross namespaces).
pub const LABEL_OWNER_NAME: &str = "connectivityproxy.sap.com/owner-name";
/// See [`LABEL_OWNER_NAME`].
pub const LABEL_OWNER_NAMESPACE: &str = "connectivityproxy.sap.com/owner-namespace";

// Annotations on managed objects.

/// Annotation with the hash of the desired state last applied to an object.
pub const ANNOTATION_APPLIED_HASH: &str = "connectivityproxy.sap.com/applied-hash";
/// Pod template annotation: hash of the rendered configuration (rolls the pods when it changes).
pub const CONFIG_HASH_ANNOTATION: &str = "connectivityproxy.sap.com/config-hash";
/// Pod template annotation: hash of the projected Secrets (rolls the pods when they change).
pub const SECRETS_HASH_ANNOTATION: &str = "connectivityproxy.sap.com/secrets-hash";
/// Proxy pod annotation: the hash of the mapping shards the controller last wrote. Setting it is an
/// update of the pod, on which the kubelet syncs the pod and refreshes its ConfigMap volumes at once,
/// instead of at its next periodic sync (`syncFrequency`, a minute by default): a new ServiceMapping
/// is in the proxy's files within about a second. It changes nothing else (the admission policy
/// `connectivity-proxy-operator-controller-writes` lets the controller change only this on a pod).
pub const MAPPINGS_WRITTEN_ANNOTATION: &str = "connectivityproxy.sap.com/mappings-written";
/// ServiceMapping annotation recording that the operator took a mapping over.
pub const ADOPTED_ANNOTATION: &str = "connectivityproxy.sap.com/adopted-by";
/// Marks the Connectivity CA Secret with the URL its CA was fetched from.
pub const FETCHED_FROM_ANNOTATION: &str = "connectivityproxy.sap.com/fetched-from";
/// Tunnel CA Secret: when the current CA was created.
pub const CA_CREATED_ANNOTATION: &str = "connectivityproxy.sap.com/ca-created-at";
/// Tunnel CA Secret: when the leaf switched to the current CA.
pub const LEAF_SWITCHED_ANNOTATION: &str = "connectivityproxy.sap.com/leaf-switched-at";
/// The operator's record of the CA it retired in a rotation: the SHA-256 fingerprint of
/// `previous-ca.crt`. A `previous-ca.crt` without it (added by hand, or changed since) is not trusted.
pub const PREVIOUS_CA_SHA256_ANNOTATION: &str = "connectivityproxy.sap.com/previous-ca-sha256";

// Annotations on the CR.

/// CR annotation recording the release whose defaults `spec.deployment` holds.
pub const DEFAULTS_RELEASE_ANNOTATION: &str =
    "connectivityproxy.sap.com/deployment-defaults-release";
/// CR annotation recording the values of those defaults (compact JSON): the next release compares
/// `spec.deployment` with them, so a field someone changed is kept over the new release's default.
pub const DEFAULTS_VALUES_ANNOTATION: &str = "connectivityproxy.sap.com/deployment-defaults";
/// CR annotation: `in-progress` or `done`.
pub const MIGRATION_ANNOTATION: &str = "connectivityproxy.sap.com/legacy-migration";
/// CR annotation recording the import of the legacy configuration (the imported field paths).
pub const IMPORTED_ANNOTATION: &str = "connectivityproxy.sap.com/legacy-config-imported";
/// CR annotation: the id of the current takeover, the suffix of its backups.
pub const TAKEOVER_ID_ANNOTATION: &str = "connectivityproxy.sap.com/legacy-takeover-id";

// Legacy takeover backups.

/// Annotation on a backup: `<namespace>/<name>` of the original.
pub const BACKUP_OF_ANNOTATION: &str = "connectivityproxy.sap.com/backup-of";
/// Where the legacy data is backed up: the module's namespace, the one namespace besides the Istio
/// namespace where the controller may write (no namespace of its own: the token cannot create one).
/// (`names::KYMA_SYSTEM`, spelled out so that this leaf module imports nothing; a test of `names` holds
/// them equal.)
pub const BACKUP_NAMESPACE: &str = "kyma-system";

/// Name of a backup of `name` for takeover `id`.
pub fn backup_name(name: &str, id: &str) -> String {
    format!("{name}-backup-{id}")
}

// Legacy reconciler markers (read, never written).

/// The legacy reconciler's managed-by label.
pub const LEGACY_LABEL_MANAGED_BY: &str = "reconciler.kyma-project.io/managed-by";
/// Value of [`LEGACY_LABEL_MANAGED_BY`].
pub const LEGACY_MANAGED_BY_VALUE: &str = "reconciler";
/// The legacy reconciler's disclaimer annotation.
pub const LEGACY_DISCLAIMER_ANNOTATION: &str =
    "reconciler.kyma-project.io/managed-by-reconciler-disclaimer";
/// The legacy reconciler's annotation that skips an object on upgrade.
pub const LEGACY_SKIP_RENDERING_ANNOTATION: &str =
    "reconciler.kyma-project.io/skip-rendering-on-upgrade";

/// On the ConnectivityProxy CR, `"true"` switches the module's NetworkPolicies off (the controller
/// removes them; any other value or none keeps them). In the operator's domain, so only the operator and
/// privileged identities may set it: an editor of the CR cannot open the module's pods to the network.
pub const DISABLE_NETWORK_POLICIES_ANNOTATION: &str =
    "connectivityproxy.sap.com/disable-network-policies";

/// HMAC-SHA256 of an object's identity (a migration backup's also of its data), keyed by the Secret
/// `connectivity-proxy-operator-ownership-key` only the controller reads: what makes an object the
/// operator's. The managed-by label alone does not (anyone who may label may set it).
pub const OWNERSHIP_PROOF_ANNOTATION: &str = "connectivityproxy.sap.com/ownership-proof";
/// On the ownership key Secret, `"true"` while objects an earlier release labelled (created before the
/// key) are still adopted; removed after the first Ready install.
pub const ADOPTING_ANNOTATION: &str = "connectivityproxy.sap.com/adopting-labelled";

/// On a Secret a user names for the proxy to mount (the service key's `secretName`), `"true"` says
/// its owner lets the proxy use it: without it the controller neither mounts it nor says more about
/// it than that it is not usable (a CR editor who may not read Secrets learns nothing from the
/// status). Set by whoever may write the Secret:
/// `kubectl label secret NAME -n kyma-system connectivityproxy.sap.com/usable-by-proxy=true`.
pub const USABLE_BY_PROXY_LABEL: &str = "connectivityproxy.sap.com/usable-by-proxy";

/// Every operator-owned key above (the legacy reconciler's are not the operator's).
pub const OPERATOR_KEYS: [&str; 19] = [
    OWNERSHIP_PROOF_ANNOTATION,
    ADOPTING_ANNOTATION,
    LABEL_OWNER_NAME,
    LABEL_OWNER_NAMESPACE,
    ANNOTATION_APPLIED_HASH,
    CONFIG_HASH_ANNOTATION,
    SECRETS_HASH_ANNOTATION,
    ADOPTED_ANNOTATION,
    FETCHED_FROM_ANNOTATION,
    CA_CREATED_ANNOTATION,
    LEAF_SWITCHED_ANNOTATION,
    PREVIOUS_CA_SHA256_ANNOTATION,
    DEFAULTS_RELEASE_ANNOTATION,
    DEFAULTS_VALUES_ANNOTATION,
    MIGRATION_ANNOTATION,
    IMPORTED_ANNOTATION,
    TAKEOVER_ID_ANNOTATION,
    BACKUP_OF_ANNOTATION,
    DISABLE_NETWORK_POLICIES_ANNOTATION,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_keys_are_distinct_and_in_the_operator_domain() {
        let set: std::collections::BTreeSet<_> = OPERATOR_KEYS.iter().collect();
        assert_eq!(set.len(), OPERATOR_KEYS.len());
        for k in OPERATOR_KEYS {
            assert!(k.starts_with(OPERATOR_ANNOTATION_PREFIX), "{k}");
        }
    }

    #[test]
    fn backup_names() {
        assert_eq!(backup_name("cm", "abc"), "cm-backup-abc");
    }
}
