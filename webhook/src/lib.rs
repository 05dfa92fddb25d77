//! The Connectivity Proxy admission webhook: defaults and protects `spec.deployment`, validates
//! ConnectivityProxies and ServiceMappings.
#![forbid(unsafe_code)]

pub mod admission;
pub mod cache;
pub mod cli;
pub mod index;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod privileged;
pub mod runtime;
pub mod server;
pub mod tls;

/// Errors of the webhook process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The serving certificate could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Kubernetes client setup failed.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    /// A listener could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Tls(_) => "tls",
            Error::Metrics(_) => "metrics",
            Error::Kube(_) => "kube",
            Error::Bind { .. } => "bind",
        }
    }
}
