//! The webhook process wired up: what `cp-webhook` runs once its flags are parsed and the
//! cryptography provider is installed. The Kubernetes client, the privileged identities and their
//! ConfigMap, the caches, the metrics server, the serving certificate (loaded, then kept current) and
//! the admission server with its SIGTERM drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::cache::Caches;
use crate::cli::Args;
use crate::metrics::Metrics;
use crate::privileged::{self, LivePolicy};
use crate::server::{self, AppState, admission_router, metrics_router, serve_tls};
use crate::tls::{self, CertSource, CertStore};

/// The target of this module's log lines: the one they had when the binary (crate `cp_webhook`) wrote
/// them, so the lines and the `RUST_LOG` directives that select them stay as they were.
const LOG: &str = "cp_webhook";

/// After the stop (SIGTERM and the shutdown delay), open requests get this long to finish.
const DRAIN: Duration = Duration::from_secs(20);

/// Runs the webhook until SIGTERM (or Ctrl-C) and the drain, or until the metrics server fails.
pub async fn run(args: Args) -> anyhow::Result<()> {
    cp_api::defaults::configure(args.proxy_image.as_deref(), args.utility_image.as_deref())?;
    let limits = args.limits()?;
    let metrics = Arc::new(Metrics::new()?);
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client")?;
    let privileged = args.privileged()?;
    tracing::info!(target: LOG, who = %privileged.describe(), "identities that may change spec.deployment");
    let callers = tls::Callers::from_file(args.client_ca_file.as_ref())?;
    tracing::info!(
        target: LOG,
        callers = callers.describe(),
        "who may call the admission port"
    );

    // Health and readiness answer from the start: alive while the certificate is still being issued,
    // ready only once it is loaded (and not while draining).
    let serving = Arc::new(AtomicBool::new(false));
    let live = Arc::new(LivePolicy::new(privileged));
    let privileged_store = args.privileged_config()?.map(|(ns, name)| {
        privileged::watch(client.clone(), ns, name, live.clone(), metrics.clone())
    });
    let state = AppState {
        policy: live,
        caches: Some(Caches::start(client.clone(), privileged_store)),
        metrics: metrics.clone(),
        serving: serving.clone(),
    };
    let metrics_listener = server::bind(args.metrics_addr).await?;
    let mut metrics_server = tokio::spawn(server::serve_plain(
        metrics_listener,
        metrics_router(state.clone()),
    ));

    let store = tokio::select! {
        s = load_certificate(&args, &client, &metrics) => s?,
        _ = shutdown_signal() => {
            tracing::info!(target: LOG, "shutting down before a certificate was loaded");
            return Ok(());
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(store, &callers)?));
    let listener = server::bind(args.addr).await?;
    serving.store(true, Ordering::SeqCst);
    tracing::info!(target: LOG, addr = %args.addr, metrics = %args.metrics_addr, "serving admission requests");
    let delay = args.shutdown_delay;
    let stop = async move {
        shutdown_signal().await;
        // Not ready any more: the endpoint leaves the Service while open requests still complete.
        serving.store(false, Ordering::SeqCst);
        tracing::info!(
            target: LOG,
            ?delay,
            "SIGTERM: readiness false; accepting requests a little longer"
        );
        tokio::time::sleep(delay).await;
    };
    tokio::select! {
        _ = serve_tls(listener, acceptor, admission_router(state), limits, metrics, stop, DRAIN) => {
            tracing::info!(target: LOG, "drained; exiting");
        }
        r = &mut metrics_server => {
            r.context("metrics server task")?.context("metrics server")?;
        }
    }
    Ok(())
}

/// Loads the serving certificate from files or from the watched Secret (waiting until the controller
/// issued it) and keeps it current.
async fn load_certificate(
    args: &Args,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<CertStore>> {
    let source = args.cert_source()?;
    let (cert, key) = match &source {
        CertSource::Files { cert, key, .. } => tls::read_files(cert, key)?,
        CertSource::Secret { namespace, name } => wait_for_secret(client, namespace, name).await,
    };
    let store = Arc::new(CertStore::new(&cert, &key)?);
    metrics.observe_cert(&cert);
    tokio::spawn(tls::watch(
        store.clone(),
        metrics.clone(),
        client.clone(),
        source,
    ));
    Ok(store)
}

/// The certificate chain and key of the Secret `ns/name`, once it holds both (read with backoff).
async fn wait_for_secret(client: &kube::Client, ns: &str, name: &str) -> (Vec<u8>, Vec<u8>) {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get_opt(name).await {
            Ok(Some(s)) => {
                if let Some((c, k)) = tls::secret_pem(&s) {
                    return (c.to_vec(), k.to_vec());
                }
                tracing::info!(
                    target: LOG,
                    ns,
                    name,
                    "serving certificate Secret has no tls.crt/tls.key yet"
                );
            }
            Ok(None) => tracing::info!(
                target: LOG,
                ns,
                name,
                "waiting for the controller to issue the serving certificate Secret"
            ),
            Err(e) => {
                tracing::warn!(target: LOG, error = %e, "reading the serving certificate Secret")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
