//! Install, configure, repair, refuse duplicates, stay quiet, delete.

use std::time::{Duration, Instant};

use cp_api::kinds::Kind;
use cp_api::{ConnectivityProxy, State};
use cp_tests::controller::CONTROLLER_USER;
use cp_tests::fixtures::secret;
use cp_tests::support::*;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

async fn get(admin: &Client, kind: Kind, ns: Option<&str>, name: &str) -> Option<DynamicObject> {
    let ar = kind.api_resource();
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    api.get_opt(name).await.expect("get")
}

const MANAGED: [(Kind, Option<&str>, &str); 11] = [
    (Kind::StatefulSet, Some(NS), "connectivity-proxy"),
    (Kind::Service, Some(NS), "connectivity-proxy"),
    (Kind::Service, Some(NS), "connectivity-proxy-tunnel"),
    (
        Kind::Service,
        Some(NS),
        "connectivity-proxy-tunnel-healthcheck",
    ),
    (Kind::ConfigMap, Some(NS), "connectivity-proxy"),
    (Kind::ConfigMap, Some(NS), "connectivity-proxy-info"),
    (
        Kind::ConfigMap,
        Some(NS),
        "connectivity-proxy-service-mappings",
    ),
    (Kind::Gateway, Some(NS), "connectivity-proxy-tunnel"),
    (Kind::VirtualService, Some(NS), "connectivity-proxy-tunnel"),
    (Kind::DestinationRule, Some(NS), "connectivity-proxy-tunnel"),
    (
        Kind::PriorityClass,
        None,
        "connectivity-proxy-priority-class",
    ),
];

/// `Ok(Some(()))` once every managed object exists (`present`), or none does; else the first that
/// does not follow.
async fn managed_objects(admin: &Client, present: bool) -> Result<Option<()>, String> {
    for (kind, ns, name) in MANAGED {
        if get(admin, kind, ns, name).await.is_some() != present {
            let state = if present { "missing" } else { "still there" };
            return Err(format!("{kind:?} {name} {state}"));
        }
    }
    Ok(Some(()))
}

async fn wait_all_exist(admin: &Client) {
    let what = "every managed object exists";
    cp_tests::wait::until(what, Duration::from_secs(15), || async move {
        let Err(missing) = managed_objects(admin, true).await else {
            return Ok(Some(()));
        };
        let crs: Api<ConnectivityProxy> = Api::all(admin.clone());
        let crs = crs.list(&Default::default()).await.map(|l| l.items);
        let status: Vec<_> = crs
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.status)
            .collect();
        Err(format!("{missing}; CR status: {status:?}"))
    })
    .await
    .expect("objects");
}

/// [`scenario_with_cr`] with every managed object there and the CR Ready.
async fn installed_and_ready() -> Env {
    let env = scenario_with_cr().await;
    wait_all_exist(&env.admin).await;
    make_ready(&env.admin, NS, CR).await;
    env
}

#[tokio::test]
async fn default_cr_installs_everything_and_becomes_ready() {
    let admin = &scenario_with_cr().await.admin;
    wait_all_exist(admin).await;
    cr_state(admin, State::Processing, "ServiceKeyPending", 15).await;
    play_btp_operator(admin, NS, CR).await;
    let cr = cr_state(admin, State::Processing, "StatefulSetNotReady", 15).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let yml = proxy_config_yml(cms.get(CR).await.expect("cm"));
    assert!(
        yml.contains(SUBACCOUNT) && yml.contains(SUBDOMAIN),
        "subaccount from the binding: {yml}"
    );
    let key: k8s_openapi::api::core::v1::Secret = Api::namespaced(admin.clone(), NS)
        .get("connectivity-proxy-service-key")
        .await
        .expect("service key Secret");
    assert!(
        key.data.unwrap_or_default().contains_key("service_key"),
        "service key mounted for the proxy"
    );
    let cacert: k8s_openapi::api::core::v1::Secret = Api::namespaced(admin.clone(), "istio-system")
        .get("cp-tls-connectivity-proxy-kyma-system-cacert")
        .await
        .expect("cacert Secret");
    let pem = cacert
        .data
        .unwrap_or_default()
        .get("cacert")
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .unwrap_or_default();
    assert!(
        pem.contains("BEGIN CERTIFICATE"),
        "the Connectivity CA was fetched: {pem}"
    );
    assert!(
        cr.finalizers()
            .iter()
            .any(|f| f == cp_api::names::FINALIZER),
        "finalizer added"
    );

    let gw = get(admin, Kind::Gateway, Some(NS), "connectivity-proxy-tunnel")
        .await
        .expect("gateway");
    assert_eq!(
        gw.data["spec"]["servers"][0]["hosts"][0],
        format!("cp.{DOMAIN}")
    );
    assert_eq!(gw.data["spec"]["servers"][0]["tls"]["mode"], "MUTUAL");
    let vs = get(
        admin,
        Kind::VirtualService,
        Some(NS),
        "connectivity-proxy-tunnel",
    )
    .await
    .expect("vs");
    assert_eq!(vs.data["spec"]["hosts"][0], format!("cp.{DOMAIN}"));
    let cfg = get(admin, Kind::ConfigMap, Some(NS), "connectivity-proxy")
        .await
        .expect("config");
    let yml = cfg.data["data"]["connectivity-proxy-config.yml"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(yml.contains(&format!("externalHost: cp.{DOMAIN}")), "{yml}");
    let info = get(admin, Kind::ConfigMap, Some(NS), "connectivity-proxy-info")
        .await
        .expect("info");
    assert_eq!(info.data["data"]["onpremise_proxy_http_port"], "20003");
    let sts = get(admin, Kind::StatefulSet, Some(NS), "connectivity-proxy")
        .await
        .expect("sts");
    assert_eq!(
        sts.metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.as_str()),
        Some("ConnectivityProxy")
    );
    assert_eq!(
        sts.data["spec"]["template"]["spec"]["containers"][0]["image"],
        "docker.io/sapse/connectivity-proxy:2.11.0"
    );
    for (kind, ns, name) in MANAGED {
        let o = get(admin, kind, ns, name).await.expect("object");
        let labels = o.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("connectivity-proxy-operator"),
            "{name}"
        );
        assert_eq!(
            labels.get("kyma-project.io/module").map(String::as_str),
            Some("connectivity-proxy"),
            "{name}"
        );
    }

    mark_statefulset_ready(admin, NS).await;
    let cr = cr_state(admin, State::Ready, "StatefulSetReady", 10).await;
    let status = cr.status.expect("status");
    assert_eq!(status.observed_generation, cr.metadata.generation);
    for c in &status.conditions {
        assert_eq!(c.observed_generation, cr.metadata.generation, "{}", c.type_);
        assert_eq!(c.status, "True", "{} {}", c.type_, c.reason);
    }
    // An Event marks the state change.
    let reason =
        |e: &k8s_openapi::api::events::v1::Event| e.reason.as_deref() == Some("StatefulSetReady");
    cp_tests::wait::event(
        admin,
        NS,
        "an Event for the CR",
        Duration::from_secs(10),
        reason,
    )
    .await
    .expect("event");
}

#[tokio::test]
async fn missing_istio_is_a_warning_until_it_is_installed() {
    let admin = &scenario().await.admin;
    let description =
        default_cr_without_crds(admin, &cp_api::names::ISTIO_CRDS, "IstioCRDsMissing").await;
    for crd in cp_api::names::ISTIO_CRDS {
        assert!(
            description.contains(crd),
            "description names {crd}: {description}"
        );
    }
    assert!(
        get(admin, Kind::StatefulSet, Some(NS), "connectivity-proxy")
            .await
            .is_none(),
        "nothing applied"
    );
    install_istio(admin).await;
    wait_all_exist(admin).await;
    make_ready(admin, NS, CR).await;
}

/// Whether every one of the module's NetworkPolicies exists (`true`) or none does (`false`).
async fn network_policies_are(admin: &Client, present: bool) -> Result<Option<()>, String> {
    let mut found = Vec::new();
    for name in cp_api::names::NETWORK_POLICIES {
        if get(admin, Kind::NetworkPolicy, Some(NS), name)
            .await
            .is_some()
        {
            found.push(name);
        }
    }
    let want = if present {
        cp_api::names::NETWORK_POLICIES.len()
    } else {
        0
    };
    if found.len() == want {
        Ok(Some(()))
    } else {
        Err(format!("present: {found:?}"))
    }
}

#[tokio::test]
async fn network_policies_are_applied_and_one_annotation_switches_them_off() {
    let admin = &scenario_with_cr().await.admin;
    let wait = |present: bool, what: &'static str| {
        cp_tests::wait::until(what, Duration::from_secs(15), move || {
            network_policies_are(admin, present)
        })
    };
    if let Err(e) = wait(true, "every NetworkPolicy applied").await {
        let status = Api::<ConnectivityProxy>::namespaced(admin.clone(), NS)
            .get("connectivity-proxy")
            .await
            .map(|c| c.status);
        panic!("{e}; CR status: {status:?}");
    }
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let key = cp_api::keys::DISABLE_NETWORK_POLICIES_ANNOTATION;
    for (value, present, what) in [
        (json!("true"), false, "the NetworkPolicies removed"),
        (json!(null), true, "the NetworkPolicies back"),
    ] {
        crs.patch(
            "connectivity-proxy",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .expect("annotate");
        wait(present, what).await.expect(what);
    }
}

#[tokio::test]
async fn changes_propagate_and_drift_is_repaired() {
    let env = installed_and_ready().await;
    let admin = &env.admin;

    let start = Instant::now();
    set_http_port(admin, NS, CR, 20555).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let svcs: Api<Service> = Api::namespaced(admin.clone(), NS);
    let what = "the port change reaches the ConfigMap and Service";
    cp_tests::wait::until(what, Duration::from_secs(5), || async {
        let port = info_http_port(&cms).await?;
        let svc = svcs.get(CR).await.map_err(|e| e.to_string())?;
        let ports = svc.spec.and_then(|s| s.ports).unwrap_or_default();
        let has = ports.iter().any(|p| p.port == 20555);
        Ok((port == "20555" && has).then_some(()))
    })
    .await
    .expect("propagated");
    println!(
        "CR edit reached the ConfigMap and Service in {:?}",
        start.elapsed()
    );

    // A deleted managed Service comes back.
    svcs.delete("connectivity-proxy-tunnel", &DeleteParams::default())
        .await
        .expect("delete service");
    cp_tests::wait::present(&svcs, "connectivity-proxy-tunnel", Duration::from_secs(5))
        .await
        .expect("the deleted Service is recreated");

    // A hand edit of a managed ConfigMap is reverted.
    let hack = json!({"data": {"onpremise_proxy_http_port": "1"}});
    cms.patch(
        "connectivity-proxy-info",
        &PatchParams::default(),
        &Patch::Merge(&hack),
    )
    .await
    .expect("hand edit");
    cp_tests::wait::until(
        "the hand edit is reverted",
        Duration::from_secs(5),
        || async { Ok((info_http_port(&cms).await? == "20555").then_some(())) },
    )
    .await
    .expect("reverted");

    // The BTP operator rotates the credentials: the proxy's pods restart (the pod template's hash of
    // the Secrets changes).
    let template_hash = || async {
        let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), NS);
        sts.get("connectivity-proxy")
            .await
            .expect("sts")
            .spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .and_then(|a| a.get("connectivityproxy.sap.com/secrets-hash").cloned())
    };
    let before = template_hash()
        .await
        .expect("the pod template carries the Secrets' hash");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), NS);
    let binding_secret = cp_api::names::binding_secret_name("connectivity-proxy", NS);
    let old = secrets.get(&binding_secret).await.expect("binding secret");
    let key = old
        .data
        .and_then(|d| {
            d.get("service_key")
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .expect("service_key");
    let rotated = key.replace("very-secret-value", "rotated-secret-value");
    assert_ne!(key, rotated, "the test key has the expected secret");
    secrets
        .patch(
            &binding_secret,
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"service_key": rotated}})),
        )
        .await
        .expect("rotate");
    let bindings: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), NS, &Kind::ServiceBinding.api_resource());
    bindings
        .patch_status(
            &cp_api::names::service_binding_name("connectivity-proxy", NS),
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"status": {"lastCredentialsRotationTime": "2026-11-30T12:00:00Z"}}),
            ),
        )
        .await
        .expect("binding status");
    let what = "the pod template follows the rotated key";
    cp_tests::wait::until(what, Duration::from_secs(10), || async {
        let now = template_hash().await;
        Ok((now.as_deref() != Some(before.as_str())).then_some(()))
    })
    .await
    .expect("restarted");
}

/// The controller's writes since `offset` besides its Lease, Events and the status of CR `status_of`.
fn controller_writes_since(
    env: &Env,
    offset: u64,
    status_of: &str,
) -> Vec<cp_tests::cluster::AuditWrite> {
    env.cp
        .audit_writes_since(offset)
        .expect("audit")
        .into_iter()
        .filter(|w| w.user == CONTROLLER_USER && w.resource != "leases" && w.resource != "events")
        .filter(|w| !(w.resource == "connectivityproxies/status" && w.name == status_of))
        .collect()
}

#[tokio::test]
async fn a_second_cr_gets_a_warning_and_changes_nothing() {
    let env = installed_and_ready().await;
    let admin = &env.admin;
    // A second CR in the module's namespace (one elsewhere is OutsideModuleNamespace, see below).
    let other_ns = NS.to_string();
    // The oldest CR is the primary, by creation second, then by name ("another" sorts first): the
    // second CR comes in a later second than the first.
    let first = Api::<ConnectivityProxy>::namespaced(admin.clone(), NS)
        .get("connectivity-proxy")
        .await
        .expect("CR");
    cp_tests::wait::a_second_past(&first.metadata).await;
    let offset = env.cp.audit_offset();
    create_default_cr(admin, &other_ns, "another").await;
    let within = Duration::from_secs(10);
    let warning = Some("DuplicateConnectivityProxy");
    let cr = wait_state(admin, &other_ns, "another", State::Warning, warning, within).await;
    assert!(description(&cr).contains("kyma-system/connectivity-proxy"));
    cr_state(admin, State::Ready, None, 5).await;
    let touched = controller_writes_since(&env, offset, "another");
    assert!(
        touched.is_empty(),
        "the second CR made the controller write: {touched:?}"
    );
}

#[tokio::test]
async fn the_module_cr_names_the_crs_outside_kyma_system_that_block_its_removal() {
    let env = scenario_ready().await;
    let admin = &env.admin;
    // lifecycle-manager removes the module only once no CR of its CRDs is left in any namespace.
    let other_ns = env.cp.namespace("stray").await.expect("ns");
    create_default_cr(admin, &other_ns, "stray").await;
    let d = cr_warning(admin, None, 10).await;
    assert!(
        d.contains("block the module's removal")
            && d.contains(&format!(": {other_ns}/stray;"))
            && d.contains(&format!(
                "kubectl delete connectivityproxies.connectivityproxy.sap.com -n {other_ns} stray"
            )),
        "{d}"
    );
    Api::<ConnectivityProxy>::namespaced(admin.clone(), &other_ns)
        .delete("stray", &DeleteParams::default())
        .await
        .expect("delete the stray CR");
    // Woken by the metadata watch, not by the resync.
    cr_state(admin, State::Ready, "StatefulSetReady", 10).await;
}

#[tokio::test]
async fn a_cr_outside_kyma_system_installs_nothing_and_the_token_cannot_write_there() {
    let env = scenario().await;
    let admin = &env.admin;
    let other_ns = env.cp.namespace("outside").await.expect("ns");
    let offset = env.cp.audit_offset();
    create_default_cr(admin, &other_ns, "elsewhere").await;
    let (warning, within) = (Some("OutsideModuleNamespace"), Duration::from_secs(10));
    let cr = wait_state(
        admin,
        &other_ns,
        "elsewhere",
        State::Warning,
        warning,
        within,
    )
    .await;
    let d = description(&cr);
    assert!(
        d.contains("only from a ConnectivityProxy in kyma-system"),
        "{d}"
    );
    let touched = controller_writes_since(&env, offset, "elsewhere");
    assert!(
        touched.is_empty(),
        "a CR outside kyma-system made the controller write: {touched:?}"
    );
    // What a stolen controller token can do outside kyma-system and the Istio namespace: nothing.
    let token = cp_tests::shared::operator_client().await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(token.clone(), &other_ns);
    let stolen = secret("planted", json!({"k": "v"}));
    for (what, result) in [
        (
            "create a Secret",
            secrets
                .create(&Default::default(), &stolen)
                .await
                .map(|_| ()),
        ),
        (
            "list Secrets",
            secrets.list(&Default::default()).await.map(|_| ()),
        ),
        (
            "create a namespace",
            Api::<k8s_openapi::api::core::v1::Namespace>::all(token.clone())
                .create(
                    &Default::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "planted-ns"}}))
                        .expect("ns"),
                )
                .await
                .map(|_| ()),
        ),
        (
            "create a PriorityClass of another name",
            Api::<DynamicObject>::all_with(token.clone(), &Kind::PriorityClass.api_resource())
                .create(
                    &Default::default(),
                    &serde_json::from_value(
                        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": "planted"}, "value": 1000000}),
                    )
                    .expect("pc"),
                )
                .await
                .map(|_| ()),
        ),
    ] {
        match result {
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            other => panic!("the controller's token could {what}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn steady_state_issues_no_writes() {
    let env = installed_and_ready().await;
    // Let the reconcile that follows Ready settle, then observe a window of resyncs (every 3 s).
    let settled = env
        .controller
        .metric("cp_controller_reconcile_total{result=\"success\"}")
        .await;
    cp_tests::wait::until("one more resync", Duration::from_secs(10), || async move {
        let now = env
            .controller
            .metric("cp_controller_reconcile_total{result=\"success\"}")
            .await;
        Ok((now > settled).then_some(()))
    })
    .await
    .expect("resync");
    let offset = env.cp.audit_offset();
    let before = env
        .controller
        .metric("cp_controller_reconcile_total{result=\"success\"}")
        .await;
    let writes_before = env
        .controller
        .metric_sum("cp_controller_writes_total")
        .await;
    assert!(
        writes_before > 0.0,
        "the install's writes are counted by the one writer (cp_controller_writes_total)"
    );
    tokio::time::sleep(Duration::from_secs(30)).await; // the observation window, not synchronisation
    let after = env
        .controller
        .metric("cp_controller_reconcile_total{result=\"success\"}")
        .await;
    assert!(
        after - before >= 5.0,
        "only {} reconciles in 30 s: the window saw no resyncs",
        after - before
    );
    // Reads: a steady reconcile reads its CR once (a quorum GET) and nothing else; everything else
    // comes from the watch caches. Watches and the Lease are not part of a reconcile.
    let reads: Vec<String> = env
        .cp
        .audit_requests_since(offset)
        .expect("audit")
        .into_iter()
        .filter(|r| r.user == CONTROLLER_USER && r.resource != "leases" && r.verb != "watch")
        .filter(|r| r.verb == "get" || r.verb == "list")
        .map(|r| format!("{} {}", r.verb, r.resource))
        .collect();
    let cr_reads = reads
        .iter()
        .filter(|r| *r == "get connectivityproxies")
        .count();
    let other: Vec<&String> = reads
        .iter()
        .filter(|r| *r != "get connectivityproxies")
        .collect();
    assert!(
        other.is_empty(),
        "{} reconciles read more than their CR: {other:?}",
        after - before
    );
    assert!(
        cr_reads as f64 <= after - before + 1.0,
        "{cr_reads} reads of the CR for {} reconciles",
        after - before
    );
    let writes: Vec<_> = env
        .cp
        .audit_writes_since(offset)
        .expect("audit")
        .into_iter()
        .filter(|w| w.user == CONTROLLER_USER && w.resource != "leases")
        .collect();
    assert!(
        writes.is_empty(),
        "{} reconciles, but writes: {writes:?}",
        after - before
    );
    assert_eq!(
        env.controller
            .metric_sum("cp_controller_writes_total")
            .await,
        writes_before,
        "cp_controller_writes_total moved in a steady state"
    );
    println!(
        "steady state: {} reconciles in 30 s, 0 writes (lease renewals excluded)",
        after - before
    );
}

#[tokio::test]
async fn deletion_waits_for_service_mappings_then_removes_everything() {
    let admin = &scenario_with_cr().await.admin;
    wait_all_exist(admin).await;
    create_mapping(admin, "blocker-1").await;
    create_mapping(admin, "blocker-2").await;
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    crs.delete("connectivity-proxy", &DeleteParams::default())
        .await
        .expect("delete CR");
    let d = cr_warning(admin, "DeletionBlockedByServiceMappings", 10).await;
    assert!(d.contains("blocker-1") && d.contains("blocker-2"), "{d}");
    for (kind, ns, name) in MANAGED {
        assert!(
            get(admin, kind, ns, name).await.is_some(),
            "{kind:?} {name} removed while blocked"
        );
    }
    let maps: Api<cp_api::ServiceMapping> = Api::all(admin.clone());
    for m in ["blocker-1", "blocker-2"] {
        maps.delete(m, &DeleteParams::default())
            .await
            .expect("delete mapping");
    }
    let what = "the CR and every managed object are gone";
    cp_tests::wait::until(what, Duration::from_secs(20), || async {
        if cp_tests::wait::get_opt(&crs, CR).await?.is_some() {
            return Err("CR still there".into());
        }
        managed_objects(admin, false).await
    })
    .await
    .expect("all gone");
}

#[tokio::test]
async fn a_secret_the_operator_did_not_create_is_never_written_labelled_or_deleted() {
    let admin = &scenario_ready().await.admin;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), NS);
    let precious = secret("precious", json!({"foo": "user data"}));
    secrets
        .create(&Default::default(), &precious)
        .await
        .expect("create precious");
    let before = secrets.get("precious").await.expect("precious");
    // A CR editor points the service key at it and sets secretData.
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let edit = json!({"spec": {"secretConfig": {"integration": {"connectivityService":
        {"secretName": "precious", "secretData": "eyJjbGllbnRpZCI6ICJ4In0="}}}}});
    edit_cr(admin, NS, CR, &edit, "edit").await;
    let msg = cr_warning(admin, "ObjectNotOwned", 20).await;
    assert!(msg.contains("Secret kyma-system/precious"), "{msg}");
    let after = secrets.get("precious").await.expect("precious kept");
    assert_eq!(after.data, before.data, "not written");
    assert_eq!(
        after.metadata.labels, before.metadata.labels,
        "not labelled"
    );
    assert_eq!(after.metadata.owner_references, None, "not owned");
    // secretData removed: the operator only reads the named Secret; it never deletes it.
    let edit = json!({"spec": {"secretConfig": {"integration": {"connectivityService":
        {"secretName": "precious", "secretData": null}}}}});
    edit_cr(admin, NS, CR, &edit, "edit").await;
    let what = "the controller observed the edit";
    cp_tests::wait::until_object(&crs, CR, what, Duration::from_secs(20), |cr| {
        let st = cr.status.unwrap_or_default();
        Ok((st.observed_generation == cr.metadata.generation
            && !st.conditions.iter().any(|c| c.reason == "ObjectNotOwned"))
        .then_some(()))
    })
    .await
    .expect("observed");
    let after = secrets.get("precious").await.expect("precious still there");
    assert_eq!(after.data, before.data);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    secrets
        .delete("precious", &DeleteParams::default())
        .await
        .expect("cleanup");
}
