//! A table of facts → plan for every state and reason of the status contract. Builders (`mk_*`,
//! [`TestFacts`]) give a cluster where everything is in place; each case changes one fact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cp_api::{ConnectivityProxy, ServiceMapping, State, names};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use serde_json::json;
use time::OffsetDateTime;

use super::*;
use crate::certificates::TunnelCertSettings;
use crate::gather::{Apis, ConnectivityCa, Facts};
use cp_api::reason::Reason;

const DOMAIN: &str = "c-1.kyma.example.org";

fn settings() -> Settings {
    Settings {
        resync: Duration::from_secs(600),
        tunnel: TunnelCertSettings {
            ca_lifetime: time::Duration::days(365),
            cert_lifetime: time::Duration::days(90),
            cert_manager_issuer: None,
            algorithm: cp_certs::KeyAlgorithm::EcdsaP256,
        },
        deployment_defaults: crate::upgrade::release_defaults(None),
        ca_endpoint_roots: vec![],
        ca_egress: Default::default(),
    }
}

/// The module's default CR as the webhook and an earlier reconcile left it: finalizer and this
/// release's defaults in place.
fn mk_cr(spec: serde_json::Value) -> ConnectivityProxy {
    let id = crate::upgrade::defaults_id(&settings().deployment_defaults);
    let mut cr: ConnectivityProxy = serde_json::from_value(json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ConnectivityProxy",
        "metadata": {"name": "connectivity-proxy", "namespace": "kyma-system", "uid": "u-1",
            "finalizers": [names::FINALIZER],
            "annotations": {cp_api::keys::DEFAULTS_RELEASE_ANNOTATION: id,
                cp_api::keys::DEFAULTS_VALUES_ANNOTATION: settings().deployment_defaults.to_string()}},
        "spec": spec
    }))
    .expect("a valid CR");
    cr.spec.deployment = serde_json::from_value(settings().deployment_defaults).ok();
    cr
}

fn default_spec() -> serde_json::Value {
    cp_api::testing::default_spec_json()
}

fn mk_default_cr() -> ConnectivityProxy {
    mk_cr(default_spec())
}

fn mk_binding(ready: Option<bool>) -> DynamicObject {
    let conditions = match ready {
        Some(r) => json!([{"type": "Ready", "status": if r { "True" } else { "False" },
            "reason": "Provisioning", "message": "in progress"}]),
        None => json!([]),
    };
    serde_json::from_value(json!({
        "apiVersion": "services.cloud.sap.com/v1", "kind": "ServiceBinding",
        "metadata": {"name": "connectivity-proxy-binding", "namespace": "kyma-system"},
        "status": {"conditions": conditions}
    }))
    .expect("binding")
}

fn mk_key_secret(with_key: bool) -> Secret {
    use base64::Engine;
    let key = br#"{"subaccount_id":"sub-1","subaccount_subdomain":"dom","connectivity_service":{"CAs_path":"/api/v1/CAs","url":"https://ca.example.org"}}"#;
    let data = if with_key {
        json!({names::SECRET_SERVICE_KEY_KEY: base64::engine::general_purpose::STANDARD.encode(key)})
    } else {
        json!({})
    };
    serde_json::from_value(json!({"metadata": {"name": "b"}, "data": data})).expect("secret")
}

fn mk_statefulset(generation: i64, observed: i64, ready: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": names::STATEFULSET, "namespace": "kyma-system", "generation": generation},
        "spec": {"replicas": 1, "selector": {}, "template": {}},
        "status": {"replicas": 1, "observedGeneration": observed, "readyReplicas": ready, "updatedReplicas": ready}
    }))
    .expect("sts")
}

fn mk_mapping(i: usize) -> Arc<ServiceMapping> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": format!("mapping-with-a-long-name-{i:06}")},
            "spec": {"type": "TCP", "subaccountId": format!("subaccount-{i:06}-0000-0000-000000000000"),
                "serviceId": format!("service-{i:06}"), "internalAddress": format!("host-{i}.example.org:8080")}
        }))
        .expect("mapping"),
    )
}

/// Facts `f` with these ServiceMappings, split as the gather splits them (the live shard ConfigMaps
/// among `f.owned`).
fn set_mappings(f: &mut Facts, mappings: Vec<Arc<ServiceMapping>>) {
    let live = crate::mappings::live_shards(&f.owned, "kyma-system");
    f.mappings = crate::mappings::MappingFacts::of_objects(&mappings, live);
}

/// The key of object `name` of `kind` in kyma-system.
fn in_kyma_system(kind: Kind, name: &str) -> Key {
    (kind, Some("kyma-system".into()), name.to_string())
}

/// Facts of a cluster where everything is in place and the proxy is ready.
struct TestFacts(Facts);

impl TestFacts {
    fn ready() -> Self {
        Self(Facts {
            now: OffsetDateTime::now_utc(),
            other_primary: None,
            legacy_statefulset: false,
            migration: None,
            apis: Apis {
                kinds: Kind::ALL
                    .into_iter()
                    .filter(|k| {
                        !matches!(k, Kind::GardenerCertificate | Kind::CertManagerCertificate)
                    })
                    .collect(),
                ..Apis::default()
            },
            cluster_domain: Some(DOMAIN.into()),
            mappings: Default::default(),
            binding: Some(mk_binding(Some(true))),
            key_secret: Some(mk_key_secret(true)),
            service_key: Ok(crate::btp::Outcome::default()),
            auditlog_secret: None,
            tunnel_ca: None,
            tunnel_tls: None,
            tunnel_rotation: None,
            connectivity_ca: ConnectivityCa::Known {
                url: "https://ca.example.org/api/v1/CAs".into(),
                pem: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".into(),
            },
            owned: BTreeMap::new(),
            adopted: Default::default(),
            unproven: vec![],
            statefulset: Some(mk_statefulset(1, 1, 1)),
            pod_problem: None,
            outside: vec![],
        })
    }

    fn with(mut self, f: impl FnOnce(&mut Facts)) -> Self {
        f(&mut self.0);
        self
    }

    /// The same cluster after the plan's writes landed: every desired object live as applied
    /// (unchanged when the plan installs nothing).
    fn applied(mut self, cr: &ConnectivityProxy) -> Self {
        let Plan::Install(install) = run(cr, &self) else {
            return self;
        };
        for w in &install.writes {
            let d = &w.desired;
            let live: DynamicObject =
                serde_json::from_value(crate::apply::with_digest(d, &w.digest)).expect("object");
            self.0
                .owned
                .insert((d.kind, d.namespace.clone(), d.name.clone()), live);
            if d.kind == Kind::Secret && d.name == names::TUNNEL_CA_SECRET {
                self.0.tunnel_ca = serde_json::from_value(d.body.clone()).ok();
            }
            if d.kind == Kind::Secret
                && d.name == install.resolved.tls_secret
                && d.namespace.as_deref() == Some(install.resolved.istio_namespace.as_str())
            {
                self.0.tunnel_tls = serde_json::from_value(d.body.clone()).ok();
            }
        }
        self
    }
}

/// What, for which CR, in which cluster, expecting (state, reason, requeue).
type Case<'a> = (
    &'a str,
    &'a ConnectivityProxy,
    TestFacts,
    (State, Reason, Option<Duration>),
);

/// `facts` with the service key and the built-in tunnel certificate's rotation settled from them for
/// `cr`, as gather does.
fn gathered(cr: &ConnectivityProxy, facts: &TestFacts) -> Facts {
    let mut facts = facts.0.clone();
    facts.resolve_service_key(cr);
    let key = facts.service_key.as_ref().ok().and_then(|k| k.key.as_ref());
    if let Ok(resolved) = desired::resolve(cr, &facts.cluster_facts(key)) {
        facts.rotate_tunnel(cr, &resolved, &settings().tunnel);
    }
    facts
}

fn run(cr: &ConnectivityProxy, facts: &TestFacts) -> Plan {
    plan(cr, &gathered(cr, facts), &settings())
}

/// (state, reason, requeue) of a plan that writes a status.
fn outcome(p: &Plan) -> (State, Reason, Option<Duration>) {
    match p {
        Plan::Blocked { status, then } => (
            status.state,
            status.reason,
            match then {
                Then::Requeue(d) => Some(*d),
                Then::Fail(_) => None,
            },
        ),
        Plan::Install(i) => (i.status.state, i.status.reason, Some(i.requeue)),
        other => panic!("no status in {other:?}"),
    }
}

fn install(p: Plan) -> Install {
    match p {
        Plan::Install(i) => *i,
        other => panic!("expected an install plan, got {other:?}"),
    }
}

#[test]
fn a_fresh_cluster_applies_everything_and_waits_for_the_rollout() {
    let cr = mk_default_cr();
    let i = install(run(&cr, &TestFacts::ready()));
    assert_eq!(
        i.writes.len(),
        i.desired,
        "everything is absent, so everything is written"
    );
    assert!(
        i.writes
            .iter()
            .all(|w| w.confirm_absent && w.why == "absent")
    );
    assert!(i.prune.is_empty());
    assert_eq!(i.status.state, State::Processing);
    assert_eq!(i.status.reason, Reason::StatefulSetNotReady);
    assert_eq!(i.requeue, NOT_READY_RECHECK);
    assert_eq!(i.resolved.external_host, format!("cp.{DOMAIN}"));
    assert!(i.tunnel.issued, "the built-in tunnel certificate is issued");
}

#[test]
fn the_plan_is_pure_new_tunnel_keys_come_from_gather() {
    let cr = mk_default_cr();
    let facts = gathered(&cr, &TestFacts::ready());
    assert!(matches!(facts.tunnel_rotation, Some(Ok(_))));
    let first = plan(&cr, &facts, &settings());
    assert!(install(first.clone()).tunnel.issued);
    assert_eq!(
        plan(&cr, &facts, &settings()),
        first,
        "the same facts, the same keys"
    );
    // Facts without the prepared certificate fail the certificate, they do not panic.
    let unprepared = Facts {
        tunnel_rotation: None,
        ..facts
    };
    assert_eq!(
        outcome(&plan(&cr, &unprepared, &settings())),
        (State::Error, Reason::CertificateFailed, None)
    );
}

#[test]
fn a_steady_state_writes_nothing_and_is_ready_until_the_renewal() {
    let cr = mk_default_cr();
    let facts = TestFacts::ready().applied(&cr);
    let i = install(run(&cr, &facts));
    let whys: Vec<_> = i.writes.iter().map(|w| (&w.desired.name, &w.why)).collect();
    assert!(
        i.writes.is_empty(),
        "nothing differs, nothing is written: {whys:?}"
    );
    assert!(i.prune.is_empty());
    assert_eq!(i.status.state, State::Ready);
    assert_eq!(i.status.reason, Reason::StatefulSetReady);
    assert!(!i.tunnel.issued, "a valid certificate is kept");
    assert!(i.requeue <= settings().resync);
}

#[test]
fn drift_is_written_back_and_stale_objects_are_pruned() {
    let cr = mk_default_cr();
    let mut facts = TestFacts::ready().applied(&cr);
    let cm = in_kyma_system(Kind::ConfigMap, names::CONFIGMAP_INFO);
    facts.0.owned.get_mut(&cm).expect("info ConfigMap").data["data"] = json!({"edited": "by hand"});
    let stale = in_kyma_system(Kind::Service, "old-service");
    let mut old = facts.0.owned[&cm].clone();
    old.metadata.name = Some("old-service".into());
    facts.0.owned.insert(stale.clone(), old);
    let i = install(run(&cr, &facts));
    assert_eq!(i.writes.len(), 1);
    assert_eq!(i.writes[0].desired.name, names::CONFIGMAP_INFO);
    assert!(
        !i.writes[0].confirm_absent,
        "a cached object is ours: no read first"
    );
    assert_eq!(
        i.prune.iter().map(Prune::key).collect::<Vec<_>>(),
        vec![stale]
    );
}

#[test]
fn an_adopted_object_is_written_once_more_and_an_unproven_one_is_never_touched() {
    let cr = mk_default_cr();
    let mut facts = TestFacts::ready().applied(&cr);
    let info = in_kyma_system(Kind::ConfigMap, names::CONFIGMAP_INFO);
    // An earlier release's object, unchanged: written again to carry the proof.
    facts.0.adopted.insert(info.clone());
    // A user's object wearing the operator's labels under a name the operator does not render.
    let foreign = in_kyma_system(Kind::ConfigMap, "user-config");
    facts.0.unproven.push(foreign.clone());
    let i = install(run(&cr, &facts));
    assert_eq!(i.writes.len(), 1);
    assert_eq!(i.writes[0].desired.name, names::CONFIGMAP_INFO);
    assert!(
        i.writes[0].why.contains("ownership proof"),
        "{}",
        i.writes[0].why
    );
    assert!(
        i.prune.is_empty(),
        "an unproven object is never pruned: {:?}",
        i.prune
    );
    assert_eq!(
        i.unproven,
        vec!["ConfigMap kyma-system/user-config".to_string()]
    );

    // Under a name the operator renders: nothing at all is written, and the status names it.
    let mut facts = TestFacts::ready().applied(&cr);
    facts.0.owned.remove(&info);
    facts.0.unproven.push(info);
    let Plan::Blocked { status, .. } = run(&cr, &facts) else {
        panic!("an unproven object under a rendered name blocks the install");
    };
    assert_eq!(
        (status.state, status.reason),
        (State::Warning, Reason::ObjectNotOwned)
    );
    assert!(
        status
            .description
            .contains("ConfigMap kyma-system/connectivity-proxy-info")
            && status.description.contains("ownership proof"),
        "{}",
        status.description
    );
}

#[test]
fn an_audit_log_secret_is_projected_only_with_its_owners_consent() {
    let mut spec = default_spec();
    spec["secretConfig"]["integration"]["auditlogService"] = json!({"secretName": "audit"});
    let cr = mk_cr(spec);
    let projected = |i: &Install| {
        let sts = i
            .writes
            .iter()
            .find(|w| w.desired.kind == Kind::StatefulSet)
            .map(|w| w.desired.body.to_string())
            .unwrap_or_default();
        sts.contains("\"audit\"")
    };
    let secret = |labels: serde_json::Value| -> k8s_openapi::api::core::v1::Secret {
        serde_json::from_value(
            json!({"metadata": {"name": "audit", "namespace": "kyma-system",
            "labels": labels}, "data": {"k": "dg=="}}),
        )
        .expect("secret")
    };
    // Absent, not opted in, another module's: one message, no projection, everything else applied.
    let mut messages = std::collections::BTreeSet::new();
    for s in [
        None,
        Some(secret(json!({}))),
        Some(secret(json!({cp_api::keys::USABLE_BY_PROXY_LABEL: "true",
            names::LABEL_MODULE: "telemetry"}))),
    ] {
        let facts = TestFacts::ready().with(|f| f.auditlog_secret = s);
        let i = install(run(&cr, &facts));
        assert!(!projected(&i), "projected without consent");
        assert_eq!(
            (i.status.state, i.status.reason),
            (State::Warning, Reason::AuditLogSecretNotUsable)
        );
        messages.insert(i.status.description.clone());
    }
    assert_eq!(messages.len(), 1, "{messages:?}");
    let msg = messages.into_iter().next().unwrap_or_default();
    assert!(
        msg.contains("kubectl label secret audit -n kyma-system"),
        "{msg}"
    );
    // With the label: projected, and the status is the usual one.
    let facts = TestFacts::ready().with(|f| {
        f.auditlog_secret = Some(secret(json!({cp_api::keys::USABLE_BY_PROXY_LABEL: "true"})))
    });
    let i = install(run(&cr, &facts));
    assert!(projected(&i));
    assert_ne!(i.status.reason, Reason::AuditLogSecretNotUsable);
}

#[test]
fn a_new_statefulset_spec_is_rolling_out_not_ready() {
    let cr = mk_default_cr();
    let mut facts = TestFacts::ready().applied(&cr);
    let key = in_kyma_system(Kind::StatefulSet, names::STATEFULSET);
    facts.0.owned.get_mut(&key).expect("sts").data["spec"]["replicas"] = json!(7);
    let i = install(run(&cr, &facts));
    assert_eq!(i.writes.len(), 1);
    assert_eq!(
        (i.status.state, i.status.reason),
        (State::Processing, Reason::StatefulSetNotReady)
    );
    assert!(
        i.status.description.contains("rolled out"),
        "{}",
        i.status.description
    );
}

#[test]
fn every_blocked_state_and_reason() {
    let resync = Some(settings().resync);
    let cr = mk_default_cr();
    let elsewhere = {
        let mut c = mk_default_cr();
        c.metadata.namespace = Some("default".into());
        c
    };
    let long_domain = format!("{}.example.org", "a".repeat(60));
    let cases: Vec<Case> = vec![
        (
            "another CR is active",
            &cr,
            TestFacts::ready()
                .with(|f| f.other_primary = Some(("kyma-system".into(), "older".into()))),
            (State::Warning, Reason::DuplicateConnectivityProxy, resync),
        ),
        (
            "outside kyma-system",
            &elsewhere,
            TestFacts::ready(),
            (State::Warning, Reason::OutsideModuleNamespace, resync),
        ),
        (
            "Istio missing",
            &cr,
            TestFacts::ready()
                .with(|f| f.apis.missing_istio = vec!["gateways.networking.istio.io".into()]),
            (State::Warning, Reason::IstioCRDsMissing, resync),
        ),
        (
            "BTP operator missing",
            &cr,
            TestFacts::ready().with(|f| {
                f.apis.missing_btp = vec!["servicebindings.services.cloud.sap.com".into()]
            }),
            (State::Warning, Reason::BTPOperatorCRDsMissing, resync),
        ),
        (
            "no cluster domain",
            &cr,
            TestFacts::ready().with(|f| f.cluster_domain = None),
            (State::Warning, Reason::ExternalHostUnresolved, resync),
        ),
        (
            "host too long",
            &cr,
            TestFacts::ready().with(|f| f.cluster_domain = Some(long_domain.clone())),
            (State::Error, Reason::ExternalHostTooLong, resync),
        ),
        (
            "binding being created",
            &cr,
            TestFacts::ready().with(|f| f.binding = None),
            (
                State::Processing,
                Reason::ServiceKeyPending,
                Some(KEY_RECHECK),
            ),
        ),
        (
            "binding not ready",
            &cr,
            TestFacts::ready().with(|f| f.binding = Some(mk_binding(Some(false)))),
            (
                State::Processing,
                Reason::ServiceKeyPending,
                Some(KEY_RECHECK),
            ),
        ),
        (
            "binding without conditions",
            &cr,
            TestFacts::ready().with(|f| f.binding = Some(mk_binding(None))),
            (
                State::Processing,
                Reason::ServiceKeyPending,
                Some(KEY_RECHECK),
            ),
        ),
        (
            "binding Secret without the key",
            &cr,
            TestFacts::ready().with(|f| f.key_secret = Some(mk_key_secret(false))),
            (
                State::Processing,
                Reason::ServiceKeyPending,
                Some(KEY_RECHECK),
            ),
        ),
        (
            "CA endpoint down",
            &cr,
            TestFacts::ready()
                .with(|f| f.connectivity_ca = ConnectivityCa::Failed("connection refused".into())),
            (
                State::Warning,
                Reason::ConnectivityCAUnavailable,
                Some(OUTSIDE_RECHECK),
            ),
        ),
        (
            "key without a CA URL",
            &cr,
            TestFacts::ready()
                .with(|f| f.connectivity_ca = ConnectivityCa::Unusable("no url".into())),
            (
                State::Warning,
                Reason::ConnectivityCAUnavailable,
                Some(OUTSIDE_RECHECK),
            ),
        ),
        (
            "StatefulSet absent",
            &cr,
            TestFacts::ready().with(|f| f.statefulset = None),
            (
                State::Processing,
                Reason::StatefulSetNotReady,
                Some(NOT_READY_RECHECK),
            ),
        ),
        (
            "generation not observed",
            &cr,
            TestFacts::ready().with(|f| f.statefulset = Some(mk_statefulset(2, 1, 1))),
            (
                State::Processing,
                Reason::StatefulSetNotReady,
                Some(NOT_READY_RECHECK),
            ),
        ),
        (
            "pod failing",
            &cr,
            TestFacts::ready().with(|f| {
                f.statefulset = Some(mk_statefulset(1, 1, 0));
                f.pod_problem = Some("init container failed".into());
            }),
            (
                State::Warning,
                Reason::ProxyPodFailing,
                Some(NOT_READY_RECHECK),
            ),
        ),
        (
            "ready",
            &cr,
            TestFacts::ready(),
            (State::Ready, Reason::StatefulSetReady, None),
        ),
    ];
    for (what, cr, facts, (state, reason, requeue)) in cases {
        // Every object written already: the status follows from the facts, not from a rollout.
        let facts = facts.applied(cr);
        let (got_state, got_reason, got_requeue) = outcome(&run(cr, &facts));
        assert_eq!((got_state, got_reason), (state, reason), "{what}");
        if let Some(r) = requeue {
            assert_eq!(got_requeue, Some(r), "{what}");
        }
    }
}

#[test]
fn a_missing_dependency_applies_nothing() {
    let facts = TestFacts::ready()
        .with(|f| f.apis.missing_istio = vec!["gateways.networking.istio.io".into()]);
    let Plan::Blocked { status, .. } = run(&mk_default_cr(), &facts) else {
        panic!("blocked")
    };
    assert!(
        status.description.contains("nothing was applied"),
        "{}",
        status.description
    );
}

#[test]
fn crs_outside_kyma_system_turn_ready_into_a_warning_naming_them_and_the_command() {
    let cr = mk_default_cr();
    let outside: Vec<(String, String)> = (0..12)
        .map(|i| (format!("team-{i:02}"), format!("cr-{i}")))
        .collect();
    let facts = TestFacts::ready().with(|f| f.outside = outside.clone());
    let i = install(run(&cr, &facts.applied(&cr)));
    assert_eq!(
        (i.status.state, i.status.reason),
        (
            State::Warning,
            Reason::ConnectivityProxiesOutsideModuleNamespace
        ),
        "{}",
        i.status.description
    );
    let d = &i.status.description;
    assert!(
        d.contains("block the module's removal")
            && d.contains(": team-00/cr-0, team-01/cr-1,")
            && d.contains("team-09/cr-9, and 2 more;")
            && !d.contains("team-10")
            && d.contains(
                "kubectl delete connectivityproxies.connectivityproxy.sap.com -n team-00 cr-0"
            ),
        "{d}"
    );
    // Everything is still applied and the Ready condition holds: only the state warns.
    assert!(
        i.status
            .conditions
            .iter()
            .any(|c| c.type_ == types::READY && c.status == "True"),
        "{:?}",
        i.status.conditions
    );
    // Not Ready for another reason: that reason stays first.
    let facts = TestFacts::ready().with(|f| {
        f.outside = outside;
        f.statefulset = None;
    });
    let i = install(run(&cr, &facts.applied(&cr)));
    assert_eq!(i.status.reason, Reason::StatefulSetNotReady);
}

/// A mapping whose entry takes about 2 KiB (16 long location ids).
fn mk_big_mapping(name: &str) -> Arc<ServiceMapping> {
    let locations: Vec<String> = (0..16)
        .map(|j| format!("{name}-{j:02}-{}", "x".repeat(100)))
        .collect();
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": name},
            "spec": {"type": "TCP", "serviceId": name, "internalAddress": "host.example.org:8080",
                "locationIds": locations}
        }))
        .expect("mapping"),
    )
}

/// The mapping shard ConfigMaps an install plan writes, by name.
fn shard_writes(i: &Install) -> Vec<&str> {
    i.writes
        .iter()
        .filter(|w| names::MAPPING_SHARD_CONFIGMAPS.contains(&w.desired.name.as_str()))
        .map(|w| w.desired.name.as_str())
        .collect()
}

#[test]
fn mappings_near_the_budget_of_all_shards_warn_and_everything_is_still_applied() {
    let cr = mk_default_cr();
    let many = |n: usize| {
        (0..n)
            .map(|i| mk_big_mapping(&format!("m-{i:05}")))
            .collect()
    };
    let facts = TestFacts::ready().with(|f| set_mappings(f, many(5600)));
    let first = install(run(&cr, &facts));
    assert_eq!(first.mapping_shards, 16);
    assert_eq!(shard_writes(&first).len(), 16, "every shard is written");
    // Once applied and rolled out: Ready, but for the budget.
    let i = install(run(&cr, &facts.applied(&cr)));
    assert_eq!(
        (i.status.state, i.status.reason),
        (State::Warning, Reason::ServiceMappingsNearLimit),
        "{}",
        i.status.description
    );
    assert!(
        i.status
            .description
            .contains("% of the 13056 KiB the 16 ConfigMaps")
            && i.status
                .description
                .contains("delete those you no longer need"),
        "{}",
        i.status.description
    );
    // Below 80 %: Ready.
    let facts = TestFacts::ready().with(|f| set_mappings(f, many(4000)));
    let i = install(run(&cr, &facts.applied(&cr)));
    assert_eq!(i.status.state, State::Ready, "{}", i.status.description);
}

#[test]
fn a_shard_that_does_not_fit_keeps_its_last_configmap() {
    // Names that all land in the first of two shards: the split cannot help, that shard overflows.
    let cr = mk_default_cr();
    let names: Vec<String> = (0..)
        .map(|i| format!("skewed-{i:05}"))
        .filter(|n| cp_api::mapping::shard_of(n, 2) == 0)
        .take(520)
        .collect();
    let facts = TestFacts::ready()
        .with(|f| set_mappings(f, names.iter().map(|n| mk_big_mapping(n)).collect()));
    let i = install(run(&cr, &facts));
    assert_eq!(i.mapping_shards, 2);
    assert_eq!(
        (i.status.state, i.status.reason),
        (State::Warning, Reason::ServiceMappingsTooLarge)
    );
    assert!(
        i.status
            .description
            .contains("ConfigMap connectivity-proxy-service-mappings (")
            && i.status.description.contains("limit 960 KiB"),
        "{}",
        i.status.description
    );
    assert_eq!(
        shard_writes(&i),
        vec!["connectivity-proxy-service-mappings-1"],
        "the first shard is not written, the other one is"
    );
    let applied = facts.applied(&cr);
    let cm = in_kyma_system(Kind::ConfigMap, names::CONFIGMAP_SERVICE_MAPPINGS);
    assert!(
        !install(run(&cr, &applied))
            .prune
            .iter()
            .any(|p| p.key() == cm),
        "nor pruned"
    );
}

/// The names in every shard ConfigMap an install plan writes.
fn names_in_shards(i: &Install) -> Vec<String> {
    let mut all: Vec<String> = i
        .writes
        .iter()
        .filter(|w| names::MAPPING_SHARD_CONFIGMAPS.contains(&w.desired.name.as_str()))
        .flat_map(|w| {
            let data = w.body().body["data"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert_eq!(data.len(), 1, "one key per shard");
            let text = data
                .values()
                .next()
                .and_then(|v| v.as_str())
                .unwrap_or("[]")
                .to_string();
            let list: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON list");
            list.into_iter()
                .map(|e| e["name"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    all.sort();
    all
}

#[test]
fn mappings_past_one_configmap_are_split_and_one_change_rewrites_one_shard() {
    let cr = mk_default_cr();
    let mappings: Vec<Arc<ServiceMapping>> = (0..7000).map(mk_mapping).collect();
    let facts = TestFacts::ready().with(|f| set_mappings(f, mappings.clone()));
    let i = install(run(&cr, &facts));
    assert_eq!(i.mapping_shards, 2, "{} bytes", i.mapping_bytes);
    assert_eq!(
        shard_writes(&i),
        vec![
            "connectivity-proxy-service-mappings",
            "connectivity-proxy-service-mappings-1"
        ]
    );
    let mut want: Vec<String> = mappings.iter().map(|m| m.name_any()).collect();
    want.sort();
    assert_eq!(
        names_in_shards(&i),
        want,
        "every mapping in exactly one shard"
    );
    // Applied: nothing to write. One more mapping: one shard is written, and only it.
    let applied = facts.applied(&cr);
    assert_eq!(
        shard_writes(&install(run(&cr, &applied))),
        Vec::<&str>::new()
    );
    let mut plus_one = mappings.clone();
    plus_one.push(mk_mapping(7000));
    let more = TestFacts(applied.0.clone()).with(|f| set_mappings(f, plus_one));
    let one = install(run(&cr, &more));
    let shard = cp_api::mapping::shard_of(&mk_mapping(7000).name_any(), 2);
    assert_eq!(
        shard_writes(&one),
        vec![names::MAPPING_SHARD_CONFIGMAPS[shard]]
    );
    assert!(one.prune.is_empty());
    // While the shards' write rate holds them back: neither written nor pruned, and the reconcile
    // comes back when they may go out.
    let mut plus_held = mappings.clone();
    plus_held.push(mk_mapping(7001));
    let held = TestFacts(applied.0.clone()).with(|f| {
        set_mappings(f, plus_held);
        f.mappings.hold = Some(Duration::from_millis(300));
    });
    let waiting = install(run(&cr, &held));
    assert_eq!(shard_writes(&waiting), Vec::<&str>::new());
    assert!(
        waiting.requeue <= Duration::from_millis(300),
        "{:?}",
        waiting.requeue
    );
    let thinned_held = TestFacts(applied.0.clone()).with(|f| {
        set_mappings(f, mappings[..2000].to_vec());
        f.mappings.hold = Some(Duration::from_millis(300));
    });
    let kept = install(run(&cr, &thinned_held));
    assert!(
        kept.prune.is_empty(),
        "no shard pruned while held: {:?}",
        kept.prune
    );
    assert_eq!(shard_writes(&kept), Vec::<&str>::new());
    // Thinned out below half of one ConfigMap: one shard again, the other pruned.
    let fewer = TestFacts(applied.0.clone()).with(|f| set_mappings(f, mappings[..2000].to_vec()));
    let back = install(run(&cr, &fewer));
    assert_eq!(back.mapping_shards, 1);
    assert_eq!(shard_writes(&back), vec![names::CONFIGMAP_SERVICE_MAPPINGS]);
    let pruned = in_kyma_system(Kind::ConfigMap, names::MAPPING_SHARD_CONFIGMAPS[1]);
    assert!(
        back.prune.iter().any(|p| p.key() == pruned),
        "{:?}",
        back.prune
    );
}

#[test]
fn a_failed_ca_fetch_keeps_the_previous_ca_secret() {
    let cr = mk_default_cr();
    let applied = TestFacts::ready().applied(&cr);
    let failed = TestFacts(applied.0.clone())
        .with(|f| f.connectivity_ca = ConnectivityCa::Failed("timeout".into()));
    let i = install(run(&cr, &failed));
    assert!(i.prune.is_empty(), "the cacert Secret stays: {:?}", i.prune);
    assert!(i.writes.is_empty());
}

#[test]
fn the_cr_is_written_first_finalizer_and_release_defaults() {
    let mut cr = mk_default_cr();
    cr.metadata.finalizers = None;
    assert!(
        matches!(run(&cr, &TestFacts::ready()), Plan::UpdateCr(p) if matches!(p[..], [CrPatch::Finalizer(_)]))
    );
    cr.metadata.finalizers = Some(vec!["someone/else".into()]);
    let Plan::UpdateCr(p) = run(&cr, &TestFacts::ready()) else {
        panic!("update")
    };
    assert_eq!(
        p,
        vec![CrPatch::Finalizer(
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": names::FINALIZER}])
        )]
    );
    let mut old = mk_default_cr();
    old.metadata.annotations = None;
    let Plan::UpdateCr(p) = run(&old, &TestFacts::ready()) else {
        panic!("update")
    };
    assert!(matches!(p[..], [CrPatch::ReleaseDefaults(_)]));
}

#[test]
fn a_legacy_installation_is_taken_over_first() {
    let cr = mk_default_cr();
    let legacy = TestFacts::ready().with(|f| f.legacy_statefulset = true);
    assert_eq!(
        run(&cr, &legacy),
        Plan::Migrate(Box::new(crate::migration::Step::Start))
    );
    let mut in_progress = mk_default_cr();
    in_progress
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(
            cp_api::keys::MIGRATION_ANNOTATION.into(),
            "in-progress".into(),
        );
    assert!(matches!(
        run(&in_progress, &TestFacts::ready()),
        Plan::Migrate(_)
    ));
    let mut done = mk_default_cr();
    done.metadata
        .annotations
        .get_or_insert_default()
        .insert(cp_api::keys::MIGRATION_ANNOTATION.into(), "done".into());
    assert!(matches!(run(&done, &TestFacts::ready()), Plan::Install(_)));
}

#[test]
fn migration_steps_report_processing_and_blockers_warn() {
    use crate::migration::{Blocker, Outcome};
    assert_eq!(migration_status(&Outcome::NotNeeded), None);
    let (c, after) =
        migration_status(&Outcome::Progressed(Reason::LegacyInstallationDetected)).expect("status");
    assert_eq!(
        (c.state, c.reason, after),
        (
            State::Processing,
            Reason::LegacyInstallationDetected,
            NEXT_STEP
        )
    );
    let blockers = vec![Blocker {
        subject: "ConfigMap x".into(),
        message: "unreadable".into(),
    }];
    let (c, _) = migration_status(&Outcome::Blocked(blockers)).expect("status");
    assert_eq!(
        (c.state, c.reason),
        (State::Warning, Reason::LegacyMigrationBlocked)
    );
}

#[test]
fn failed_writes_name_the_object_and_who_must_act() {
    let i = install(run(&mk_default_cr(), &TestFacts::ready()));
    let (c, after) = apply_failed(&i, &crate::Error::NotOurs("Service kyma-system/x".into()));
    assert_eq!(
        (c.state, c.reason, after),
        (
            State::Warning,
            Reason::ObjectNotOwned,
            Some(OUTSIDE_RECHECK)
        )
    );
    assert!(c.description.contains("Service kyma-system/x"));
    let (c, after) = apply_failed(
        &i,
        &crate::Error::Invalid("namespace istio-system does not exist".into()),
    );
    assert_eq!(
        (c.state, c.reason, after),
        (State::Error, Reason::ApplyFailed, None)
    );
}

#[test]
fn a_rotated_key_or_certificate_changes_the_pod_template_hash() {
    let key = crate::btp::ServiceKey::parse(b"{}".to_vec()).expect("key");
    let other = crate::btp::ServiceKey::parse(b"{\"a\":1}".to_vec()).expect("key");
    assert_eq!(secrets_hash(None, None), None);
    assert_ne!(
        secrets_hash(None, Some(&key)),
        secrets_hash(None, Some(&other))
    );
    let tls: Secret = serde_json::from_value(json!({"data": {"tls.crt": "YQ=="}})).expect("secret");
    assert_ne!(
        secrets_hash(Some(&tls), Some(&key)),
        secrets_hash(None, Some(&key))
    );
}

fn mk_mapping_at(
    name: &str,
    created: &str,
    subaccount: &str,
    service: &str,
) -> Arc<ServiceMapping> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
            "spec": {"type": "RFC", "subaccountId": subaccount, "serviceId": service,
                "internalAddress": format!("{name}.apps:3300")}
        }))
        .expect("mapping"),
    )
}

/// The names the mappings ConfigMap of an install plan publishes.
fn published(i: &Install) -> Vec<String> {
    let cm = i
        .writes
        .iter()
        .find(|w| w.desired.name == names::CONFIGMAP_SERVICE_MAPPINGS)
        .expect("the mappings ConfigMap is written");
    let json = cm.body().body["data"][names::CONFIGMAP_SERVICE_MAPPINGS_KEY]
        .as_str()
        .expect("servicemappings")
        .to_string();
    let entries: Vec<serde_json::Value> = serde_json::from_str(&json).expect("json");
    entries
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect()
}

#[test]
fn duplicate_mappings_publish_only_the_oldest_and_warn() {
    let cr = mk_default_cr();
    let mappings = vec![
        // Younger, but first by name.
        mk_mapping_at("a-newer", "2026-01-02T00:00:00Z", "sub-1", "erp"),
        mk_mapping_at("z-oldest", "2026-01-01T00:00:00Z", "sub-1", "erp"),
        // The same key up to case and surrounding whitespace.
        mk_mapping_at("m-case", "2026-01-03T00:00:00Z", " SUB-1 ", "ERP\t"),
        mk_mapping_at("other", "2026-01-04T00:00:00Z", "sub-1", "crm"),
    ];
    let facts = TestFacts::ready().with(|f| set_mappings(f, mappings));
    let i = install(run(&cr, &facts));
    assert_eq!(published(&i), vec!["other", "z-oldest"]);
    assert_eq!(
        (i.status.state, i.status.reason),
        (State::Warning, Reason::DuplicateServiceMappings)
    );
    for name in ["a-newer", "m-case", "z-oldest"] {
        assert!(
            i.status.description.contains(name),
            "{name} in {}",
            i.status.description
        );
    }
}

fn mk_user_key_cr() -> ConnectivityProxy {
    let mut spec = default_spec();
    spec["secretConfig"]["integration"]["connectivityService"]["secretName"] = json!("users-key");
    mk_cr(spec)
}

fn mk_user_secret(data: serde_json::Value) -> Secret {
    serde_json::from_value(
        json!({"metadata": {"name": "users-key", "namespace": "kyma-system",
            "labels": {cp_api::keys::USABLE_BY_PROXY_LABEL: "true"}},
        "data": data}),
    )
    .expect("secret")
}

#[test]
fn an_unusable_service_key_is_a_warning_that_names_the_secret_and_the_key() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cr = mk_user_key_cr();
    let good = r#"{"clientid":"c","subaccount_id":"sub-1","connectivity_service":{"CAs_path":"/api/v1/CAs","url":"https://ca.example.org"}}"#;
    let cases: Vec<(&str, Option<Secret>, &[&str])> = vec![
        (
            "the Secret does not exist",
            None,
            &[
                "Secret kyma-system/users-key",
                "is not usable by the proxy",
                "service_key",
            ],
        ),
        (
            "no service_key in it",
            Some(mk_user_secret(json!({"credentials": b64(good)}))),
            &["Secret kyma-system/users-key", "no key service_key"],
        ),
        (
            "not JSON",
            Some(mk_user_secret(json!({"service_key": b64("clientid=x")}))),
            &["Secret kyma-system/users-key", "service_key", "JSON"],
        ),
        (
            "JSON but not an object",
            Some(mk_user_secret(json!({"service_key": b64("\"clientid\"")}))),
            &["Secret kyma-system/users-key", "service_key", "JSON object"],
        ),
    ];
    for (what, secret, texts) in cases {
        let facts = TestFacts::ready()
            .with(|f| {
                f.binding = None;
                f.key_secret = secret;
            })
            .applied(&cr);
        let (state, reason, _) = outcome(&run(&cr, &facts));
        assert_eq!(
            (state, reason),
            (State::Warning, Reason::ServiceKeyInvalid),
            "{what}"
        );
        let Plan::Blocked { status, .. } = run(&cr, &facts) else {
            panic!("{what}: nothing is applied")
        };
        for t in texts {
            assert!(
                status.description.contains(t),
                "{what}: {t:?} in {}",
                status.description
            );
        }
        assert!(
            !status.description.contains("clientid=x"),
            "{what}: the key's content is never quoted"
        );
    }
    // A usable key in the user's Secret: Ready.
    let facts = TestFacts::ready()
        .with(|f| {
            f.binding = None;
            f.key_secret = Some(mk_user_secret(json!({"service_key": b64(good)})));
        })
        .applied(&cr);
    assert_eq!(outcome(&run(&cr, &facts)).0, State::Ready);
    // secretData that is not a service key.
    let mut inline = default_spec();
    inline["secretConfig"]["integration"]["connectivityService"] =
        json!({"secretName": "inline-key", "secretData": b64("not json")});
    let cr = mk_cr(inline);
    let facts = TestFacts::ready().applied(&cr);
    let (state, reason, _) = outcome(&run(&cr, &facts));
    assert_eq!((state, reason), (State::Warning, Reason::ServiceKeyInvalid));
}
