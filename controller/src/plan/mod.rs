//! Plan: what one reconcile does, decided purely from the CR and the gathered [`Facts`]. Every state
//! and reason of the status contract is chosen here; [`crate::reconcile`] only carries the plan out.

use cp_api::reason::Reason;
use std::collections::BTreeSet;
use std::time::Duration;

use cp_api::{ConnectivityProxy, State, names};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::btp::ServiceKey;
use crate::cache::Key;
use crate::certificates::tunnel::{self, Live, Tunnel};
use crate::context::Settings;
use crate::desired::{self, Desired, Kind, Resolved};
use crate::gather::{ConnectivityCa, Facts};
use crate::status::{Computed, Cond, types};
pub use crate::writer::Prune;
use cp_api::keys::FETCHED_FROM_ANNOTATION;

/// After writing the CR itself, come back soon even if the watch never delivers that write (it can be
/// lost when etcd restarts right after it).
pub const NEXT_STEP: Duration = Duration::from_secs(1);
/// How soon a CR whose proxy is not ready yet is looked at again: its pods change without the
/// StatefulSet changing (an init container failing, an image pull backing off).
pub const NOT_READY_RECHECK: Duration = Duration::from_secs(10);
/// How soon a problem outside the CR (an object that is not ours, the CA endpoint, legacy blockers) is
/// looked at again.
pub const OUTSIDE_RECHECK: Duration = Duration::from_secs(30);
/// How soon a pending service key is looked at again (the BTP operator updates the binding).
pub const KEY_RECHECK: Duration = Duration::from_secs(2);

/// What one reconcile does.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Nothing is applied; the status says why.
    Blocked {
        /// The status to write.
        status: Computed,
        /// What comes next.
        then: Then,
    },
    /// The CR itself is written first (finalizer, this release's `spec.deployment` defaults).
    UpdateCr(Vec<CrPatch>),
    /// The legacy installation is taken over first: this step ([`crate::migration::decide`]), one a
    /// reconcile.
    Migrate(Box<crate::migration::Step>),
    /// The CR is being deleted ([`crate::deletion::plan_deletion`]).
    Delete(Box<crate::deletion::DeletionPlan>),
    /// Apply what differs, prune what is no longer desired, report.
    Install(Box<Install>),
}

/// What follows a blocked reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Then {
    /// Look again after this long.
    Requeue(Duration),
    /// The reconcile failed (error backoff) with this message.
    Fail(String),
}

/// A write to the CR itself.
#[derive(Clone, Debug, PartialEq)]
pub enum CrPatch {
    /// JSON patch adding the operator's finalizer.
    Finalizer(Value),
    /// Merge patch moving `spec.deployment` to this release's defaults.
    ReleaseDefaults(Value),
}

/// One object to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The object.
    pub desired: Desired,
    /// Its body's length and hash, computed once by the plan.
    pub digest: crate::apply::Digest,
    /// Why (`absent`, `/spec/... differs`).
    pub why: String,
    /// Not in the caches: the API is asked first (an object of that name may not be ours).
    pub confirm_absent: bool,
    /// The resourceVersion the cache held (the cache is trusted again once it has moved past it).
    pub cached_version: Option<String>,
    /// A mapping shard's text, which the desired object holds only as its marker.
    pub text: Option<std::sync::Arc<str>>,
}

impl Write {
    /// The object as written: a mapping shard with its text in place of the marker.
    pub fn body(&self) -> std::borrow::Cow<'_, Desired> {
        match &self.text {
            Some(text) => std::borrow::Cow::Owned(crate::mappings::with_text(&self.desired, text)),
            None => std::borrow::Cow::Borrowed(&self.desired),
        }
    }
}

/// The install plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Install {
    /// Objects that differ from their live state, in apply order.
    pub writes: Vec<Write>,
    /// How many objects are desired.
    pub desired: usize,
    /// Managed objects of this CR that are no longer desired.
    pub prune: Vec<Prune>,
    /// Conditions that passed (for a status that reports a failed apply).
    pub passed: Vec<Cond>,
    /// The status once everything is written.
    pub status: Computed,
    /// When to look again.
    pub requeue: Duration,
    /// Resolved values (ServiceMapping endpoints).
    pub resolved: Resolved,
    /// The tunnel certificate (metrics).
    pub tunnel: Tunnel,
    /// The ServiceMappings left out because an older one has the same key.
    pub conflicts: Vec<crate::mappings::Conflict>,
    /// How many ConfigMaps the published mappings are split across.
    pub mapping_shards: usize,
    /// The bytes of their entries ([`cp_api::mapping::entry_bytes`] summed).
    pub mapping_bytes: usize,
    /// Objects with the operator's labels but no ownership proof, left alone (`Kind ns/name`).
    pub unproven: Vec<String>,
}

fn blocked(state: State, passed: Vec<Cond>, failed: Cond, then: Then) -> Plan {
    Plan::Blocked {
        status: Computed::blocked(state, passed, failed),
        then,
    }
}

/// The failed condition of a CR outside the module's namespace: it installs nothing. (The controller
/// watches only the metadata of such CRs, `crate::outside`; this plan is its answer for them too.)
pub fn outside_module_namespace() -> Cond {
    Cond::failed(
        types::CONFIGURATION,
        Reason::OutsideModuleNamespace,
        format!(
            "the Connectivity Proxy is installed only from a ConnectivityProxy in {ks} (the module's namespace; the operator writes nowhere else but the Istio namespace): create it in {ks} and delete this one",
            ks = names::KYMA_SYSTEM
        ),
    )
}

/// Plans the reconcile of `cr` (not being deleted).
pub fn plan(cr: &ConnectivityProxy, facts: &Facts, settings: &Settings) -> Plan {
    if cr.meta().deletion_timestamp.is_some() {
        return Plan::Delete(Box::new(crate::deletion::plan_deletion(
            cr.finalizers(),
            facts,
            settings.resync,
        )));
    }
    if let Some(p) = admission(cr, facts, settings) {
        return p;
    }
    let deps = match dependencies(cr, facts, settings.resync) {
        Ok(c) => c,
        Err(p) => return p,
    };
    install(cr, facts, settings, deps)
}

/// Which CR is installed, the CR's own writes, and the legacy takeover, in that order.
fn admission(cr: &ConnectivityProxy, facts: &Facts, settings: &Settings) -> Option<Plan> {
    let resync = Then::Requeue(settings.resync);
    let config = |reason: Reason, msg: String| {
        let failed = Cond::failed(types::CONFIGURATION, reason, msg);
        Some(blocked(State::Warning, vec![], failed, resync.clone()))
    };
    if let Some((ns, name)) = &facts.other_primary {
        return config(
            Reason::DuplicateConnectivityProxy,
            format!(
                "only one ConnectivityProxy is reconciled per cluster and {ns}/{name} is the active one; delete this one"
            ),
        );
    }
    if cr.namespace().as_deref() != Some(names::KYMA_SYSTEM) {
        return Some(blocked(
            State::Warning,
            vec![],
            outside_module_namespace(),
            resync.clone(),
        ));
    }
    let patches: Vec<CrPatch> = [
        finalizer_patch(cr).map(CrPatch::Finalizer),
        crate::upgrade::release_patch(cr, &settings.deployment_defaults)
            .map(CrPatch::ReleaseDefaults),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !patches.is_empty() {
        return Some(Plan::UpdateCr(patches));
    }
    if !crate::migration::wanted(cr, facts.legacy_statefulset) {
        return None;
    }
    let idle = crate::migration::Progress::Idle {
        legacy_statefulset: facts.legacy_statefulset,
    };
    let progress = facts.migration.as_ref().unwrap_or(&idle);
    Some(Plan::Migrate(Box::new(crate::migration::decide(
        &cr.spec, progress,
    ))))
}

/// The JSON patch adding the finalizer, unless the CR has it.
pub fn finalizer_patch(cr: &ConnectivityProxy) -> Option<Value> {
    if cr.finalizers().iter().any(|f| f == names::FINALIZER) {
        return None;
    }
    let add = if cr.finalizers().is_empty() {
        crate::writer::json_op::add(&["metadata", "finalizers"], vec![names::FINALIZER])
    } else {
        crate::writer::json_op::add(&["metadata", "finalizers", "-"], names::FINALIZER)
    };
    Some(crate::desired::body(&json_patch::Patch(vec![add])))
}

/// The status a migration step leads to, and when to look again.
pub fn migration_status(outcome: &crate::migration::Outcome) -> Option<(Computed, Duration)> {
    use crate::migration::Outcome;
    match outcome {
        Outcome::NotNeeded | Outcome::LeftAlone(_) => None,
        Outcome::Progressed(step) => Some((
            Computed::blocked(
                State::Processing,
                vec![],
                Cond::failed(
                    types::CONFIGURATION,
                    *step,
                    "taking over the legacy reconciler installation",
                ),
            ),
            NEXT_STEP,
        )),
        Outcome::Blocked(blockers) => {
            let list: Vec<String> = blockers.iter().map(ToString::to_string).collect();
            let msg = format!(
                "the takeover of the legacy installation is blocked; the legacy installation keeps running untouched until this is fixed: {} (preview with `cp-controller migrate-plan`)",
                list.join("; ")
            );
            let failed = Cond::failed(types::CONFIGURATION, Reason::LegacyMigrationBlocked, msg);
            // What blocks is outside the CR (legacy ConfigMaps, mappings): look again soon.
            Some((
                Computed::blocked(State::Warning, vec![], failed),
                Duration::from_secs(10),
            ))
        }
    }
}

/// Istio (for the Istio ingress) and the BTP operator (for an auto-provisioned key) must be installed.
fn dependencies(cr: &ConnectivityProxy, facts: &Facts, resync: Duration) -> Result<Cond, Plan> {
    let istio: &[String] = if cr.spec.ingress_class() == "istio" {
        &facts.apis.missing_istio
    } else {
        &[]
    };
    let needs_btp = names::is_auto_provision(Some(&cr.spec.connectivity_secret().0));
    let btp: &[String] = if needs_btp {
        &facts.apis.missing_btp
    } else {
        &[]
    };
    let (reason, what) = if !istio.is_empty() {
        (
            Reason::IstioCRDsMissing,
            format!(
                "Istio is not installed: CRDs {} are missing",
                istio.join(", ")
            ),
        )
    } else if !btp.is_empty() {
        (
            Reason::BTPOperatorCRDsMissing,
            format!(
                "the SAP BTP service operator is not installed (CRDs {} are missing) but \
                 spec.secretConfig.integration.connectivityService.secretName is auto-provision",
                btp.join(", ")
            ),
        )
    } else {
        return Ok(Cond::ok(
            types::DEPENDENCIES,
            Reason::DependenciesAvailable,
            "required CRDs are installed",
        ));
    };
    let msg = format!(
        "{what}; install it and the Connectivity Proxy is installed within seconds, nothing was applied"
    );
    Err(Plan::Blocked {
        status: Computed::blocked(
            State::Warning,
            vec![],
            Cond::failed(types::DEPENDENCIES, reason, msg),
        ),
        // The CRD watch wakes the reconcile when they appear.
        then: Then::Requeue(resync),
    })
}

fn install(cr: &ConnectivityProxy, facts: &Facts, settings: &Settings, deps: Cond) -> Plan {
    let resync = settings.resync;
    let key = match &facts.service_key {
        Ok(k) => k,
        Err(e) => {
            let failed = Cond::failed(
                types::CONFIGURATION,
                Reason::InvalidConfiguration,
                e.clone(),
            );
            return blocked(State::Warning, vec![deps], failed, Then::Requeue(resync));
        }
    };
    if let Some(problem) = &key.invalid {
        // Nothing is applied or pruned: a broken Secret must not take down a proxy (or its tunnel
        // CA) that still runs with the previous key. The Secret's watch wakes the reconcile.
        let msg = format!("{problem}; nothing was applied");
        let failed = Cond::failed(types::CONFIGURATION, Reason::ServiceKeyInvalid, msg);
        return blocked(State::Warning, vec![deps], failed, Then::Requeue(resync));
    }
    let mut resolved = match desired::resolve(cr, &facts.cluster_facts(key.key.as_ref())) {
        Ok(r) => r,
        Err(problem) => {
            let failed = Cond::failed(types::CONFIGURATION, problem.reason(), problem.message());
            return blocked(problem.state(), vec![deps], failed, Then::Requeue(resync));
        }
    };
    let config = Cond::ok(
        types::CONFIGURATION,
        Reason::ConfigurationValid,
        format!("tunnel host {}", resolved.external_host),
    );
    let auditlog_problem = auditlog_problem(cr, facts, &mut resolved);
    let provider = crate::certificates::provider(
        facts.apis.gardener,
        facts.apis.cert_manager,
        &settings.tunnel,
    );
    let live = Live {
        ca: facts.tunnel_ca.as_ref(),
        tls: facts.tunnel_tls.as_ref(),
    };
    let built_in = facts.tunnel_rotation.as_ref();
    let tunnel = match tunnel::objects(cr, &resolved, provider, &settings.tunnel, live, built_in) {
        Ok(t) => t,
        Err(e) => {
            let failed = Cond::failed(
                types::INSTALLED,
                Reason::CertificateFailed,
                format!("certificate: {e}"),
            );
            return blocked(
                State::Error,
                vec![deps, config],
                failed,
                Then::Fail(e.to_string()),
            );
        }
    };
    // The TLS Secret as it will be once this plan is applied (a certificate issued now is in the pod
    // template's hash right away, so a fresh install rolls the proxy once, not twice).
    let tls = tunnel
        .objects
        .iter()
        .find(|d| d.kind == Kind::Secret && d.name == resolved.tls_secret)
        .and_then(|d| serde_json::from_value(d.body.clone()).ok())
        .or_else(|| facts.tunnel_tls.clone());
    resolved.secrets_hash = secrets_hash(tls.as_ref(), key.key.as_ref());
    let mappings = &facts.mappings;
    let mut objects = desired::planned(cr, &resolved, mappings);
    objects.extend(tunnel.objects.iter().cloned());
    objects.extend(key.objects.iter().cloned());
    let (ca_object, ca_problem, keep_ca) = connectivity_ca_object(cr, &resolved, facts);
    objects.extend(ca_object);
    // An object under a name the operator renders wears its labels without its proof: nothing is
    // written (the rest of the install would build on an object someone else controls).
    if let Some(d) = objects.iter().find(|d| {
        let key = (d.kind, d.namespace.clone(), d.name.clone());
        facts.unproven.contains(&key)
    }) {
        let failed = Cond::failed(
            types::INSTALLED,
            Reason::ObjectNotOwned,
            crate::apply::not_ours(d).to_string(),
        );
        return blocked(
            State::Warning,
            vec![deps, config],
            failed,
            Then::Requeue(OUTSIDE_RECHECK),
        );
    }
    let passed = vec![deps, config];
    // Each body is serialised once here, for its hash and its size (the mappings ConfigMap's).
    // The shards' digests come from their renderings: a change of one mapping reads one shard.
    let digests: Vec<crate::apply::Digest> = objects
        .iter()
        .map(|d| {
            crate::mappings::shard_digest(d, &mappings.shards)
                .unwrap_or_else(|| crate::apply::Digest::of(d))
        })
        .collect();
    let overfull = overfull_shards(&objects, &digests);
    let report = Report {
        passed: &passed,
        resolved: &resolved,
        facts,
        mappings_bytes: mappings.bytes,
        overfull: &overfull,
        ca_problem,
        auditlog_problem,
        key_waiting: key.waiting.clone(),
        published: mappings.published,
        conflicts: &mappings.conflicts,
        statefulset_written: false,
        renew_at: tunnel.renew_at,
        resync,
    };
    let (writes, prune, held) = changes(&objects, &digests, facts, &overfull, keep_ca);
    let report = Report {
        statefulset_written: writes.iter().any(|w| w.desired.kind == Kind::StatefulSet),
        ..report
    };
    let (status, requeue) = report.status(objects.len());
    // Shards held back by the write rate: looked at again when they may go out.
    let requeue = match held {
        Some(hold) => requeue.min(hold),
        None => requeue,
    };
    Plan::Install(Box::new(Install {
        writes,
        desired: objects.len(),
        prune,
        passed,
        status,
        requeue,
        resolved,
        tunnel,
        conflicts: mappings.conflicts.clone(),
        mapping_shards: mappings.shards.len(),
        mapping_bytes: mappings.bytes,
        unproven: facts.unproven.iter().map(crate::cache::describe).collect(),
    }))
}

/// Why the audit log Secret the CR names is not projected into the proxy, if it is not: absent, not
/// opted in or another module's, in one message (a CR editor who may not read Secrets learns neither
/// whether it exists nor what it holds). `resolved` then projects none.
fn auditlog_problem(
    cr: &ConnectivityProxy,
    facts: &Facts,
    resolved: &mut Resolved,
) -> Option<String> {
    let name = resolved.auditlog_secret.clone()?;
    let usable = facts
        .auditlog_secret
        .as_ref()
        .is_some_and(|s| crate::btp::usable_by_proxy(s, cr));
    if usable {
        return None;
    }
    resolved.auditlog_secret = None;
    let ns = cr.namespace().unwrap_or_default();
    Some(format!(
        "Secret {ns}/{name}, named in spec.secretConfig.integration.auditlogService.secretName, is not \
         usable by the proxy: it must exist, belong to no other Kyma module and carry the label {label}=true \
         (its owner's consent: kubectl label secret {name} -n {ns} {label}=true); the proxy runs without \
         it until then",
        label = cp_api::keys::USABLE_BY_PROXY_LABEL
    ))
}

/// The key of desired object `d`.
fn key_of(d: &Desired) -> Key {
    (d.kind, d.namespace.clone(), d.name.clone())
}

/// The objects that differ from their cached state, and the owned objects no longer desired; the
/// shard writes held back by their write rate ([`crate::mappings::ShardWrites`]) are left out, the
/// pause returned.
fn changes(
    objects: &[Desired],
    digests: &[crate::apply::Digest],
    facts: &Facts,
    overfull: &[(&str, usize)],
    keep: Option<Key>,
) -> (Vec<Write>, Vec<Prune>, Option<Duration>) {
    let mut desired_keys: BTreeSet<Key> = keep.into_iter().collect();
    let mut writes = Vec::new();
    let mut held = None;
    let hold = facts.mappings.hold;
    let is_shard = |k: &Key| k.0 == Kind::ConfigMap && names::mapping_shard(&k.2).is_some();
    if hold.is_some() {
        // While the shards wait, none of the live ones is pruned either (a merge would lose entries).
        desired_keys.extend(facts.owned.keys().filter(|k| is_shard(k)).cloned());
    }
    for (d, digest) in objects.iter().zip(digests) {
        let key = (d.kind, d.namespace.clone(), d.name.clone());
        let live = facts.owned.get(&key);
        let adopted = facts.adopted.contains(&key);
        desired_keys.insert(key);
        // A shard that does not fit keeps its last content: neither written nor pruned.
        let too_large = d.kind == Kind::ConfigMap && overfull.iter().any(|(n, _)| *n == d.name);
        if too_large {
            continue;
        }
        let why = if adopted {
            // An earlier release's object: written once more, with the ownership proof.
            Some("adopted: the ownership proof is added".to_string())
        } else {
            crate::apply::apply_reason_with(d, digest, live)
        };
        if let Some(why) = why {
            if hold.is_some() && is_shard(&key_of(d)) {
                held = hold;
                continue;
            }
            let text = names::mapping_shard(&d.name)
                .filter(|_| d.kind == Kind::ConfigMap)
                .map(|i| {
                    facts
                        .mappings
                        .shards
                        .get(i)
                        .map_or_else(|| std::sync::Arc::from("[]"), |s| s.text.clone())
                });
            writes.push(Write {
                desired: d.clone(),
                digest: digest.clone(),
                why,
                confirm_absent: live.is_none(),
                cached_version: live.and_then(|l| l.metadata.resource_version.clone()),
                text,
            });
        }
    }
    let prune = facts
        .owned
        .iter()
        .filter(|(k, _)| !desired_keys.contains(*k))
        .map(|(k, o)| Prune::of(k.0, o))
        .collect();
    (writes, prune, held)
}

/// The mapping shards too large to apply (over [`crate::mappings::MAX_CONFIGMAP_BYTES`]) and their size.
fn overfull_shards<'a>(
    objects: &'a [Desired],
    digests: &[crate::apply::Digest],
) -> Vec<(&'a str, usize)> {
    objects
        .iter()
        .zip(digests)
        .filter(|(d, digest)| {
            d.kind == Kind::ConfigMap
                && names::mapping_shard(&d.name).is_some()
                && digest.len > crate::mappings::MAX_CONFIGMAP_BYTES
        })
        .map(|(d, digest)| (d.name.as_str(), digest.len))
        .collect()
}

/// The `<tls>-cacert` Secret with the Connectivity service CA: its object, the problem to report,
/// and the live Secret to keep when a fetch failed.
fn connectivity_ca_object(
    cr: &ConnectivityProxy,
    resolved: &Resolved,
    facts: &Facts,
) -> (Option<Desired>, Option<String>, Option<Key>) {
    let ns = resolved.istio_namespace.clone();
    let name = names::cacert_secret_name(&resolved.tls_secret);
    match &facts.connectivity_ca {
        ConnectivityCa::NotNeeded => (None, None, None),
        ConnectivityCa::Unusable(problem) => (None, Some(problem.clone()), None),
        ConnectivityCa::Failed(problem) => {
            let key = (Kind::Secret, Some(ns), name);
            (None, Some(problem.clone()), Some(key))
        }
        ConnectivityCa::Known { url, pem } => {
            let body = desired::secret(
                "Opaque",
                Some([(FETCHED_FROM_ANNOTATION.to_string(), url.clone())].into()),
                [("cacert".to_string(), pem.clone().into_bytes())].into(),
            );
            let d = desired::object(cr, Kind::Secret, Some(&ns), &name, desired::body(&body));
            (Some(d), None, None)
        }
    }
}

/// Hash of the service key and the tunnel TLS Secret's data (once they exist), for the pod template:
/// a rotated key or certificate restarts the proxy.
pub fn secrets_hash(
    tls: Option<&k8s_openapi::api::core::v1::Secret>,
    key: Option<&ServiceKey>,
) -> Option<String> {
    let key = key?;
    let mut material = String::from_utf8_lossy(&key.content).to_string();
    for (k, v) in tls.and_then(|s| s.data.as_ref()).into_iter().flatten() {
        material.push_str(k);
        material.push_str(&String::from_utf8_lossy(&v.0));
    }
    Some(desired::hash_str(&material))
}

/// Inputs of the install status.
struct Report<'a> {
    passed: &'a [Cond],
    resolved: &'a Resolved,
    facts: &'a Facts,
    /// The bytes of the published mappings' entries, all shards together.
    mappings_bytes: usize,
    /// The shards that do not fit into a ConfigMap, with their size.
    overfull: &'a [(&'a str, usize)],
    ca_problem: Option<String>,
    auditlog_problem: Option<String>,
    key_waiting: Option<String>,
    published: usize,
    conflicts: &'a [crate::mappings::Conflict],
    statefulset_written: bool,
    renew_at: Option<time::OffsetDateTime>,
    resync: Duration,
}

impl Report<'_> {
    /// The next renewal is scheduled, not polled: requeue exactly when it is due.
    fn resync(&self) -> Duration {
        match self.renew_at {
            Some(at) => {
                let until = (at - self.facts.now).as_seconds_f64().max(0.05);
                self.resync.min(Duration::from_secs_f64(until))
            }
            None => self.resync,
        }
    }

    fn status(&self, objects: usize) -> (Computed, Duration) {
        let installed = Cond::ok(
            types::INSTALLED,
            Reason::ResourcesApplied,
            format!("{objects} objects applied"),
        );
        let mut passed = self.passed.to_vec();
        let installed_failed = |state, reason: Reason, msg: String, after: Duration| {
            let failed = Cond::failed(types::INSTALLED, reason, msg);
            (Computed::blocked(state, passed.clone(), failed), after)
        };
        if let Some((shard, size)) = self.overfull.first() {
            let msg = format!(
                "the {} ServiceMappings need {} KiB, and the share of them in ConfigMap {shard} ({} KiB) is more \
                 than a ConfigMap can hold (limit {} KiB); the last configuration that fitted stays in use \
                 there: remove ServiceMappings you no longer need",
                self.published,
                self.mappings_bytes / 1024,
                size / 1024,
                crate::mappings::MAX_CONFIGMAP_BYTES / 1024
            );
            return installed_failed(
                State::Warning,
                Reason::ServiceMappingsTooLarge,
                msg,
                self.resync(),
            );
        }
        if let Some(problem) = &self.ca_problem {
            let (state, reason) = (State::Warning, Reason::ConnectivityCAUnavailable);
            return installed_failed(state, reason, problem.clone(), OUTSIDE_RECHECK);
        }
        if let Some(problem) = &self.auditlog_problem {
            let (state, reason) = (State::Warning, Reason::AuditLogSecretNotUsable);
            return installed_failed(state, reason, problem.clone(), OUTSIDE_RECHECK);
        }
        if let Some(waiting) = &self.key_waiting {
            let (state, reason) = (State::Processing, Reason::ServiceKeyPending);
            return installed_failed(state, reason, waiting.clone(), KEY_RECHECK);
        }
        if !self.conflicts.is_empty() {
            // The mapping watch wakes the reconcile when a duplicate is deleted or changed.
            let (state, reason) = (State::Warning, Reason::DuplicateServiceMappings);
            return installed_failed(
                state,
                reason,
                duplicates_message(self.conflicts),
                self.resync(),
            );
        }
        passed.push(installed);
        let (computed, after) = self.readiness(passed);
        // Ready, but the mappings ConfigMap fills up: say so while there is room to act.
        use cp_api::mapping::{
            MAPPING_SHARDS_MAX, MAPPINGS_TOTAL_BUDGET_BYTES, MAPPINGS_WARNING_PERCENT,
        };
        let near =
            self.mappings_bytes * 100 >= MAPPINGS_TOTAL_BUDGET_BYTES * MAPPINGS_WARNING_PERCENT;
        if computed.state == State::Ready && near {
            let description = format!(
                "the {} ServiceMappings take {} KiB, {} % of the {} KiB the {MAPPING_SHARDS_MAX} ConfigMaps \
                 {}[-1…-{}] can hold; at {} KiB new ServiceMappings are refused: delete those you no longer \
                 need",
                self.published,
                self.mappings_bytes / 1024,
                self.mappings_bytes * 100 / MAPPINGS_TOTAL_BUDGET_BYTES,
                MAPPINGS_TOTAL_BUDGET_BYTES / 1024,
                names::CONFIGMAP_SERVICE_MAPPINGS,
                MAPPING_SHARDS_MAX - 1,
                MAPPINGS_TOTAL_BUDGET_BYTES / 1024,
            );
            let computed = Computed {
                state: State::Warning,
                description,
                reason: Reason::ServiceMappingsNearLimit,
                ..computed
            };
            return (computed, after);
        }
        if computed.state == State::Ready && !self.facts.outside.is_empty() {
            let computed = Computed {
                state: State::Warning,
                description: outside_message(&self.facts.outside),
                reason: Reason::ConnectivityProxiesOutsideModuleNamespace,
                ..computed
            };
            return (computed, after);
        }
        (computed, after)
    }

    fn readiness(&self, passed: Vec<Cond>) -> (Computed, Duration) {
        let ready = match (&self.facts.statefulset, self.statefulset_written) {
            (_, true) => Err(crate::pods::NotReady::RollingOut),
            (Some(sts), false) => crate::pods::statefulset_ready(sts),
            (None, false) => Err(crate::pods::NotReady::Absent),
        };
        let recheck = self.resync().min(NOT_READY_RECHECK);
        match ready {
            Ok(msg) => {
                let mut conditions = passed;
                conditions.push(Cond::ok(types::READY, Reason::StatefulSetReady, msg));
                let computed = Computed {
                    state: State::Ready,
                    description: format!(
                        "Connectivity Proxy is ready; tunnel host {}",
                        self.resolved.external_host
                    ),
                    reason: Reason::StatefulSetReady,
                    conditions,
                };
                (computed, self.resync())
            }
            // A cause that will not resolve by itself: a Warning that names it.
            Err(msg) => match (&self.facts.pod_problem, self.statefulset_written) {
                (Some(problem), false) => {
                    let failed = Cond::failed(
                        types::READY,
                        Reason::ProxyPodFailing,
                        format!("{msg}; {problem}"),
                    );
                    (Computed::blocked(State::Warning, passed, failed), recheck)
                }
                _ => {
                    let failed =
                        Cond::failed(types::READY, Reason::StatefulSetNotReady, msg.to_string());
                    (
                        Computed::blocked(State::Processing, passed, failed),
                        recheck,
                    )
                }
            },
        }
    }
}

/// How many CRs outside kyma-system a status message names.
const OUTSIDE_LISTED: usize = 10;

/// The module is ready, but CRs outside kyma-system exist: what they do (nothing) and block (the
/// module's removal), which (at most [`OUTSIDE_LISTED`], sorted) and the command that removes one.
fn outside_message(outside: &[(String, String)]) -> String {
    let mut listed: Vec<String> = outside
        .iter()
        .take(OUTSIDE_LISTED)
        .map(|(ns, name)| format!("{ns}/{name}"))
        .collect();
    if outside.len() > OUTSIDE_LISTED {
        listed.push(format!("and {} more", outside.len() - OUTSIDE_LISTED));
    }
    let (ns, name) = &outside[0];
    format!(
        "Connectivity Proxy is ready, but ConnectivityProxy CRs outside {} configure nothing and block \
         the module's removal (lifecycle-manager removes the module only when none is left in any \
         namespace): {}; delete each (kubectl delete connectivityproxies.connectivityproxy.sap.com -n {ns} {name})",
        names::KYMA_SYSTEM,
        listed.join(", ")
    )
}

/// How many duplicate mappings a status message names.
const CONFLICTS_LISTED: usize = 10;

/// Every conflict (up to [`CONFLICTS_LISTED`]) with both mappings and the fix.
fn duplicates_message(conflicts: &[crate::mappings::Conflict]) -> String {
    let mut listed: Vec<String> = conflicts
        .iter()
        .take(CONFLICTS_LISTED)
        .map(crate::mappings::Conflict::message)
        .collect();
    let more = conflicts.len().saturating_sub(CONFLICTS_LISTED);
    if more > 0 {
        listed.push(format!("and {more} more (see the Warning Events on them)"));
    }
    format!(
        "{} ServiceMapping(s) share (type, subaccountId, serviceId) with an older one and are not published: {}",
        conflicts.len(),
        listed.join("; ")
    )
}

/// The status after a write failed: Warning when an object is not ours (needs the user; that object
/// untouched), Error otherwise.
pub fn apply_failed(install: &Install, err: &crate::Error) -> (Computed, Option<Duration>) {
    let (state, reason, after) = match err {
        crate::Error::NotOurs(_) => (
            State::Warning,
            Reason::ObjectNotOwned,
            Some(OUTSIDE_RECHECK),
        ),
        _ => (State::Error, Reason::ApplyFailed, None),
    };
    let failed = Cond::failed(types::INSTALLED, reason, err.to_string());
    (
        Computed::blocked(state, install.passed.clone(), failed),
        after,
    )
}

#[cfg(test)]
mod tests;
