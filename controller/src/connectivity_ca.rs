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

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Where the CA is served, from the service key JSON.
pub fn ca_url(service_key: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(service_key).ok()?;
    let cs = v.get("connectivity_service")?;
    let base = cs.get("url")?.as_str()?.trim_end_matches('/');
    let path = cs.get("CAs_path")?.as_str()?;
    Some(format!("{base}/{}", path.trim_start_matches('/')))
}

/// Resolves host names in-process (hickory: `/etc/resolv.conf` and `/etc/hosts`), so the static
/// binary in an image without NSS libraries still resolves the Connectivity service's host.
#[derive(Clone)]
pub struct Resolver(Arc<hickory_resolver::TokioResolver>);

impl Resolver {
    /// A resolver configured from the system files.
    pub fn from_system() -> Result<Self, String> {
        let builder = hickory_resolver::TokioResolver::builder(TokioRuntimeProvider::default())
            .map_err(|e| format!("reading /etc/resolv.conf: {e}"))?;
        let resolver = builder
            .build()
            .map_err(|e| format!("configuring the DNS resolver: {e}"))?;
        Ok(Self(Arc::new(resolver)))
    }

    /// The addresses of `host`.
    pub async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let found = self
            .0
            .lookup_ip(host)
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?;
        Ok(found.iter().collect())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let ips = this.lookup(name.as_str()).await?;
            Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// Fetches the CA with a bounded timeout per attempt and a few retries; returns PEM.
pub async fn fetch(url: &str, timeout: Duration, attempts: u32) -> Result<String, String> {
    let mut http = HttpConnector::new_with_resolver(Resolver::from_system()?);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("loading the system's root certificates: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let mut last = String::new();
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
        }
        let req = match hyper::Request::get(uri.clone()).body(Empty::<Bytes>::new()) {
            Ok(r) => r,
            Err(e) => return Err(e.to_string()),
        };
        let result = tokio::time::timeout(timeout, async {
            let resp = client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("HTTP {status}"));
            }
            Ok::<_, String>(String::from_utf8_lossy(&body).to_string())
        })
        .await;
        match result {
            Ok(Ok(pem)) if !cp_certs::split_bundle(&pem).is_empty() => return Ok(pem),
            Ok(Ok(_)) => last = "the response holds no PEM certificate".into(),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("no answer within {timeout:?}"),
        }
    }
    Err(format!(
        "fetching the Connectivity CA from {url} failed after {attempts} attempts: {last}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_from_service_key() {
        let key = br#"{"connectivity_service": {"url": "https://c.example.com/", "CAs_path": "/api/v1/CAs"}}"#;
        assert_eq!(
            ca_url(key).as_deref(),
            Some("https://c.example.com/api/v1/CAs")
        );
        assert_eq!(ca_url(b"{}"), None);
    }
}
