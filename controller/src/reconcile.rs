//! The reconcile loop: one function per step, each returning either progress or the status that
//! explains why it stopped.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use cp_api::{ConnectivityProxy, State, names};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::Error;
use crate::context::Ctx;
use crate::desired::{self, ClusterFacts, Kind};
use crate::status::{self, Computed, Cond, types};

/// Reconciles one CR, recording metrics.
pub async fn reconcile(cr: Arc<ConnectivityProxy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = Instant::now();
    // Right after a start the caches may be empty: an empty mapping list would publish an empty
    // mappings ConfigMap or let a blocked deletion proceed. Nothing is decided before they synced.
    if !ctx.synced.load(std::sync::atomic::Ordering::SeqCst) {
        tracing::info!("caches not synced yet; reconciling once they are");
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    let cr = match current(&cr, &ctx).await {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(Action::await_change()),
        Err(e) => return Err(e),
    };
    let result = if cr.meta().deletion_timestamp.is_some() {
        crate::deletion::reconcile_deletion(&cr, &ctx).await
    } else {
        install(&cr, &ctx).await
    };
    let label = match &result {
        Ok(_) => "success",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[label])
        .observe(start.elapsed().as_secs_f64());
    ctx.metrics
        .service_mappings
        .set(ctx.mappings.state().len() as i64);
    tracing::debug!(result = ?result, elapsed = ?start.elapsed(), "reconcile finished");
    if result.is_ok()
        && let Ok(mut f) = ctx.failures.lock()
    {
        f.remove(&failure_key(&cr));
    }
    result
}

fn failure_key(cr: &ConnectivityProxy) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

/// The delay after the `n`-th consecutive failure: 2 s doubling to at most 5 minutes.
pub fn backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_secs(2u64.saturating_mul(1u64 << n.min(8)).min(300))
}

/// The CR as stored now (one quorum read), not as the watch last delivered it: a watch can miss an
/// event when etcd restarts right after a write (seen with kube-apiserver 1.37), and a resync would
/// otherwise reconcile the stale copy forever. `None` when the CR is gone.
async fn current(
    cached: &Arc<ConnectivityProxy>,
    ctx: &Ctx,
) -> Result<Option<Arc<ConnectivityProxy>>, Error> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(ctx.client.clone(), &cached.namespace().unwrap_or_default());
    match api.get_opt(&cached.name_any()).await {
        Ok(Some(fresh)) => {
            if fresh.metadata.generation > cached.metadata.generation {
                tracing::info!(
                    namespace = cached.namespace().unwrap_or_default(),
                    name = cached.name_any(),
                    cached = ?cached.metadata.generation,
                    current = ?fresh.metadata.generation,
                    "the watch was behind; reconciling the current generation"
                );
            }
            Ok(Some(Arc::new(fresh)))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(Error::kube("reading the ConnectivityProxy", e)),
    }
}

/// Requeue with exponential backoff (capped) on consecutive errors; a success resets it.
pub fn error_policy(cr: Arc<ConnectivityProxy>, err: &Error, ctx: Arc<Ctx>) -> Action {
    let n = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(failure_key(&cr)).or_insert(0);
            *n = n.saturating_add(1);
            *n - 1
        })
        .unwrap_or(0);
    let delay = backoff(n);
    tracing::warn!(namespace = cr.namespace().unwrap_or_default(), name = cr.name_any(), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The CR that is reconciled: the oldest (then by name) in `kyma-system`, the module's namespace. A CR
/// elsewhere is never installed: the controller may write only in kyma-system and the Istio namespace.
pub fn primary(ctx: &Ctx) -> Option<Arc<ConnectivityProxy>> {
    ctx.proxies
        .state()
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(names::KYMA_SYSTEM))
        .min_by(|a, b| {
            let key = |c: &ConnectivityProxy| {
                (
                    c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    c.name_any(),
                )
            };
            key(a).cmp(&key(b))
        })
}

/// A CR this controller does not install: Warning with `reason`, nothing applied.
async fn not_installed(
    ctx: &Ctx,
    cr: &ConnectivityProxy,
    reason: &str,
    msg: String,
    then: Action,
) -> Result<Action, Error> {
    let computed = Computed::blocked(
        State::Warning,
        vec![],
        Cond::failed(types::CONFIGURATION, reason, msg),
    );
    status::write(ctx, cr, &computed).await?;
    Ok(then)
}

fn same(a: &ConnectivityProxy, b: &ConnectivityProxy) -> bool {
    a.uid().is_some() && a.uid() == b.uid()
        || (a.namespace() == b.namespace() && a.name_any() == b.name_any())
}

async fn install(cr: &ConnectivityProxy, ctx: &Ctx) -> Result<Action, Error> {
    let resync = Action::requeue(ctx.settings.resync);
    // After writing the CR itself, come back soon even if the watch never delivers that write (it can
    // be lost when etcd restarts right after it).
    let next_step = Action::requeue(std::time::Duration::from_secs(1));
    if let Some(p) = primary(ctx).filter(|p| !same(p, cr)) {
        let msg = format!(
            "only one ConnectivityProxy is reconciled per cluster and {}/{} is the active one; delete this one",
            p.namespace().unwrap_or_default(),
            p.name_any()
        );
        return not_installed(ctx, cr, "DuplicateConnectivityProxy", msg, resync).await;
    }
    if cr.namespace().as_deref() != Some(names::KYMA_SYSTEM) {
        let msg = format!(
            "the Connectivity Proxy is installed only from a ConnectivityProxy in {ks} (the module's namespace; the operator writes nowhere else but the Istio namespace): create it in {ks} and delete this one",
            ks = names::KYMA_SYSTEM
        );
        return not_installed(ctx, cr, "OutsideModuleNamespace", msg, resync).await;
    }
    ensure_finalizer(cr, ctx).await?;
    if crate::upgrade::ensure_release_defaults(&ctx.client, cr, &ctx.settings.deployment_defaults)
        .await?
    {
        return Ok(next_step);
    }
    match crate::migration::migrate(&ctx.client, cr).await? {
        crate::migration::Outcome::NotNeeded => {}
        crate::migration::Outcome::Progressed(step) => {
            let computed = Computed::blocked(
                State::Processing,
                vec![],
                Cond::failed(
                    types::CONFIGURATION,
                    step,
                    "taking over the legacy reconciler installation",
                ),
            );
            status::write(ctx, cr, &computed).await?;
            return Ok(next_step);
        }
        crate::migration::Outcome::Blocked(blockers) => {
            let list: Vec<String> = blockers.iter().map(ToString::to_string).collect();
            let msg = format!(
                "the takeover of the legacy installation is blocked; the legacy installation keeps running untouched until this is fixed: {} (preview with `cp-controller migrate-plan`)",
                list.join("; ")
            );
            let computed = Computed::blocked(
                State::Warning,
                vec![],
                Cond::failed(types::CONFIGURATION, "LegacyMigrationBlocked", msg),
            );
            status::write(ctx, cr, &computed).await?;
            // What blocks is outside the CR (legacy ConfigMaps, mappings): look again soon.
            return Ok(Action::requeue(std::time::Duration::from_secs(10)));
        }
    }

    // Dependencies.
    let mut missing = Vec::new();
    if cr.spec.ingress_class() == "istio" {
        missing.extend(ctx.missing_crds(&names::ISTIO_CRDS));
    }
    let (key_name, _) = cr.spec.connectivity_secret();
    let needs_btp = names::is_auto_provision(Some(&key_name));
    let btp_missing = if needs_btp {
        ctx.missing_crds(&names::BTP_CRDS)
    } else {
        vec![]
    };
    if !missing.is_empty() || !btp_missing.is_empty() {
        let (reason, what) = if !missing.is_empty() {
            (
                "IstioCRDsMissing",
                format!(
                    "Istio is not installed: CRDs {} are missing",
                    missing.join(", ")
                ),
            )
        } else {
            (
                "BTPOperatorCRDsMissing",
                format!(
                    "the SAP BTP service operator is not installed (CRDs {} are missing) but \
                     spec.secretConfig.integration.connectivityService.secretName is auto-provision",
                    btp_missing.join(", ")
                ),
            )
        };
        let msg = format!(
            "{what}; install it and the Connectivity Proxy is installed within seconds, nothing was applied"
        );
        let computed = Computed::blocked(
            State::Warning,
            vec![],
            Cond::failed(types::DEPENDENCIES, reason, msg),
        );
        status::write(ctx, cr, &computed).await?;
        return Ok(resync);
    }
    let deps = Cond::ok(
        types::DEPENDENCIES,
        "DependenciesAvailable",
        "required CRDs are installed",
    );

    // Configuration.
    let key = crate::btp::service_key(&ctx.client, cr).await?;
    let mut facts = cluster_facts(ctx).await?;
    if let Some(k) = &key.key {
        facts.binding_subaccount_id = k.subaccount_id.clone();
        facts.binding_subaccount_subdomain = k.subaccount_subdomain.clone();
    }
    let mut resolved = match desired::resolve(cr, &facts) {
        Ok(r) => r,
        Err(problem) => {
            let computed = Computed::blocked(
                problem.state(),
                vec![deps],
                Cond::failed(types::CONFIGURATION, problem.reason(), problem.message()),
            );
            status::write(ctx, cr, &computed).await?;
            return Ok(resync);
        }
    };
    let config = Cond::ok(
        types::CONFIGURATION,
        "ConfigurationValid",
        format!("tunnel host {}", resolved.external_host),
    );

    // The tunnel's TLS Secret, read once: its data goes into the pod template's hash, and the
    // certificate step decides renewal (built-in CA) or records the expiry (Gardener, cert-manager) from it.
    let tls_live = {
        let ns = &resolved.istio_namespace;
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), ns)
            .get_opt(&resolved.tls_secret)
            .await
            .map_err(|e| Error::kube(format!("reading Secret {ns}/{}", resolved.tls_secret), e))?
    };
    resolved.secrets_hash = secrets_hash(tls_live.as_ref(), key.key.as_ref());

    // Apply.
    let mappings = ctx.mappings.state();
    let mut objects = desired::desired(cr, &resolved, &mappings);
    let provider = crate::certificates::provider(
        ctx.has_crd(names::GARDENER_CERT_CRD),
        ctx.has_crd(names::CERT_MANAGER_CRD),
        &ctx.settings.tunnel,
    );
    let (cert_objects, renew_at) = match crate::certificates::tunnel_objects(
        &ctx.client,
        cr,
        &resolved,
        provider,
        &ctx.settings.tunnel,
        &ctx.metrics,
        tls_live.as_ref(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            let computed = Computed::blocked(
                State::Error,
                vec![deps, config],
                Cond::failed(types::INSTALLED, "CertificateFailed", e.to_string()),
            );
            status::write(ctx, cr, &computed).await?;
            return Err(e);
        }
    };
    objects.extend(cert_objects);
    objects.extend(key.objects.clone());
    // The aggregated mappings must fit into one ConfigMap: keep the last good one rather than fail.
    let mappings_json_len = objects
        .iter()
        .find(|d| d.kind == Kind::ConfigMap && d.name == names::CONFIGMAP_SERVICE_MAPPINGS)
        .map(|d| d.body.to_string().len())
        .unwrap_or(0);
    let mappings_too_large = mappings_json_len > crate::mappings::MAX_CONFIGMAP_BYTES;
    // The next renewal is scheduled, not polled: requeue exactly when it is due.
    let requeue_after = match renew_at {
        Some(at) => {
            let until = (at - time::OffsetDateTime::now_utc())
                .as_seconds_f64()
                .max(0.05);
            ctx.settings
                .resync
                .min(std::time::Duration::from_secs_f64(until))
        }
        None => ctx.settings.resync,
    };
    let resync = Action::requeue(requeue_after);
    let (ca_objects, keep_as_is, ca_problem) =
        connectivity_ca_objects(ctx, cr, &resolved, key.key.as_ref()).await?;
    objects.extend(ca_objects);
    if let Err(e) = apply_all(ctx, cr, &objects, mappings_too_large, &keep_as_is).await {
        if let Error::NotOurs(_) = &e {
            // Needs the user (another name, or their object removed): Warning; that object untouched.
            let computed = Computed::blocked(
                State::Warning,
                vec![deps, config],
                Cond::failed(types::INSTALLED, "ObjectNotOwned", e.to_string()),
            );
            status::write(ctx, cr, &computed).await?;
            return Ok(Action::requeue(std::time::Duration::from_secs(30)));
        }
        let computed = Computed::blocked(
            State::Error,
            vec![deps, config],
            Cond::failed(types::INSTALLED, "ApplyFailed", e.to_string()),
        );
        status::write(ctx, cr, &computed).await?;
        return Err(e);
    }
    let installed = Cond::ok(
        types::INSTALLED,
        "ResourcesApplied",
        format!("{} objects applied", objects.len()),
    );
    let port = cp_api::validation::external_port(&cr.spec);
    if let Err(e) =
        crate::mappings::reconcile_mappings(&ctx.client, &mappings, &resolved, port).await
    {
        tracing::warn!(error = %e, "updating ServiceMappings");
    }
    if mappings_too_large {
        let msg = format!(
            "the {} ServiceMappings need {} KiB, more than fits into ConfigMap {} (limit {} KiB); \
             the last configuration that fitted stays in use: remove ServiceMappings you no longer need",
            mappings.len(),
            mappings_json_len / 1024,
            names::CONFIGMAP_SERVICE_MAPPINGS,
            crate::mappings::MAX_CONFIGMAP_BYTES / 1024
        );
        let computed = Computed::blocked(
            State::Warning,
            vec![deps, config],
            Cond::failed(types::INSTALLED, "ServiceMappingsTooLarge", msg),
        );
        status::write(ctx, cr, &computed).await?;
        return Ok(resync);
    }
    if let Some(problem) = ca_problem {
        let computed = Computed::blocked(
            State::Warning,
            vec![deps, config],
            Cond::failed(types::INSTALLED, "ConnectivityCAUnavailable", problem),
        );
        status::write(ctx, cr, &computed).await?;
        return Ok(Action::requeue(std::time::Duration::from_secs(30)));
    }
    if let Some(waiting) = &key.waiting {
        let computed = Computed::blocked(
            State::Processing,
            vec![deps, config],
            Cond::failed(types::INSTALLED, "ServiceKeyPending", waiting.clone()),
        );
        status::write(ctx, cr, &computed).await?;
        // The SAP BTP service operator updates the binding: look again shortly.
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    }

    // Readiness.
    let ns = cr.namespace().unwrap_or_default();
    let sts = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(names::STATEFULSET)
        .await
        .map_err(|e| Error::kube("reading the StatefulSet", e))?;
    let computed = match sts.as_ref().map(statefulset_ready) {
        Some(Ok(msg)) => Computed {
            state: State::Ready,
            description: format!(
                "Connectivity Proxy is ready; tunnel host {}",
                resolved.external_host
            ),
            reason: "StatefulSetReady".into(),
            conditions: vec![
                deps,
                config,
                installed,
                Cond::ok(types::READY, "StatefulSetReady", msg),
            ],
        },
        other => {
            let msg = match other {
                Some(Err(m)) => m,
                _ => "StatefulSet connectivity-proxy does not exist yet".into(),
            };
            match proxy_pod_problem(ctx, cr, &ns).await {
                // A cause that will not resolve by itself: a Warning that names it.
                Some(problem) => Computed::blocked(
                    State::Warning,
                    vec![deps, config, installed],
                    Cond::failed(types::READY, "ProxyPodFailing", format!("{msg}; {problem}")),
                ),
                None => Computed::blocked(
                    State::Processing,
                    vec![deps, config, installed],
                    Cond::failed(types::READY, "StatefulSetNotReady", msg),
                ),
            }
        }
    };
    status::write(ctx, cr, &computed).await?;
    if computed.state != State::Ready {
        // The proxy's pods change without their StatefulSet changing (an init container failing, an image
        // pull backing off): look again soon while the proxy is not ready, not at the resync.
        return Ok(Action::requeue(requeue_after.min(NOT_READY_RECHECK)));
    }
    Ok(resync)
}

/// How soon a CR whose proxy is not ready yet is looked at again.
const NOT_READY_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// Ready when the controller observed the current spec and every replica is updated and ready.
pub fn statefulset_ready(sts: &StatefulSet) -> Result<String, String> {
    let want = sts.spec.replicas.unwrap_or(1);
    let status = sts.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0);
    let generation = sts.metadata.generation.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    if observed < generation {
        return Err(format!(
            "StatefulSet generation {generation} not yet observed (observed {observed})"
        ));
    }
    if ready < want || updated < want {
        return Err(format!(
            "{ready}/{want} replicas ready, {updated}/{want} updated"
        ));
    }
    Ok(format!("{ready}/{want} replicas ready"))
}

/// Why the proxy's pods do not become ready, when the reason will not resolve by itself. A failed read
/// (e.g. RBAC) is logged and leaves the plain "not ready" status.
async fn proxy_pod_problem(ctx: &Ctx, cr: &ConnectivityProxy, ns: &str) -> Option<String> {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ctx.client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&format!(
            "{}={}",
            names::APP_LABEL,
            desired::APP
        )))
        .await
        .map_err(|e| tracing::warn!(error = %e, "reading the proxy's pods"))
        .ok()?;
    let fd_limit = desired::effective_deployment(cr)
        .resources
        .and_then(|r| r.max_file_descriptor_count)
        .unwrap_or(64000);
    crate::pods::problem(&pods.items, fd_limit)
}

async fn cluster_facts(ctx: &Ctx) -> Result<ClusterFacts, Error> {
    // The watch keeps shoot-info in a store; read the API only while the store has not seen it
    // (before its first list, or on clusters without shoot-info).
    let cached = ctx.shoot_info.get(
        &kube::runtime::reflector::ObjectRef::new(names::SHOOT_INFO)
            .within(names::SHOOT_INFO_NAMESPACE),
    );
    let shoot_info = match cached {
        Some(cm) => Some((*cm).clone()),
        None => Api::<ConfigMap>::namespaced(ctx.client.clone(), names::SHOOT_INFO_NAMESPACE)
            .get_opt(names::SHOOT_INFO)
            .await
            .map_err(|e| Error::kube("reading ConfigMap kube-system/shoot-info", e))?,
    };
    Ok(ClusterFacts {
        cluster_domain: shoot_info
            .and_then(|c| c.data)
            .and_then(|d| d.get("domain").cloned()),
        service_mappings: ctx.mappings.state().iter().map(|m| m.name_any()).collect(),
        binding_subaccount_id: None,
        binding_subaccount_subdomain: None,
    })
}

async fn apply_all(
    ctx: &Ctx,
    cr: &ConnectivityProxy,
    objects: &[desired::Desired],
    skip_mappings: bool,
    keep_as_is: &[(Kind, Option<String>, String)],
) -> Result<(), Error> {
    let mut keep: BTreeSet<(Kind, Option<String>, String)> = keep_as_is.iter().cloned().collect();
    for d in objects {
        let skip = skip_mappings
            && d.kind == Kind::ConfigMap
            && d.name == names::CONFIGMAP_SERVICE_MAPPINGS;
        if !skip && ctx.applier.ensure(d).await? {
            ctx.metrics
                .applies
                .with_label_values(&[&d.kind.api_resource().kind])
                .inc();
            tracing::info!(kind = %d.kind.api_resource().kind, name = %d.name, namespace = d.namespace.as_deref().unwrap_or(""), "applied");
        }
        keep.insert((d.kind, d.namespace.clone(), d.name.clone()));
    }
    let kinds = ctx.available_kinds();
    let ns = cr.namespace().unwrap_or_default();
    let pruned = ctx
        .applier
        .prune(
            &kinds,
            (&ns, &cr.name_any()),
            &desired::object_namespaces(cr),
            &keep,
        )
        .await?;
    if pruned > 0 {
        tracing::info!(pruned, "removed managed objects that are no longer desired");
    }
    Ok(())
}

async fn ensure_finalizer(cr: &ConnectivityProxy, ctx: &Ctx) -> Result<(), Error> {
    if cr.finalizers().iter().any(|f| f == names::FINALIZER) {
        return Ok(());
    }
    let api: Api<ConnectivityProxy> =
        Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
    let patch = if cr.finalizers().is_empty() {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": [names::FINALIZER]}])
    } else {
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": names::FINALIZER}])
    };
    let patch: json_patch::Patch = serde_json::from_value(patch)?;
    api.patch(
        &cr.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
    .map_err(|e| Error::kube("adding the finalizer", e))?;
    Ok(())
}

type Keep = Vec<(Kind, Option<String>, String)>;

/// Hash of the service key and the tunnel TLS Secret's data (once they exist), for the pod template:
/// a rotated key or certificate restarts the proxy.
fn secrets_hash(
    tls: Option<&k8s_openapi::api::core::v1::Secret>,
    key: Option<&crate::btp::ServiceKey>,
) -> Option<String> {
    let key = key?;
    let mut material = String::from_utf8_lossy(&key.content).to_string();
    for (k, v) in tls.and_then(|s| s.data.as_ref()).into_iter().flatten() {
        material.push_str(k);
        material.push_str(&String::from_utf8_lossy(&v.0));
    }
    Some(crate::desired::hash_str(&material))
}

/// The `<tls>-cacert` Secret with the Connectivity service CA. The CA is fetched only when the
/// Secret is missing or was fetched from another URL; a failed fetch keeps the previous Secret and is
/// reported as a problem.
async fn connectivity_ca_objects(
    ctx: &Ctx,
    cr: &ConnectivityProxy,
    resolved: &desired::Resolved,
    key: Option<&crate::btp::ServiceKey>,
) -> Result<(Vec<desired::Desired>, Keep, Option<String>), Error> {
    const FETCHED_FROM: &str = "connectivityproxy.sap.com/fetched-from";
    if cr.spec.ingress_class() != "istio" {
        return Ok((vec![], vec![], None));
    }
    let Some(key) = key else {
        return Ok((vec![], vec![], None));
    };
    let ns = resolved.istio_namespace.clone();
    let name = names::cacert_secret_name(&resolved.tls_secret);
    let url = match crate::connectivity_ca::ca_url(&key.content) {
        Ok(url) => url,
        Err(problem) => return Ok((vec![], vec![], Some(problem))),
    };
    let live = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("reading Secret {ns}/{name}"), e))?;
    let fresh = ctx
        .ca_fetched
        .lock()
        .ok()
        .and_then(|m| {
            m.get(&url)
                .map(|t| t.elapsed() < crate::context::CA_REFRESH)
        })
        .unwrap_or(false);
    let cached = live
        .as_ref()
        .filter(|_| fresh)
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FETCHED_FROM))
                == Some(&url)
        })
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get("cacert"))
        .map(|b| String::from_utf8_lossy(&b.0).to_string());
    let pem = match cached {
        Some(p) => p,
        None => {
            match crate::connectivity_ca::fetch(
                &url,
                std::time::Duration::from_secs(5),
                3,
                &ctx.settings.ca_endpoint_roots,
            )
            .await
            {
                Ok(p) => {
                    tracing::info!(%url, "Connectivity service CA fetched");
                    if let Ok(mut m) = ctx.ca_fetched.lock() {
                        m.insert(url.clone(), std::time::Instant::now());
                    }
                    p
                }
                Err(e) => {
                    let keep = if live.is_some() {
                        vec![(Kind::Secret, Some(ns), name)]
                    } else {
                        vec![]
                    };
                    return Ok((vec![], keep, Some(e)));
                }
            }
        }
    };
    use base64::Engine;
    let body = json!({
        "metadata": {"annotations": {FETCHED_FROM: url}},
        "type": "Opaque",
        "data": {"cacert": base64::engine::general_purpose::STANDARD.encode(pem.as_bytes())},
    });
    Ok((
        vec![desired::object(cr, Kind::Secret, Some(&ns), &name, body)],
        vec![],
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn error_backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(2));
        assert_eq!(backoff(1), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(64));
        assert_eq!(backoff(7), Duration::from_secs(256));
        assert_eq!(backoff(8), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
    }
}
