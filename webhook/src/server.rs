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
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Endpoint, Policy};
use crate::cache::Caches;
use crate::metrics::Metrics;

/// Largest AdmissionReview accepted: an object and its old version at the API server's 1.5 MiB
/// object limit, plus the envelope.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// Fixed policy.
    pub policy: Arc<Policy>,
    /// Watch-backed caches.
    pub caches: Option<Caches>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

impl AppState {
    fn ready(&self) -> bool {
        self.caches.as_ref().is_none_or(Caches::ready)
    }
}

/// The admission routes (served over TLS).
pub fn admission_router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(|s, b| handle(Endpoint::Mutate, s, b)))
        .route("/validate", post(|s, b| handle(Endpoint::Validate, s, b)))
        .route(
            "/validate-servicemapping",
            post(|s, b| handle(Endpoint::ValidateServiceMapping, s, b)),
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
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response()
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
            state
                .metrics
                .requests
                .with_label_values(&[endpoint.as_str(), "UNKNOWN", "bad_request"])
                .inc();
            tracing::warn!(endpoint = endpoint.as_str(), error = %e, "bad admission request");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    let facts = || state.caches.as_ref().map(Caches::facts).unwrap_or_default();
    let (resp, decision) = admission::review(endpoint, &req, &state.policy, &facts);
    let op = format!("{:?}", req.operation).to_uppercase();
    state
        .metrics
        .requests
        .with_label_values(&[endpoint.as_str(), &op, decision.as_str()])
        .inc();
    state
        .metrics
        .duration
        .with_label_values(&[endpoint.as_str()])
        .observe(start.elapsed().as_secs_f64());
    tracing::info!(
        endpoint = endpoint.as_str(),
        uid = %req.uid,
        user = req.user_info.username.as_deref().unwrap_or(""),
        operation = %op,
        namespace = req.namespace.as_deref().unwrap_or(""),
        name = %req.name,
        decision = decision.as_str(),
        reason = %resp.result.message,
        "admission decision"
    );
    match admission::encode_response(resp) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the admission response failed");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

/// Serves `router` over TLS on `listener` until the process ends.
pub async fn serve_tls(listener: TcpListener, acceptor: TlsAcceptor, router: Router) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        // Answers are small and written at once: do not let Nagle's algorithm hold them back.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let svc = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Serves plain HTTP.
pub async fn serve_plain(addr: SocketAddr, router: Router) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    axum::serve(listener, router).await
}
