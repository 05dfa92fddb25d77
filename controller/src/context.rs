//! What every reconcile shares.

use std::sync::Arc;
use std::time::Duration;

use cp_api::ConnectivityProxy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::apply::Applier;
use crate::metrics::Metrics;

/// Fixed settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How often a healthy CR is reconciled anyway (reads only unless something drifted).
    pub resync: Duration,
    /// Business-tunnel certificate settings.
    pub tunnel: crate::certificates::TunnelCertSettings,
    /// `spec.deployment` defaults of this release (with any override applied).
    pub deployment_defaults: serde_json::Value,
    /// Roots trusted for the Connectivity CA endpoint besides the system's (`--connectivity-ca-trust`).
    pub ca_endpoint_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Hosts and addresses the Connectivity CA may be fetched from (`--connectivity-ca-hosts`, ...).
    pub ca_egress: Arc<crate::egress::Egress>,
}

/// Shared state of the reconciler.
pub struct Ctx {
    /// API client.
    pub client: Client,
    /// Applies desired objects.
    pub applier: Applier,
    /// The read caches of managed objects and the Secrets the controller reads.
    pub cache: crate::cache::Cache,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: Recorder,
    /// Every CRD in the cluster (dependency detection).
    pub crds: Store<CustomResourceDefinition>,
    /// Every ServiceMapping, as the controller keeps it (`crate::mappings::watch`).
    pub mappings: Arc<std::sync::RwLock<crate::mappings::MappingState>>,
    /// The last write of the mapping shard ConfigMaps (their write rate is bounded).
    pub shard_writes: crate::mappings::ShardWrites,
    /// Every ConnectivityProxy.
    pub proxies: Store<ConnectivityProxy>,
    /// ConfigMap `kube-system/shoot-info` (the cluster domain), watched.
    pub shoot_info: Store<k8s_openapi::api::core::v1::ConfigMap>,
    /// Settings.
    pub settings: Settings,
    /// When the Connectivity CA was last fetched, by URL: it is fetched again after
    /// [`CA_REFRESH`], as the legacy reconciler refetched it on every run.
    pub ca_fetched: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Set once the CRD and ServiceMapping stores have had their first complete listing (also
    /// `/readyz`): no reconcile decides anything before.
    pub synced: Arc<std::sync::atomic::AtomicBool>,
    /// Consecutive reconcile failures per CR (`namespace/name`), for the error backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Duplicate ServiceMappings already reported by an Event, as (loser uid, winner uid).
    pub reported_conflicts: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Labelled objects without an ownership proof already named in a Warning (`Kind ns/name`).
    pub reported_unproven: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The ConnectivityProxy CRs outside kyma-system, as (namespace, name), kept by
    /// [`crate::outside`]: lifecycle-manager removes the module only when none is left, so the module's
    /// own CR names them while its deletion waits.
    pub outside: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// Wakes a CR's reconcile (a foreign CR gone lets a blocked deletion go on).
    pub wake: crate::cache::Trigger,
}

/// How long a fetched Connectivity CA is trusted before it is fetched again.
pub const CA_REFRESH: std::time::Duration = std::time::Duration::from_secs(3600);

impl Ctx {
    /// The CRs outside kyma-system, sorted.
    pub fn outside_crs(&self) -> Vec<(String, String)> {
        self.outside
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Which of `names` are not installed and established.
    pub fn missing_crds(&self, names: &[&str]) -> Vec<String> {
        names
            .iter()
            .filter(|n| {
                let crd = self.crds.get(&kube::runtime::reflector::ObjectRef::new(n));
                !crd.is_some_and(|c| crate::cache::established(&c))
            })
            .map(|n| n.to_string())
            .collect()
    }

    /// Managed kinds whose API exists in the cluster.
    pub fn available_kinds(&self) -> Vec<crate::desired::Kind> {
        crate::desired::Kind::ALL
            .into_iter()
            .filter(|k| k.crd().is_none_or(|crd| self.has_crd(crd)))
            .collect()
    }

    /// Whether a CRD is installed and established.
    pub fn has_crd(&self, name: &str) -> bool {
        self.missing_crds(&[name]).is_empty()
    }
}
