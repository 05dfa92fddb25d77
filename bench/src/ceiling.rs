//! The ceiling: a minimal rustls + hyper server that answers every request with a fixed
//! AdmissionReview after reading the body. Nothing an admission webhook does can be faster over the
//! same TLS and HTTP stack.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Serves on `addr` with the certificate and key files until the process ends.
pub async fn serve(addr: &str, cert_file: &str, key_file: &str, body: Bytes) -> anyhow::Result<()> {
    let certs = CertificateDer::pem_file_iter(cert_file)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, body) = (acceptor.clone(), body.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let body = body.clone();
                async move {
                    let _ = req.into_body().collect().await;
                    hyper::Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(body))
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}
