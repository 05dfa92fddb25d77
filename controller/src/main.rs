//! `cp-controller`: the controller process.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use clap::Parser;
use cp_api::{ConnectivityProxy, ServiceMapping, names};
use cp_controller::apply::Applier;
use cp_controller::certificates::{TunnelCertSettings, WebhookCertSettings, run_webhook_certs};
use cp_controller::context::{Ctx, Settings};
use cp_controller::leader::{self, LeaseConfig};
use cp_controller::metrics::Metrics;
use cp_controller::reconcile::{error_policy, reconcile};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};

/// Controller of the Connectivity Proxy module operator.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Resolve this host name the way the Connectivity CA fetch does (in-process resolver reading
    /// /etc/resolv.conf and /etc/hosts), print its addresses and exit: a diagnostic for the image,
    /// which has no shell.
    #[arg(long, value_name = "HOST")]
    check_dns: Option<String>,
    /// Address of the plain-HTTP server for `/metrics`, `/healthz` and `/readyz`.
    #[arg(
        long,
        env = "CP_CONTROLLER_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    metrics_addr: SocketAddr,
    /// Reconcile healthy CRs this often anyway (seconds); a steady state only reads.
    #[arg(long, env = "CP_RESYNC_SECONDS", default_value_t = 600)]
    resync_seconds: u64,
    /// Elect a leader on a Lease so that several replicas can run.
    #[arg(long, env = "CP_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "CP_LEASE_NAMESPACE", default_value = "kyma-system")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "CP_LEASE_NAME",
        default_value = "connectivity-proxy-operator"
    )]
    lease_name: String,
    /// Lease duration in seconds.
    #[arg(long, env = "CP_LEASE_SECONDS", default_value_t = 15)]
    lease_seconds: u64,
    /// This replica's identity (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Issue and rotate the webhook's serving certificate and keep the CA bundle in both webhook configurations.
    #[arg(long, env = "CP_MANAGE_WEBHOOK_CERTS", default_value_t = true, action = clap::ArgAction::Set)]
    manage_webhook_certs: bool,
    /// Namespace of the webhook Service and its certificate Secrets.
    #[arg(long, env = "CP_WEBHOOK_NAMESPACE", default_value = "kyma-system")]
    webhook_namespace: String,
    /// Name of the webhook Service (the certificate's DNS names derive from it).
    #[arg(
        long,
        env = "CP_WEBHOOK_SERVICE",
        default_value = "connectivity-proxy-operator-webhook"
    )]
    webhook_service: String,
    /// Extra IP addresses in the webhook certificate (comma-separated; 127.0.0.1 for a local webhook).
    #[arg(long, env = "CP_WEBHOOK_IPS", value_delimiter = ',')]
    webhook_ips: Vec<std::net::IpAddr>,
    /// Lifetime of the webhook CA (seconds).
    #[arg(long, env = "CP_WEBHOOK_CA_LIFETIME_SECONDS", default_value_t = 365 * 86400)]
    webhook_ca_lifetime_seconds: i64,
    /// Lifetime of the webhook serving certificate (seconds).
    #[arg(long, env = "CP_WEBHOOK_CERT_LIFETIME_SECONDS", default_value_t = 90 * 86400)]
    webhook_cert_lifetime_seconds: i64,
    /// Time a new CA bundle or certificate needs to reach the API server and every webhook replica
    /// (seconds): both learn it by watch; a broken watch re-lists within the 30 s backoff cap.
    #[arg(long, env = "CP_CERT_PROPAGATION_SECONDS", default_value_t = 60)]
    cert_propagation_seconds: i64,
    /// Extra trusted roots (PEM file) for the Connectivity service's CA endpoint, besides the system's
    /// (a private landscape; the tests' own endpoint). The endpoint is HTTPS-only either way. A path that
    /// does not exist means none (the bundle mounts an optional Secret); read at start.
    #[arg(long, env = "CP_CONNECTIVITY_CA_TRUST")]
    connectivity_ca_trust: Option<std::path::PathBuf>,
    /// Hosts the Connectivity service CA may be fetched from, comma-separated: `.domain.tld` for its
    /// subdomains (at least two labels) or an exact host. The service key's URL must name one of them.
    #[arg(
        long,
        env = "CP_CONNECTIVITY_CA_HOSTS",
        value_delimiter = ',',
        default_value = cp_controller::egress::DEFAULT_HOSTS
    )]
    connectivity_ca_hosts: Vec<String>,
    /// A file with more such hosts (comma- or line-separated); absent: none (the bundle points it at the
    /// optional trust Secret's key `allowed-hosts`). Read at start.
    #[arg(long, env = "CP_CONNECTIVITY_CA_HOSTS_FILE")]
    connectivity_ca_hosts_file: Option<std::path::PathBuf>,
    /// Networks (CIDR) the CA fetch may connect to although they are private, loopback, link-local or
    /// otherwise special-purpose (a private landscape's endpoint), comma-separated. Default: none.
    #[arg(
        long,
        env = "CP_CONNECTIVITY_CA_ALLOWED_NETWORKS",
        value_delimiter = ','
    )]
    connectivity_ca_allowed_networks: Vec<String>,
    /// A file with more such networks; absent: none (the trust Secret's key `allowed-networks`).
    #[arg(long, env = "CP_CONNECTIVITY_CA_ALLOWED_NETWORKS_FILE")]
    connectivity_ca_allowed_networks_file: Option<std::path::PathBuf>,
    /// The cluster's pod and Service networks (CIDR), refused to the CA fetch even where they are public
    /// addresses, comma-separated. Private, loopback, link-local, CGNAT and unique-local ranges are
    /// refused anyway.
    #[arg(long, env = "CP_CLUSTER_NETWORKS", value_delimiter = ',')]
    cluster_networks: Vec<String>,
    /// Lifetime of the operator's own business-tunnel CA (seconds).
    #[arg(long, env = "CP_TUNNEL_CA_LIFETIME_SECONDS", default_value_t = 5 * 365 * 86400)]
    tunnel_ca_lifetime_seconds: i64,
    /// Lifetime of the built-in business-tunnel certificate (seconds).
    #[arg(long, env = "CP_TUNNEL_CERT_LIFETIME_SECONDS", default_value_t = 90 * 86400)]
    tunnel_cert_lifetime_seconds: i64,
    /// Key algorithm of the certificates the operator issues: `ecdsa-p256` (default) or `rsa-2048`.
    #[arg(long, env = "CP_KEY_ALGORITHM", default_value = "ecdsa-p256")]
    key_algorithm: cp_certs::KeyAlgorithm,
    /// JSON merged over this release's spec.deployment defaults (a hotfix image, or an upgrade test).
    #[arg(long, env = "CP_DEPLOYMENT_DEFAULTS_OVERRIDE")]
    deployment_defaults_override: Option<String>,
    /// cert-manager issuer for the tunnel certificate, `Kind/name` (used when cert-manager is installed and Gardener is not).
    #[arg(long, env = "CP_CERT_MANAGER_ISSUER")]
    cert_manager_issuer: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Preview the takeover of a legacy reconciler installation in the cluster of the current
    /// kubeconfig, read-only: the spec.config it would import, the backups it would write, every legacy
    /// object it would delete, adopt or keep, the ServiceMappings it would take over, and every blocker
    /// with its fix. Exits 0 when the takeover can proceed (or there is nothing to take over), 2 when
    /// it is blocked, 1 when the cluster could not be read.
    MigratePlan {
        /// Namespace of the module's CR (and of the legacy installation).
        #[arg(long, default_value = "kyma-system")]
        namespace: String,
        /// Name of the module's CR; when it does not exist yet, the module's default CR is assumed.
        #[arg(long, default_value = "connectivity-proxy")]
        name: String,
        /// `text` for people, `json` for scripts.
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        output: String,
    },
}

/// `migrate-plan`: reads, plans, prints; never writes.
/// Entries of an optional list file (comma- or line-separated; `#` starts a comment); absent: none.
fn list_file(path: Option<&std::path::Path>) -> anyhow::Result<Vec<String>> {
    let Some(path) = path.filter(|p| p.exists()) else {
        return Ok(vec![]);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(|l| l.split(','))
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect())
}

/// Where the Connectivity CA may be fetched from: the flags plus the optional files.
fn ca_egress(args: &Args) -> anyhow::Result<cp_controller::egress::Egress> {
    let mut hosts = args.connectivity_ca_hosts.clone();
    hosts.extend(list_file(args.connectivity_ca_hosts_file.as_deref())?);
    let mut allowed = args.connectivity_ca_allowed_networks.clone();
    allowed.extend(list_file(
        args.connectivity_ca_allowed_networks_file.as_deref(),
    )?);
    let egress = cp_controller::egress::Egress::new(&hosts, &allowed, &args.cluster_networks)
        .map_err(anyhow::Error::msg)
        .context(
            "--connectivity-ca-hosts, --connectivity-ca-allowed-networks, --cluster-networks",
        )?;
    tracing::info!(?hosts, allowed_networks = ?allowed, cluster_networks = ?args.cluster_networks, "Connectivity CA hosts");
    Ok(egress)
}

async fn migrate_plan(namespace: &str, name: &str, output: &str) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("building the Kubernetes client from the current kubeconfig")?;
    let cr = Api::<ConnectivityProxy>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading ConnectivityProxy {namespace}/{name}"))?;
    let (spec, id) = match cr {
        Some(cr) => {
            let id = cr
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(cp_api::keys::TAKEOVER_ID_ANNOTATION))
                .cloned()
                .unwrap_or_else(|| "<takeover id>".into());
            (cr.spec, id)
        }
        None => (
            serde_json::from_value(serde_json::json!({"config": {
                "servers": {"businessDataTunnel": {"externalHost": names::AUTO_PROVISION}},
                "subaccountId": names::AUTO_PROVISION, "subaccountSubdomain": names::AUTO_PROVISION},
                "ingress": {"tls": {"secretName": names::AUTO_PROVISION}},
                "secretConfig": {"integration": {"connectivityService": {"secretName": names::AUTO_PROVISION}}}}))
            .context("the default CR")?,
            "<takeover id>".to_string(),
        ),
    };
    let gather_id = if id.starts_with('<') { "" } else { id.as_str() };
    let facts = cp_controller::migration::plan::gather(&client, namespace, gather_id)
        .await
        .context("reading the cluster")?;
    let plan = cp_controller::migration::plan::plan(&spec, &facts, &id);
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", cp_controller::migration::plan::render_text(&plan));
    }
    if !plan.blockers.is_empty() {
        std::process::exit(2);
    }
    Ok(())
}

#[derive(Clone)]
struct Health {
    metrics: Arc<Metrics>,
    ready: Arc<std::sync::atomic::AtomicBool>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cp_api::cli::exit_code("cp-controller", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::MigratePlan {
        namespace,
        name,
        output,
    }) = &args.command
    {
        return migrate_plan(namespace, name, output).await;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .json()
        .init();
    if let Some(host) = &args.check_dns {
        let resolver =
            cp_controller::connectivity_ca::Resolver::from_system().map_err(anyhow::Error::msg)?;
        let addrs = resolver.lookup(host).await.map_err(anyhow::Error::msg)?;
        for a in addrs {
            println!("{a}");
        }
        return Ok(());
    }
    let overrides: Option<serde_json::Value> = match &args.deployment_defaults_override {
        Some(s) => {
            Some(serde_json::from_str(s).context("--deployment-defaults-override is not JSON")?)
        }
        None => None,
    };
    let client = Client::try_default()
        .await
        .context("building the Kubernetes client")?;
    let metrics = Arc::new(Metrics::new()?);
    let health = Health {
        metrics: metrics.clone(),
        ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    tokio::spawn(serve_health(args.metrics_addr, health.clone()));

    let identity = args.identity.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "cp-controller".into()),
            std::process::id()
        )
    });
    let module_owner = cp_controller::module_owner::module_owner(&client).await;
    let lease = LeaseConfig {
        namespace: args.lease_namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.clone(),
        duration: Duration::from_secs(args.lease_seconds.max(3)),
        owner: module_owner.clone(),
    };
    if args.leader_elect {
        tracing::info!(%identity, "waiting for the leader lease");
        leader::acquire(&client, &lease).await;
        metrics.leader.set(1);
    }

    let (crds, crd_stream) =
        reflected::<CustomResourceDefinition>(Api::all(client.clone()), watcher::Config::default());
    let (mappings, mapping_stream) =
        reflected::<ServiceMapping>(Api::all(client.clone()), watcher::Config::default());
    let controller = Controller::new(
        Api::<ConnectivityProxy>::all(client.clone()),
        watcher::Config::default(),
    );
    let proxies = controller.store();
    let (shoot_store, shoot_writer) = reflector::store::<ConfigMap>();
    // Every managed kind is cached and watched (label-selected, where the RBAC lets the controller
    // read: kyma-system, istio-system, cluster scope), each event mapped to its CR through the owner
    // labels: drift anywhere is repaired within seconds, and a steady reconcile reads nothing but its CR.
    let (trigger, triggered) = futures::channel::mpsc::channel::<ObjectRef<ConnectivityProxy>>(256);
    let cache = cp_controller::cache::Cache::start(client.clone(), crds.clone(), trigger);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        applier: Applier::new(client.clone()),
        cache,
        metrics: metrics.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "connectivity-proxy-operator".into(),
                instance: Some(identity),
            },
        ),
        crds: crds.clone(),
        mappings: mappings.clone(),
        proxies: proxies.clone(),
        shoot_info: shoot_store,
        ca_fetched: Default::default(),
        failures: Default::default(),
        reported_conflicts: Default::default(),
        synced: health.ready.clone(),
        settings: Settings {
            deployment_defaults: cp_controller::upgrade::release_defaults(overrides.as_ref()),
            ca_endpoint_roots: match &args.connectivity_ca_trust {
                // The bundle points at an optional Secret's file: absent, no extra roots.
                Some(p) if !p.exists() => {
                    tracing::info!(path = %p.display(), "no extra roots for the Connectivity CA endpoint (file absent)");
                    vec![]
                }
                Some(p) => cp_controller::connectivity_ca::load_roots(p)
                    .map_err(anyhow::Error::msg)
                    .context("--connectivity-ca-trust")?,
                None => vec![],
            },
            ca_egress: std::sync::Arc::new(ca_egress(&args)?),
            resync: Duration::from_secs(args.resync_seconds),
            tunnel: TunnelCertSettings {
                ca_lifetime: time::Duration::seconds(args.tunnel_ca_lifetime_seconds),
                cert_lifetime: time::Duration::seconds(args.tunnel_cert_lifetime_seconds),
                cert_manager_issuer: args
                    .cert_manager_issuer
                    .as_deref()
                    .and_then(|s| s.split_once('/'))
                    .map(|(k, n)| (k.to_string(), n.to_string())),
                algorithm: args.key_algorithm,
            },
        },
    });
    let all = |store: Store<ConnectivityProxy>| {
        move || {
            store
                .state()
                .iter()
                .map(|c| ObjectRef::from_obj(&**c))
                .collect::<Vec<_>>()
        }
    };
    let (all_for_crd, all_for_mapping, all_for_shoot) = (
        all(proxies.clone()),
        all(proxies.clone()),
        all(proxies.clone()),
    );
    let relevant_crd = |name: &str| {
        names::ISTIO_CRDS.contains(&name)
            || names::BTP_CRDS.contains(&name)
            || name == names::GARDENER_CERT_CRD
            || name == names::CERT_MANAGER_CRD
    };
    let shoot_info = reflector::reflector(
        shoot_writer,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), names::SHOOT_INFO_NAMESPACE),
            watcher::Config::default().fields(&format!("metadata.name={}", names::SHOOT_INFO)),
        ),
    )
    .default_backoff()
    .touched_objects();
    if args.manage_webhook_certs {
        tokio::spawn(run_webhook_certs(
            client.clone(),
            WebhookCertSettings {
                namespace: args.webhook_namespace.clone(),
                service: args.webhook_service.clone(),
                ips: args.webhook_ips.clone(),
                ca_lifetime: time::Duration::seconds(args.webhook_ca_lifetime_seconds),
                cert_lifetime: time::Duration::seconds(args.webhook_cert_lifetime_seconds),
                propagation: time::Duration::seconds(args.cert_propagation_seconds),
                algorithm: args.key_algorithm,
                owner: module_owner.clone(),
            },
            metrics.clone(),
        ));
    }

    let ready_flag = health.ready.clone();
    // The stores decisions depend on: which CRDs exist (dependencies), which ServiceMappings exist
    // (aggregation, blocked deletion) and shoot-info (the cluster domain). The CR store feeds the
    // reconciles themselves; the managed caches confirm absence with the API until they have listed.
    let (c, m, s) = (crds.clone(), mappings.clone(), ctx.shoot_info.clone());
    tokio::spawn(async move {
        let _ = c.wait_until_ready().await;
        let _ = m.wait_until_ready().await;
        let _ = s.wait_until_ready().await;
        ready_flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });

    let controller = controller
        .watches_stream(crd_stream, move |crd| {
            if relevant_crd(crd.metadata.name.as_deref().unwrap_or_default()) {
                all_for_crd()
            } else {
                vec![]
            }
        })
        .watches_stream(mapping_stream, move |_| all_for_mapping())
        .watches_stream(shoot_info, move |_| all_for_shoot());
    let run = controller
        .reconcile_on(triggered)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        });
    if args.leader_elect {
        tokio::select! {
            _ = run => {
                // Shut down by a signal: hand the lease over now rather than after it lapses.
                metrics.leader.set(0);
                leader::release(client.clone(), &lease).await;
            }
            _ = leader::keep(client.clone(), lease.clone()) => {
                metrics.leader.set(0);
                anyhow::bail!("lost the leader lease; exiting so that the new leader reconciles alone");
            }
        }
    } else {
        run.await;
    }
    Ok(())
}

fn reflected<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = reflector::reflector(
        writer,
        watcher(api, cfg).modify(|o| cp_api::slim_for_cache(o.meta_mut())),
    )
    .default_backoff()
    .touched_objects();
    (store, stream)
}

async fn serve_health(addr: SocketAddr, health: Health) {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(h): State<Health>| async move { h.metrics.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                if h.ready.load(std::sync::atomic::Ordering::SeqCst) {
                    (axum::http::StatusCode::OK, "ok")
                } else {
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "caches not synced",
                    )
                }
            }),
        )
        .with_state(health);
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => {
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        }
        Err(e) => tracing::error!(%addr, error = %e, "cannot bind the metrics server"),
    }
}
