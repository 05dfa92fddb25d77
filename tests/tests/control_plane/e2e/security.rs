//! Security round 2, through the real API server: an editor's annotations, the controller's writes
//! without the webhook, and what the API server itself enforces on a stolen controller token.

use std::time::Duration;

use cp_api::admission_config::{self, Endpoint};
use cp_api::names;
use cp_tests::cluster::Identity;
use cp_tests::fixtures::{
    OPERATOR_CONFIG, default_cr, default_cr_object, dynamic_crs, dynamic_mappings, operator_config,
    service_mapping_json,
};
use cp_tests::shared::{
    AUTHENTICATED, alice_client, control_plane, operator_client, webhook, webhook_and_namespace,
};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const MIGRATION: &str = "connectivityproxy.sap.com/legacy-migration";
const DEFAULTS_RELEASE: &str = "connectivityproxy.sap.com/deployment-defaults-release";

fn denial<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message.clone(),
        other => panic!("{what}: expected a 403 denial, got {other:?}"),
    }
}

#[tokio::test]
async fn an_editor_cannot_set_change_or_remove_the_operators_annotations() {
    let ns = webhook_and_namespace("sec-annot").await;
    let alice = alice_client(AUTHENTICATED).await;
    let api = dynamic_crs(&alice, &ns);

    // Create with an operator annotation: refused, naming the key.
    let mut cr = default_cr("annotated");
    cr["metadata"]["annotations"] = json!({MIGRATION: "in-progress", "team": "a"});
    let obj: DynamicObject = serde_json::from_value(cr).expect("object");
    let msg = denial(api.create(&PostParams::default(), &obj).await, "create");
    assert!(msg.contains(MIGRATION), "{msg}");

    // A plain CR, with annotations of her own: admitted, and she may edit those.
    let obj = default_cr_object("cp");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
    let own = json!({"metadata": {"annotations": {"team": "b"}}});
    api.patch("cp", &PatchParams::default(), &Patch::Merge(&own))
        .await
        .expect("her own annotation");

    // Setting an operator annotation on a metadata-only update: refused.
    for (key, value) in [
        (MIGRATION, "in-progress"),
        (DEFAULTS_RELEASE, "0.0.1-x"),
        // An editor cannot open the module's pods to the network.
        (cp_api::keys::DISABLE_NETWORK_POLICIES_ANNOTATION, "true"),
    ] {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        let msg = denial(
            api.patch("cp", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
            key,
        );
        assert!(msg.contains(key), "{msg}");
        assert!(
            msg.contains("belong to the Connectivity Proxy operator"),
            "{msg}"
        );
    }

    // The operator writes one; alice may neither change nor remove it, and may still edit the rest.
    let op = dynamic_crs(&operator_client().await, &ns);
    let set = json!({"metadata": {"annotations": {DEFAULTS_RELEASE: "release-a"}}});
    op.patch("cp", &PatchParams::default(), &Patch::Merge(&set))
        .await
        .expect("the operator writes its annotation");
    for patch in [
        json!({"metadata": {"annotations": {DEFAULTS_RELEASE: "release-b"}}}),
        json!({"metadata": {"annotations": {DEFAULTS_RELEASE: null}}}),
    ] {
        let msg = denial(
            api.patch("cp", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
            "change or removal",
        );
        assert!(msg.contains(DEFAULTS_RELEASE), "{msg}");
    }
    let mine = json!({"metadata": {"annotations": {"team": "c"}, "labels": {"x": "y"}}});
    let after = api
        .patch("cp", &PatchParams::default(), &Patch::Merge(&mine))
        .await
        .expect("other metadata stays editable");
    assert_eq!(
        after.metadata.annotations.unwrap_or_default()[DEFAULTS_RELEASE],
        "release-a"
    );

    // ServiceMappings: the same rule.
    let mut sm = service_mapping_json(
        "sec-annot-mapping",
        json!({"type": "RFC", "subaccountId": "00000000-0000-0000-0000-0000000000aa", "serviceId": "sec-annot",
            "internalAddress": "erp.erp:3300", "locationIds": ["loc1"]}),
    );
    sm["metadata"]["annotations"] = json!({"connectivityproxy.sap.com/adopted-by": "me"});
    let sm: DynamicObject = serde_json::from_value(sm).expect("mapping");
    let mappings = dynamic_mappings(&alice);
    let msg = denial(
        mappings.create(&PostParams::default(), &sm).await,
        "mapping with an operator annotation",
    );
    assert!(msg.contains("adopted-by"), "{msg}");
}

/// A validating configuration built exactly as the module's, under another name, calling a port where
/// nothing listens and applied only to objects carrying a test label: alice's writes of such objects
/// fail closed, the controller's go through (its `matchConditions`).
#[tokio::test]
async fn the_controllers_own_writes_do_not_depend_on_its_webhook() {
    webhook().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("sec-nowebhook").await.expect("ns");
    let label = "cp-test/dead-webhook";
    let port = cp_tests::cluster::free_port().expect("port");
    let mut dead =
        admission_config::validating(&Endpoint::Url(format!("https://127.0.0.1:{port}")), None);
    dead.metadata.name = Some("cp-test-dead-webhook".into());
    for w in dead.webhooks.iter_mut().flatten() {
        w.name = format!("dead.{}", w.name);
        w.object_selector = Some(
            serde_json::from_value(json!({"matchLabels": {label: "true"}})).expect("selector"),
        );
        w.timeout_seconds = Some(2);
    }
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    configs
        .create(&PostParams::default(), &dead)
        .await
        .expect("register the dead webhook");

    let mut cr = default_cr("cp");
    cr["metadata"]["labels"] = json!({label: "true"});
    let obj: DynamicObject = serde_json::from_value(cr).expect("object");
    // Created by the admin before the dead webhook takes effect is not guaranteed: create as the
    // operator, which the dead webhook must not be asked about.
    let op = dynamic_crs(&operator_client().await, &ns);
    let result = cp_tests::wait::until(
        "the operator's create admitted without the webhook",
        Duration::from_secs(10),
        || async {
            match op.create(&PostParams::default(), &obj).await {
                Ok(o) => Ok(Some(o)),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    let alice_api = dynamic_crs(&alice_client(AUTHENTICATED).await, &ns);
    // The dead webhook is in force: alice's write of the labelled CR fails closed.
    let alice_write = cp_tests::wait::until(
        "alice's write refused by the unreachable webhook",
        Duration::from_secs(10),
        || {
            let api = alice_api.clone();
            async move {
                let p = json!({"metadata": {"annotations": {"team": "x"}}});
                match api
                    .patch("cp", &PatchParams::default(), &Patch::Merge(&p))
                    .await
                {
                    Err(kube::Error::Api(s)) if s.message.contains("dead.") => Ok(Some(s.message)),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    // The controller removes a finalizer (what a deletion waits for) while the webhook is down.
    let op_patch = async {
        let add = json!({"metadata": {"finalizers": [names::FINALIZER]}});
        op.patch("cp", &PatchParams::default(), &Patch::Merge(&add))
            .await?;
        op.delete("cp", &DeleteParams::default()).await?;
        let remove = json!({"metadata": {"finalizers": null}});
        op.patch("cp", &PatchParams::default(), &Patch::Merge(&remove))
            .await
    }
    .await;
    configs
        .delete("cp-test-dead-webhook", &DeleteParams::default())
        .await
        .expect("remove the dead webhook");
    result.expect("the operator's create");
    alice_write.expect("the dead webhook is asked about alice's writes");
    op_patch.expect("the operator's finalizer removal without the webhook");
}

/// What the API server enforces on the controller's token, whatever its RBAC verbs allow: only
/// `caBundle` of its webhook configurations changes.
#[tokio::test]
async fn a_stolen_controller_token_can_change_only_the_ca_bundle_of_the_webhook_configurations() {
    webhook().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    // The controller's RBAC and the admission policies bound to its ServiceAccount, as shipped.
    for ns in [names::KYMA_SYSTEM, names::ISTIO_NAMESPACE] {
        cp_tests::cluster::ensure_namespace(&admin, ns)
            .await
            .expect("namespace");
    }
    cp_tests::manifest::apply_controller_rbac(&admin)
        .await
        .expect("controller RBAC");
    let token: Api<ValidatingWebhookConfiguration> = Api::all(operator_client().await);
    let name = names::VALIDATING_WEBHOOK_CONFIG;
    let attempts: Vec<(&str, Value)> = vec![
        (
            "failurePolicy Ignore",
            json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]),
        ),
        (
            "another URL",
            json!([{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": "https://127.0.0.1:1/validate"}]),
        ),
        (
            "no rules",
            json!([{"op": "replace", "path": "/webhooks/0/rules", "value": []}]),
        ),
        (
            "a namespace selector",
            json!([{"op": "add", "path": "/webhooks/0/namespaceSelector", "value": {"matchLabels": {"x": "y"}}}]),
        ),
        (
            "a webhook removed",
            json!([{"op": "remove", "path": "/webhooks/1"}]),
        ),
    ];
    // The policy takes effect within seconds of its creation: wait until a label change (which it
    // refuses) is refused, each probe a new value, so an early admitted probe is no false verdict.
    let (admin_configs, what) = (Api::all(admin.clone()), "the admission policy in force");
    cp_tests::wait::label_change_refused(
        &token,
        &admin_configs,
        name,
        what,
        Duration::from_secs(30),
    )
    .await
    .expect("the policy refuses a label change");
    for (what, patch) in attempts {
        let patch: json_patch::Patch = serde_json::from_value(patch).expect("patch");
        let result = token
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await;
        let msg = match result {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
            other => {
                // Put admission back before failing: the other tests need it.
                control_plane_webhook_restore().await;
                panic!("{what}: expected the policy's denial, got {other:?}")
            }
        };
        assert!(
            msg.contains("may change only clientConfig.caBundle"),
            "{what}: {msg}"
        );
    }
    // caBundle alone: admitted (what the controller does on every rotation).
    let current = token.get(name).await.expect("read");
    let bundle = current.webhooks.unwrap_or_default()[0]
        .client_config
        .ca_bundle
        .clone();
    let same = json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle",
        "value": bundle.map(|b| { use base64::Engine; base64::engine::general_purpose::STANDARD.encode(b.0) })}]);
    token
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(same).expect("patch")),
        )
        .await
        .expect("a caBundle write is admitted");
}

/// Registers the module's webhook again (a refused attempt must never leave admission broken).
async fn control_plane_webhook_restore() {
    let admin = control_plane().admin().await.expect("admin");
    webhook().await.register(&admin).await.expect("register");
}

/// A ConnectivityProxy outside `kyma-system` is stored (with a warning) but never cached or used: in
/// shared tenant mode it does not change the ServiceMapping rules, while one in `kyma-system` does.
#[tokio::test]
async fn a_cr_in_another_namespace_never_changes_the_servicemapping_rules() {
    webhook().await;
    let _mappings = cp_tests::shared::MAPPINGS_LOCK.lock().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    cp_tests::cluster::ensure_namespace(&admin, names::KYMA_SYSTEM)
        .await
        .expect("kyma-system");
    let elsewhere = cp.namespace("sec-elsewhere").await.expect("ns");
    let shared = |name: &str| {
        let mut cr = default_cr(name);
        cr["spec"]["config"]["tenantMode"] = json!("shared");
        cr["spec"]["config"]
            .as_object_mut()
            .map(|c| c.remove("subaccountId"));
        serde_json::from_value::<DynamicObject>(cr).expect("object")
    };
    dynamic_crs(&alice_client(AUTHENTICATED).await, &elsewhere)
        .create(&PostParams::default(), &shared("foreign-shared"))
        .await
        .expect("a CR elsewhere is admitted");
    let control = dynamic_crs(&admin, names::KYMA_SYSTEM);
    control
        .create(&PostParams::default(), &shared("sec-shared-control"))
        .await
        .expect("the kyma-system CR");
    let mappings = dynamic_mappings(&admin);
    let spec = json!({"type": "RFC", "serviceId": "sec-no-subaccount", "internalAddress": "erp.erp:3300",
        "locationIds": ["loc1"]});
    let mapping: DynamicObject =
        serde_json::from_value(service_mapping_json("sec-no-subaccount", spec)).expect("mapping");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let verdict = |want_admitted: bool| {
        let (mappings, mapping, dry) = (mappings.clone(), mapping.clone(), dry.clone());
        async move {
            match mappings.create(&dry, &mapping).await {
                Ok(_) if want_admitted => Ok(Some(())),
                Err(kube::Error::Api(s))
                    if !want_admitted && s.message.contains("shared tenant mode") =>
                {
                    Ok(Some(()))
                }
                other => Err(format!("{other:?}")),
            }
        }
    };
    // The kyma-system CR, created after the foreign one, is seen: the rule applies.
    let seen = cp_tests::wait::until(
        "shared tenant mode of the kyma-system CR in force",
        Duration::from_secs(10),
        || verdict(false),
    )
    .await;
    control
        .delete("sec-shared-control", &DeleteParams::default())
        .await
        .expect("delete the kyma-system CR");
    let after = cp_tests::wait::until(
        "the rule lifted once only the foreign CR is left",
        Duration::from_secs(10),
        || verdict(true),
    )
    .await;
    let _ = dynamic_crs(&admin, &elsewhere)
        .delete("foreign-shared", &DeleteParams::default())
        .await;
    seen.expect("the kyma-system CR counts");
    after.expect("the CR in another namespace does not count");
}

/// Every free-form field has a size limit, enforced by the API server from the CRD schema.
#[tokio::test]
async fn oversized_fields_are_refused_by_the_crd_schema_naming_the_field() {
    let ns = webhook_and_namespace("sec-sizes").await;
    let api = dynamic_crs(&alice_client(AUTHENTICATED).await, &ns);
    let mut cr = default_cr("big");
    cr["spec"]["secretConfig"]["integration"]["connectivityService"]["secretName"] =
        json!("a".repeat(300));
    let obj: DynamicObject = serde_json::from_value(cr).expect("object");
    match api.create(&PostParams::default(), &obj).await {
        Err(kube::Error::Api(s)) if s.code == 422 => assert!(
            s.message.contains("secretName") && s.message.contains("253"),
            "{}",
            s.message
        ),
        other => panic!("a 300-character secret name: expected 422, got {other:?}"),
    }
    let mappings = dynamic_mappings(&alice_client(AUTHENTICATED).await);
    let spec = json!({"type": "RFC", "subaccountId": "00000000-0000-0000-0000-0000000000bb", "serviceId": "sec-sizes",
        "internalAddress": format!("{}.erp:3300", "e".repeat(2000)),
        "locationIds": (0..300).map(|i| format!("loc{i}")).collect::<Vec<_>>()});
    let sm: DynamicObject =
        serde_json::from_value(service_mapping_json("sec-sizes", spec)).expect("mapping");
    match mappings.create(&PostParams::default(), &sm).await {
        Err(kube::Error::Api(s)) if s.code == 422 => assert!(
            s.message.contains("internalAddress") && s.message.contains("locationIds"),
            "{}",
            s.message
        ),
        other => panic!("an oversized mapping: expected 422, got {other:?}"),
    }
}

/// Kubernetes' own `edit` and `view`, filled by kube-controller-manager's clusterrole-aggregation
/// controller from the bundle's roles: an editor writes ConnectivityProxies and ServiceMappings; a
/// viewer reads ServiceMappings but not the CRs, which may carry a service key inline (like Secrets,
/// which `view` never grants).
#[tokio::test]
async fn through_the_aggregated_roles_an_editor_writes_and_a_viewer_never_reads_an_inline_key() {
    webhook().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    cp_tests::manifest::apply_file(
        &admin,
        &cp_tests::workspace_root().join("manifests/rbac/user-roles.yaml"),
        None,
    )
    .await
    .expect("the bundle's user roles");
    let bindings = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cp-test-edna-edit}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: User, name: edna, apiGroup: rbac.authorization.k8s.io}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cp-test-victor-view}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: User, name: victor, apiGroup: rbac.authorization.k8s.io}]
"#;
    cp_tests::manifest::apply_yaml(&admin, bindings, None)
        .await
        .expect("bindings to edit and view");
    let user = |name: &str| Identity::User {
        name: name.into(),
        groups: vec!["system:authenticated".into()],
    };
    let edna = cp.client(&user("edna")).await.expect("edna");
    let victor = cp.client(&user("victor")).await.expect("victor");
    let ns = cp.namespace("sec-roles").await.expect("ns");
    let mut cr = default_cr("cp");
    let key = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(
            json!({"clientid": "c", "clientsecret": "inline-secret", "subaccount_id": "s", "subaccount_subdomain": "d"})
                .to_string(),
        )
    };
    cr["spec"]["secretConfig"] = json!({"integration": {"connectivityService": {
        "secretName": "inline-key", "secretData": key}}});
    let obj: DynamicObject = serde_json::from_value(cr).expect("object");
    // The aggregation controller fills `edit` within seconds of the roles' creation.
    cp_tests::wait::until(
        "edna creates a CR through edit",
        Duration::from_secs(30),
        || {
            let (api, obj) = (dynamic_crs(&edna, &ns), obj.clone());
            async move {
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => Ok(Some(())),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(())),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await
    .expect("edit grants ConnectivityProxies");
    let victors_mappings = dynamic_mappings(&victor);
    cp_tests::wait::until(
        "victor lists ServiceMappings through view",
        Duration::from_secs(30),
        || {
            let api = victors_mappings.clone();
            async move {
                api.list(&Default::default())
                    .await
                    .map(|_| Some(()))
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await
    .expect("view grants ServiceMappings");
    let theirs = dynamic_crs(&victor, &ns);
    for (what, result) in [
        ("get", theirs.get("cp").await.map(|_| ())),
        ("list", theirs.list(&Default::default()).await.map(|_| ())),
        ("get status", theirs.get_status("cp").await.map(|_| ())),
    ] {
        match result {
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            other => panic!(
                "a viewer may {what} a ConnectivityProxy (it can carry a service key): {other:?}"
            ),
        }
    }
}

/// The sum of every `cp_webhook_admission_requests_total` series on `wh`'s metrics port.
async fn admission_requests(wh: &cp_tests::webhook::Webhook) -> f64 {
    let (_, body) = wh.metrics_get("/metrics").await.expect("metrics");
    body.lines()
        .filter(|l| l.starts_with("cp_webhook_admission_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Round 3, a pod on the network: with `--client-ca-file` (the CA of the client certificate the API
/// server's `--admission-control-config-file` gives it for webhooks) only the API server completes
/// the TLS handshake: a caller without a certificate, or with one of another CA under the same name,
/// gets no answer at all, and the API server's own calls are admitted as before.
#[tokio::test]
async fn with_a_client_ca_the_webhook_answers_only_the_api_server() {
    webhook().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("sec-mtls").await.expect("ns");
    let ca_arg = format!(
        "--client-ca-file={}",
        cp.admission_client_ca_file().display()
    );
    let wh = cp_tests::webhook::Webhook::start(&cp, "webhook-mtls", &[ca_arg.as_str()])
        .await
        .expect("a webhook with a client CA");

    // Direct callers first: nothing is answered, nothing is counted.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": "ConnectivityProxy"},
        "resource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": "connectivityproxies"},
        "name": "x", "namespace": "y", "operation": "CREATE", "userInfo": {"username": "bob"}}});
    let post = || {
        http::Request::post("/validate")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&review).expect("json"))
            .expect("request")
    };
    let anonymous = wh.direct_client().expect("direct client");
    let r = anonymous.request_text(post()).await;
    assert!(
        matches!(r, Err(ref e) if !matches!(e, kube::Error::Api(_))),
        "a caller without a client certificate must get no answer: {r:?}"
    );
    let now = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    let other_ca = cp_certs::Ca::generate(
        "cp-test-impostor-ca",
        now,
        now + time::Duration::days(1),
        cp_certs::KeyAlgorithm::default(),
    )
    .expect("CA");
    let impostor = other_ca
        .issue(&cp_certs::LeafSpec::client(
            "kube-apiserver-admission-client",
            &[],
            now,
            time::Duration::days(1),
        ))
        .expect("impostor certificate");
    let r = wh
        .direct_client_with_cert(&impostor.cert_pem, &impostor.key_pem)
        .await
        .expect("client")
        .request_text(post())
        .await;
    assert!(
        matches!(r, Err(ref e) if !matches!(e, kube::Error::Api(_))),
        "a certificate of another CA must get no answer: {r:?}"
    );
    assert_eq!(
        admission_requests(&wh).await,
        0.0,
        "no refused caller reached admission"
    );
    // The API server's client certificate is answered (the same files its admission config names).
    let read = |f: &str| std::fs::read_to_string(cp.dir.join(f)).expect("admission client file");
    let answer = wh
        .direct_client_with_cert(&read("admission-client.crt"), &read("admission-client.key"))
        .await
        .expect("client")
        .request_text(post())
        .await
        .expect("the API server's certificate is answered");
    assert!(answer.contains("\"uid\":\"u1\""), "{answer}");

    // Through the API server: a validating configuration for labelled CRs, pointed at this webhook.
    let label = "cp-test/mtls-webhook";
    let ca = wh.ca.as_ref().map(|c| c.cert_pem.as_bytes());
    let mut cfg = admission_config::validating(&Endpoint::Url(wh.url.clone()), ca);
    cfg.metadata.name = Some("cp-test-mtls-webhook".into());
    for w in cfg.webhooks.iter_mut().flatten() {
        w.name = format!("mtls.{}", w.name);
        w.object_selector = Some(
            serde_json::from_value(json!({"matchLabels": {label: "true"}})).expect("selector"),
        );
    }
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    configs
        .create(&PostParams::default(), &cfg)
        .await
        .expect("register the mTLS webhook");
    let mut cr = default_cr("cp-mtls");
    cr["metadata"]["labels"] = json!({label: "true"});
    let obj: DynamicObject = serde_json::from_value(cr).expect("object");
    let api = dynamic_crs(&alice_client(AUTHENTICATED).await, &ns);
    let before = admission_requests(&wh).await;
    let through = cp_tests::wait::until(
        "a CR admitted through the API server by the mTLS webhook",
        Duration::from_secs(20),
        || {
            let (api, obj, wh) = (api.clone(), obj.clone(), &wh);
            async move {
                let dry = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                match api.create(&dry, &obj).await {
                    Ok(_) if admission_requests(wh).await > before => Ok(Some(())),
                    Ok(_) => Err("admitted, but not yet asked of the mTLS webhook".into()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;
    configs
        .delete("cp-test-mtls-webhook", &DeleteParams::default())
        .await
        .expect("remove the mTLS webhook");
    through.expect("the API server's calls are answered");
}

/// The webhook's ServiceAccount token (as shipped in `rbac/webhook.yaml`) reads what admission needs
/// and writes nothing: every write below is refused by the real API server's RBAC (dry runs: authorised
/// like a real write, persisted never), and no Secret but its own serving certificate can be read.
#[tokio::test]
async fn a_stolen_webhook_token_reads_what_admission_needs_and_writes_nothing() {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
    webhook().await;
    let cp = control_plane();
    let token = cp
        .client(&Identity::ServiceAccount {
            namespace: names::KYMA_SYSTEM.into(),
            name: "connectivity-proxy-webhook".into(),
        })
        .await
        .expect("webhook token");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let patch = PatchParams {
        dry_run: true,
        ..PatchParams::apply("stolen-webhook-token")
    };
    let ks = names::KYMA_SYSTEM;
    // Reads admission needs: the module's CRs in kyma-system, ServiceMappings, its ConfigMap by name.
    dynamic_crs(&token, ks)
        .list(&Default::default())
        .await
        .expect("CRs in kyma-system are read");
    let mappings = dynamic_mappings(&token);
    mappings
        .list(&Default::default())
        .await
        .expect("ServiceMappings are read");
    // Refused: every write, every other read.
    let mut cr = default_cr(names::DEFAULT_CR_NAME);
    cr["metadata"]["namespace"] = json!(ks);
    denial(
        dynamic_crs(&token, ks)
            .create(&dry, &serde_json::from_value(cr.clone()).expect("cr"))
            .await,
        "create a CR",
    );
    denial(
        dynamic_crs(&token, ks)
            .patch(names::DEFAULT_CR_NAME, &patch, &Patch::Apply(&cr))
            .await,
        "apply the CR",
    );
    let sm = service_mapping_json(
        "stolen-webhook-token",
        json!({"type": "RFC", "subaccountId": "s", "serviceId": "x", "internalAddress": "a:1"}),
    );
    denial(
        mappings
            .create(&dry, &serde_json::from_value(sm).expect("sm"))
            .await,
        "create a ServiceMapping",
    );
    let secrets: Api<Secret> = Api::namespaced(token.clone(), ks);
    denial(secrets.list(&Default::default()).await, "list Secrets");
    denial(
        secrets.get(names::OWNERSHIP_KEY_SECRET).await,
        "read the ownership key",
    );
    denial(
        secrets
            .create(
                &dry,
                &serde_json::from_value(json!({"metadata": {"name": "stolen"}})).expect("secret"),
            )
            .await,
        "create a Secret",
    );
    let cms: Api<ConfigMap> = Api::namespaced(token.clone(), ks);
    denial(
        cms.patch(
            OPERATOR_CONFIG,
            &patch,
            &Patch::Apply(operator_config(json!({"privilegedUsers": "mallory"}))),
        )
        .await,
        "make itself privileged through the ConfigMap",
    );
    let pods: Api<Pod> = Api::namespaced(token.clone(), ks);
    denial(
        pods.create(
            &dry,
            &serde_json::from_value(json!({"metadata": {"name": "stolen"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})).expect("pod"),
        )
        .await,
        "run a pod",
    );
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(token.clone());
    denial(
        hooks
            .patch(
                names::VALIDATING_WEBHOOK_CONFIG,
                &PatchParams {
                    dry_run: true,
                    ..Default::default()
                },
                &Patch::Merge(json!({"webhooks": []})),
            )
            .await,
        "change its webhook configuration",
    );
    // Elsewhere: not even a read of the module's CRs.
    denial(
        dynamic_crs(&token, "default")
            .list(&Default::default())
            .await,
        "list CRs elsewhere",
    );
}
