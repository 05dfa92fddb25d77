//! The Connectivity Proxy controller: installs and configures the proxy from the CR and reports an
//! honest status. `main.rs` parses the flags ([`cli`]) and [`runtime`] wires it up; everything else lives in modules by concern.
#![forbid(unsafe_code)]

pub mod apply;
pub mod btp;
pub mod cache;
pub mod certificates;
pub mod cli;
pub mod connectivity_ca;
pub mod context;
pub mod deletion;
pub mod desired;
pub mod egress;
pub mod gather;
pub mod leader;
pub mod mappings;
pub mod metrics;
pub mod migration;
pub mod module_owner;
pub mod outside;
pub mod ownership;
pub mod plan;
pub mod pods;
pub mod reconcile;
pub mod runtime;
pub mod status;
pub mod upgrade;
pub mod writer;

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What the controller was doing.
        context: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// (De)serialisation failed.
    #[error("serialisation: {0}")]
    Serde(#[from] serde_json::Error),
    /// The CR holds a value the controller cannot use.
    #[error("{0}")]
    Invalid(String),
    /// A certificate could not be issued.
    #[error("certificate: {0}")]
    Certificate(String),
    /// An object the operator would write exists and was not created by it.
    #[error(
        "{0} exists and was not created by the Connectivity Proxy operator (it carries no ownership proof of the operator: the label app.kubernetes.io/managed-by=connectivity-proxy-operator alone does not make an object the operator's): the operator never writes into, labels, owns or deletes an object it did not create; choose another name in the CR or delete that object"
    )]
    NotOurs(String),
}

impl Error {
    /// A Kubernetes error with what the controller was doing.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            context: context.into(),
            source,
        }
    }

    /// Label for the reconcile error metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Serde(_) => "serde",
            Error::Certificate(_) => "certificate",
            Error::Invalid(_) => "invalid",
            Error::NotOurs(_) => "not_ours",
        }
    }
}
