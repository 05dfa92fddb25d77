//! Prometheus metrics of the webhook.

use std::sync::OnceLock;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use crate::admission::{Decision, Endpoint, Operation};

/// Histograms (their series carry suffixes).
const HISTOGRAMS: [&str; 1] = ["cp_webhook_admission_duration_seconds"];

/// Every metric the webhook exports.
#[derive(Debug)]
pub struct Metrics {
    exposition: cp_api::exposition::Exposition,
    /// `cp_webhook_admission_requests_total{endpoint,operation,decision}`.
    pub requests: IntCounterVec,
    /// `cp_webhook_admission_duration_seconds{endpoint}`.
    pub duration: HistogramVec,
    /// `cp_webhook_certificate_reloads_total`.
    pub cert_reloads: IntCounter,
    /// `cp_webhook_certificate_reload_failures_total{error}`, by [`crate::Error::metric_label`].
    pub cert_reload_failures: IntCounterVec,
    /// `cp_webhook_certificate_expiry_timestamp_seconds`.
    pub cert_expiry: IntGauge,
    /// `cp_webhook_privileged_identities_refused`: identities of the privileged ConfigMap refused as too
    /// broad (every user, every ServiceAccount, ...), in its current version.
    pub privileged_refused: IntGauge,
    /// `cp_build_info{component,version,fips}`.
    pub build_info: IntGaugeVec,
    /// `cp_webhook_connections_refused_total{reason}`: closed at once, over a connection cap.
    pub connections_refused: IntCounterVec,
    /// `cp_webhook_connections_closed_total{reason}`: closed by a limit (handshake timeout, idle).
    pub connections_closed: IntCounterVec,
    /// `cp_webhook_requests_shed_total{reason}`: answered without a review, by limit.
    pub requests_shed: IntCounterVec,
    /// `cp_webhook_open_connections`.
    pub open_connections: IntGauge,
    /// `cp_webhook_connections_total{protocol}`: connections past the TLS handshake, by the protocol
    /// ALPN chose (`h2`, `http/1.1`).
    pub connections: IntCounterVec,
    /// The request series resolved once each (no label lookup per request), created on first use.
    handles: Handles,
}

/// Request counters by endpoint × operation (or none: undecodable) × decision (or bad request), and
/// duration histograms by endpoint.
#[derive(Debug, Default)]
struct Handles {
    requests: [[[OnceLock<IntCounter>; 4]; 5]; 3],
    duration: [OnceLock<Histogram>; 3],
}

fn endpoint_index(e: Endpoint) -> usize {
    match e {
        Endpoint::Mutate => 0,
        Endpoint::Validate => 1,
        Endpoint::ValidateServiceMapping => 2,
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let (mut exposition, build_info) = cp_api::exposition::Exposition::new(
            &HISTOGRAMS,
            "webhook",
            cp_certs::crypto::fips_label(),
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "cp_webhook_admission_requests_total",
                "Admission requests by endpoint, operation and decision.",
            ),
            &["endpoint", "operation", "decision"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "cp_webhook_admission_duration_seconds",
                "Time to answer an admission request.",
            )
            // Up to the API server's 10 s webhook timeout: with 0.5 s as the last bucket, a p99 above
            // 0.5 s read as exactly 0.5 and the WebhookSlow alert (`> 0.5`) could never fire (promtool
            // showed it: tests/prometheus/alerts_test.yaml).
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
                2.5, 5.0, 10.0,
            ]),
            &["endpoint"],
        )?;
        let cert_reloads = IntCounter::new(
            "cp_webhook_certificate_reloads_total",
            "Serving certificates swapped in without a restart.",
        )?;
        let cert_reload_failures = IntCounterVec::new(
            Opts::new(
                "cp_webhook_certificate_reload_failures_total",
                "New serving certificates that could not be loaded, by error.",
            ),
            &["error"],
        )?;
        let cert_expiry = IntGauge::new(
            "cp_webhook_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
        )?;
        let privileged_refused = IntGauge::new(
            "cp_webhook_privileged_identities_refused",
            "Identities in the privileged ConfigMap refused as too broad (e.g. system:authenticated).",
        )?;
        let connections_refused = IntCounterVec::new(
            Opts::new(
                "cp_webhook_connections_refused_total",
                "Connections closed at once because the open ones reached a cap, by cap \
                 (global_limit, source_limit).",
            ),
            &["reason"],
        )?;
        let connections_closed = IntCounterVec::new(
            Opts::new(
                "cp_webhook_connections_closed_total",
                "Connections closed by a limit, by limit (handshake_timeout, idle).",
            ),
            &["reason"],
        )?;
        let requests_shed = IntCounterVec::new(
            Opts::new(
                "cp_webhook_requests_shed_total",
                "Requests answered without a review because of a limit, by limit (source_busy: 429, \
                 busy: 503, body_timeout: 408, timeout: 503).",
            ),
            &["reason"],
        )?;
        let open_connections = IntGauge::new(
            "cp_webhook_open_connections",
            "Open connections to the admission port.",
        )?;
        let connections = IntCounterVec::new(
            Opts::new(
                "cp_webhook_connections_total",
                "Connections past the TLS handshake, by the protocol ALPN chose (h2, http/1.1). The \
                 API server multiplexes its admission calls on HTTP/2 connections.",
            ),
            &["protocol"],
        )?;
        for p in ["h2", "http/1.1"] {
            connections.with_label_values(&[p]);
        }
        // Every reason exported from the start (at 0), so alerts see a rise from 0.
        for r in ["global_limit", "source_limit"] {
            connections_refused.with_label_values(&[r]);
        }
        for r in ["handshake_timeout", "idle"] {
            connections_closed.with_label_values(&[r]);
        }
        for r in ["source_busy", "busy", "body_timeout", "timeout"] {
            requests_shed.with_label_values(&[r]);
        }
        exposition.register(vec![
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(connections_refused.clone()),
            Box::new(connections_closed.clone()),
            Box::new(requests_shed.clone()),
            Box::new(open_connections.clone()),
            Box::new(connections.clone()),
            Box::new(duration.clone()),
            Box::new(cert_reloads.clone()),
            Box::new(cert_reload_failures.clone()),
            Box::new(cert_expiry.clone()),
            Box::new(privileged_refused.clone()),
        ])?;
        Ok(Self {
            exposition,
            requests,
            duration,
            cert_reloads,
            cert_reload_failures,
            cert_expiry,
            privileged_refused,
            build_info,
            connections_refused,
            connections_closed,
            requests_shed,
            open_connections,
            connections,
            handles: Handles::default(),
        })
    }

    /// Counts one admission request: `operation` is `None` for a body that could not be decoded and
    /// `decision` is `None` for one answered with HTTP 400.
    pub fn count(
        &self,
        endpoint: Endpoint,
        operation: Option<Operation>,
        decision: Option<Decision>,
    ) {
        let op = match operation {
            Some(Operation::Create) => 0,
            Some(Operation::Update) => 1,
            Some(Operation::Delete) => 2,
            Some(Operation::Connect) => 3,
            None => 4,
        };
        let d = match decision {
            Some(Decision::Allowed) => 0,
            Some(Decision::Patched) => 1,
            Some(Decision::Denied) => 2,
            None => 3,
        };
        let e = endpoint_index(endpoint);
        self.handles.requests[e][op][d]
            .get_or_init(|| {
                self.requests.with_label_values(&[
                    endpoint.as_str(),
                    operation.map_or("UNKNOWN", Operation::as_str),
                    decision.map_or("bad_request", Decision::as_str),
                ])
            })
            .inc();
    }

    /// Records how long an admission request took.
    pub fn observe(&self, endpoint: Endpoint, elapsed: std::time::Duration) {
        self.handles.duration[endpoint_index(endpoint)]
            .get_or_init(|| self.duration.with_label_values(&[endpoint.as_str()]))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a connection closed at once over a cap (`reason`: [`crate::limits::Refused::as_str`]).
    pub fn connection_refused(&self, reason: &str) {
        self.connections_refused.with_label_values(&[reason]).inc();
    }

    /// Counts a connection closed by a limit (`handshake_timeout`, `idle`).
    pub fn connection_closed(&self, reason: &str) {
        self.connections_closed.with_label_values(&[reason]).inc();
    }

    /// Counts a request answered without a review because of a limit (`reason`:
    /// [`crate::limits::Shed::as_str`], `body_timeout` or `timeout`).
    pub fn request_shed(&self, reason: &str) {
        self.requests_shed.with_label_values(&[reason]).inc();
    }

    /// Counts a new serving certificate that could not be loaded, labelled by its error.
    pub fn cert_reload_failed(&self, err: &crate::Error) {
        self.cert_reload_failures
            .with_label_values(&[err.metric_label()])
            .inc();
    }

    /// Records the expiry of a newly served certificate.
    pub fn observe_cert(&self, cert_pem: &[u8]) {
        if let Ok(info) = cp_certs::inspect(&String::from_utf8_lossy(cert_pem)) {
            self.cert_expiry.set(info.not_after.unix_timestamp());
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
