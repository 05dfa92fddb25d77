//! Gather: every fact a reconcile decides from, read once per reconcile from the controller's caches
//! ([`crate::cache`]) — the install, the legacy takeover's progress ([`crate::migration::gather`]),
//! the certificates, the ServiceMappings — and the time. Nothing here writes or generates keys: the
//! built-in tunnel certificate's new keys, the one input that is generated, are settled after the
//! reads ([`Facts::settle_tunnel_keys`]); [`crate::plan`] decides from these facts alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use cp_api::{ConnectivityProxy, names};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;

use crate::Error;
use crate::cache::{Key, typed};
use crate::certificates::tunnel::{self, Provider, TunnelCertSettings};
use crate::context::Ctx;
use crate::desired::{self, Kind};
use crate::mappings::MappingFacts;

/// Which optional APIs the cluster serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Apis {
    /// Istio CRDs that are missing.
    pub missing_istio: Vec<String>,
    /// SAP BTP service operator CRDs that are missing.
    pub missing_btp: Vec<String>,
    /// Gardener's cert-management is installed.
    pub gardener: bool,
    /// cert-manager is installed.
    pub cert_manager: bool,
    /// Managed kinds whose API exists.
    pub kinds: Vec<Kind>,
}

/// The Connectivity service CA for the `<tls>-cacert` Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ConnectivityCa {
    /// Not used (no Istio ingress, or no service key yet).
    #[default]
    NotNeeded,
    /// The service key names no usable CA URL.
    Unusable(String),
    /// The CA, fetched from `url` (now, or recently and still in the Secret).
    Known {
        /// Where it came from.
        url: String,
        /// The CA certificate(s).
        pem: String,
    },
    /// Fetching failed; the previous Secret (if any) stays.
    Failed(String),
}

/// Everything one reconcile decides from.
#[derive(Clone, Debug)]
pub struct Facts {
    /// When the facts were gathered.
    pub now: OffsetDateTime,
    /// The CR reconciled per cluster (the oldest in kyma-system), when that is another one.
    pub other_primary: Option<(String, String)>,
    /// The StatefulSet under the proxy's name is the legacy reconciler's.
    pub legacy_statefulset: bool,
    /// The legacy takeover's progress and leftovers, when the reconcile takes the legacy installation
    /// over first ([`crate::migration::wanted`]); the plan decides its next step.
    pub migration: Option<crate::migration::Progress>,
    /// Optional APIs.
    pub apis: Apis,
    /// `data.domain` of `kube-system/shoot-info`.
    pub cluster_domain: Option<String>,
    /// The ServiceMappings: published, in conflict, and split into the proxy's shards.
    pub mappings: MappingFacts,
    /// The CR's ServiceBinding (auto-provision).
    pub binding: Option<DynamicObject>,
    /// The Secret the service key is read from ([`crate::btp::key_source`]).
    pub key_secret: Option<Secret>,
    /// The service key resolved from the CR, [`Self::binding`] and [`Self::key_secret`]
    /// ([`Self::resolve_service_key`]), or why the CR's key cannot be read.
    pub service_key: Result<crate::btp::Outcome, String>,
    /// The audit log Secret the CR names, when it exists.
    pub auditlog_secret: Option<Secret>,
    /// The built-in tunnel CA Secret.
    pub tunnel_ca: Option<Secret>,
    /// The tunnel's TLS Secret, whoever issued it.
    pub tunnel_tls: Option<Secret>,
    /// The built-in tunnel certificate's rotation at [`Self::now`] ([`Self::settle_tunnel_keys`]: new
    /// keys and certificates are generated there when due), when the built-in provider issues it.
    pub tunnel_rotation: Option<Result<cp_certs::rotation::Rotation, tunnel::IssueError>>,
    /// The Connectivity service CA.
    pub connectivity_ca: ConnectivityCa,
    /// Every managed object that belongs to this CR, as cached, that the operator can prove is its
    /// own (or adopts: [`Self::adopted`]).
    pub owned: BTreeMap<Key, DynamicObject>,
    /// Those of [`Self::owned`] an earlier release labelled, without a proof yet: written once more.
    pub adopted: std::collections::BTreeSet<Key>,
    /// Objects with the operator's labels for this CR but no ownership proof: never overwritten,
    /// pruned or deleted, named in a Warning.
    pub unproven: Vec<Key>,
    /// The proxy's StatefulSet when it is ours.
    pub statefulset: Option<StatefulSet>,
    /// Why the proxy's pods fail, when they are not ready for a reason that will not pass by itself.
    pub pod_problem: Option<String>,
    /// The ConnectivityProxy CRs outside kyma-system, as (namespace, name), sorted: each blocks the
    /// module's removal by lifecycle-manager ([`crate::outside`]).
    pub outside: Vec<(String, String)>,
}

impl Facts {
    /// The facts of a CR the controller does not install (another is active, or it lives outside
    /// the module's namespace): nothing is read for it.
    pub fn not_installed(other_primary: Option<(String, String)>, apis: Apis) -> Self {
        Self {
            now: OffsetDateTime::now_utc(),
            other_primary,
            legacy_statefulset: false,
            migration: None,
            apis,
            cluster_domain: None,
            mappings: MappingFacts::default(),
            binding: None,
            key_secret: None,
            service_key: Ok(crate::btp::Outcome::default()),
            auditlog_secret: None,
            tunnel_ca: None,
            tunnel_tls: None,
            tunnel_rotation: None,
            connectivity_ca: ConnectivityCa::NotNeeded,
            owned: BTreeMap::new(),
            adopted: Default::default(),
            unproven: vec![],
            statefulset: None,
            pod_problem: None,
            outside: vec![],
        }
    }

    /// Resolves the service key of `cr` from [`Self::binding`] and [`Self::key_secret`], once per
    /// reconcile: the Secrets and the Connectivity CA are read for it and the plan decides from it.
    pub fn resolve_service_key(&mut self, cr: &ConnectivityProxy) {
        self.service_key =
            crate::btp::service_key(cr, self.binding.as_ref(), self.key_secret.as_ref())
                .map_err(|e| e.to_string());
    }

    /// Rotates the built-in tunnel certificate of `cr` (resolved as `resolved`) from
    /// [`Self::tunnel_ca`] and [`Self::tunnel_tls`] at [`Self::now`], when the built-in provider
    /// issues it: private keys are generated here, not in the plan.
    pub fn rotate_tunnel(
        &mut self,
        cr: &ConnectivityProxy,
        resolved: &desired::Resolved,
        settings: &TunnelCertSettings,
    ) {
        let provider =
            crate::certificates::provider(self.apis.gardener, self.apis.cert_manager, settings);
        self.tunnel_rotation = (resolved.tls_auto && provider == Provider::BuiltIn).then(|| {
            let live = tunnel::Live {
                ca: self.tunnel_ca.as_ref(),
                tls: self.tunnel_tls.as_ref(),
            };
            tunnel::rotate(cr, resolved, settings, live, self.now)
        });
    }

    /// Settles the one input of the plan that is generated, not read: the built-in tunnel
    /// certificate's rotation, with new keys when it is due ([`Self::rotate_tunnel`]). Called once
    /// between [`gather`] (reads only) and the plan (pure).
    pub fn settle_tunnel_keys(&mut self, cr: &ConnectivityProxy, settings: &TunnelCertSettings) {
        let key = self.service_key.as_ref().ok().and_then(|o| o.key.clone());
        if let Ok(resolved) = desired::resolve(cr, &self.cluster_facts(key.as_ref())) {
            self.rotate_tunnel(cr, &resolved, settings);
        }
    }

    /// The cluster facts `desired::resolve` needs, with the subaccount from the service key.
    pub fn cluster_facts(&self, key: Option<&crate::btp::ServiceKey>) -> desired::ClusterFacts {
        desired::ClusterFacts {
            cluster_domain: self.cluster_domain.clone(),
            service_mapping_count: self.mappings.len(),
            service_mappings: self.mappings.names().take(3).map(String::from).collect(),
            binding_subaccount_id: key.and_then(|k| k.subaccount_id.clone()),
            binding_subaccount_subdomain: key.and_then(|k| k.subaccount_subdomain.clone()),
        }
    }
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

/// Whether `a` and `b` are the same CR.
pub fn same(a: &ConnectivityProxy, b: &ConnectivityProxy) -> bool {
    a.uid().is_some() && a.uid() == b.uid()
        || (a.namespace() == b.namespace() && a.name_any() == b.name_any())
}

/// The mappings from the state the watch keeps, split for the shard ConfigMaps among `owned`.
fn mapping_facts(ctx: &Ctx, owned: &BTreeMap<Key, DynamicObject>, ns: &str) -> MappingFacts {
    let state = ctx
        .mappings
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    MappingFacts {
        hold: ctx.shard_writes.hold(std::time::Instant::now()),
        ..MappingFacts::of(&state, crate::mappings::live_shards(owned, ns))
    }
}

/// Gathers the facts for `cr`. Reads come from the caches; the API is read only for what a cache does
/// not hold yet, and the Connectivity CA endpoint only when its CA is due.
#[tracing::instrument(skip_all)]
pub async fn gather(cr: &ConnectivityProxy, ctx: &Ctx) -> Result<Facts, Error> {
    let ns = cr.namespace().unwrap_or_default();
    let apis = apis(ctx);
    let proof = ctx.applier.proof();
    if cr.meta().deletion_timestamp.is_some() {
        // Being deleted: what the deletion decides from, the mappings and the managed objects.
        let mut facts = Facts::not_installed(None, apis);
        owned(cr, ctx, &mut facts).await?;
        facts.mappings = mapping_facts(ctx, &facts.owned, &ns);
        return Ok(facts);
    }
    let other_primary = primary(ctx)
        .filter(|p| !same(p, cr))
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()));
    if other_primary.is_some() || ns != names::KYMA_SYSTEM {
        // Not installed from this CR: nothing else is read (the controller may not read elsewhere).
        return Ok(Facts::not_installed(other_primary, apis));
    }
    let sts = ctx
        .cache
        .live(Kind::StatefulSet, Some(&ns), names::STATEFULSET)
        .await?;
    let legacy_statefulset = sts
        .as_ref()
        .is_some_and(|s| crate::migration::is_legacy(&s.metadata));
    let migration = if crate::migration::wanted(cr, legacy_statefulset) {
        Some(crate::migration::gather(&ctx.client, proof, cr, legacy_statefulset).await?)
    } else {
        None
    };
    let statefulset = match sts.filter(|s| proof.ours(Kind::StatefulSet, &s.metadata)) {
        Some(s) => Some(typed::<StatefulSet>(&s)?),
        None => None,
    };
    let binding = if apis.missing_btp.is_empty() {
        let name = names::service_binding_name(&cr.name_any(), &ns);
        ctx.cache
            .live(Kind::ServiceBinding, Some(&ns), &name)
            .await?
    } else {
        None
    };
    let key_secret = match crate::btp::key_source(cr) {
        Some(name) => ctx.cache.secret(&ns, &name, cr).await?,
        None => None,
    };
    let auditlog_secret = match cr.spec.auditlog_secret().filter(|a| !a.is_empty()) {
        Some(name) => ctx.cache.secret(&ns, name, cr).await?,
        None => None,
    };
    let mut facts = Facts {
        legacy_statefulset,
        migration,
        cluster_domain: cluster_domain(ctx),
        binding,
        key_secret,
        auditlog_secret,
        statefulset,
        outside: ctx.outside_crs(),
        ..Facts::not_installed(other_primary, apis)
    };
    owned(cr, ctx, &mut facts).await?;
    facts.mappings = mapping_facts(ctx, &facts.owned, &ns);
    facts.resolve_service_key(cr);
    tunnel_and_ca(cr, ctx, &mut facts).await?;
    if facts
        .statefulset
        .as_ref()
        .is_none_or(|s| crate::pods::statefulset_ready(s).is_err())
    {
        facts.pod_problem = proxy_pod_problem(ctx, cr, &ns).await;
    }
    // Every foreign Secret this CR names has been read: the watches on names it no longer names close.
    let watches = ctx.cache.release_unread();
    ctx.metrics
        .foreign_secret_watches
        .set(i64::try_from(watches).unwrap_or(i64::MAX));
    Ok(facts)
}

/// The managed objects of `cr` from the caches, filed by their ownership proof.
async fn owned(cr: &ConnectivityProxy, ctx: &Ctx, facts: &mut Facts) -> Result<(), Error> {
    let proof = ctx.applier.proof();
    for (k, o) in ctx
        .cache
        .owned(&facts.apis.kinds, cr, &desired::object_namespaces(cr))
        .await?
    {
        sort_by_proof(
            proof,
            (k, o),
            &mut facts.owned,
            &mut facts.adopted,
            &mut facts.unproven,
        );
    }
    Ok(())
}

/// Files a labelled object under what its ownership proof says ([`crate::ownership::Standing`]).
fn sort_by_proof(
    proof: &crate::ownership::Proof,
    (kind, o): (Kind, DynamicObject),
    owned: &mut BTreeMap<Key, DynamicObject>,
    adopted: &mut std::collections::BTreeSet<Key>,
    unproven: &mut Vec<Key>,
) {
    use crate::ownership::Standing;
    let key = (kind, o.namespace(), o.name_any());
    match proof.standing(kind, &o.metadata) {
        Standing::Proven => {
            owned.insert(key, o);
        }
        Standing::Adopted => {
            adopted.insert(key.clone());
            owned.insert(key, o);
        }
        Standing::Unproven | Standing::Foreign => unproven.push(key),
    }
}

fn apis(ctx: &Ctx) -> Apis {
    Apis {
        missing_istio: ctx.missing_crds(&names::ISTIO_CRDS),
        missing_btp: ctx.missing_crds(&names::BTP_CRDS),
        gardener: ctx.has_crd(names::GARDENER_CERT_CRD),
        cert_manager: ctx.has_crd(names::CERT_MANAGER_CRD),
        kinds: ctx.available_kinds(),
    }
}

fn cluster_domain(ctx: &Ctx) -> Option<String> {
    ctx.shoot_info
        .get(&ObjectRef::new(names::SHOOT_INFO).within(names::SHOOT_INFO_NAMESPACE))
        .and_then(|c| c.data.as_ref()?.get("domain").cloned())
}

/// The tunnel's Secrets (and the built-in certificate's rotation) and the Connectivity CA: where they
/// live follows from the resolved CR, so they are read once the key and the cluster facts are known
/// (nothing when the CR does not resolve).
async fn tunnel_and_ca(cr: &ConnectivityProxy, ctx: &Ctx, facts: &mut Facts) -> Result<(), Error> {
    let key = facts.service_key.as_ref().ok().and_then(|o| o.key.clone());
    let Ok(resolved) = desired::resolve(cr, &facts.cluster_facts(key.as_ref())) else {
        return Ok(());
    };
    let cr_ns = cr.namespace().unwrap_or_default();
    // A CA (or certificate) someone else labelled as the operator's is never signed with or kept.
    let proof = ctx.applier.proof();
    facts.tunnel_ca = ctx
        .cache
        .secret(&cr_ns, names::TUNNEL_CA_SECRET, cr)
        .await?
        .filter(|s| proof.ours(Kind::Secret, &s.metadata));
    facts.tunnel_tls = ctx
        .cache
        .secret(&resolved.istio_namespace, &resolved.tls_secret, cr)
        .await?
        .filter(|s| {
            proof.standing(Kind::Secret, &s.metadata) != crate::ownership::Standing::Unproven
        });
    if cr.spec.ingress_class() == "istio"
        && let Some(key) = key
    {
        let cacert = (
            Kind::Secret,
            Some(resolved.istio_namespace.clone()),
            names::cacert_secret_name(&resolved.tls_secret),
        );
        facts.connectivity_ca = connectivity_ca(ctx, &key, facts.owned.get(&cacert)).await;
    }
    Ok(())
}

/// The Connectivity service CA: fetched when the Secret is missing, was fetched from another URL, or
/// was fetched more than [`crate::context::CA_REFRESH`] ago (the legacy reconciler refetched it on
/// every run).
async fn connectivity_ca(
    ctx: &Ctx,
    key: &crate::btp::ServiceKey,
    live: Option<&DynamicObject>,
) -> ConnectivityCa {
    let url = match crate::connectivity_ca::ca_url(&key.content) {
        Ok(url) => url,
        Err(problem) => return ConnectivityCa::Unusable(problem.to_string()),
    };
    // The host must be on the operator's list, whatever the key's own domain says.
    let host = url
        .parse::<hyper::Uri>()
        .ok()
        .and_then(|u| u.host().map(String::from))
        .unwrap_or_default();
    if let Err(problem) = ctx.settings.ca_egress.check_host(&host) {
        return ConnectivityCa::Unusable(problem.to_string());
    }
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
        .filter(|_| fresh)
        .filter(|s| s.annotations().get(cp_api::keys::FETCHED_FROM_ANNOTATION) == Some(&url))
        .and_then(|s| {
            s.data
                .get("data")?
                .get("cacert")?
                .as_str()
                .map(String::from)
        })
        .and_then(|b64| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(b64).ok()
        })
        .map(|b| String::from_utf8_lossy(&b).to_string());
    if let Some(pem) = cached {
        return ConnectivityCa::Known { url, pem };
    }
    let timeout = std::time::Duration::from_secs(5);
    let resolver = match crate::connectivity_ca::Resolver::from_system() {
        Ok(r) => crate::connectivity_ca::CheckedResolver::new(r, ctx.settings.ca_egress.clone()),
        Err(e) => return ConnectivityCa::Failed(e.to_string()),
    };
    match crate::connectivity_ca::fetch(&url, timeout, 3, &ctx.settings.ca_endpoint_roots, resolver)
        .await
    {
        Ok(pem) => {
            tracing::info!(%url, "Connectivity service CA fetched");
            if let Ok(mut m) = ctx.ca_fetched.lock() {
                m.insert(url.clone(), std::time::Instant::now());
            }
            ConnectivityCa::Known { url, pem }
        }
        Err(e) => ConnectivityCa::Failed(e.to_string()),
    }
}

/// Why the proxy's pods do not become ready, when the reason will not resolve by itself. Listed only
/// while the proxy is not ready; a failed read (e.g. RBAC) is logged and leaves the plain "not ready".
/// The list is served from the API server's watch cache (`resourceVersion=0`): a consistent list waits
/// for that cache to catch up with etcd, measured at 70-90 ms on kube-apiserver 1.37, and this runs
/// before the reconcile's writes whenever the StatefulSet is rolling (every edit). A pod status a few
/// milliseconds old is as good a diagnosis; the next reconcile reads again.
async fn proxy_pod_problem(ctx: &Ctx, cr: &ConnectivityProxy, ns: &str) -> Option<String> {
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ctx.client.clone(), ns)
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("{}={}", names::APP_LABEL, desired::APP))
                .match_any(),
        )
        .await
        .map_err(|e| tracing::warn!(error = %e, "reading the proxy's pods"))
        .ok()?;
    let fd_limit = desired::effective_deployment(cr)
        .resources
        .and_then(|r| r.max_file_descriptor_count)
        .unwrap_or(cp_api::defaults::MAX_FILE_DESCRIPTORS);
    crate::pods::problem(&pods.items, fd_limit)
}
