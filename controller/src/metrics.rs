//! Prometheus metrics of the controller.

use cp_api::State;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Histograms (their series carry suffixes).
const HISTOGRAMS: [&str; 1] = ["cp_controller_reconcile_duration_seconds"];

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    names: Vec<String>,
    /// `cp_controller_reconcile_total{result}`: result is `success` or an error label.
    pub reconciles: IntCounterVec,
    /// `cp_controller_reconcile_duration_seconds{result}`.
    pub reconcile_duration: HistogramVec,
    /// `cp_controller_state{namespace,name,state}`: 1 for the CR's current state.
    pub state: IntGaugeVec,
    /// `cp_controller_applied_objects_total{kind}`: server-side applies that changed something.
    pub applies: IntCounterVec,
    /// `cp_controller_service_mappings`: ServiceMappings in the cluster.
    pub service_mappings: IntGauge,
    /// `cp_certificate_expiry_timestamp_seconds{certificate}`.
    pub cert_expiry: IntGaugeVec,
    /// `cp_certificate_rotations_total{certificate}`.
    pub cert_rotations: IntCounterVec,
    /// `cp_certificate_failures_total{certificate}`.
    pub cert_failures: IntCounterVec,
    /// `cp_controller_leader`: 1 while this replica leads.
    pub leader: IntGauge,
    /// `cp_build_info{component,version}`.
    pub build_info: IntGaugeVec,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mut names = Vec::new();
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
        let service_mappings = IntGauge::new(
            "cp_controller_service_mappings",
            "ServiceMappings in the cluster.",
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
        let build_info = IntGaugeVec::new(
            Opts::new("cp_build_info", "Build information."),
            &["component", "version"],
        )?;
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_duration.clone()),
            Box::new(state.clone()),
            Box::new(applies.clone()),
            Box::new(service_mappings.clone()),
            Box::new(cert_expiry.clone()),
            Box::new(cert_rotations.clone()),
            Box::new(cert_failures.clone()),
            Box::new(leader.clone()),
            Box::new(build_info.clone()),
        ] {
            names.extend(c.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(c)?;
        }
        build_info
            .with_label_values(&["controller", env!("CARGO_PKG_VERSION")])
            .set(1);
        Ok(Self {
            registry,
            names,
            reconciles,
            reconcile_duration,
            state,
            applies,
            service_mappings,
            cert_expiry,
            cert_rotations,
            cert_failures,
            leader,
            build_info,
        })
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
    }

    /// Every series name this process can export (histograms with their `_bucket`, `_sum` and
    /// `_count` series), whether or not it has samples yet: dashboards and alerts are checked against it.
    pub fn metric_names(&self) -> Vec<String> {
        let mut out = self.names.clone();
        for h in HISTOGRAMS {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.push(format!("{h}{suffix}"));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
