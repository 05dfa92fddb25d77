//! CA and leaf issuance.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::Result;

/// Key algorithm of a new certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// ECDSA P-256 (default).
    #[default]
    EcdsaP256,
    /// RSA 2048 with SHA-256, for peers that cannot verify ECDSA.
    Rsa2048,
}

impl std::str::FromStr for KeyAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ecdsa" | "ecdsa-p256" | "p256" => Ok(KeyAlgorithm::EcdsaP256),
            "rsa" | "rsa2048" | "rsa-2048" => Ok(KeyAlgorithm::Rsa2048),
            other => Err(format!(
                "{other:?} is not a key algorithm: use ecdsa-p256 or rsa-2048"
            )),
        }
    }
}

impl KeyAlgorithm {
    fn generate(self) -> Result<KeyPair> {
        Ok(match self {
            KeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?,
            KeyAlgorithm::Rsa2048 => crate::crypto::rsa_2048()?,
        })
    }
}

/// Where a leaf may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server.
    Server,
    /// TLS client.
    Client,
}

/// What a leaf certificate is for.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    /// Subject common name.
    pub common_name: String,
    /// Subject organizations (Kubernetes groups for client certificates).
    pub organizations: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<IpAddr>,
    /// Server or client.
    pub usage: Usage,
    /// Validity start.
    pub not_before: OffsetDateTime,
    /// Validity end.
    pub not_after: OffsetDateTime,
    /// Key algorithm.
    pub algorithm: KeyAlgorithm,
}

impl LeafSpec {
    /// A server certificate valid from `now` for `lifetime`.
    pub fn server(
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
        now: OffsetDateTime,
        lifetime: Duration,
    ) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: vec![],
            dns_names: dns_names.iter().map(|s| s.to_string()).collect(),
            ips: ips.to_vec(),
            usage: Usage::Server,
            not_before: now,
            not_after: now + lifetime,
            algorithm: KeyAlgorithm::default(),
        }
    }

    /// A client certificate for a Kubernetes user (`CN`) and groups (`O`).
    pub fn client(user: &str, groups: &[&str], now: OffsetDateTime, lifetime: Duration) -> Self {
        Self {
            common_name: user.into(),
            organizations: groups.iter().map(|s| s.to_string()).collect(),
            dns_names: vec![],
            ips: vec![],
            usage: Usage::Client,
            not_before: now,
            not_after: now + lifetime,
            algorithm: KeyAlgorithm::default(),
        }
    }
}

/// A certificate with its private key, both PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Certificate PEM.
    pub cert_pem: String,
    /// PKCS#8 private key PEM.
    pub key_pem: String,
}

/// A certificate authority: its certificate and key as PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ca {
    /// CA certificate PEM.
    pub cert_pem: String,
    /// CA private key PEM.
    pub key_pem: String,
}

impl Ca {
    /// A new self-signed CA valid from `not_before` to `not_after`.
    pub fn generate(
        common_name: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
        algorithm: KeyAlgorithm,
    ) -> Result<Self> {
        let key = algorithm.generate()?;
        let params = Self::params(common_name, not_before, not_after)?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn params(
        common_name: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<CertificateParams> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial());
        Ok(params)
    }

    /// Issues a leaf certificate signed by this CA.
    pub fn issue(&self, spec: &LeafSpec) -> Result<Leaf> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let key = spec.algorithm.generate()?;
        let mut params = CertificateParams::new(spec.dns_names.clone())?;
        params
            .subject_alt_names
            .extend(spec.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, spec.common_name.as_str());
        for org in &spec.organizations {
            dn.push(DnType::OrganizationName, org.as_str());
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match spec.usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn random_serial() -> rcgen::SerialNumber {
    // A fresh key's public bytes are random; 16 of them make a unique positive serial.
    let mut bytes = KeyPair::generate()
        .map(|k| k.public_key_raw()[1..17].to_vec())
        .unwrap_or_else(|_| {
            OffsetDateTime::now_utc()
                .unix_timestamp_nanos()
                .to_be_bytes()
                .to_vec()
        });
    bytes[0] &= 0x7f;
    rcgen::SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsa_and_ecdsa_leaves_verify_against_their_ca() {
        let now = OffsetDateTime::now_utc();
        for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
            let ca = Ca::generate(
                "ca",
                now - Duration::minutes(1),
                now + Duration::days(1),
                alg,
            )
            .expect("ca");
            let mut spec = LeafSpec::server(
                "svc",
                &["svc.ns.svc"],
                &[],
                now - Duration::minutes(1),
                Duration::hours(1),
            );
            spec.algorithm = alg;
            let leaf = ca.issue(&spec).expect("leaf");
            crate::verify_chain(&leaf.cert_pem, &ca.cert_pem, "svc.ns.svc", now)
                .unwrap_or_else(|e| panic!("{alg:?}: {e}"));
            assert!("rsa".parse::<KeyAlgorithm>() == Ok(KeyAlgorithm::Rsa2048));
        }
    }
}
