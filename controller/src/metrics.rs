//! Prometheus metrics of the controller.

use cp_api::reason::Reason;
use std::collections::BTreeMap;
use std::sync::Mutex;

use cp_api::{ConnectivityProxy, State};
use kube::ResourceExt;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

/// Histograms (their series carry suffixes).
const HISTOGRAMS: [&str; 1] = ["cp_controller_reconcile_duration_seconds"];

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    exposition: cp_api::exposition::Exposition,
    /// `cp_controller_reconcile_total{result}`: result is `success` or an error label.
    pub reconciles: IntCounterVec,
    /// `cp_controller_reconcile_duration_seconds{result}`.
    pub reconcile_duration: HistogramVec,
    /// `cp_controller_state{namespace,name,state}`: 1 for the CR's current state.
    pub state: IntGaugeVec,
    /// `cp_controller_applied_objects_total{kind}`: server-side applies that changed something.
    pub applies: IntCounterVec,
    /// `cp_controller_writes_total{resource,verb,result}`: every write to the API server (the Lease
    /// and Events aside), through [`crate::writer::Writer`].
    pub writes: IntCounterVec,
    /// `cp_controller_service_mappings`: ServiceMappings in the cluster.
    pub service_mappings: IntGauge,
    /// `cp_controller_service_mapping_bytes`: the bytes the published mappings take in their ConfigMaps.
    pub service_mapping_bytes: IntGauge,
    /// `cp_controller_service_mapping_budget_bytes`: what the ConfigMaps can hold together (constant;
    /// the alert compares the two).
    pub service_mapping_budget_bytes: IntGauge,
    /// `cp_controller_service_mapping_shards`: the ConfigMaps the mappings are split across.
    pub service_mapping_shards: IntGauge,
    /// `cp_controller_service_mapping_changes_total`: watch events that changed a mapping's record.
    pub service_mapping_changes: IntCounter,
    /// `cp_controller_foreign_secret_watches`: watches open on Secrets the operator reads but does not
    /// manage (bounded by `cache::MAX_FOREIGN_WATCHES`).
    pub foreign_secret_watches: IntGauge,
    /// `cp_certificate_expiry_timestamp_seconds{certificate}`.
    pub cert_expiry: IntGaugeVec,
    /// `cp_certificate_rotations_total{certificate}`.
    pub cert_rotations: IntCounterVec,
    /// `cp_certificate_failures_total{certificate}`.
    pub cert_failures: IntCounterVec,
    /// `cp_controller_leader`: 1 while this replica leads.
    pub leader: IntGauge,
    /// `cp_build_info{component,version,fips}`.
    pub build_info: IntGaugeVec,
    /// `cp_module_info{namespace,name,state,reason,migration,operator_version,proxy_version,fips}`: 1
    /// for each CR's current combination, for a fleet view in KCP (`fips`: \"true\" in the FIPS build). Set through [`Metrics::set_module_info`].
    module_info: IntGaugeVec,
    /// The label values of each CR's `cp_module_info` series, keyed by (namespace, name): replaced
    /// when they change so that exactly one series per CR exists.
    module_info_current: Mutex<BTreeMap<(String, String), [String; 8]>>,
}

/// Where the CR stands in the takeover of a legacy reconciler installation (`migration` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    /// No takeover was ever needed.
    None,
    /// A takeover step is under way.
    InProgress,
    /// The takeover is blocked (`LegacyMigrationBlocked`); the legacy installation keeps running.
    Blocked,
    /// The legacy installation was taken over.
    Done,
}

impl Migration {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Migration::None => "none",
            Migration::InProgress => "in_progress",
            Migration::Blocked => "blocked",
            Migration::Done => "done",
        }
    }

    /// From the CR's migration annotation and the reason of the status being written: the reason wins,
    /// since the CR passed along is the copy read before the step that changed the annotation.
    pub fn of(annotation: Option<&str>, reason: Reason) -> Self {
        match reason {
            Reason::LegacyMigrationBlocked => return Migration::Blocked,
            Reason::LegacyMigrationDone => return Migration::Done,
            Reason::LegacyInstallationDetected
            | Reason::LegacyTakeoverIdRecorded
            | Reason::LegacyConfigurationImported => return Migration::InProgress,
            _ => {}
        }
        match annotation {
            Some("in-progress") => Migration::InProgress,
            Some("done") => Migration::Done,
            _ => Migration::None,
        }
    }
}

/// The `certificate` label values of the certificate metrics: the business tunnel's, the webhook's CA
/// and its serving certificate.
pub const CERTIFICATES: [&str; 3] = ["tunnel", "webhook-ca", "webhook-serving"];
/// The certificates whose issuance can fail on its own (the webhook CA is issued with its leaf).
pub const FALLIBLE_CERTIFICATES: [&str; 2] = ["tunnel", "webhook-serving"];

/// What `cp_module_info` says about one CR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Module state.
    pub state: State,
    /// Reason of the state (CamelCase, from the first failing condition or `StatefulSetReady`).
    pub reason: String,
    /// Takeover of a legacy installation.
    pub migration: Migration,
    /// Tag of the Connectivity Proxy image in `spec.deployment` (`unknown` when not set yet).
    pub proxy_version: String,
}

impl ModuleInfo {
    /// From the CR as reconciled and the state and reason being written into its status.
    pub fn of(cr: &ConnectivityProxy, state: State, reason: Reason) -> Self {
        let annotation = cr
            .annotations()
            .get(cp_api::keys::MIGRATION_ANNOTATION)
            .map(String::as_str);
        let proxy_version = cr
            .spec
            .deployment
            .as_ref()
            .and_then(|d| d.image.as_ref())
            .map(|i| i.tag.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "unknown".into());
        Self {
            state,
            reason: reason.to_string(),
            migration: Migration::of(annotation, reason),
            proxy_version,
        }
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let (mut exposition, build_info) = cp_api::exposition::Exposition::new(
            &HISTOGRAMS,
            "controller",
            cp_certs::crypto::fips_label(),
        )?;
        let reconciles = IntCounterVec::new(
            Opts::new("cp_controller_reconcile_total", "Reconciles by result."),
            &["result"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "cp_controller_reconcile_duration_seconds",
                "Reconcile duration by result.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["result"],
        )?;
        let state = IntGaugeVec::new(
            Opts::new(
                "cp_controller_state",
                "1 for the current state of each ConnectivityProxy.",
            ),
            &["namespace", "name", "state"],
        )?;
        let applies = IntCounterVec::new(
            Opts::new(
                "cp_controller_applied_objects_total",
                "Server-side applies that changed a managed object, by kind.",
            ),
            &["kind"],
        )?;
        let writes = IntCounterVec::new(
            Opts::new(
                "cp_controller_writes_total",
                "Writes to the API server (the leader Lease and Events aside), by resource, verb (apply, apply-status, merge, merge-status, json-patch, create, delete) and result (ok, conflict, error).",
            ),
            &["resource", "verb", "result"],
        )?;
        let service_mappings = IntGauge::new(
            "cp_controller_service_mappings",
            "ServiceMappings in the cluster.",
        )?;
        let service_mapping_bytes = IntGauge::new(
            "cp_controller_service_mapping_bytes",
            "Bytes the published ServiceMappings take in their ConfigMaps (new ones are refused at cp_controller_service_mapping_budget_bytes).",
        )?;
        let service_mapping_budget_bytes = IntGauge::new(
            "cp_controller_service_mapping_budget_bytes",
            "Bytes the ServiceMapping ConfigMaps can hold together; the webhook refuses a mapping beyond it.",
        )?;
        service_mapping_budget_bytes.set(cp_api::mapping::MAPPINGS_TOTAL_BUDGET_BYTES as i64);
        let service_mapping_shards = IntGauge::new(
            "cp_controller_service_mapping_shards",
            "ConfigMaps the published ServiceMappings are split across (connectivity-proxy-service-mappings and its shards).",
        )?;
        let service_mapping_changes = IntCounter::new(
            "cp_controller_service_mapping_changes_total",
            "ServiceMapping watch events that changed what the controller keeps of a mapping (each costs one record, not a pass over all of them).",
        )?;
        let foreign_secret_watches = IntGauge::new(
            "cp_controller_foreign_secret_watches",
            "Watches open on Secrets the operator reads but does not manage (a user's service key, a tunnel Secret issued by Gardener or cert-manager).",
        )?;
        let cert_expiry = IntGaugeVec::new(
            Opts::new(
                "cp_certificate_expiry_timestamp_seconds",
                "Expiry (Unix time) of each certificate the operator manages.",
            ),
            &["certificate"],
        )?;
        let cert_rotations = IntCounterVec::new(
            Opts::new(
                "cp_certificate_rotations_total",
                "Certificates issued or renewed, by certificate.",
            ),
            &["certificate"],
        )?;
        let cert_failures = IntCounterVec::new(
            Opts::new(
                "cp_certificate_failures_total",
                "Failed certificate issuances or renewals, by certificate.",
            ),
            &["certificate"],
        )?;
        let leader = IntGauge::new(
            "cp_controller_leader",
            "1 while this replica holds the leader lease.",
        )?;
        let module_info = IntGaugeVec::new(
            Opts::new(
                "cp_module_info",
                "1 for the current state, reason, legacy migration phase, operator and proxy versions of each ConnectivityProxy.",
            ),
            &[
                "namespace",
                "name",
                "state",
                "reason",
                "migration",
                "operator_version",
                "proxy_version",
                "fips",
            ],
        )?;
        exposition.register(vec![
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_duration.clone()),
            Box::new(state.clone()),
            Box::new(applies.clone()),
            Box::new(writes.clone()),
            Box::new(service_mappings.clone()),
            Box::new(service_mapping_bytes.clone()),
            Box::new(service_mapping_budget_bytes.clone()),
            Box::new(service_mapping_shards.clone()),
            Box::new(service_mapping_changes.clone()),
            Box::new(foreign_secret_watches.clone()),
            Box::new(cert_expiry.clone()),
            Box::new(cert_rotations.clone()),
            Box::new(cert_failures.clone()),
            Box::new(leader.clone()),
            Box::new(module_info.clone()),
        ])?;
        // Every certificate's counters exist from the start at 0: a dashboard or an alert over
        // `increase(...)` sees "no failures" rather than no series (a real Prometheus showed the panel
        // empty until the first failure).
        for c in CERTIFICATES {
            cert_rotations.with_label_values(&[c]).inc_by(0);
        }
        for c in FALLIBLE_CERTIFICATES {
            cert_failures.with_label_values(&[c]).inc_by(0);
        }
        Ok(Self {
            exposition,
            reconciles,
            reconcile_duration,
            state,
            applies,
            writes,
            service_mappings,
            service_mapping_bytes,
            service_mapping_budget_bytes,
            service_mapping_shards,
            service_mapping_changes,
            foreign_secret_watches,
            cert_expiry,
            cert_rotations,
            cert_failures,
            leader,
            build_info,
            module_info,
            module_info_current: Mutex::new(BTreeMap::new()),
        })
    }

    /// Sets the `cp_module_info` series of one CR, removing its previous one when a label changed.
    pub fn set_module_info(&self, namespace: &str, name: &str, info: &ModuleInfo) {
        let labels = [
            namespace.to_string(),
            name.to_string(),
            info.state.as_str().to_string(),
            info.reason.clone(),
            info.migration.as_str().to_string(),
            cp_api::defaults::RELEASE.to_string(),
            info.proxy_version.clone(),
            cp_certs::crypto::fips_label().to_string(),
        ];
        let Ok(mut current) = self.module_info_current.lock() else {
            return;
        };
        let key = (namespace.to_string(), name.to_string());
        if let Some(previous) = current.get(&key).filter(|p| **p != labels) {
            let _ = self
                .module_info
                .remove_label_values(&previous.each_ref().map(String::as_str));
        }
        self.module_info
            .with_label_values(&labels.each_ref().map(String::as_str))
            .set(1);
        current.insert(key, labels);
    }

    /// Sets the state series of one CR.
    pub fn set_state(&self, namespace: &str, name: &str, current: Option<State>) {
        for s in State::ALL {
            self.state
                .with_label_values(&[namespace, name, s.as_str()])
                .set(i64::from(Some(s) == current));
        }
    }

    /// Drops the series of a deleted CR.
    pub fn forget(&self, namespace: &str, name: &str) {
        for s in State::ALL {
            let _ = self
                .state
                .remove_label_values(&[namespace, name, s.as_str()]);
        }
        if let Ok(mut current) = self.module_info_current.lock()
            && let Some(previous) = current.remove(&(namespace.to_string(), name.to_string()))
        {
            let _ = self
                .module_info
                .remove_label_values(&previous.each_ref().map(String::as_str));
        }
    }

    /// Every series name this process can export ([`cp_api::exposition::Exposition::metric_names`]).
    pub fn metric_names(&self) -> Vec<String> {
        self.exposition.metric_names()
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        self.exposition.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cr(annotation: Option<&str>, tag: Option<&str>) -> ConnectivityProxy {
        let mut spec = serde_json::json!({"config": {
            "servers": {"businessDataTunnel": {"externalHost": "auto-provision"}},
            "subaccountId": "auto-provision",
            "subaccountSubdomain": "auto-provision"
        }});
        if let Some(t) = tag {
            spec["deployment"] =
                serde_json::json!({"image": {"registry": "r", "repository": "p", "tag": t}});
        }
        let mut cr: ConnectivityProxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "connectivityproxy.sap.com/v1",
            "kind": "ConnectivityProxy",
            "metadata": {"name": "connectivity-proxy", "namespace": "kyma-system"},
            "spec": spec,
        }))
        .expect("cr");
        if let Some(a) = annotation {
            cr.annotations_mut()
                .insert(cp_api::keys::MIGRATION_ANNOTATION.into(), a.into());
        }
        cr
    }

    fn info_lines(m: &Metrics) -> Vec<String> {
        m.render()
            .lines()
            .filter(|l| l.starts_with("cp_module_info{"))
            .map(String::from)
            .collect()
    }

    #[test]
    fn module_info_renders_one_series_with_every_label() {
        let m = Metrics::new().expect("metrics");
        let info = ModuleInfo::of(
            &cr(None, Some("2.11.0")),
            State::Ready,
            Reason::StatefulSetReady,
        );
        m.set_module_info("kyma-system", "connectivity-proxy", &info);
        let lines = info_lines(&m);
        assert_eq!(lines.len(), 1, "{lines:?}");
        for label in [
            "namespace=\"kyma-system\"",
            "name=\"connectivity-proxy\"",
            "state=\"Ready\"",
            "reason=\"StatefulSetReady\"",
            "migration=\"none\"",
            &format!("operator_version=\"{}\"", cp_api::defaults::RELEASE),
            "proxy_version=\"2.11.0\"",
        ] {
            assert!(lines[0].contains(label), "{label} missing in {}", lines[0]);
        }
        assert!(lines[0].ends_with(" 1"), "{}", lines[0]);
        assert!(m.metric_names().contains(&"cp_module_info".to_string()));
    }

    #[test]
    fn module_info_state_change_leaves_exactly_one_series() {
        let m = Metrics::new().expect("metrics");
        let c = cr(None, Some("2.11.0"));
        m.set_module_info(
            "kyma-system",
            "connectivity-proxy",
            &ModuleInfo::of(&c, State::Processing, Reason::StatefulSetNotReady),
        );
        m.set_module_info(
            "kyma-system",
            "connectivity-proxy",
            &ModuleInfo::of(&c, State::Ready, Reason::StatefulSetReady),
        );
        m.set_module_info(
            "kyma-system",
            "connectivity-proxy",
            &ModuleInfo::of(&c, State::Ready, Reason::StatefulSetReady),
        );
        let lines = info_lines(&m);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("state=\"Ready\""), "{}", lines[0]);
        // Another CR has its own series.
        m.set_module_info(
            "default",
            "other",
            &ModuleInfo::of(&c, State::Warning, Reason::OutsideModuleNamespace),
        );
        assert_eq!(info_lines(&m).len(), 2);
    }

    #[test]
    fn forget_removes_the_module_info_series() {
        let m = Metrics::new().expect("metrics");
        let info = ModuleInfo::of(&cr(None, Some("2.11.0")), State::Deleting, Reason::Deleting);
        m.set_module_info("kyma-system", "connectivity-proxy", &info);
        m.set_module_info("default", "other", &info);
        m.forget("kyma-system", "connectivity-proxy");
        let lines = info_lines(&m);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("name=\"other\""), "{}", lines[0]);
        // Forgetting twice, or a CR never seen, is harmless.
        m.forget("kyma-system", "connectivity-proxy");
        m.forget("kyma-system", "never-seen");
        assert_eq!(info_lines(&m).len(), 1);
    }

    #[test]
    fn migration_phase_follows_the_reason_then_the_annotation() {
        let phase = |a: Option<&str>, reason: Reason| {
            ModuleInfo::of(&cr(a, Some("2.11.0")), State::Processing, reason).migration
        };
        assert_eq!(phase(None, Reason::StatefulSetReady), Migration::None);
        assert_eq!(
            phase(None, Reason::LegacyInstallationDetected),
            Migration::InProgress
        );
        assert_eq!(
            phase(Some("in-progress"), Reason::LegacyConfigurationImported),
            Migration::InProgress
        );
        assert_eq!(
            phase(Some("in-progress"), Reason::LegacyMigrationBlocked),
            Migration::Blocked
        );
        assert_eq!(
            phase(Some("in-progress"), Reason::LegacyMigrationDone),
            Migration::Done
        );
        assert_eq!(
            phase(Some("done"), Reason::StatefulSetReady),
            Migration::Done
        );
        assert_eq!(
            phase(Some("in-progress"), Reason::ApplyFailed),
            Migration::InProgress
        );
    }

    #[test]
    fn proxy_version_is_the_image_tag_of_spec_deployment() {
        let of = |tag| {
            ModuleInfo::of(&cr(None, tag), State::Ready, Reason::StatefulSetReady).proxy_version
        };
        assert_eq!(of(Some("2.11.0")), "2.11.0");
        assert_eq!(of(Some("")), "unknown");
        assert_eq!(of(None), "unknown");
    }
}
