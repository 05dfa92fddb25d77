//! The controller process wired up: what `cp-controller` runs once its flags are parsed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::apply::Applier;
use crate::certificates::{TunnelCertSettings, WebhookCertSettings, run_webhook_certs};
use crate::cli::Args;
use crate::context::{Ctx, Settings};
use crate::leader::{self, LeaseConfig};
use crate::metrics::Metrics;
use crate::reconcile::{error_policy, reconcile};
use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use cp_api::{ConnectivityProxy, ServiceMapping, names};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};

#[derive(Clone)]
struct Health {
    metrics: Arc<Metrics>,
    ready: Arc<std::sync::atomic::AtomicBool>,
}

/// `migrate-plan`: reads, plans, prints; never writes. Exits 2 when the takeover is blocked.
pub async fn migrate_plan(namespace: &str, name: &str, output: &str) -> anyhow::Result<()> {
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
            serde_json::from_value(cp_api::defaults::kyma_default_spec())
                .context("the default CR")?,
            "<takeover id>".to_string(),
        ),
    };
    let gather_id = if id.starts_with('<') { "" } else { id.as_str() };
    // Backups count only with the controller's ownership proof: without read access to its key, every
    // backup is shown as not the operator's.
    let proof = match Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        client.clone(),
        names::KYMA_SYSTEM,
    )
    .get_opt(names::OWNERSHIP_KEY_SECRET)
    .await
    {
        Ok(Some(s)) => crate::ownership::from_secret(&s)?,
        // No controller has run yet: nothing carries a proof.
        Ok(None) => crate::ownership::Proof::without_key(),
        Err(e) => {
            if output != "json" {
                println!(
                    "note: the ownership key Secret {}/{} cannot be read ({e}): backups are shown as not the operator's",
                    names::KYMA_SYSTEM,
                    names::OWNERSHIP_KEY_SECRET
                );
            }
            crate::ownership::Proof::without_key()
        }
    };
    let facts = crate::migration::plan::gather(&client, &proof, namespace, gather_id, None)
        .await
        .context("reading the cluster")?;
    let plan = crate::migration::plan::plan(&spec, &facts, &id);
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", crate::migration::plan::render_text(&plan));
    }
    if !plan.blockers.is_empty() {
        std::process::exit(2);
    }
    Ok(())
}

/// The controller process: health and metrics server, leader election, caches, the reconcile loop;
/// returns when a signal stops it (releasing the lease) or fails when the lease is lost.
pub async fn run(args: Args) -> anyhow::Result<()> {
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
    let module_owner = crate::module_owner::module_owner(&client).await;
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
    // Every write goes through the one writer, counted in the writes metric.
    let writer = crate::writer::Writer::new(client.clone(), metrics.writes.clone());
    // The key of the ownership proofs: read (or created, once) before anything is written.
    let proof = Arc::new(
        crate::ownership::load_or_create(&writer, module_owner.as_ref())
            .await
            .context("the ownership key")?,
    );

    let (crds, crd_stream) = reflected::<CustomResourceDefinition>(
        Api::all(client.clone()),
        watcher::Config::default(),
        crate::cache::slim_crd,
    );
    // The mappings are kept as compact records, changed one event at a time (`crate::mappings`).
    let mappings = Arc::new(std::sync::RwLock::new(crate::mappings::MappingState::new()));
    let (mappings_synced, mut mappings_listed) = tokio::sync::watch::channel(false);
    // Only the module's namespace is reconciled and cached in full: a CR elsewhere (any namespace's
    // editor may create one) is seen through its metadata alone (`crate::outside`).
    let controller = Controller::new(
        Api::<ConnectivityProxy>::namespaced(client.clone(), names::KYMA_SYSTEM),
        watcher::Config::default(),
    );
    let proxies = controller.store();
    let (shoot_store, shoot_writer) = reflector::store::<ConfigMap>();
    // Every managed kind is cached and watched (label-selected, where the RBAC lets the controller
    // read: kyma-system, istio-system, cluster scope), each event mapped to its CR through the owner
    // labels: drift anywhere is repaired within seconds, and a steady reconcile reads nothing but its CR.
    let (trigger, triggered) = futures::channel::mpsc::channel::<ObjectRef<ConnectivityProxy>>(256);
    let wake = trigger.clone();
    tokio::spawn(crate::mappings::watch::run(
        Api::<ServiceMapping>::all(client.clone()),
        mappings.clone(),
        mappings_synced,
        trigger.clone(),
        proxies.clone(),
        metrics.service_mapping_changes.clone(),
    ));
    let cache = crate::cache::Cache::start(client.clone(), crds.clone(), proxies.clone(), trigger);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        applier: Applier::new(writer.clone(), proof.clone()),
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
        shard_writes: Default::default(),
        proxies: proxies.clone(),
        shoot_info: shoot_store,
        ca_fetched: Default::default(),
        failures: Default::default(),
        reported_conflicts: Default::default(),
        reported_unproven: Default::default(),
        outside: Default::default(),
        wake,
        synced: health.ready.clone(),
        settings: Settings {
            deployment_defaults: crate::upgrade::release_defaults(overrides.as_ref()),
            ca_endpoint_roots: match &args.connectivity_ca_trust {
                // The bundle points at an optional Secret's file: absent, no extra roots.
                Some(p) if !p.exists() => {
                    tracing::info!(path = %p.display(), "no extra roots for the Connectivity CA endpoint (file absent)");
                    vec![]
                }
                Some(p) => {
                    crate::connectivity_ca::load_roots(p).context("--connectivity-ca-trust")?
                }
                None => vec![],
            },
            ca_egress: std::sync::Arc::new(crate::cli::ca_egress(&args)?),
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
    tokio::spawn(crate::outside::run(ctx.clone()));
    let all = |store: Store<ConnectivityProxy>| {
        move || {
            store
                .state()
                .iter()
                .map(|c| ObjectRef::from_obj(&**c))
                .collect::<Vec<_>>()
        }
    };
    let (all_for_crd, all_for_shoot) = (all(proxies.clone()), all(proxies.clone()));
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
            ctx.applier.clone(),
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
    let (c, s) = (crds.clone(), ctx.shoot_info.clone());
    tokio::spawn(async move {
        let _ = c.wait_until_ready().await;
        let _ = mappings_listed.wait_for(|listed| *listed).await;
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

/// A reflector store of `K` and its stream of touched objects; `slim` drops what the controller never
/// reads from each object before it is stored.
fn reflected<K>(
    api: Api<K>,
    cfg: watcher::Config,
    slim: fn(&mut K),
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
    let stream = reflector::reflector(writer, watcher(api, cfg).modify(slim))
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
