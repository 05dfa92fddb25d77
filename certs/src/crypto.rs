//! The one cryptography backend of a build: ring in the default build, aws-lc-rs in FIPS mode in the
//! `fips` build (`make images-fips`, docs/fips.md). Everything that hashes, signs, verifies or speaks TLS
//! in the webhook and the controller goes through here, so a build has exactly one backend and the FIPS
//! build offers only what its boundary approves. Where both features meet (a workspace build with
//! `--all-features`), `fips` wins; the FIPS binaries compile in no ring at all (`make test-fips` checks
//! the FIPS profile's build directory and their embedded dependency list).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

#[cfg(not(any(feature = "ring", feature = "fips")))]
compile_error!("cp-certs: enable a backend feature, `ring` (default) or `fips`");

/// The backend's digest, HMAC and signature modules (ring's API; aws-lc-rs mirrors it).
#[cfg(feature = "fips")]
pub use aws_lc_rs as backend;
/// The backend's digest, HMAC and signature modules (ring's API; aws-lc-rs mirrors it).
#[cfg(not(feature = "fips"))]
pub use ring as backend;

/// Whether this is the FIPS build (the `fips` feature), whatever the module reports at run time.
pub const FIPS_BUILD: bool = cfg!(feature = "fips");

/// The `fips` label of `cp_build_info` and `cp_module_info`: "true" in the FIPS build (whose binaries
/// exit at start unless the module reports FIPS mode, [`install`]), "false" otherwise.
pub fn fips_label() -> &'static str {
    if FIPS_BUILD { "true" } else { "false" }
}

/// What the log line and the metrics say of the build's cryptography.
pub fn backend_name() -> &'static str {
    if FIPS_BUILD {
        "aws-lc-rs (AWS-LC FIPS module)"
    } else {
        "ring"
    }
}

/// The TLS provider of this build. In the FIPS build: aws-lc-rs in FIPS mode with only the approved
/// cipher suites (AES-GCM; no ChaCha20-Poly1305) and only the NIST curves P-256 and P-384 for key
/// exchange (no X25519, no hybrid post-quantum group, which the module's boundary does not cover).
/// Built once per process and shared by every TLS configuration.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(make_provider())).clone()
}

#[cfg(feature = "fips")]
fn make_provider() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::kx_group;
    let mut p = rustls::crypto::default_fips_provider();
    p.cipher_suites.retain(|s| s.fips());
    p.kx_groups = vec![kx_group::SECP256R1, kx_group::SECP384R1];
    p
}

#[cfg(not(feature = "fips"))]
fn make_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Errors of [`install`].
#[derive(Debug, thiserror::Error)]
pub enum FipsError {
    /// The FIPS build's provider does not report FIPS mode: the AWS-LC module failed its power-on
    /// self-test or was not built in FIPS mode.
    #[error(
        "this is the FIPS build but the cryptography module does not report FIPS mode (aws-lc-rs \
         fips() is false): the AWS-LC FIPS module is not active; rebuild with `make images-fips`"
    )]
    NotInFipsMode,
    /// A cipher suite or key-exchange group outside the FIPS boundary is offered.
    #[error("the FIPS build offers a non-approved algorithm: {0}")]
    NotApproved(String),
}

/// Installs this build's provider as the process default (the Kubernetes client's TLS uses it) and,
/// in the FIPS build, checks that the module is in FIPS mode and that every offered algorithm is
/// approved. Returns whether FIPS mode is on. Idempotent.
pub fn install() -> Result<bool, FipsError> {
    let provider = provider();
    let _ = CryptoProvider::install_default(provider.as_ref().clone());
    if FIPS_BUILD {
        check_fips(&provider)?;
    }
    Ok(provider.fips())
}

fn check_fips(provider: &CryptoProvider) -> Result<(), FipsError> {
    if let Some(s) = provider.cipher_suites.iter().find(|s| !s.fips()) {
        return Err(FipsError::NotApproved(format!(
            "cipher suite {:?}",
            s.suite()
        )));
    }
    if let Some(g) = provider.kx_groups.iter().find(|g| !g.fips()) {
        return Err(FipsError::NotApproved(format!(
            "key exchange {:?}",
            g.name()
        )));
    }
    if !provider.fips() {
        return Err(FipsError::NotInFipsMode);
    }
    Ok(())
}

/// An RSA-2048 key: the rsa crate in the default build (ring cannot generate RSA keys), the AWS-LC
/// FIPS module in the FIPS build.
#[cfg(not(feature = "fips"))]
pub(crate) fn rsa_2048() -> crate::Result<rcgen::KeyPair> {
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};
    let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048)
        .map_err(|e| crate::Error::Check(format!("generating an RSA key: {e}")))?;
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| crate::Error::Check(format!("encoding an RSA key: {e}")))?;
    Ok(rcgen::KeyPair::from_pkcs8_pem_and_sign_algo(
        &pem,
        &rcgen::PKCS_RSA_SHA256,
    )?)
}

#[cfg(feature = "fips")]
pub(crate) fn rsa_2048() -> crate::Result<rcgen::KeyPair> {
    Ok(rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?)
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = backend::digest::digest(&backend::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_this_builds_backend_and_fips_exactly_in_the_fips_build() {
        let p = make_provider();
        assert_eq!(p.fips(), FIPS_BUILD);
        assert_eq!(install().expect("install"), FIPS_BUILD);
        // The process default is now this build's provider.
        let installed = CryptoProvider::get_default().expect("installed");
        assert_eq!(installed.fips(), FIPS_BUILD);
    }

    #[test]
    fn the_fips_build_offers_no_chacha20_and_no_x25519() {
        let p = make_provider();
        let suites: Vec<String> = p
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        let groups: Vec<String> = p
            .kx_groups
            .iter()
            .map(|g| format!("{:?}", g.name()))
            .collect();
        if FIPS_BUILD {
            assert!(suites.iter().all(|s| !s.contains("CHACHA20")), "{suites:?}");
            assert!(groups.iter().all(|g| !g.contains("X25519")), "{groups:?}");
            assert_eq!(groups, ["secp256r1", "secp384r1"]);
            assert!(check_fips(&p).is_ok());
        } else {
            // The default build keeps ring's defaults (unchanged by the FIPS work).
            assert!(suites.iter().any(|s| s.contains("CHACHA20")), "{suites:?}");
            assert!(groups.iter().any(|g| g.contains("X25519")), "{groups:?}");
        }
    }

    #[test]
    fn sha256_is_the_standard_digest() {
        let hex: String = sha256(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
