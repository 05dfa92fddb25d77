//! The Connectivity service CA, fetched from the service key's `connectivity_service.url` +
//! `CAs_path`, for the `<tls>-cacert` Secret the Istio gateway uses to verify the Cloud Connector.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::egress::{Egress, Refused};

/// Why the Connectivity CA is not fetched (each message names what to fix).
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The service key is not JSON.
    #[error("the Connectivity service key is not JSON")]
    KeyNotJson,
    /// The service key lacks a field.
    #[error(
        "the Connectivity service key has no connectivity_service.{0}; the gateway cannot verify the Cloud Connector"
    )]
    KeyField(&'static str),
    /// The key's URL is no URL.
    #[error("connectivity_service.url {0:?} is not a URL")]
    KeyUrl(String),
    /// The key's URL is not HTTPS.
    #[error("connectivity_service.url {0:?} is not HTTPS; the CA is fetched only over HTTPS")]
    NotHttps(String),
    /// The key's URL names an address.
    #[error(
        "connectivity_service.url {0:?} names an IP address; a DNS name in the service key's domain is required"
    )]
    KeyIpAddress(String),
    /// The key has no domain to check the URL's host against.
    #[error(
        "the Connectivity service key has no uaadomain, so {0} cannot be checked against the key's domain; the CA is not fetched"
    )]
    NoUaaDomain(String),
    /// The key's URL is outside the key's domain.
    #[error(
        "connectivity_service.url host {host} is outside the service key's domain {domain} (from uaadomain); the CA is not fetched"
    )]
    OutsideDomain {
        /// The URL's host.
        host: String,
        /// The key's domain.
        domain: String,
    },
    /// The extra roots file cannot be read.
    #[error("reading {path}: {source}")]
    ReadRoots {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The extra roots file is not PEM.
    #[error("{path}: {reason}")]
    BadRoots {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The extra roots file holds no certificate.
    #[error("{0} holds no PEM certificate")]
    NoRoots(String),
    /// `/etc/resolv.conf` is unusable.
    #[error("reading /etc/resolv.conf: {0}")]
    ResolvConf(String),
    /// The resolver cannot be built.
    #[error("configuring the DNS resolver: {0}")]
    Resolver(String),
    /// A lookup failed.
    #[error("resolving {host}: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// A name without addresses.
    #[error("{0} resolves to no address")]
    NoAddress(String),
    /// A name that resolves to a refused address.
    #[error(
        "{host} resolves to {refused}; the CA is not fetched from inside the cluster's or a special-purpose network"
    )]
    RefusedAddress {
        /// The host.
        host: String,
        /// Why its address is refused.
        refused: Refused,
    },
    /// The host or a network rule is refused.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The URL to fetch is no URL.
    #[error("{0:?} is not a URL")]
    Url(String),
    /// The URL to fetch names an address.
    #[error("{0} names an IP address; the CA is fetched only from a host on the operator's list")]
    IpAddress(String),
    /// An extra root is unusable.
    #[error("an extra trusted root is unusable: {0}")]
    ExtraRoot(String),
    /// No roots at all.
    #[error("no trusted root certificates (system bundle empty and none given)")]
    NoTrustedRoots,
    /// The TLS client cannot be configured.
    #[error("configuring TLS: {0}")]
    Tls(String),
    /// The FIPS build's TLS client is not FIPS-compliant.
    #[error("the FIPS build's TLS client configuration is not FIPS-compliant")]
    NotFips,
    /// The request cannot be built.
    #[error("{0}")]
    Request(String),
    /// Every attempt failed.
    #[error("fetching the Connectivity CA from {url} failed after {attempts} attempts: {last}")]
    Fetch {
        /// The URL.
        url: String,
        /// How many attempts.
        attempts: u32,
        /// The last attempt's failure.
        last: Attempt,
    },
}

/// Why one attempt to fetch the CA failed.
#[derive(Debug, thiserror::Error)]
pub enum Attempt {
    /// No attempt was made.
    #[error("no attempt")]
    None,
    /// The connection or the request failed (with every cause).
    #[error("{0}")]
    Transport(String),
    /// An HTTP error status.
    #[error("HTTP {0}")]
    Status(hyper::StatusCode),
    /// Too large or cut off.
    #[error("the response is larger than {MAX_CA_BYTES} bytes or was cut off")]
    Body,
    /// No certificate in the answer.
    #[error("the response holds no PEM certificate")]
    NoPem,
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The largest CA bundle accepted (a handful of PEM certificates is a few KiB).
pub const MAX_CA_BYTES: usize = 256 * 1024;

/// Where the CA is served, from the service key JSON: `connectivity_service.url` + `CAs_path`. The URL
/// is refused unless it is HTTPS to a DNS name inside the key's own domain (`uaadomain` without its
/// first label, e.g. `authentication.eu10.hana.ondemand.com` → `eu10.hana.ondemand.com`): a key written
/// by a CR editor cannot make the controller fetch from anywhere else (SSRF).
pub fn ca_url(service_key: &[u8]) -> Result<String, CaError> {
    let v: Value = serde_json::from_slice(service_key).map_err(|_| CaError::KeyNotJson)?;
    let cs = v.get("connectivity_service");
    let field = |name: &'static str| {
        cs.and_then(|c| c.get(name))
            .and_then(Value::as_str)
            .ok_or(CaError::KeyField(name))
    };
    let (base, path) = (field("url")?, field("CAs_path")?);
    let url = format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    );
    let uri: hyper::Uri = url.parse().map_err(|_| CaError::KeyUrl(base.into()))?;
    if uri.scheme_str() != Some("https") {
        return Err(CaError::NotHttps(base.into()));
    }
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        return Err(CaError::KeyIpAddress(base.into()));
    }
    let domain = v
        .get("uaadomain")
        .and_then(Value::as_str)
        .and_then(|d| d.split_once('.').map(|(_, rest)| rest.to_ascii_lowercase()))
        .filter(|d| d.contains('.') || !d.is_empty())
        .ok_or_else(|| CaError::NoUaaDomain(host.clone()))?;
    if host != domain && !host.ends_with(&format!(".{domain}")) {
        return Err(CaError::OutsideDomain { host, domain });
    }
    Ok(url)
}

/// Reads extra trusted roots (PEM) for the CA endpoint, e.g. a private landscape's CA.
pub fn load_roots(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let shown = || path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| CaError::ReadRoots {
        path: shown(),
        source,
    })?;
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CaError::BadRoots {
            path: shown(),
            reason: e.to_string(),
        })?;
    if roots.is_empty() {
        return Err(CaError::NoRoots(shown()));
    }
    Ok(roots)
}

/// Resolves host names in-process (hickory: `/etc/resolv.conf` and `/etc/hosts`), so the static
/// binary in an image without NSS libraries still resolves the Connectivity service's host.
#[derive(Clone)]
pub struct Resolver(Arc<hickory_resolver::TokioResolver>);

impl Resolver {
    /// A resolver configured from the system files.
    pub fn from_system() -> Result<Self, CaError> {
        let builder = hickory_resolver::TokioResolver::builder(TokioRuntimeProvider::default())
            .map_err(|e| CaError::ResolvConf(e.to_string()))?;
        let resolver = builder
            .build()
            .map_err(|e| CaError::Resolver(e.to_string()))?;
        Ok(Self(Arc::new(resolver)))
    }

    /// A resolver asking only the DNS server at `server` (UDP), e.g. a test's own on loopback.
    pub fn with_server(server: SocketAddr) -> Result<Self, CaError> {
        use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
        let mut udp = ConnectionConfig::udp();
        udp.port = server.port();
        let config = ResolverConfig::from_parts(
            None,
            vec![],
            vec![NameServerConfig::new(server.ip(), true, vec![udp])],
        );
        let resolver = hickory_resolver::TokioResolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        )
        .build()
        .map_err(|e| CaError::Resolver(e.to_string()))?;
        Ok(Self(Arc::new(resolver)))
    }

    /// The addresses of `host`.
    pub async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, CaError> {
        let found = self.0.lookup_ip(host).await.map_err(|e| CaError::Resolve {
            host: host.into(),
            reason: e.to_string(),
        })?;
        Ok(found.iter().collect())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A [`Resolver`] whose answers pass [`Egress::check_address`]: a name any of whose addresses is
/// refused is refused as a whole (an attacker's DNS may mix a public address with an internal one), and
/// the connector connects to the checked addresses it returns, never resolving again.
#[derive(Clone)]
pub struct CheckedResolver {
    resolver: Resolver,
    egress: Arc<Egress>,
}

impl CheckedResolver {
    /// `resolver`'s answers, checked against `egress`.
    pub fn new(resolver: Resolver, egress: Arc<Egress>) -> Self {
        Self { resolver, egress }
    }

    /// The addresses of `host`, every one of them checked.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, CaError> {
        let ips = self.resolver.lookup(host).await?;
        if ips.is_empty() {
            return Err(CaError::NoAddress(host.into()));
        }
        self.check(host, &ips)?;
        Ok(ips)
    }

    fn check(&self, host: &str, ips: &[IpAddr]) -> Result<(), CaError> {
        for ip in ips {
            self.egress
                .check_address(*ip)
                .map_err(|refused| CaError::RefusedAddress {
                    host: host.into(),
                    refused,
                })?;
        }
        Ok(())
    }
}

impl tower::Service<Name> for CheckedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let ips = this.resolve(name.as_str()).await?;
            Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// Fetches the CA over HTTPS (the system's roots plus `extra_roots`) with a bounded time per attempt,
/// a few retries and at most [`MAX_CA_BYTES`]; returns PEM. Errors never quote the response body.
/// The host must be on the operator's list and every address it resolves to outside the refused
/// ranges (`resolver`'s [`Egress`]); nothing is sent otherwise.
pub async fn fetch(
    url: &str,
    timeout: Duration,
    attempts: u32,
    extra_roots: &[CertificateDer<'static>],
    resolver: CheckedResolver,
) -> Result<String, CaError> {
    let uri: hyper::Uri = url.parse().map_err(|_| CaError::Url(url.into()))?;
    let host = uri.host().unwrap_or_default();
    // The connector skips the resolver for an address literal: refused here.
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        return Err(CaError::IpAddress(url.into()));
    }
    resolver.egress.check_host(host)?;
    // A refused address is final (no retries); a failed lookup is retried below. The connector checks
    // its own answer again.
    if let Ok(ips) = resolver.resolver.lookup(host).await {
        resolver.check(host, &ips)?;
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(c);
    }
    for c in extra_roots {
        roots
            .add(c.clone())
            .map_err(|e| CaError::ExtraRoot(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(CaError::NoTrustedRoots);
    }
    let tls = rustls::ClientConfig::builder_with_provider(cp_certs::crypto::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| CaError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if cp_certs::crypto::FIPS_BUILD && !tls.fips() {
        return Err(CaError::NotFips);
    }
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut last = Attempt::None;
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
        }
        let req = match hyper::Request::get(uri.clone()).body(Empty::<Bytes>::new()) {
            Ok(r) => r,
            Err(e) => return Err(CaError::Request(e.to_string())),
        };
        let result = tokio::time::timeout(timeout, async {
            let resp = client.request(req).await.map_err(|e| {
                use std::error::Error as _;
                let mut msg = e.to_string();
                let mut src = e.source();
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                Attempt::Transport(msg)
            })?;
            let status = resp.status();
            if !status.is_success() {
                return Err(Attempt::Status(status));
            }
            let body = http_body_util::Limited::new(resp.into_body(), MAX_CA_BYTES)
                .collect()
                .await
                .map_err(|_| Attempt::Body)?
                .to_bytes();
            Ok::<_, Attempt>(String::from_utf8_lossy(&body).to_string())
        })
        .await;
        match result {
            Ok(Ok(pem)) if !cp_certs::split_bundle(&pem).is_empty() => return Ok(pem),
            Ok(Ok(_)) => last = Attempt::NoPem,
            Ok(Err(e)) => last = e,
            Err(_) => last = Attempt::Timeout(timeout),
        }
    }
    Err(CaError::Fetch {
        url: url.into(),
        attempts,
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(url: &str, uaadomain: Option<&str>) -> Vec<u8> {
        let mut v =
            serde_json::json!({"connectivity_service": {"url": url, "CAs_path": "/api/v1/CAs"}});
        if let Some(d) = uaadomain {
            v["uaadomain"] = d.into();
        }
        v.to_string().into_bytes()
    }

    #[test]
    fn url_from_service_key_only_https_inside_the_keys_domain() {
        let eu10 = Some("authentication.eu10.hana.ondemand.com");
        assert_eq!(
            ca_url(&key(
                "https://connectivity.cf.eu10.hana.ondemand.com/",
                eu10
            ))
            .expect("a URL"),
            "https://connectivity.cf.eu10.hana.ondemand.com/api/v1/CAs"
        );
        for (url, domain, why) in [
            (
                "http://connectivity.cf.eu10.hana.ondemand.com",
                eu10,
                "not HTTPS",
            ),
            ("https://169.254.169.254", eu10, "IP address"),
            ("https://[::1]:8443", eu10, "IP address"),
            (
                "https://evil.example.com",
                eu10,
                "outside the service key's domain",
            ),
            ("https://eu10.hana.ondemand.com.evil.com", eu10, "outside"),
            (
                "https://connectivity.cf.eu10.hana.ondemand.com",
                None,
                "no uaadomain",
            ),
        ] {
            let e = ca_url(&key(url, domain)).expect_err(url).to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
        assert!(
            ca_url(b"{}")
                .expect_err("no url")
                .to_string()
                .contains("connectivity_service.url")
        );
        assert!(ca_url(b"not json").is_err());
    }
}
