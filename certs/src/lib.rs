//! Certificates for the Connectivity Proxy operator: CA and leaf issuance, PEM handling and the
//! renewal decision. Pure: no Kubernetes calls, no clock reads except where a `now` is passed in.
#![forbid(unsafe_code)]

pub mod crypto;
mod inspect;
mod issue;
pub mod renewal;
pub mod rotation;

pub use inspect::{CertInfo, fingerprint, inspect, split_bundle, verify_chain};
pub use issue::{Ca, KeyAlgorithm, Leaf, LeafSpec, Usage};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Generating a key or signing a certificate failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM block or certificate could not be parsed.
    #[error("cannot parse {what}: {reason}")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// A certificate failed a check.
    #[error("certificate check failed: {0}")]
    Check(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
