//! The serving certificate, hot-swapped behind an `ArcSwap` without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::Error;
use crate::metrics::Metrics;

/// The current certificate, read by every TLS handshake.
#[derive(Debug)]
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    loaded: ArcSwap<(Vec<u8>, Vec<u8>)>,
    /// Expiry of the served certificate (`None`: unreadable, judged by rustls alone).
    not_after: ArcSwap<Option<time::OffsetDateTime>>,
    /// Why the newest certificate seen could not be swapped in (`None`: the newest one is served).
    refused: ArcSwap<Option<String>>,
}

fn expiry(cert_pem: &[u8]) -> Option<time::OffsetDateTime> {
    cp_certs::inspect(&String::from_utf8_lossy(cert_pem))
        .ok()
        .map(|i| i.not_after)
}

impl CertStore {
    /// A store holding the given PEM certificate chain and key.
    pub fn new(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, Error> {
        Ok(Self {
            current: ArcSwap::from_pointee(certified_key(cert_pem, key_pem)?),
            loaded: ArcSwap::from_pointee((cert_pem.to_vec(), key_pem.to_vec())),
            not_after: ArcSwap::from_pointee(expiry(cert_pem)),
            refused: ArcSwap::from_pointee(None),
        })
    }

    /// Swaps in a new certificate if it differs from the current one; returns whether it did.
    /// A certificate that does not parse is refused and the current one stays (and the store reports
    /// the refusal in [`CertStore::problem`] until a certificate it can serve arrives).
    pub fn update(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<bool, Error> {
        let loaded = self.loaded.load();
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            self.refused.store(Arc::new(None));
            return Ok(false);
        }
        let key = match certified_key(cert_pem, key_pem) {
            Ok(k) => k,
            Err(e) => {
                self.refused.store(Arc::new(Some(e.to_string())));
                return Err(e);
            }
        };
        self.current.store(Arc::new(key));
        self.loaded
            .store(Arc::new((cert_pem.to_vec(), key_pem.to_vec())));
        self.not_after.store(Arc::new(expiry(cert_pem)));
        self.refused.store(Arc::new(None));
        Ok(true)
    }

    /// Why this replica cannot serve the current certificate at `now`, if it cannot: the one it serves
    /// has expired, or the newest one published could not be loaded (a client that trusts only the
    /// new CA would fail). Readiness reports it, so the Service stops sending requests here.
    pub fn problem(&self, now: time::OffsetDateTime) -> Option<String> {
        if let Some(why) = self.refused.load().as_ref() {
            return Some(format!(
                "the newest serving certificate could not be loaded ({why}); still serving the previous one"
            ));
        }
        match **self.not_after.load() {
            Some(t) if t <= now => Some(format!("the serving certificate expired at {t}")),
            _ => None,
        }
    }

    /// The PEM of the certificate being served.
    pub fn cert_pem(&self) -> Vec<u8> {
        self.loaded.load().0.clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Tls("certificate PEM holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| Error::Tls(format!("private key PEM: {e}")))?;
    let signing = cp_certs::crypto::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| Error::Tls(format!("private key: {e}")))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match()
        .map_err(|e| Error::Tls(format!("key does not match certificate: {e}")))?;
    Ok(ck)
}

/// The store this process serves from ([`server_config`] registers it), for readiness.
static SERVED: std::sync::RwLock<Option<std::sync::Weak<CertStore>>> = std::sync::RwLock::new(None);

/// Why this process cannot serve the current certificate, if it cannot ([`CertStore::problem`] of the
/// store it serves from; `None` before one is registered: readiness waits for it separately).
pub fn serving_problem() -> Option<String> {
    let served = match SERVED.read() {
        Ok(s) => s.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    served
        .and_then(|w| w.upgrade())
        .and_then(|s| s.problem(time::OffsetDateTime::now_utc()))
}

/// Who may open a TLS connection to the admission port.
#[derive(Clone, Debug, Default)]
pub enum Callers {
    /// Anyone who reaches the port (the platform does not give the API server a client certificate
    /// for webhooks: Gardener and most managed clusters). Answers then say nothing beyond what the
    /// request's own content implies (see the admission module).
    #[default]
    Anyone,
    /// Only clients presenting a certificate issued by one of these CAs (PEM): the API server, when
    /// its `--admission-control-config-file` gives it a client certificate for webhooks. Everyone
    /// else fails the handshake and never sees an answer.
    ClientCa(Vec<u8>),
}

impl Callers {
    /// Reads `--client-ca-file` (`None`: [`Callers::Anyone`]).
    pub fn from_file(path: Option<&PathBuf>) -> Result<Self, Error> {
        match path {
            None => Ok(Self::Anyone),
            Some(p) => std::fs::read(p)
                .map(Self::ClientCa)
                .map_err(|e| Error::Tls(format!("reading --client-ca-file {}: {e}", p.display()))),
        }
    }

    /// For the log line at start.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Anyone => {
                "any caller (no --client-ca-file): answers name nothing beyond the request's content"
            }
            Self::ClientCa(_) => "only callers with a client certificate of --client-ca-file",
        }
    }
}

fn client_verifier(
    callers: &Callers,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, Error> {
    let Callers::ClientCa(pem) = callers else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| Error::Tls(format!("client CA PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("client CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(Error::Tls("client CA PEM holds no certificate".into()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        cp_certs::crypto::provider(),
    )
    .build()
    .map(Some)
    .map_err(|e| Error::Tls(format!("client CA: {e}")))
}

/// A rustls server configuration (TLS 1.2 and 1.3 only) that serves whatever `store` holds, to the
/// `callers` allowed.
pub fn server_config(store: Arc<CertStore>, callers: &Callers) -> Result<ServerConfig, Error> {
    match SERVED.write() {
        Ok(mut s) => *s = Some(Arc::downgrade(&store)),
        Err(poisoned) => *poisoned.into_inner() = Some(Arc::downgrade(&store)),
    }
    let builder = ServerConfig::builder_with_provider(cp_certs::crypto::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match client_verifier(callers)? {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(store);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // rustls's own judgement of the whole configuration (provider in FIPS mode, TLS 1.2 with the
    // extended master secret): the FIPS build serves nothing it would not call FIPS.
    if cp_certs::crypto::FIPS_BUILD && !cfg.fips() {
        return Err(Error::Tls(
            "the FIPS build's server configuration is not FIPS-compliant (rustls ServerConfig::fips() \
             is false)"
                .into(),
        ));
    }
    Ok(cfg)
}

/// Where the certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// PEM files (e.g. a mounted Secret), re-read every `interval`.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
        /// How often to look for a change.
        interval: Duration,
    },
    /// A `kubernetes.io/tls` Secret, watched.
    Secret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Reads the initial certificate from files.
pub fn read_files(cert: &PathBuf, key: &PathBuf) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let c =
        std::fs::read(cert).map_err(|e| Error::Tls(format!("reading {}: {e}", cert.display())))?;
    let k =
        std::fs::read(key).map_err(|e| Error::Tls(format!("reading {}: {e}", key.display())))?;
    Ok((c, k))
}

/// Applies a newly observed certificate: swap, log, count.
pub fn apply_update(store: &CertStore, metrics: &Metrics, cert: &[u8], key: &[u8]) {
    match store.update(cert, key) {
        Ok(true) => {
            metrics.cert_reloads.inc();
            metrics.observe_cert(cert);
            tracing::info!("serving certificate reloaded");
        }
        Ok(false) => {}
        Err(e) => {
            metrics.cert_reload_failed(&e);
            tracing::warn!(error = %e, "new serving certificate refused; keeping the current one");
        }
    }
}

/// Re-reads certificate files every `interval` and swaps in changes.
pub async fn watch_files(
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match read_files(&cert, &key) {
            Ok((c, k)) => apply_update(&store, &metrics, &c, &k),
            Err(e) => tracing::warn!(error = %e, "cannot read serving certificate files"),
        }
    }
}

/// The PEM certificate chain and key of a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`), if it
/// holds both.
pub fn secret_pem(secret: &k8s_openapi::api::core::v1::Secret) -> Option<(&[u8], &[u8])> {
    let data = secret.data.as_ref()?;
    Some((&data.get("tls.crt")?.0, &data.get("tls.key")?.0))
}

/// Keeps `store` current from `source`: [`watch_files`] or [`watch_secret`].
pub async fn watch(
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    client: kube::Client,
    source: CertSource,
) {
    match source {
        CertSource::Files {
            cert,
            key,
            interval,
        } => watch_files(store, metrics, cert, key, interval).await,
        CertSource::Secret { namespace, name } => {
            watch_secret(store, metrics, client, namespace, name).await
        }
    }
}

/// Watches a TLS Secret and swaps in changes.
pub async fn watch_secret(
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    client: kube::Client,
    namespace: String,
    name: String,
) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(secret) => match secret_pem(&secret) {
                Some((c, k)) => apply_update(&store, &metrics, c, k),
                None => {
                    tracing::warn!(%namespace, %name, "serving certificate Secret lacks tls.crt or tls.key")
                }
            },
            Err(e) => tracing::warn!(error = %e, "watching the serving certificate Secret"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::{Duration as Span, OffsetDateTime};

    fn leaf(ca: &cp_certs::Ca, from: OffsetDateTime, lifetime: Span) -> cp_certs::Leaf {
        ca.issue(&cp_certs::LeafSpec::server(
            "cp-webhook",
            &["localhost"],
            &[],
            from,
            lifetime,
        ))
        .expect("leaf")
    }

    #[test]
    fn a_store_that_cannot_serve_the_current_certificate_says_why() {
        let now = OffsetDateTime::now_utc();
        let ca = cp_certs::Ca::generate(
            "ca",
            now - Span::hours(1),
            now + Span::days(1),
            cp_certs::KeyAlgorithm::EcdsaP256,
        )
        .expect("ca");
        let (a, b) = (
            leaf(&ca, now - Span::minutes(1), Span::hours(1)),
            leaf(&ca, now - Span::minutes(1), Span::hours(1)),
        );
        let store = CertStore::new(a.cert_pem.as_bytes(), a.key_pem.as_bytes()).expect("store");
        assert_eq!(store.problem(now), None);
        // Expired: judged by the served certificate's notAfter.
        let msg = store.problem(now + Span::hours(2)).expect("expired");
        assert!(msg.contains("expired"), "{msg}");
        // A rotation whose new certificate cannot be loaded (another certificate's key).
        assert!(
            store
                .update(b.cert_pem.as_bytes(), a.key_pem.as_bytes())
                .is_err()
        );
        let msg = store.problem(now).expect("refused");
        assert!(msg.contains("could not be loaded"), "{msg}");
        // The published certificate reverted to the served one, or a loadable new one: fine again.
        assert_eq!(
            store
                .update(a.cert_pem.as_bytes(), a.key_pem.as_bytes())
                .ok(),
            Some(false)
        );
        assert_eq!(store.problem(now), None);
        store
            .update(b.cert_pem.as_bytes(), a.key_pem.as_bytes())
            .expect_err("mismatch");
        assert_eq!(
            store
                .update(b.cert_pem.as_bytes(), b.key_pem.as_bytes())
                .ok(),
            Some(true)
        );
        assert_eq!(store.problem(now), None);
    }
}
