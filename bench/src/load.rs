//! A small HTTPS load generator: `concurrency` keep-alive HTTP/1.1 connections, each with one request
//! in flight, for a fixed time after a warm-up; every latency is kept for exact percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::TlsConnector;

/// One load run's result.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests completed in the measured window.
    pub requests: usize,
    /// Requests that failed or got a non-200 answer in the measured window.
    pub errors: usize,
    /// Requests per second in the measured window.
    pub rps: f64,
    /// Latency percentiles in microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest request.
    pub max_us: u64,
}

/// What to send where.
#[derive(Clone)]
pub struct Target {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// Request path.
    pub path: String,
    /// Request body.
    pub body: Bytes,
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
}

fn connector(ca_pem: &str) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: &Target, tls: &TlsConnector) -> anyhow::Result<Sender> {
    let tcp = tokio::net::TcpStream::connect(&target.addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("127.0.0.1")?.to_owned();
    let stream = tls.connect(name, tcp).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request and its answer; `Ok(false)` for a non-200 answer.
pub async fn send(sender: &mut Sender, target: &Target) -> anyhow::Result<(bool, Bytes)> {
    let req = http::Request::post(&target.path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(target.body.clone()))?;
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    let ok = resp.status() == http::StatusCode::OK;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((ok, body))
}

/// One request on a fresh connection, to check what a server answers before loading it.
pub async fn probe(target: &Target) -> anyhow::Result<(bool, Bytes)> {
    let tls = connector(&target.ca_pem)?;
    let mut sender = connect(target, &tls).await?;
    send(&mut sender, target).await
}

/// Loads `target` with `concurrency` connections: `warmup` unmeasured, then `measure`.
pub async fn run(
    target: &Target,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Stats> {
    let tls = connector(&target.ca_pem)?;
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + measure;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut sender = connect(target, &tls).await?;
        let (target, tls) = (target.clone(), tls.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut errors = 0usize;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let ok = matches!(send(&mut sender, &target).await, Ok((true, _)));
                let t1 = Instant::now();
                if t0 >= measure_from && t1 <= end {
                    if ok {
                        lat.push((t1 - t0).as_micros() as u32);
                    } else {
                        errors += 1;
                    }
                }
                if !ok {
                    // Reconnect after a failure (the server may have closed the connection).
                    match connect(&target, &tls).await {
                        Ok(s) => sender = s,
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut all: Vec<u32> = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await?;
        all.extend(lat);
        errors += e;
    }
    all.sort_unstable();
    let pct = |p: f64| -> u64 {
        if all.is_empty() {
            return 0;
        }
        let idx = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        u64::from(all[idx])
    };
    Ok(Stats {
        requests: all.len(),
        errors,
        rps: all.len() as f64 / measure.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        max_us: all.last().map(|v| u64::from(*v)).unwrap_or(0),
    })
}
