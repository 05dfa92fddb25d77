//! The Connectivity service CA, fetched from the service key's `connectivity_service.url` +
//! `CAs_path`, for the `<tls>-cacert` Secret the Istio gateway uses to verify the Cloud Connector.

use std::time::Duration;

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

/// Fetches the CA with a bounded timeout per attempt and a few retries; returns PEM.
pub async fn fetch(url: &str, timeout: Duration, attempts: u32) -> Result<String, String> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("loading the system's root certificates: {e}"))?
        .https_or_http()
        .enable_http1()
        .build();
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
