//! Admission end to end: requests travel through the real API server to the registered webhook.

use cp_api::defaults;
use cp_tests::fixtures::{
    default_cr, dynamic_crs, dynamic_mappings, operator_config, service_mapping_json,
};
use cp_tests::shared::{
    AUTHENTICATED, MAPPINGS_LOCK, alice_client, control_plane, operator_client, webhook,
    webhook_and_namespace,
};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn create(client: &Client, ns: &str, v: Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(v).expect("object");
    dynamic_crs(client, ns)
        .create(&PostParams::default(), &obj)
        .await
}

/// Parameters of a dry-run write: admitted (or denied) and not stored.
fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

async fn dry_create(client: &Client, ns: &str, v: Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(v).expect("object");
    dynamic_crs(client, ns).create(&dry_run(), &obj).await
}

/// The denial message, or a panic if the call succeeded.
fn denied<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(s)) => {
            assert!(
                s.message.contains("admission webhook"),
                "{what}: not an admission denial: {}",
                s.message
            );
            s.message.clone()
        }
        other => panic!("{what}: expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn default_cr_created_by_a_user_gets_complete_deployment_defaults() {
    let ns = webhook_and_namespace("wh-default").await;
    let stored = create(
        &alice_client(AUTHENTICATED).await,
        &ns,
        default_cr("connectivity-proxy"),
    )
    .await
    .expect("alice creates the default CR");
    assert_eq!(
        stored.data["spec"]["deployment"],
        defaults::deployment_defaults_json()
    );
    assert_eq!(
        stored.data["spec"]["config"]["subaccountId"], "auto-provision",
        "user fields untouched"
    );
}

#[tokio::test]
async fn users_cannot_change_deployment_by_any_write_method() {
    let ns = webhook_and_namespace("wh-protect").await;
    let alice = alice_client(AUTHENTICATED).await;
    create(&alice, &ns, default_cr("cp")).await.expect("create");
    let api = dynamic_crs(&alice, &ns);

    // update (PUT)
    let mut current = api.get("cp").await.expect("get");
    current.data["spec"]["deployment"]["replicaCount"] = json!(3);
    let msg = denied(
        api.replace("cp", &PostParams::default(), &current).await,
        "update",
    );
    assert!(msg.contains("spec.deployment.replicaCount"), "{msg}");

    // merge patch
    let merge = json!({"spec": {"deployment": {"image": {"tag": "6.6.6"}}}});
    let msg = denied(
        api.patch("cp", &PatchParams::default(), &Patch::Merge(&merge))
            .await,
        "merge patch",
    );
    assert!(msg.contains("spec.deployment.image.tag"), "{msg}");

    // JSON patch
    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/deployment/replicaCount", "value": 4}
    ]))
    .expect("patch");
    let msg = denied(
        api.patch("cp", &PatchParams::default(), &Patch::Json::<()>(jp))
            .await,
        "json patch",
    );
    assert!(msg.contains("spec.deployment.replicaCount"), "{msg}");

    // server-side apply
    let apply = json!({
        "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ConnectivityProxy",
        "metadata": {"name": "cp"},
        "spec": {"deployment": {"image": {"registry": "evil.example.com", "repository": "x", "tag": "1"}}}
    });
    let msg = denied(
        api.patch(
            "cp",
            &PatchParams::apply("alice-tool").force(),
            &Patch::Apply(&apply),
        )
        .await,
        "server-side apply",
    );
    assert!(msg.contains("spec.deployment.image.registry"), "{msg}");

    // Removing the whole section is refilled by the mutating webhook: nothing changes.
    let remove: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/deployment"}]))
            .expect("patch");
    let after = api
        .patch("cp", &PatchParams::default(), &Patch::Json::<()>(remove))
        .await
        .expect("removal is refilled");
    assert_eq!(
        after.data["spec"]["deployment"],
        defaults::deployment_defaults_json()
    );

    // User fields may change.
    let cfg = json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": 20100}}}}}});
    let after = api
        .patch("cp", &PatchParams::default(), &Patch::Merge(&cfg))
        .await
        .expect("spec.config edit allowed");
    assert_eq!(
        after.data["spec"]["config"]["servers"]["proxy"]["http"]["port"],
        20100
    );
    assert_eq!(
        after.data["spec"]["deployment"],
        defaults::deployment_defaults_json()
    );

    // The operator's ServiceAccount may change spec.deployment.
    let op = dynamic_crs(&operator_client().await, &ns);
    let bump = json!({"spec": {"deployment": {"replicaCount": 2}}});
    let after = op
        .patch("cp", &PatchParams::default(), &Patch::Merge(&bump))
        .await
        .expect("operator may change deployment");
    assert_eq!(after.data["spec"]["deployment"]["replicaCount"], 2);
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let mut cur = &mut v;
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        if cur.get(part).is_none() {
            cur[part] = json!({});
        }
        cur = &mut cur[part];
    }
    if value.is_null() {
        cur.as_object_mut().map(|o| o.remove(key));
    } else {
        cur[key] = value;
    }
    v
}

/// `base` with `spec.config.multiRegionMode` set to `mode`, then service channels disabled and the
/// shared tenant mode where asked.
fn multi_region(base: &Value, mode: Value, channels_off: bool, shared_tenant: bool) -> Value {
    let mut v = with(base.clone(), "/spec/config/multiRegionMode", mode);
    if channels_off {
        v = with(v, "/spec/config/serviceChannels", json!({"enabled": false}));
    }
    if shared_tenant {
        v = with(v, "/spec/config/tenantMode", json!("shared"));
    }
    v
}

#[tokio::test]
async fn every_validation_rule_has_an_allowed_and_a_denied_case() {
    webhook().await;
    let _mappings = MAPPINGS_LOCK.lock().await;
    let ns = control_plane().namespace("wh-rules").await.expect("ns");
    let alice = alice_client(AUTHENTICATED).await;
    let base = default_cr("rules");
    let regions = json!({"enabled": true, "configMapName": "regions"});
    // (rule, denied object, field named in the message, allowed object)
    let cases = vec![
        (
            "dedicated tenant mode needs subaccountId",
            with(base.clone(), "/spec/config/subaccountId", Value::Null),
            "spec.config.subaccountId",
            with(
                with(base.clone(), "/spec/config/subaccountId", Value::Null),
                "/spec/config/tenantMode",
                json!("shared"),
            ),
        ),
        (
            "subaccountSubdomain needed while a proxy has authorization disabled",
            with(
                base.clone(),
                "/spec/config/subaccountSubdomain",
                Value::Null,
            ),
            "spec.config.subaccountSubdomain",
            with(
                with(
                    base.clone(),
                    "/spec/config/subaccountSubdomain",
                    Value::Null,
                ),
                "/spec/config/servers/proxy",
                json!({"authorization": {"oauth": {"allowedClientId": "c"}},
                       "http": {"enableProxyAuthorization": true}, "rfcAndLdap": {"enableProxyAuthorization": true},
                       "socks5": {"enableProxyAuthorization": true}}),
            ),
        ),
        (
            "allowedClientId needed while a proxy has authorization enabled",
            with(
                base.clone(),
                "/spec/config/servers/proxy",
                json!({"http": {"enableProxyAuthorization": true}}),
            ),
            "spec.config.servers.proxy.authorization.oauth.allowedClientId",
            with(
                base.clone(),
                "/spec/config/servers/proxy",
                json!({"http": {"enableProxyAuthorization": true}, "authorization": {"oauth": {"allowedClientId": "c"}}}),
            ),
        ),
        (
            "multi-region needs configMapName",
            multi_region(&base, json!({"enabled": true}), true, true),
            "spec.config.multiRegionMode.configMapName",
            multi_region(&base, regions.clone(), true, true),
        ),
        (
            "multi-region is incompatible with service channels",
            multi_region(&base, regions.clone(), false, true),
            "spec.config.serviceChannels.enabled",
            multi_region(&base, regions.clone(), true, true),
        ),
        (
            "multi-region is incompatible with dedicated tenant mode",
            multi_region(&base, regions.clone(), true, false),
            "spec.config.tenantMode",
            multi_region(&base, regions.clone(), true, true),
        ),
        (
            "className istio needs ingress.tls.secretName",
            with(base.clone(), "/spec/ingress", json!({"className": "istio"})),
            "spec.ingress.tls.secretName",
            with(
                base.clone(),
                "/spec/ingress",
                json!({"className": "istio", "tls": {"secretName": "tls"}}),
            ),
        ),
        (
            "the audit log secret may not be one of the operator's own (it is projected whole into the proxy)",
            with(
                base.clone(),
                "/spec/secretConfig/integration/auditlogService",
                json!({"secretName": "connectivity-proxy-webhook-ca"}),
            ),
            "spec.secretConfig.integration.auditlogService.secretName",
            with(
                base.clone(),
                "/spec/secretConfig/integration/auditlogService",
                json!({"secretName": "my-auditlog-key"}),
            ),
        ),
        (
            "className nginx is not served by the Kyma module",
            with(
                base.clone(),
                "/spec/ingress",
                json!({"className": "nginx", "tls": {"secretName": "tls"}}),
            ),
            "spec.ingress.className",
            with(
                base.clone(),
                "/spec/ingress",
                json!({"className": "istio", "tls": {"secretName": "tls"}}),
            ),
        ),
    ];
    for (rule, bad, field, good) in cases {
        let msg = denied(dry_create(&alice, &ns, bad).await, rule);
        assert!(
            msg.contains(field),
            "{rule}: message does not name {field}: {msg}"
        );
        dry_create(&alice, &ns, good)
            .await
            .unwrap_or_else(|e| panic!("{rule}: allowed case denied: {e}"));
    }
}

#[tokio::test]
async fn connectivity_secret_name_is_frozen_while_secret_data_is_set() {
    let ns = webhook_and_namespace("wh-secret").await;
    let alice = alice_client(AUTHENTICATED).await;
    let api = dynamic_crs(&alice, &ns);
    let cr = with(
        default_cr("sec"),
        "/spec/secretConfig/integration/connectivityService",
        json!({"secretName": "mine", "secretData": "eyJhIjoxfQ=="}),
    );
    create(&alice, &ns, cr).await.expect("create");
    let rename = json!({"spec": {"secretConfig": {"integration": {"connectivityService": {"secretName": "other"}}}}});
    let msg = denied(
        api.patch("sec", &PatchParams::default(), &Patch::Merge(&rename))
            .await,
        "rename with secretData",
    );
    assert!(
        msg.contains("spec.secretConfig.integration.connectivityService.secretName"),
        "{msg}"
    );
    // Dropping secretData and renaming in the same edit is still a change while data was set.
    let clear = json!({"spec": {"secretConfig": {"integration": {"connectivityService": {"secretData": null}}}}});
    api.patch("sec", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .expect("removing secretData is allowed");
    api.patch("sec", &PatchParams::default(), &Patch::Merge(&rename))
        .await
        .expect("rename without secretData is allowed");
}

/// An RFC mapping of `service` in subaccount `sub-1`.
fn mapping(name: &str, service: &str) -> Value {
    let spec = json!({"type": "RFC", "serviceId": service, "internalAddress": "erp.default:3300",
        "subaccountId": "sub-1"});
    service_mapping_json(name, spec)
}

async fn create_mapping(client: &Client, v: Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(v).expect("mapping");
    dynamic_mappings(client)
        .create(&PostParams::default(), &obj)
        .await
}

/// Waits until the webhook's cache has seen a mapping: a duplicate of it is refused.
async fn wait_mapping_cached(client: &Client, service: &str) {
    let probe = mapping("cache-probe", service);
    cp_tests::wait::until(
        "the webhook cache to hold the mapping",
        std::time::Duration::from_secs(10),
        || async {
            let obj: DynamicObject =
                serde_json::from_value(probe.clone()).map_err(|e| e.to_string())?;
            match dynamic_mappings(client).create(&dry_run(), &obj).await {
                Err(kube::Error::Api(s)) if s.message.contains("already maps") => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("cached");
}

#[tokio::test]
async fn service_mappings_are_validated_and_unique() {
    webhook().await;
    let _mappings = MAPPINGS_LOCK.lock().await;
    let alice = alice_client(AUTHENTICATED).await;
    create_mapping(&alice, mapping("sm-unique-a", "unique-s4"))
        .await
        .expect("first mapping");
    wait_mapping_cached(&alice, "unique-s4").await;
    let msg = denied(
        create_mapping(&alice, mapping("sm-unique-b", "unique-s4")).await,
        "duplicate",
    );
    // The other mapping is not named (whoever reaches the webhook's port could ask): the answer
    // says what is taken and how to find who holds it.
    assert!(
        msg.contains("another ServiceMapping already maps")
            && msg.contains("unique-s4")
            && msg.contains("kubectl get servicemappings")
            && !msg.contains("sm-unique-a"),
        "{msg}"
    );
    create_mapping(&alice, mapping("sm-unique-c", "unique-other"))
        .await
        .expect("another serviceId");
    let bad = with(
        mapping("sm-bad-port", "bad-port"),
        "/spec/internalAddress",
        json!("erp.default:99999"),
    );
    let msg = denied(create_mapping(&alice, bad).await, "bad port");
    assert!(msg.contains("spec.internalAddress"), "{msg}");
    let bad = with(
        mapping("sm-no-port", "no-port"),
        "/spec/internalAddress",
        json!("erp.default"),
    );
    denied(create_mapping(&alice, bad).await, "no port");
    // An update of the mapping itself is not a duplicate.
    let api = dynamic_mappings(&alice);
    let loc = json!({"spec": {"locationIds": ["loc1"]}});
    api.patch("sm-unique-a", &PatchParams::default(), &Patch::Merge(&loc))
        .await
        .expect("update own mapping");
    for n in ["sm-unique-a", "sm-unique-c"] {
        api.delete(n, &Default::default()).await.expect("cleanup");
    }
}

#[tokio::test]
async fn a_mapping_held_by_a_foreign_finalizer_is_still_validated() {
    webhook().await;
    let _mappings = MAPPINGS_LOCK.lock().await;
    let alice = alice_client(AUTHENTICATED).await;
    let held = with(
        mapping("sm-held", "held-s4"),
        "/metadata/finalizers",
        json!(["example.com/hold"]),
    );
    create_mapping(&alice, held).await.expect("held mapping");
    let api = dynamic_mappings(&alice);
    api.delete("sm-held", &Default::default())
        .await
        .expect("delete (held by the finalizer)");
    let held = api.get("sm-held").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some(), "being deleted");
    // While the finalizer holds it, a spec edit is judged by every rule.
    let bad = json!({"spec": {"internalAddress": "erp.default:99999"}});
    let msg = denied(
        api.patch("sm-held", &PatchParams::default(), &Patch::Merge(&bad))
            .await,
        "a bad port on a mapping being deleted",
    );
    assert!(msg.contains("spec.internalAddress"), "{msg}");
    // A valid edit and the finalizer's removal are admitted: deletion never hangs on the webhook.
    let good = json!({"spec": {"locationIds": ["loc1"]}});
    api.patch("sm-held", &PatchParams::default(), &Patch::Merge(&good))
        .await
        .expect("a valid edit of a mapping being deleted");
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("sm-held", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("the finalizer's removal");
}

#[tokio::test]
async fn service_channels_cannot_be_disabled_while_mappings_exist() {
    webhook().await;
    let _mappings = MAPPINGS_LOCK.lock().await;
    let ns = control_plane().namespace("wh-channels").await.expect("ns");
    let alice = alice_client(AUTHENTICATED).await;
    create_mapping(&alice, mapping("sm-channels", "channels-s4"))
        .await
        .expect("mapping");
    wait_mapping_cached(&alice, "channels-s4").await;
    let api = dynamic_crs(&alice, &ns);
    create(&alice, &ns, default_cr("ch")).await.expect("create");
    let off = json!({"spec": {"config": {"serviceChannels": {"enabled": false}}}});
    let msg = denied(
        api.patch("ch", &PatchParams::default(), &Patch::Merge(&off))
            .await,
        "disable channels",
    );
    assert!(msg.contains("sm-channels"), "lists the mappings: {msg}");
    dynamic_mappings(&alice)
        .delete("sm-channels", &Default::default())
        .await
        .expect("delete mapping");
    cp_tests::wait::until(
        "service channels can be disabled",
        std::time::Duration::from_secs(10),
        || async {
            match api
                .patch("ch", &PatchParams::default(), &Patch::Merge(&off))
                .await
            {
                Ok(_) => Ok(Some(())),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("allowed after the mapping is gone");
}

#[tokio::test]
async fn malformed_requests_get_a_4xx_and_the_webhook_stays_up() {
    let wh = webhook().await;
    let client = wh.direct_client().expect("direct client");
    let big = vec![b' '; 5 * 1024 * 1024];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("/mutate", b"not json".to_vec()),
        ("/validate", br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec()),
        (
            "/validate-servicemapping",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        ),
        (
            "/validate",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}"#
                .to_vec(),
        ),
        ("/mutate", big),
    ];
    for (path, body) in cases {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .body(body)
            .expect("request");
        match client.request_text(req).await {
            Err(kube::Error::Api(s)) => assert!(
                (400..500).contains(&s.code),
                "{path}: {} {}",
                s.code,
                s.message
            ),
            other => panic!("{path}: expected a 4xx, got {other:?}"),
        }
    }
    // A well-formed review without an object is a denial with a reason, not an error.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": "ConnectivityProxy"},
        "resource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": "connectivityproxies"},
        "name": "x", "namespace": "y", "operation": "CREATE", "userInfo": {"username": "bob"}}});
    let req = http::Request::post("/validate")
        .body(serde_json::to_vec(&review).expect("json"))
        .expect("request");
    // A fresh connection: the server closes the one that carried the oversized body.
    let client = wh.direct_client().expect("direct client");
    let text = client.request_text(req).await.expect("answered");
    let answer: Value = serde_json::from_str(&text).expect("AdmissionReview");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["uid"], "u1");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no object")
    );
    let (code, _) = wh.metrics_get("/healthz").await.expect("healthz");
    assert_eq!(code, 200, "the webhook is still up");
    let (_, metrics) = wh.metrics_get("/metrics").await.expect("metrics");
    assert!(
        metrics.contains("cp_webhook_admission_requests_total"),
        "{metrics}"
    );
}

/// A ClientHello without a `supported_versions` extension, so `version` is the highest it offers
/// (`[3, 2]`: TLS 1.1, `[3, 3]`: TLS 1.2), with cipher suites and extensions a TLS 1.2 server accepts:
/// the version is the only reason to refuse it.
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = version.to_vec();
    body.extend([0x5a; 32]); // random
    body.push(0); // no session id
    // ECDHE-ECDSA/RSA-AES128-GCM-SHA256, ECDHE-RSA/ECDSA-AES128-SHA, RSA-AES128-SHA
    let suites: [u16; 5] = [0xc02b, 0xc02f, 0xc013, 0xc009, 0x002f];
    body.extend(((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend(s.to_be_bytes());
    }
    body.extend([1, 0]); // compression: null
    let extensions: Vec<u8> = [
        &[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17][..], // supported_groups: secp256r1
        &[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00][..],             // ec_point_formats: uncompressed
        &[0x00, 0x17, 0x00, 0x00][..], // extended_master_secret (the FIPS build requires it)
        // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256
        &[
            0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01,
        ][..],
    ]
    .concat();
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01]; // handshake record, TLS 1.0 record version
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

/// The first 7 bytes the server sends back after `hello`.
async fn first_record(addr: &str, hello: &[u8]) -> [u8; 7] {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(hello).await.expect("ClientHello");
    let mut reply = [0u8; 7];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        conn.read_exact(&mut reply),
    )
    .await
    .expect("the webhook answers within 10 s")
    .expect("a TLS record");
    reply
}

#[tokio::test]
async fn the_webhook_refuses_tls_1_1_clients() {
    let wh = webhook().await;
    let addr = wh.url.trim_start_matches("https://");
    // The same hello offering TLS 1.2 gets a ServerHello (a handshake record, 22): the probe works.
    let tls12 = first_record(addr, &client_hello([3, 3])).await;
    assert_eq!(
        tls12[0], 22,
        "TLS 1.2 hello: expected a handshake record, got {tls12:?}"
    );
    // Offering at most TLS 1.1: a fatal alert (21), protocol_version (70) or handshake_failure (40).
    let tls11 = first_record(addr, &client_hello([3, 2])).await;
    assert_eq!(
        tls11[0], 21,
        "TLS 1.1 hello: expected an alert, got {tls11:?}"
    );
    assert_eq!(tls11[5], 2, "a fatal alert: {tls11:?}");
    assert!(
        [70, 40].contains(&tls11[6]),
        "protocol_version or handshake_failure: {tls11:?}"
    );
}

#[tokio::test]
async fn idle_and_half_sent_connections_neither_stop_admission_nor_stay_open() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cp = control_plane();
    let wh = webhook().await;
    let addr = wh.url.trim_start_matches("https://").to_string();
    // 300 hostile connections: half only connect, half send the start of a ClientHello and stop. They
    // come from 127.0.0.3, not from the API server's 127.0.0.1 (a pod has an address of its own): the
    // webhook caps connections per source, so most are closed at once and the rest at the handshake
    // timeout.
    let mut conns = Vec::new();
    let target: std::net::SocketAddr = addr.parse().expect("webhook address");
    for i in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 3], 0)))
            .expect("bind 127.0.0.3");
        let mut s = socket.connect(target).await.expect("connect");
        if i % 2 == 1 {
            // A connection closed at once may refuse it.
            let _ = s
                .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
                .await;
        }
        conns.push(s);
    }
    let opened = std::time::Instant::now();
    // Admission through the API server goes on meanwhile.
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("hostile-conns").await.expect("ns");
    let api: Api<cp_api::ConnectivityProxy> = Api::namespaced(admin.clone(), &ns);
    let cr: cp_api::ConnectivityProxy =
        serde_json::from_value(default_cr("under-flood")).expect("cr");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let admitted = api.create(&dry, &cr).await.expect("admitted while flooded");
    assert!(
        admitted.spec.deployment.is_some(),
        "the webhook injected the defaults"
    );
    assert!(
        opened.elapsed() < std::time::Duration::from_secs(5),
        "admitted before the hostile connections time out"
    );
    // Nor do they stay open: each is closed by the server within the handshake timeout.
    let closed = futures::future::join_all(conns.into_iter().map(|mut s| async move {
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    }));
    let all = tokio::time::timeout(std::time::Duration::from_secs(20), closed)
        .await
        .expect("every hostile connection closed by the server within 20 s");
    assert!(all.iter().all(|c| *c));
    // And the webhook still serves.
    api.create(&dry, &cr).await.expect("admitted afterwards");
}

/// Tests that write ConfigMap `connectivity-proxy-operator-config` take turns.
static PRIVILEGED_CONFIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn privileged_identities_are_read_live_from_the_configmap() {
    webhook().await;
    let _config = PRIVILEGED_CONFIG.lock().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("wh-privileged").await.expect("ns");
    create(&alice_client(AUTHENTICATED).await, &ns, default_cr("cp"))
        .await
        .expect("create");
    let carol = cp
        .client(&cp_tests::Identity::User {
            name: "carol".into(),
            groups: vec![],
        })
        .await
        .expect("carol");
    let api = dynamic_crs(&carol, &ns);
    let edit = |n: i64| json!({"spec": {"deployment": {"replicaCount": n}}});
    let msg = denied(
        api.patch("cp", &PatchParams::default(), &Patch::Merge(&edit(2)))
            .await,
        "carol before she is listed",
    );
    assert!(msg.contains("spec.deployment.replicaCount"), "{msg}");
    let set = |users: &'static str| {
        let admin = admin.clone();
        async move {
            let cm = operator_config(json!({"privilegedUsers": users, "privilegedGroups": ""}));
            cp_tests::manifest::apply_json(&admin, cm, None)
                .await
                .expect("config");
        }
    };
    // Each attempt edits spec.deployment to a new value: true when admitted, false when refused for it.
    let n = std::sync::atomic::AtomicI64::new(2);
    let wait_for = |admitted: bool, what: &'static str| {
        let (api, n, edit) = (&api, &n, &edit);
        cp_tests::wait::until(
            what,
            std::time::Duration::from_secs(15),
            move || async move {
                let v = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let outcome = match api
                    .patch("cp", &PatchParams::default(), &Patch::Merge(&edit(v)))
                    .await
                {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.message.contains("spec.deployment") => false,
                    Err(e) => return Err(e.to_string()),
                };
                if outcome == admitted {
                    Ok(Some(()))
                } else {
                    Err(format!("admitted: {outcome}"))
                }
            },
        )
    };
    // Listed: her edit goes through within seconds, without a restart of the webhook.
    set("someone-else, carol").await;
    wait_for(true, "carol's edit admitted")
        .await
        .expect("the webhook picked up the ConfigMap");
    // Removed: she loses the right as quickly.
    set("someone-else").await;
    wait_for(false, "carol's edit refused again")
        .await
        .expect("the webhook dropped carol");
}

/// Groups every user or every ServiceAccount is in are refused in the privileged list of the
/// ConfigMap: naming `system:authenticated` there does not hand `spec.deployment` to everyone, while a
/// narrow group named beside it is honoured.
#[tokio::test]
async fn broad_groups_in_the_configmap_do_not_make_everyone_privileged() {
    webhook().await;
    let _config = PRIVILEGED_CONFIG.lock().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("wh-broad-groups").await.expect("ns");
    let alice = alice_client(AUTHENTICATED).await;
    create(&alice, &ns, default_cr("cp")).await.expect("create");
    let set = |groups: &'static str| {
        let admin = admin.clone();
        async move {
            let cm = operator_config(json!({"privilegedUsers": "", "privilegedGroups": groups}));
            cp_tests::manifest::apply_json(&admin, cm, None)
                .await
                .expect("config");
        }
    };
    set("system:authenticated, system:serviceaccounts, system:serviceaccounts:kyma-system, sre-team").await;
    // carol is in sre-team: her edit is admitted once the webhook has read the ConfigMap.
    let carol = cp
        .client(&cp_tests::Identity::User {
            name: "carol".into(),
            groups: vec!["sre-team".into()],
        })
        .await
        .expect("carol");
    let n = std::sync::atomic::AtomicI64::new(2);
    let edit = |v: i64| json!({"spec": {"deployment": {"replicaCount": v}}});
    cp_tests::wait::until(
        "sre-team's edit admitted",
        std::time::Duration::from_secs(15),
        || {
            let api = dynamic_crs(&carol, &ns);
            let v = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                api.patch("cp", &PatchParams::default(), &Patch::Merge(&edit(v)))
                    .await
                    .map(|_| Some(()))
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await
    .expect("the webhook read the ConfigMap");
    // alice is in system:authenticated (as every authenticated user): still refused.
    let v = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let msg = denied(
        dynamic_crs(&alice, &ns)
            .patch("cp", &PatchParams::default(), &Patch::Merge(&edit(v)))
            .await,
        "alice, in system:authenticated",
    );
    assert!(msg.contains("spec.deployment.replicaCount"), "{msg}");
    set("").await;
}
