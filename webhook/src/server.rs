//! HTTP: the TLS admission server and the plain-HTTP metrics server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::admission::{self, Endpoint};
use crate::cache::Caches;
use crate::limits::{Activity, ConnPermit, Gate, Limits, Shed, Throttle};
use crate::metrics::Metrics;

pub use crate::limits::MAX_BODY;

/// A TLS handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// HTTP/1 request headers (also the first bytes of the next request on a kept-alive connection, so
/// this is HTTP/1's idle timeout too) must arrive within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection without a request in progress for this long is closed gracefully: an HTTP/2
/// connection that only answers pings, a TLS client that never sends a request, HTTP/2 headers that
/// never complete.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection is closed gracefully after this long, however busy, so none stays open for ever.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// After a graceful close (age, idle) a connection gets this long to finish before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// HTTP/2 streams in progress on one connection at most (the API server opens another connection
/// beyond it).
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 32;

/// Largest HTTP/2 header list (decoded) accepted; the API server's are well under 4 KiB.
pub const H2_MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// HTTP/2 pings: an unanswered one closes the connection after [`H2_KEEP_ALIVE_TIMEOUT`].
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// See [`H2_KEEP_ALIVE_INTERVAL`].
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Refusals and sheds are counted by metrics; at most one log line per this per kind.
const LOG_EVERY: Duration = Duration::from_secs(10);

static REFUSED_LOG: LazyLock<Throttle> = LazyLock::new(|| Throttle::new(LOG_EVERY));
static SHED_LOG: LazyLock<Throttle> = LazyLock::new(|| Throttle::new(LOG_EVERY));
static SLOW_LOG: LazyLock<Throttle> = LazyLock::new(|| Throttle::new(LOG_EVERY));

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The policy in force (privileged identities read live).
    pub policy: Arc<crate::privileged::LivePolicy>,
    /// Watch-backed caches.
    pub caches: Option<Caches>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Serving: a certificate is loaded and the process is not draining.
    pub serving: Arc<std::sync::atomic::AtomicBool>,
}

impl AppState {
    fn ready(&self) -> bool {
        self.serving.load(std::sync::atomic::Ordering::SeqCst)
            && self.caches.as_ref().is_none_or(Caches::ready)
            && crate::tls::serving_problem().is_none()
    }
}

/// The admission routes (served over TLS).
pub fn admission_router(state: AppState) -> Router {
    router_with(state, handle)
}

/// The admission routes with `handler` answering the three admission endpoints. The limits (body
/// size and time, reservations, timeouts) are applied by [`serve_tls`] before a request reaches
/// them. The bench's floor server is this with a handler that only reads the envelope.
pub fn router_with<H, F>(state: AppState, handler: H) -> Router
where
    H: Fn(Endpoint, State<AppState>, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response> + Send + 'static,
{
    let (h1, h2, h3) = (handler.clone(), handler.clone(), handler);
    Router::new()
        .route("/mutate", post(move |s, b| h1(Endpoint::Mutate, s, b)))
        .route("/validate", post(move |s, b| h2(Endpoint::Validate, s, b)))
        .route(
            "/validate-servicemapping",
            post(move |s, b| h3(Endpoint::ValidateServiceMapping, s, b)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The metrics routes (plain HTTP).
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not serving yet (waiting for the certificate or the caches) or draining",
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn handle(endpoint: Endpoint, State(state): State<AppState>, body: Bytes) -> Response {
    let start = Instant::now();
    let req = match admission::decode(&body) {
        Ok(r) => r,
        Err(e) => {
            state.metrics.count(endpoint, None, None);
            tracing::warn!(endpoint = endpoint.as_str(), error = %e, "bad admission request");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    let facts = || state.caches.as_ref().map(Caches::facts).unwrap_or_default();
    let (resp, decision) = admission::review(endpoint, &req, &state.policy.current(), &facts);
    state
        .metrics
        .count(endpoint, Some(req.operation), Some(decision));
    state.metrics.observe(endpoint, start.elapsed());
    // A denial is news for whoever runs the cluster; an admitted request is routine (the API server's
    // audit log has every one) and is logged at debug.
    if decision == admission::Decision::Denied {
        log_decision(tracing::Level::INFO, endpoint, &req, &resp, decision);
    } else if tracing::enabled!(tracing::Level::DEBUG) {
        log_decision(tracing::Level::DEBUG, endpoint, &req, &resp, decision);
    }
    match admission::encode_response(resp) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the admission response failed");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

fn log_decision(
    level: tracing::Level,
    endpoint: Endpoint,
    req: &admission::Request,
    resp: &admission::Response,
    decision: admission::Decision,
) {
    macro_rules! at {
        ($lvl:expr) => {
            tracing::event!(
                $lvl,
                endpoint = endpoint.as_str(),
                uid = %req.uid,
                user = req.user_info.username.as_deref().unwrap_or(""),
                operation = req.operation.as_str(),
                namespace = req.namespace.as_deref().unwrap_or(""),
                name = %req.name,
                decision = decision.as_str(),
                reason = %resp.result.message,
                "admission decision"
            )
        };
    }
    if level == tracing::Level::INFO {
        at!(tracing::Level::INFO);
    } else {
        at!(tracing::Level::DEBUG);
    }
}

/// A plain-text answer without a review (the API server logs the text).
fn refuse(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

/// Runs one request through the limits of [`crate::limits`] and then `router`: a request whose body
/// is too large is refused before it is read; it reserves its declared length (waiting at most
/// [`Limits::slot_wait`], else 429/503); its body must arrive within [`Limits::body_timeout`] (else
/// 408) and the whole request within [`Limits::request_timeout`] (else 503).
pub async fn guarded<B>(
    conn: &ConnPermit,
    metrics: &Metrics,
    router: Router,
    req: Request<B>,
) -> Response
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let limits = conn.limits();
    let deadline = tokio::time::Instant::now() + limits.request_timeout;
    let hint = req.body().size_hint();
    if hint.lower() > MAX_BODY as u64 {
        // Read and drop what the client sends (never buffered, bounded in bytes and time) so that it
        // reads the answer instead of a reset while still writing.
        let until = (tokio::time::Instant::now() + limits.body_timeout).min(deadline);
        discard(req.into_body(), 2 * MAX_BODY as u64, until).await;
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than 4 MiB",
        );
    }
    // The declared length, or the most a body without one may bring.
    let declared = hint
        .upper()
        .and_then(|n| usize::try_from(n).ok())
        .map_or(MAX_BODY, |n| n.min(MAX_BODY));
    let reservation = match tokio::time::timeout_at(deadline, conn.reserve(declared)).await {
        Ok(Ok(r)) => r,
        Ok(Err(shed)) => return shed_answer(conn, metrics, shed),
        Err(_) => return shed_answer(conn, metrics, Shed::Busy),
    };
    let (parts, body) = req.into_parts();
    let body = if declared == 0 {
        Body::empty()
    } else {
        let until = (tokio::time::Instant::now() + limits.body_timeout).min(deadline);
        match tokio::time::timeout_at(until, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(collected)) => Body::from(collected.to_bytes()),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than 4 MiB",
                );
            }
            Ok(Err(_)) => {
                return refuse(StatusCode::BAD_REQUEST, "reading the request body failed");
            }
            Err(_) => {
                metrics.request_shed("body_timeout");
                if SLOW_LOG.allow() {
                    tracing::warn!(
                        peer = %conn.ip(),
                        timeout = ?limits.body_timeout,
                        "a request body did not arrive in time (slow client?); logged at most every 10 s, \
                         cp_webhook_requests_shed_total{{reason=\"body_timeout\"}} counts them"
                    );
                }
                return refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive in time",
                );
            }
        }
    };
    let answer =
        match tokio::time::timeout_at(deadline, router.oneshot(Request::from_parts(parts, body)))
            .await
        {
            Ok(Ok(r)) => r,
            Ok(Err(never)) => match never {},
            Err(_) => {
                metrics.request_shed("timeout");
                refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the request did not complete in time",
                )
            }
        };
    drop(reservation);
    answer
}

/// Reads `body` to its end, at most `limit` bytes and until `until`, keeping nothing.
async fn discard<B: HttpBody<Data = Bytes>>(body: B, limit: u64, until: tokio::time::Instant) {
    let mut body = std::pin::pin!(body);
    let mut seen = 0u64;
    while seen <= limit {
        match tokio::time::timeout_at(until, body.as_mut().frame()).await {
            Ok(Some(Ok(frame))) => {
                seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            _ => return,
        }
    }
}

fn shed_answer(conn: &ConnPermit, metrics: &Metrics, shed: Shed) -> Response {
    metrics.request_shed(shed.as_str());
    if SHED_LOG.allow() {
        tracing::warn!(
            peer = %conn.ip(),
            reason = shed.as_str(),
            "shedding admission requests: too many request bodies in progress; logged at most every \
             10 s, cp_webhook_requests_shed_total counts them"
        );
    }
    let (status, text) = match shed {
        Shed::SourceBusy => (
            StatusCode::TOO_MANY_REQUESTS,
            "too many request bodies in progress from this address",
        ),
        Shed::Busy => (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many request bodies in progress",
        ),
    };
    (status, [(header::RETRY_AFTER, "1")], text).into_response()
}

/// The HTTP/1 and HTTP/2 settings of every connection.
fn http_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST_SIZE)
        .keep_alive_interval(Some(H2_KEEP_ALIVE_INTERVAL))
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// What a connection's requests share.
struct Conn {
    permit: ConnPermit,
    activity: Activity,
    router: Router,
    metrics: Arc<Metrics>,
}

/// Decrements the open-connections gauge when the connection's task ends.
struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

/// Serves `router` over TLS on `listener` within `limits` until `stop` resolves; then stops
/// accepting, lets every open connection finish its requests (graceful shutdown) and returns once
/// they have, or after `drain` at the latest.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    let gate = Gate::new(limits);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let permit = match gate.admit(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                metrics.connection_refused(why.as_str());
                if REFUSED_LOG.allow() {
                    tracing::warn!(
                        %peer,
                        reason = why.as_str(),
                        max = limits.max_connections,
                        max_per_source = limits.max_connections_per_source,
                        "too many open connections; closing new ones at once (logged at most every \
                         10 s, cp_webhook_connections_refused_total counts them)"
                    );
                }
                drop(tcp);
                continue;
            }
        };
        metrics.open_connections.inc();
        let open = Open(metrics.clone());
        // Answers are small and written at once: do not let Nagle's algorithm hold them back.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let conn = Arc::new(Conn {
            permit,
            activity: Activity::default(),
            router: router.clone(),
            metrics: metrics.clone(),
        });
        let mut shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            let _open = open;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    conn.metrics.connection_closed("handshake_timeout");
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let protocol = match tls.get_ref().1.alpn_protocol() {
                Some(b"h2") => "h2",
                _ => "http/1.1",
            };
            conn.metrics
                .connections
                .with_label_values(&[protocol])
                .inc();
            let svc = hyper::service::service_fn({
                let conn = conn.clone();
                move |req| {
                    let conn = conn.clone();
                    async move {
                        let _busy = conn.activity.begin();
                        let answer =
                            guarded(&conn.permit, &conn.metrics, conn.router.clone(), req).await;
                        Ok::<_, Infallible>(answer)
                    }
                }
            });
            let builder = http_builder();
            let http = builder.serve_connection(TokioIo::new(tls), svc);
            tokio::pin!(http);
            let age = tokio::time::sleep(MAX_CONNECTION_AGE);
            tokio::pin!(age);
            // Age and idleness close gracefully within a grace period; a shutdown waits for the
            // requests in progress (the drain period bounds it).
            let bounded = tokio::select! {
                r = http.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = &mut age => true,
                _ = conn.activity.idle_for(IDLE_TIMEOUT) => {
                    conn.metrics.connection_closed("idle");
                    true
                }
                _ = stopped(&mut shutdown) => false,
            };
            http.as_mut().graceful_shutdown();
            let result = if bounded {
                tokio::time::timeout(CLOSE_GRACE, http.as_mut())
                    .await
                    .unwrap_or(Ok(()))
            } else {
                http.as_mut().await
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("no longer accepting connections; draining the open ones");
    drop(listener);
    let _ = shutdown_tx.send(true);
    if tokio::time::timeout(drain, gate.drained()).await.is_err() {
        tracing::warn!(?drain, "connections still open after the drain period");
    }
}

/// Resolves once the shutdown flag is set (never, if its sender is gone without setting it).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Binds a listener on `addr` (the error names the address).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, crate::Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| crate::Error::Bind { addr, source })
}

/// Serves `router` over plain HTTP on `listener` (the metrics server).
pub async fn serve_plain(listener: TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper::body::{Frame, SizeHint};

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn limits() -> Limits {
        Limits {
            body_budget: 1000,
            body_budget_per_source: 1000,
            slot_wait: Duration::from_millis(50),
            body_timeout: Duration::from_millis(100),
            request_timeout: Duration::from_secs(1),
            ..Limits::default()
        }
    }

    fn router() -> Router {
        Router::new().route(
            "/validate",
            post(|b: Bytes| async move { b.len().to_string() }),
        )
    }

    /// A body that declares `len` bytes and never sends one (a slow client).
    struct Stalled(u64);

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.0)
        }
    }

    fn post_body<B>(body: B) -> Request<B> {
        Request::post("/validate").body(body).expect("request")
    }

    #[tokio::test]
    async fn a_request_waiting_for_a_slot_past_its_wait_is_shed_with_503_and_served_after() {
        let gate = Gate::new(limits());
        let metrics = Metrics::new().expect("metrics");
        let hog = gate.admit(ip(2)).expect("hog");
        let held = hog.reserve(1000).await.expect("the whole budget");
        let api = gate.admit(ip(1)).expect("api server");
        let body = || http_body_util::Full::new(Bytes::from_static(b"{}"));
        let t = Instant::now();
        let r = guarded(&api, &metrics, router(), post_body(body())).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(metrics.requests_shed.with_label_values(&["busy"]).get(), 1);
        drop(held);
        let r = guarded(&api, &metrics, router(), post_body(body())).await;
        assert_eq!(r.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_source_over_its_share_gets_429_at_once() {
        let gate = Gate::new(Limits {
            body_budget_per_source: 100,
            ..limits()
        });
        let metrics = Metrics::new().expect("metrics");
        let conn = gate.admit(ip(2)).expect("conn");
        let _held = conn.reserve(100).await.expect("its share");
        let r = guarded(&conn, &metrics, router(), post_body(Stalled(10))).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            metrics
                .requests_shed
                .with_label_values(&["source_busy"])
                .get(),
            1
        );
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_gets_408_and_frees_its_reservation() {
        let gate = Gate::new(limits());
        let metrics = Metrics::new().expect("metrics");
        let conn = gate.admit(ip(2)).expect("conn");
        let t = Instant::now();
        let r = guarded(&conn, &metrics, router(), post_body(Stalled(1000))).await;
        assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(
            metrics
                .requests_shed
                .with_label_values(&["body_timeout"])
                .get(),
            1
        );
        // The whole budget is free again.
        let _all = conn.reserve(1000).await.expect("reservation returned");
    }

    #[tokio::test]
    async fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
        let gate = Gate::new(limits());
        let metrics = Metrics::new().expect("metrics");
        let conn = gate.admit(ip(2)).expect("conn");
        let r = guarded(
            &conn,
            &metrics,
            router(),
            post_body(Stalled(MAX_BODY as u64 + 1)),
        )
        .await;
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
