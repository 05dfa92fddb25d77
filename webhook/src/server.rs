//! HTTP: the TLS admission server and the plain-HTTP metrics server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Endpoint};
use crate::cache::Caches;
use crate::metrics::Metrics;

/// Largest AdmissionReview accepted: an object and its old version at the API server's 1.5 MiB
/// object limit, plus the envelope.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Requests handled at once. With [`MAX_BODY`] this bounds buffered bodies to 32 MiB, a quarter of
/// the Deployment's 128 Mi memory limit; more requests wait (the API server's timeout is 5 s).
pub const MAX_CONCURRENT_REQUESTS: usize = 8;

/// Open connections at most; a connection beyond it is closed at once (the API server retries on a
/// new one), so idle or slow clients cannot exhaust the process.
pub const MAX_CONNECTIONS: usize = 768;

/// A TLS handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Request headers (also the first bytes of the next request on a kept-alive connection) must
/// arrive within this.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A request (body read, review, answer) must complete within this.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection is closed gracefully after this long, however busy, so none stays open for ever.
pub const MAX_CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(300);

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

/// The admission routes with `handler` answering the three admission endpoints, behind the same
/// limits (body size, timeout, concurrency). The bench's floor server is this with a handler that
/// only reads the envelope.
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
        .layer(axum::middleware::from_fn(with_timeout))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            MAX_CONCURRENT_REQUESTS,
        ))
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

/// Bounds a request, its body read included, by [`REQUEST_TIMEOUT`].
async fn with_timeout(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("the request did not complete within {REQUEST_TIMEOUT:?}"),
        )
            .into_response(),
    }
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

/// Serves `router` over TLS on `listener` until `stop` resolves; then stops accepting, lets every
/// open connection finish its requests (graceful shutdown) and returns once they have, or after
/// `drain` at the latest.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
    drain: std::time::Duration,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = MAX_CONNECTIONS, "too many open connections; closing this one");
            drop(tcp);
            continue;
        };
        // Answers are small and written at once: do not let Nagle's algorithm hold them back.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let svc = TowerToHyperService::new(router.clone());
        let mut shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(std::time::Duration::from_secs(30)));
            let conn = builder.serve_connection(TokioIo::new(tls), svc);
            tokio::pin!(conn);
            let age = tokio::time::sleep(MAX_CONNECTION_AGE);
            tokio::pin!(age);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = &mut age => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
                _ = stopped(&mut shutdown) => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("no longer accepting connections; draining the open ones");
    drop(listener);
    let _ = shutdown_tx.send(true);
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, connections.acquire_many(all))
        .await
        .is_err()
    {
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

/// Serves plain HTTP.
pub async fn serve_plain(addr: SocketAddr, router: Router) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    axum::serve(listener, router).await
}
