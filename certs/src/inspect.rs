//! Reading certificates back: validity, names and chain checks.

use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate, parse_x509_pem};

use crate::{Error, Result};

/// What the operator needs to know about a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Validity start.
    pub not_before: OffsetDateTime,
    /// Validity end.
    pub not_after: OffsetDateTime,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// Subject common name.
    pub common_name: Option<String>,
    /// Whether it is a CA.
    pub is_ca: bool,
}

fn parse_err(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Parse {
        what,
        reason: e.to_string(),
    }
}

/// Parses the first certificate of a PEM bundle.
pub fn inspect(cert_pem: &str) -> Result<CertInfo> {
    let (_, pem) =
        parse_x509_pem(cert_pem.as_bytes()).map_err(|e| parse_err("certificate PEM", e))?;
    let (_, cert) =
        X509Certificate::from_der(&pem.contents).map_err(|e| parse_err("certificate", e))?;
    let validity = cert.validity();
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(String::from);
    Ok(CertInfo {
        not_before: validity.not_before.to_datetime(),
        not_after: validity.not_after.to_datetime(),
        dns_names,
        common_name,
        is_ca: cert.is_ca(),
    })
}

/// The SHA-256 fingerprint of the first certificate of a PEM bundle (lowercase hex of its DER), as
/// `openssl x509 -fingerprint -sha256` shows it without the colons.
pub fn fingerprint(cert_pem: &str) -> Result<String> {
    let (_, pem) =
        parse_x509_pem(cert_pem.as_bytes()).map_err(|e| parse_err("certificate PEM", e))?;
    let digest = crate::crypto::sha256(&pem.contents);
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Every certificate PEM block of a bundle, in order.
pub fn split_bundle(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        if line.starts_with("-----BEGIN CERTIFICATE-----") {
            current.clear();
        }
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END CERTIFICATE-----") {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// Checks that `leaf_pem` is signed by `ca_pem`, is valid at `now` and covers `host`.
pub fn verify_chain(leaf_pem: &str, ca_pem: &str, host: &str, now: OffsetDateTime) -> Result<()> {
    let (_, leaf_block) =
        parse_x509_pem(leaf_pem.as_bytes()).map_err(|e| parse_err("leaf PEM", e))?;
    let (_, leaf) =
        X509Certificate::from_der(&leaf_block.contents).map_err(|e| parse_err("leaf", e))?;
    let (_, ca_block) = parse_x509_pem(ca_pem.as_bytes()).map_err(|e| parse_err("CA PEM", e))?;
    let (_, ca) = X509Certificate::from_der(&ca_block.contents).map_err(|e| parse_err("CA", e))?;
    leaf.verify_signature(Some(ca.public_key()))
        .map_err(|e| Error::Check(format!("leaf is not signed by the CA: {e}")))?;
    let info = inspect(leaf_pem)?;
    if now < info.not_before || now >= info.not_after {
        return Err(Error::Check(format!(
            "leaf is not valid at {now} (valid {} to {})",
            info.not_before, info.not_after
        )));
    }
    if !info.dns_names.iter().any(|n| n == host) {
        return Err(Error::Check(format!(
            "leaf does not name {host} (names: {:?})",
            info.dns_names
        )));
    }
    Ok(())
}
