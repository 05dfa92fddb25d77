//! Every reason the controller writes into a ConnectivityProxy's status (its `state`'s reason and each
//! condition's) or into an Event: one enum, so that the user guide's troubleshooting table can be
//! checked against it (`docs/user-guide.md`, tested in `cp-controller`'s library tests).

macro_rules! reasons {
    ($( $(#[doc = $doc:literal])+ $kind:ident $variant:ident ),* $(,)?) => {
        /// A CamelCase reason of the status, a condition or an Event.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $( $(#[doc = $doc])+ $variant, )*
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];

            /// The reason as written into the status or the Event.
            pub const fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => stringify!($variant),)* }
            }

            /// Where the reason appears.
            pub const fn kind(self) -> ReasonKind {
                match self { $(Reason::$variant => ReasonKind::$kind,)* }
            }
        }
    };
}

/// Where a [`Reason`] appears; the user guide lists every one that is not [`ReasonKind::Healthy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasonKind {
    /// A True (or not yet evaluated) condition: nothing for the user to do.
    Healthy,
    /// The reason of a failing condition and of the CR's state.
    Status,
    /// A Warning Event's reason.
    Event,
}

reasons! {
    /// Condition `Dependencies`: Istio (and the BTP operator where needed) are installed.
    Healthy DependenciesAvailable,
    /// Condition `Configuration`: the spec is valid and complete.
    Healthy ConfigurationValid,
    /// Condition `Installed`: every managed object is applied.
    Healthy ResourcesApplied,
    /// Condition `Ready` and the Ready state: every proxy replica is ready.
    Healthy StatefulSetReady,
    /// A later condition while an earlier one fails.
    Healthy NotEvaluated,
    /// Istio's CRDs are missing; nothing was applied.
    Status IstioCRDsMissing,
    /// The service key is `auto-provision` but the SAP BTP service operator's CRDs are missing.
    Status BTPOperatorCRDsMissing,
    /// Another ConnectivityProxy is the active one.
    Status DuplicateConnectivityProxy,
    /// The CR is not in the module's namespace.
    Status OutsideModuleNamespace,
    /// A validation rule is broken.
    Status InvalidConfiguration,
    /// `externalHost` is `auto-provision` and the cluster domain is unknown.
    Status ExternalHostUnresolved,
    /// The tunnel host exceeds the certificate common-name limit.
    Status ExternalHostTooLong,
    /// A write failed.
    Status ApplyFailed,
    /// An object the operator would write exists and is not the operator's.
    Status ObjectNotOwned,
    /// The tunnel certificate could not be issued.
    Status CertificateFailed,
    /// The legacy takeover cannot proceed.
    Status LegacyMigrationBlocked,
    /// The service key Secret is missing or unusable.
    Status ServiceKeyInvalid,
    /// Waiting for the BTP ServiceBinding or its Secret.
    Status ServiceKeyPending,
    /// The Connectivity service's CA could not be fetched.
    Status ConnectivityCAUnavailable,
    /// Proxy pods are starting.
    Status StatefulSetNotReady,
    /// A proxy pod fails in a way that does not resolve by itself.
    Status ProxyPodFailing,
    /// Takeover step: a legacy installation was found.
    Status LegacyInstallationDetected,
    /// Takeover step: the takeover's id is recorded on the CR.
    Status LegacyTakeoverIdRecorded,
    /// Takeover step: the legacy configuration is in the spec.
    Status LegacyConfigurationImported,
    /// Takeover step: the legacy objects are gone.
    Status LegacyMigrationDone,
    /// A takeover was marked in progress but nothing legacy is left.
    Status NoLegacyInstallation,
    /// ServiceMappings share a key; the newer ones are not published.
    Status DuplicateServiceMappings,
    /// The ServiceMappings do not fit into one ConfigMap.
    Status ServiceMappingsTooLarge,
    /// The aggregated ServiceMappings take 80 % or more of the ConfigMap's budget: everything works, new
    /// mappings are refused once it is full.
    Status ServiceMappingsNearLimit,
    /// The module is ready, but ConnectivityProxy CRs exist outside kyma-system: they configure nothing
    /// and block the module's removal by lifecycle-manager (named in the description).
    Status ConnectivityProxiesOutsideModuleNamespace,
    /// The audit log Secret the CR names is absent, not opted in or another module's: the proxy runs
    /// without it.
    Status AuditLogSecretNotUsable,
    /// The CR is being deleted but ServiceMappings exist.
    Status DeletionBlockedByServiceMappings,
    /// Every managed object is being removed.
    Status Deleting,
    /// Event: a legacy-named object without the legacy marks was left alone.
    Event LegacyLookAlikeLeftAlone,
    /// Event: objects carry the operator's labels but no ownership proof; they were left alone.
    Event UnprovenObjectLeftAlone,
    /// Event on a ServiceMapping: an older one has the same key.
    Event DuplicateServiceMapping,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> Self {
        r.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user guide's troubleshooting table names every reason a user can meet, and nothing else.
    #[test]
    fn the_user_guide_lists_every_reason() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/user-guide.md");
        let guide = std::fs::read_to_string(path).expect("docs/user-guide.md");
        let table = guide
            .split("## Troubleshooting")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .expect("docs/user-guide.md has a Troubleshooting section");
        let listed: std::collections::BTreeSet<&str> = table
            .lines()
            .filter_map(|l| l.strip_prefix('|'))
            .filter_map(|l| l.split('|').nth(1))
            .flat_map(|cell| cell.split('`').skip(1).step_by(2))
            .collect();
        let missing: Vec<&str> = Reason::ALL
            .iter()
            .filter(|r| r.kind() != ReasonKind::Healthy || **r == Reason::StatefulSetReady)
            .map(|r| r.as_str())
            .filter(|r| !listed.contains(r))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/user-guide.md's troubleshooting table lacks {missing:?}"
        );
        let unknown: Vec<&&str> = listed
            .iter()
            .filter(|l| !Reason::ALL.iter().any(|r| r.as_str() == **l))
            .collect();
        assert!(
            unknown.is_empty(),
            "docs/user-guide.md lists reasons the controller never writes: {unknown:?}"
        );
    }

    #[test]
    fn reasons_are_unique_camel_case() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                s.chars().next().is_some_and(|c| c.is_ascii_uppercase()),
                "{s}"
            );
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
        }
    }
}
