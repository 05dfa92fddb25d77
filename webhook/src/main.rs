//! `cp-webhook`: the admission webhook process.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use cp_api::policy::PrivilegedIdentities;
use cp_webhook::cache::Caches;
use cp_webhook::limits::Limits;
use cp_webhook::metrics::Metrics;
use cp_webhook::server::{AppState, admission_router, metrics_router, serve_tls};
use cp_webhook::tls::{self, CertStore};

/// mimalloc, not glibc's malloc: `cp_webhook::memory` says why.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

/// Admission webhook of the Connectivity Proxy module operator.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address of the TLS admission server.
    #[arg(long, env = "CP_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    addr: SocketAddr,
    /// Address of the plain-HTTP metrics server (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "CP_WEBHOOK_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// After SIGTERM, keep accepting requests this long with readiness false (so the endpoint leaves
    /// the Service first), then finish the open requests and exit.
    #[arg(long, env = "CP_WEBHOOK_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    shutdown_delay: Duration,
    /// Serving certificate chain (PEM). Re-read when it changes.
    #[arg(long, env = "CP_WEBHOOK_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Serving private key (PEM).
    #[arg(long, env = "CP_WEBHOOK_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) of the client certificate the API server presents to webhooks (its
    /// `--admission-control-config-file`). Set: only callers with a certificate of this CA complete
    /// the TLS handshake. Unset (Gardener and most managed clusters configure none): anyone on the
    /// pod network may call, and answers name nothing beyond the request's own content.
    #[arg(long, env = "CP_WEBHOOK_CLIENT_CA_FILE")]
    client_ca_file: Option<PathBuf>,
    /// How often to look for a changed certificate file.
    #[arg(long, env = "CP_WEBHOOK_TLS_RELOAD_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    tls_reload_interval: Duration,
    /// Serve the certificate of this `kubernetes.io/tls` Secret (`namespace/name`), watched; used when no files are given.
    #[arg(
        long,
        env = "CP_WEBHOOK_TLS_SECRET",
        default_value = "kyma-system/connectivity-proxy-webhook-cert"
    )]
    tls_secret: String,
    /// The operator's ServiceAccount (`namespace/name`): the identity that may change `spec.deployment`.
    #[arg(
        long,
        env = "CP_OPERATOR_SERVICE_ACCOUNT",
        default_value = "kyma-system/connectivity-proxy-controller"
    )]
    operator_service_account: String,
    /// The Connectivity Proxy image injected as `spec.deployment.image` (the bundle sets it; lifecycle-manager's
    /// image localization rewrites it for restricted markets).
    #[arg(long, env = "CP_PROXY_IMAGE")]
    proxy_image: Option<String>,
    /// The utility image injected as `spec.deployment.utilityImage`; set and localized like `--proxy-image`.
    #[arg(long, env = "CP_UTILITY_IMAGE")]
    utility_image: Option<String>,
    /// More users that may change `spec.deployment` (comma-separated).
    #[arg(long, env = "CP_PRIVILEGED_USERS", value_delimiter = ',')]
    privileged_users: Vec<String>,
    /// Groups that may change `spec.deployment` (comma-separated).
    #[arg(long, env = "CP_PRIVILEGED_GROUPS", value_delimiter = ',')]
    privileged_groups: Vec<String>,
    /// ConfigMap (`namespace/name`) with more privileged identities (`privilegedUsers`,
    /// `privilegedGroups`), watched: changes apply within seconds. Empty: none.
    #[arg(
        long,
        env = "CP_PRIVILEGED_CONFIG",
        default_value = "kyma-system/connectivity-proxy-operator-config"
    )]
    privileged_config: String,
    /// Open connections to the admission port at most; one beyond it is closed at once.
    #[arg(long, env = "CP_WEBHOOK_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Open connections from one IP address at most (below --max-connections, so a few sources
    /// cannot take every connection and the API server's address still gets in).
    #[arg(
        long,
        env = "CP_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = Limits::default().max_connections_per_source
    )]
    max_connections_per_source: usize,
}

impl Args {
    fn limits(&self) -> anyhow::Result<Limits> {
        anyhow::ensure!(
            self.max_connections_per_source >= 1
                && self.max_connections_per_source <= self.max_connections,
            "--max-connections-per-source ({}) must be between 1 and --max-connections ({})",
            self.max_connections_per_source,
            self.max_connections
        );
        Ok(Limits {
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            ..Limits::default()
        })
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 2s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: unit must be ms, s or m")),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cp_api::cli::exit_code("cp-webhook", run().await)
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .json()
        .init();
    if let Err(e) = cp_webhook::memory::no_huge_pages() {
        tracing::warn!(error = %e, "transparent huge pages stay on (more memory, nothing else)");
    }
    let args = Args::parse();
    // After the flags (`--version` and `--help` print only what they print), before any TLS: this
    // build's provider becomes the process default; the FIPS build exits here unless the AWS-LC module
    // reports FIPS mode (docs/fips.md).
    let fips = cp_certs::crypto::install()?;
    tracing::info!(
        fips,
        crypto = cp_certs::crypto::backend_name(),
        "cryptography provider installed"
    );
    cp_api::defaults::configure(args.proxy_image.as_deref(), args.utility_image.as_deref())?;
    let limits = args.limits()?;
    let metrics = Arc::new(Metrics::new()?);
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client")?;

    let (sa_ns, sa_name) = args
        .operator_service_account
        .split_once('/')
        .context("--operator-service-account must be namespace/name")?;
    let mut users = vec![format!("system:serviceaccount:{sa_ns}:{sa_name}")];
    users.extend(
        args.privileged_users
            .iter()
            .filter(|u| !u.is_empty())
            .cloned(),
    );
    let privileged = PrivilegedIdentities {
        users,
        groups: args
            .privileged_groups
            .iter()
            .filter(|g| !g.is_empty())
            .cloned()
            .collect(),
    };
    tracing::info!(who = %privileged.describe(), "identities that may change spec.deployment");
    let callers = tls::Callers::from_file(args.client_ca_file.as_ref())?;
    tracing::info!(
        callers = callers.describe(),
        "who may call the admission port"
    );

    // Health and readiness answer from the start: alive while the certificate is still being issued,
    // ready only once it is loaded (and not while draining).
    let serving = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = Arc::new(cp_webhook::privileged::LivePolicy::new(privileged));
    let privileged_store = match args.privileged_config.split_once('/') {
        Some((ns, name)) => Some(cp_webhook::privileged::watch(
            client.clone(),
            ns,
            name,
            live.clone(),
            metrics.clone(),
        )),
        None if args.privileged_config.is_empty() => None,
        None => anyhow::bail!("--privileged-config must be namespace/name or empty"),
    };
    let state = AppState {
        policy: live,
        caches: Some(Caches::start(client.clone(), privileged_store)),
        metrics: metrics.clone(),
        serving: serving.clone(),
    };
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| cp_webhook::Error::Bind {
            addr: args.metrics_addr,
            source,
        })?;
    let metrics_router = metrics_router(state.clone());
    let mut metrics_server =
        tokio::spawn(async move { axum::serve(metrics_listener, metrics_router).await });

    let store = tokio::select! {
        s = load_certificate(&args, &client, &metrics) => s?,
        _ = shutdown_signal() => {
            tracing::info!("shutting down before a certificate was loaded");
            return Ok(());
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(store, &callers)?));
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|source| cp_webhook::Error::Bind {
            addr: args.addr,
            source,
        })?;
    serving.store(true, std::sync::atomic::Ordering::SeqCst);
    tracing::info!(addr = %args.addr, metrics = %args.metrics_addr, "serving admission requests");
    let delay = args.shutdown_delay;
    let stop = async move {
        shutdown_signal().await;
        // Not ready any more: the endpoint leaves the Service while open requests still complete.
        serving.store(false, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(
            ?delay,
            "SIGTERM: readiness false; accepting requests a little longer"
        );
        tokio::time::sleep(delay).await;
    };
    tokio::select! {
        _ = serve_tls(listener, acceptor, admission_router(state), limits, metrics, stop, Duration::from_secs(20)) => {
            tracing::info!("drained; exiting");
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
    Ok(match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let (c, k) = tls::read_files(cert, key)?;
            let store = Arc::new(CertStore::new(&c, &k)?);
            metrics.observe_cert(&c);
            tokio::spawn(tls::watch_files(
                store.clone(),
                metrics.clone(),
                cert.clone(),
                key.clone(),
                args.tls_reload_interval,
            ));
            store
        }
        _ => {
            let (ns, name) = args
                .tls_secret
                .split_once('/')
                .context("--tls-secret must be namespace/name")?;
            let secret = wait_for_secret(client, ns, name).await?;
            let store = Arc::new(CertStore::new(&secret.0, &secret.1)?);
            metrics.observe_cert(&secret.0);
            tokio::spawn(tls::watch_secret(
                store.clone(),
                metrics.clone(),
                client.clone(),
                ns.into(),
                name.into(),
            ));
            store
        }
    })
}

async fn wait_for_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get_opt(name).await {
            Ok(Some(s)) => {
                let data = s.data.unwrap_or_default();
                if let (Some(c), Some(k)) = (data.get("tls.crt"), data.get("tls.key")) {
                    return Ok((c.0.clone(), k.0.clone()));
                }
                tracing::info!(
                    ns,
                    name,
                    "serving certificate Secret has no tls.crt/tls.key yet"
                );
            }
            Ok(None) => tracing::info!(
                ns,
                name,
                "waiting for the controller to issue the serving certificate Secret"
            ),
            Err(e) => tracing::warn!(error = %e, "reading the serving certificate Secret"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

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
