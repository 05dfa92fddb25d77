//! The floor: the webhook's own server (rustls, hyper, axum, the same limits and metrics) with a
//! handler that only reads the AdmissionReview envelope (uid, kind, operation; the objects skipped
//! with `IgnoredAny`) and answers a precomputed review with that uid. No admission webhook on this
//! stack can do less per request; `cp-webhook`'s CPU per request is compared with it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use cp_webhook::admission::{Decision, Endpoint, Operation};
use cp_webhook::server::{AppState, router_with, serve_tls};
use serde::Deserialize;
use serde::de::IgnoredAny;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    request: Envelope2<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope2<'a> {
    #[serde(borrow)]
    uid: std::borrow::Cow<'a, str>,
    #[allow(dead_code)]
    kind: IgnoredAny,
    operation: Operation,
    #[allow(dead_code)]
    object: IgnoredAny,
}

/// What precedes the uid in each precomputed answer: `/mutate` carries the release's defaulting
/// patch (the size of the real answer), the others allow.
struct Answers {
    mutate: Vec<u8>,
    allowed: Vec<u8>,
}

fn answers() -> anyhow::Result<Answers> {
    use base64::Engine;
    let patch = serde_json::to_vec(&serde_json::json!([{
        "op": "add",
        "path": "/spec/deployment",
        "value": cp_api::defaults::deployment_defaults_value(),
    }]))?;
    let patch = base64::engine::general_purpose::STANDARD.encode(patch);
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"allowed":true,"#;
    Ok(Answers {
        mutate: format!(r#"{head}"patchType":"JSONPatch","patch":"{patch}","uid":""#).into_bytes(),
        allowed: format!(r#"{head}"uid":""#).into_bytes(),
    })
}

async fn handle(
    answers: Arc<Answers>,
    endpoint: Endpoint,
    State(state): State<AppState>,
    body: Bytes,
) -> Response {
    let start = Instant::now();
    let Ok(env) = serde_json::from_slice::<Envelope>(&body) else {
        state.metrics.count(endpoint, None, None);
        return (StatusCode::BAD_REQUEST, "not an AdmissionReview").into_response();
    };
    let (before, decision) = match endpoint {
        Endpoint::Mutate => (&answers.mutate, Decision::Patched),
        _ => (&answers.allowed, Decision::Allowed),
    };
    let mut out = Vec::with_capacity(before.len() + env.request.uid.len() + 3);
    out.extend_from_slice(before);
    out.extend_from_slice(env.request.uid.as_bytes());
    out.extend_from_slice(b"\"}}");
    state
        .metrics
        .count(endpoint, Some(env.request.operation), Some(decision));
    state.metrics.observe(endpoint, start.elapsed());
    ([(header::CONTENT_TYPE, "application/json")], out).into_response()
}

/// Serves the floor on `addr` with the certificate and key files until the process ends.
pub async fn serve(addr: &str, cert_file: &str, key_file: &str) -> anyhow::Result<()> {
    let answers = Arc::new(answers()?);
    serve_with(addr, cert_file, key_file, move |state| {
        router_with(state, move |e, s, b| handle(answers.clone(), e, s, b))
    })
    .await
}

/// Serves the router `make` builds on `addr` over TLS (cp-webhook's `serve_tls`) with the certificate
/// and key files, without an API server (no caches, serving from the start), until the process ends.
pub async fn serve_with(
    addr: &str,
    cert_file: &str,
    key_file: &str,
    make: impl FnOnce(AppState) -> axum::Router,
) -> anyhow::Result<()> {
    let (cert, key) = cp_webhook::tls::read_files(&cert_file.into(), &key_file.into())?;
    let store = Arc::new(cp_webhook::tls::CertStore::new(&cert, &key)?);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cp_webhook::tls::server_config(
        store,
        &Default::default(),
    )?));
    let state = AppState {
        policy: Arc::new(cp_webhook::privileged::LivePolicy::new(Default::default())),
        caches: None,
        metrics: Arc::new(cp_webhook::metrics::Metrics::new()?),
        serving: Arc::new(AtomicBool::new(true)),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let metrics = state.metrics.clone();
    serve_tls(
        listener,
        acceptor,
        make(state),
        cp_webhook::limits::Limits::default(),
        metrics,
        std::future::pending(),
        Duration::from_secs(1),
    )
    .await;
    Ok(())
}
