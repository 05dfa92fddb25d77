//! What a pod on the cluster network can do to the admission port: slow bodies, slow headers, idle
//! HTTP/2 connections and a connection flood, from addresses other than the API server's, while CR
//! writes go through the API server (which calls the webhook, `failurePolicy: Fail`).
//!
//! On the loopback harness the API server connects from 127.0.0.1; each attacker binds its socket to
//! 127.0.0.2 and up (all of 127/8 is loopback on Linux), so the webhook sees them as other sources.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use cp_api::ConnectivityProxy;
use cp_tests::fixtures::{default_connectivity_proxy, default_cr, install_our_crds};
use cp_tests::shared::take_turn;
use cp_tests::webhook::{Webhook, metric};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

use super::TURN;

/// Attacking addresses: 127.0.0.2 ..= 127.0.0.(1 + SOURCES).
const SOURCES: u8 = 10;
/// Per source: requests with complete headers and `Content-Length`, then one body byte per tick.
const SLOW_BODIES: usize = 4;
/// Per source: request headers, one byte per tick, never complete.
const SLOW_HEADERS: usize = 2;
/// Per source: HTTP/2 connections (preface and SETTINGS sent, pings answered) without a request.
const IDLE_H2: usize = 2;
/// Per source: TCP connections that send nothing, more than the per-source cap leaves room for.
const FLOOD: usize = 20;
/// The webhook's caps in this test: the attackers' attempts (28 per source, 280 in all) exceed the
/// global cap, what the per-source cap lets in (10 x 16) does not.
const MAX_CONNECTIONS: usize = 200;
const MAX_PER_SOURCE: usize = 16;
/// The dribbling pace.
const TICK: Duration = Duration::from_millis(100);
/// How long CR writes go on under attack.
const UNDER_ATTACK: Duration = Duration::from_secs(12);
/// Each write through the API server must complete within this.
const WRITE_BOUND: Duration = Duration::from_secs(2);

/// What the attackers saw, shared by their tasks.
#[derive(Default)]
struct Seen {
    stop: AtomicBool,
    /// Slow-body requests whose headers were sent (each attacker counts once per request).
    slow_bodies_sent: AtomicUsize,
    /// Slow-body attackers that held a request at least once.
    slow_body_attackers_in: AtomicUsize,
    /// Slow-body requests the server ended, and the longest any took to end (ms after its headers).
    slow_bodies_ended: AtomicUsize,
    slow_body_longest_ms: AtomicU64,
    /// Answers with a 408 status line.
    slow_bodies_408: AtomicUsize,
    /// Slow-header connections the server closed, and the longest any stayed open (ms).
    slow_headers_closed: AtomicUsize,
    slow_header_longest_ms: AtomicU64,
    /// HTTP/2 connections with h2 negotiated and the server's SETTINGS received.
    h2_established: AtomicUsize,
    /// Flood connections closed by the server within 200 ms of connecting (refused at once), and
    /// those it accepted (closed later, at the handshake timeout, or still open at the end).
    flood_refused: AtomicUsize,
    flood_held: AtomicUsize,
    flood_attempts: AtomicUsize,
}

impl Seen {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

fn source(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + i)
}

async fn connect_from(src: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(src), 0))?;
    match tokio::time::timeout(Duration::from_secs(2), socket.connect(addr)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::other("connect timed out")),
    }
}

fn connector(ca_pem: &str, alpn: &[u8]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls_from(src: Ipv4Addr, addr: SocketAddr, tls: &TlsConnector) -> Option<Tls> {
    let tcp = connect_from(src, addr).await.ok()?;
    let name = ServerName::try_from("localhost").ok()?;
    tokio::time::timeout(Duration::from_secs(5), tls.connect(name, tcp))
        .await
        .ok()?
        .ok()
}

fn record_max(cell: &AtomicU64, since: Instant) {
    let ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
    cell.fetch_max(ms, Ordering::AcqRel);
}

/// Complete headers with `Content-Length: 2000`, then one body byte per tick until the server
/// answers or closes; then again on a new connection.
async fn slow_body(src: Ipv4Addr, addr: SocketAddr, tls: TlsConnector, seen: Arc<Seen>) {
    let mut counted = false;
    while !seen.stopped() {
        let Some(stream) = tls_from(src, addr, &tls).await else {
            tokio::time::sleep(TICK).await; // pacing the next attempt
            continue;
        };
        let (mut rd, mut wr) = tokio::io::split(stream);
        let head = "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                    Content-Length: 2000\r\n\r\n{";
        if wr.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let sent = Instant::now();
        seen.slow_bodies_sent.fetch_add(1, Ordering::AcqRel);
        if !counted {
            counted = true;
            seen.slow_body_attackers_in.fetch_add(1, Ordering::AcqRel);
        }
        let mut buf = [0u8; 512];
        let mut answer = Vec::new();
        loop {
            tokio::select! {
                r = rd.read(&mut buf) => {
                    if let Ok(n @ 1..) = r {
                        answer.extend_from_slice(&buf[..n]);
                        if !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                    }
                    seen.slow_bodies_ended.fetch_add(1, Ordering::AcqRel);
                    record_max(&seen.slow_body_longest_ms, sent);
                    if answer.starts_with(b"HTTP/1.1 408") {
                        seen.slow_bodies_408.fetch_add(1, Ordering::AcqRel);
                    }
                    break;
                }
                _ = tokio::time::sleep(TICK) => {
                    if seen.stopped() || wr.write_all(b" ").await.is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// Request headers, one byte per tick, never complete; then again on a new connection.
async fn slow_header(src: Ipv4Addr, addr: SocketAddr, tls: TlsConnector, seen: Arc<Seen>) {
    while !seen.stopped() {
        let Some(stream) = tls_from(src, addr, &tls).await else {
            tokio::time::sleep(TICK).await;
            continue;
        };
        let opened = Instant::now();
        let (mut rd, mut wr) = tokio::io::split(stream);
        let head = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
        let mut at = 0usize;
        let mut buf = [0u8; 512];
        loop {
            tokio::select! {
                r = rd.read(&mut buf) => {
                    // Anything (an error answer, EOF, a reset) means the server gave up on it.
                    let _ = r;
                    seen.slow_headers_closed.fetch_add(1, Ordering::AcqRel);
                    record_max(&seen.slow_header_longest_ms, opened);
                    break;
                }
                _ = tokio::time::sleep(TICK) => {
                    let byte = head.get(at).copied().unwrap_or(b'a');
                    at += 1;
                    if seen.stopped() || wr.write_all(&[byte]).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// An HTTP/2 connection that sends its preface and SETTINGS, acknowledges the server's SETTINGS and
/// answers its pings, and never opens a stream.
async fn idle_h2(src: Ipv4Addr, addr: SocketAddr, tls: TlsConnector, seen: Arc<Seen>) {
    while !seen.stopped() {
        let Some(mut stream) = tls_from(src, addr, &tls).await else {
            tokio::time::sleep(TICK).await;
            continue;
        };
        if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return;
        }
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
        if stream.write_all(&hello).await.is_err() {
            continue;
        }
        let mut counted = false;
        let mut acc: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        'conn: loop {
            // `read` is cancel-safe: a tick loses no bytes.
            let n = tokio::select! {
                r = stream.read(&mut buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                _ = tokio::time::sleep(TICK) => {
                    if seen.stopped() {
                        return;
                    }
                    continue;
                }
            };
            acc.extend_from_slice(&buf[..n]);
            while acc.len() >= 9 {
                let len =
                    (usize::from(acc[0]) << 16) | (usize::from(acc[1]) << 8) | usize::from(acc[2]);
                if acc.len() < 9 + len {
                    break;
                }
                let frame: Vec<u8> = acc.drain(..9 + len).collect();
                let reply = match (frame[3], frame[4] & 1) {
                    (4, 0) => {
                        if !counted {
                            counted = true;
                            seen.h2_established.fetch_add(1, Ordering::AcqRel);
                        }
                        Some(vec![0, 0, 0, 4, 1, 0, 0, 0, 0]) // SETTINGS ack
                    }
                    (6, 0) => {
                        let mut pong = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                        pong.extend(&frame[9..]);
                        Some(pong)
                    }
                    (7, _) => break 'conn, // GOAWAY
                    _ => None,
                };
                if let Some(reply) = reply
                    && stream.write_all(&reply).await.is_err()
                {
                    break 'conn;
                }
            }
        }
    }
}

/// A fresh connection from the API server's address (127.0.0.1): `GET /healthz` on the admission
/// port, answered within 2 s.
async fn fresh_get(addr: SocketAddr, tls: &TlsConnector) -> Result<(), String> {
    let run = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
        let mut s = tls.connect(name, tcp).await.map_err(|e| e.to_string())?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        if answer.starts_with(b"HTTP/1.1 200") {
            Ok(())
        } else {
            Err(format!("answer {:?}", String::from_utf8_lossy(&answer)))
        }
    };
    match tokio::time::timeout(WRITE_BOUND, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {WRITE_BOUND:?}")),
    }
}

/// TCP connections that send nothing: the ones beyond the source's cap are closed at once.
async fn flood(src: Ipv4Addr, addr: SocketAddr, seen: Arc<Seen>) {
    while !seen.stopped() {
        let Ok(mut tcp) = connect_from(src, addr).await else {
            tokio::time::sleep(TICK).await;
            continue;
        };
        seen.flood_attempts.fetch_add(1, Ordering::AcqRel);
        let opened = Instant::now();
        let mut buf = [0u8; 64];
        let mut held = false;
        loop {
            match tokio::time::timeout(TICK, tcp.read(&mut buf)).await {
                Ok(Ok(1..)) => continue,
                Ok(_) => break, // closed by the server
                Err(_) if seen.stopped() => break,
                Err(_) => {
                    if !held && opened.elapsed() >= Duration::from_millis(200) {
                        held = true;
                        seen.flood_held.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }
        if !held && !seen.stopped() {
            seen.flood_refused.fetch_add(1, Ordering::AcqRel);
            tokio::time::sleep(TICK).await; // pacing: a refused client tries again
        }
    }
}

/// Waits (20 s) until `counter` reaches `want`.
async fn reaches(counter: &AtomicUsize, want: usize, what: &str) -> anyhow::Result<()> {
    cp_tests::wait::until(what, Duration::from_secs(20), || async {
        let n = counter.load(Ordering::Acquire);
        if n >= want {
            Ok(Some(()))
        } else {
            Err(format!("{n} of {want}"))
        }
    })
    .await
}

#[tokio::test]
async fn slow_and_idle_clients_from_other_addresses_do_not_starve_admission() {
    let (_turn, cp, admin) = take_turn(&TURN).await;
    install_our_crds(&admin).await;
    // The caps as environment variables, as a Deployment would set them (`env` execs the webhook).
    let (max, per_source) = (
        format!("CP_WEBHOOK_MAX_CONNECTIONS={MAX_CONNECTIONS}"),
        format!("CP_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE={MAX_PER_SOURCE}"),
    );
    let wh = Webhook::start_wrapped(
        &cp,
        "webhook-under-attack",
        &[],
        &["env", &max, &per_source],
    )
    .await
    .expect("webhook");
    wh.register(&admin).await.expect("register");
    let ns = cp.namespace("under-attack").await.expect("ns");
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), &ns);
    let mutated = "cp_webhook_admission_duration_seconds_count{endpoint=\"mutate\"}";
    // Wait until the API server calls this webhook (not a previous test's).
    cp_tests::wait::until(
        "the API server calls this webhook",
        Duration::from_secs(30),
        || {
            let (api, addr) = (api.clone(), wh.metrics_addr.clone());
            async move {
                let cr: ConnectivityProxy =
                    serde_json::from_value(default_cr("probe")).map_err(|e| e.to_string())?;
                let dry = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                api.create(&dry, &cr).await.map_err(|e| e.to_string())?;
                Ok((metric(&addr, mutated).await > 0.0).then_some(()))
            }
        },
    )
    .await
    .expect("admission through this webhook");
    let cr = default_connectivity_proxy("target");
    api.create(&PostParams::default(), &cr)
        .await
        .expect("the CR the writes patch");

    let addr: SocketAddr = wh
        .url
        .trim_start_matches("https://")
        .parse()
        .expect("webhook address");
    let ca = &wh.ca.as_ref().expect("the test's CA").cert_pem;
    let (h1, h2) = (connector(ca, b"http/1.1"), connector(ca, b"h2"));
    let seen = Arc::new(Seen::default());
    let mut attackers = Vec::new();
    for i in 0..SOURCES {
        let src = source(i);
        for _ in 0..SLOW_BODIES {
            attackers.push(tokio::spawn(slow_body(src, addr, h1.clone(), seen.clone())));
        }
        for _ in 0..SLOW_HEADERS {
            attackers.push(tokio::spawn(slow_header(
                src,
                addr,
                h1.clone(),
                seen.clone(),
            )));
        }
        for _ in 0..IDLE_H2 {
            attackers.push(tokio::spawn(idle_h2(src, addr, h2.clone(), seen.clone())));
        }
    }
    let slow_bodies = usize::from(SOURCES) * SLOW_BODIES;
    let what = "every slow-body client holds a request";
    reaches(&seen.slow_body_attackers_in, slow_bodies, what)
        .await
        .expect("the slow clients are in");
    for i in 0..SOURCES {
        for _ in 0..FLOOD {
            attackers.push(tokio::spawn(flood(source(i), addr, seen.clone())));
        }
    }
    let what = "every flood connection tried";
    reaches(&seen.flood_attempts, usize::from(SOURCES) * FLOOD, what)
        .await
        .expect("the flood is on");

    // CR writes through the API server, back to back, while the attack goes on.
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = default_connectivity_proxy("probe");
    let mut i = 0u32;
    while started.elapsed() < UNDER_ATTACK && failures.is_empty() {
        i += 1;
        let t = Instant::now();
        let r = if i.is_multiple_of(2) {
            api.create(&dry, &probe).await.map(|_| ())
        } else {
            let patch = json!({"metadata": {"annotations": {"attempt": i.to_string()}}});
            api.patch("target", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        };
        let took = t.elapsed();
        latencies.push(took);
        if let Err(e) = r {
            failures.push(format!("write {i} after {took:?}: {e}"));
        }
        // And a new connection from the API server's address gets in.
        if let Err(e) = fresh_get(addr, &h1).await {
            failures.push(format!(
                "a new connection from 127.0.0.1 (after write {i}): {e}"
            ));
        }
    }
    let metrics_text = wh
        .metrics_get("/metrics")
        .await
        .map(|(_, m)| m)
        .unwrap_or_default();
    seen.stop.store(true, Ordering::Release);
    let joined = tokio::time::timeout(
        Duration::from_secs(15),
        futures::future::join_all(attackers),
    )
    .await;
    api.delete("target", &Default::default())
        .await
        .expect("cleanup");

    latencies.sort();
    let writes = latencies.len();
    let max = latencies.last().copied().unwrap_or_default();
    let p50 = latencies.get(writes / 2).copied().unwrap_or_default();
    let load = |a: &AtomicUsize| a.load(Ordering::Acquire);
    let series = |name: &str| {
        metrics_text
            .lines()
            .filter(|l| l.starts_with(name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{writes} writes in {:?} under attack: p50 {p50:?}, max {max:?}; slow bodies: {} sent, {} ended \
         ({} with 408), longest {} ms; slow headers: {} closed, longest {} ms; idle HTTP/2: {} \
         established; flood: {} attempts, {} refused at once, {} held; {}; {}; {}",
        started.elapsed(),
        load(&seen.slow_bodies_sent),
        load(&seen.slow_bodies_ended),
        load(&seen.slow_bodies_408),
        seen.slow_body_longest_ms.load(Ordering::Acquire),
        load(&seen.slow_headers_closed),
        seen.slow_header_longest_ms.load(Ordering::Acquire),
        load(&seen.h2_established),
        load(&seen.flood_attempts),
        load(&seen.flood_refused),
        load(&seen.flood_held),
        series("cp_webhook_connections_refused_total"),
        series("cp_webhook_requests_shed_total"),
        series("cp_webhook_connections_closed_total"),
    );
    assert!(
        failures.is_empty(),
        "writes failed under attack: {failures:?}"
    );
    assert!(max <= WRITE_BOUND, "a write took {max:?} under attack");
    assert!(writes >= 10, "only {writes} writes in {UNDER_ATTACK:?}");
    assert!(
        joined.is_ok(),
        "attackers still running 15 s after the stop"
    );
    // The attack was real: every slow client got in, and the server ended its requests itself.
    assert!(
        load(&seen.slow_bodies_ended) >= slow_bodies,
        "slow bodies were not cut off"
    );
    assert!(
        seen.slow_body_longest_ms.load(Ordering::Acquire) < 3_500,
        "a slow body was held longer than the body timeout"
    );
    assert!(
        load(&seen.slow_headers_closed) >= usize::from(SOURCES) * SLOW_HEADERS,
        "slow headers were not cut off"
    );
    assert!(
        seen.slow_header_longest_ms.load(Ordering::Acquire) < 4_500,
        "slow headers were held longer than the header timeout"
    );
    assert_eq!(
        load(&seen.h2_established),
        usize::from(SOURCES) * IDLE_H2,
        "idle HTTP/2 connections"
    );
    // Fairness: each source hit its cap, the global cap was never reached, so the API server's
    // address always got in.
    assert!(load(&seen.flood_refused) > 0, "no connection was refused");
    assert!(
        metrics_text.contains("cp_webhook_connections_refused_total{reason=\"global_limit\"} 0"),
        "{}",
        series("cp_webhook_connections_refused_total")
    );
    assert!(
        !metrics_text.contains("cp_webhook_connections_refused_total{reason=\"source_limit\"} 0"),
        "{}",
        series("cp_webhook_connections_refused_total")
    );
}
