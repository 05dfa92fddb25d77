//! Certificate integration tests on their own control plane: the controller issues the webhook's
//! serving certificate and the business-tunnel certificate with lifetimes of seconds.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cp_api::{ConnectivityProxy, names};
use cp_tests::cluster::ensure_namespace;
use cp_tests::controller::ControllerProcess;
use cp_tests::fixtures::{
    self, default_connectivity_proxy, default_cr_object, dynamic_crs, install_our_crds,
};
use cp_tests::manifest;
use cp_tests::shared::{EDITOR_RBAC, alice_client, control_plane, take_turn};
use cp_tests::webhook::{Webhook, metric};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;

const DOMAIN: &str = "certs.kyma.example.com";
static TURN: Mutex<()> = Mutex::const_new(());

async fn controller() -> &'static ControllerProcess {
    static C: cp_tests::group::Slot<ControllerProcess> = cp_tests::group::Slot::new();
    C.get_or_init(|| async {
        let cp = control_plane();
        let admin = cp.admin().await.expect("admin");
        install_our_crds(&admin).await;
        for ns in ["kyma-system", "istio-system"] {
            ensure_namespace(&admin, ns).await.expect("namespace");
        }
        ControllerProcess::start(
            &cp,
            "cp-controller",
            &[
                "--leader-elect=false",
                "--webhook-ips=127.0.0.1",
                "--webhook-ca-lifetime-seconds=24",
                "--webhook-cert-lifetime-seconds=9",
                "--cert-propagation-seconds=2",
                "--tunnel-cert-lifetime-seconds=20",
                "--tunnel-ca-lifetime-seconds=3600",
            ],
        )
        .await
        .expect("controller")
    })
    .await
}

#[tokio::test]
async fn webhook_certificate_and_ca_rotate_without_a_failed_admission_request() {
    let (_turn, cp, admin) = take_turn(&TURN).await;
    let ctrl = controller().await;
    manifest::apply_yaml(&admin, EDITOR_RBAC, None)
        .await
        .expect("RBAC");
    // Two webhook replicas behind one address, as behind the Service (2 replicas in the Deployment):
    // each learns every rotation by its own watch, so the overlap must cover the slower of the two.
    // The webhook configurations exist without a CA bundle: the controller injects it.
    let wh = Webhook::start_from_secret(&cp, "cp-webhook", &[])
        .await
        .expect("webhook starts on the controller's certificate");
    let wh2 = Webhook::start_from_secret(&cp, "cp-webhook-2", &[])
        .await
        .expect("second replica");
    let backends = [&wh, &wh2]
        .iter()
        .map(|w| w.url.trim_start_matches("https://").to_string())
        .collect();
    let (service, _lb) = cp_tests::round_robin(backends).await.expect("service");
    let front = Webhook {
        url: format!("https://{service}"),
        metrics_addr: wh.metrics_addr.clone(),
        ca: None,
        cert_file: wh.cert_file.clone(),
        key_file: wh.key_file.clone(),
    };
    front.register(&admin).await.expect("register");

    let ns = cp.namespace("rotation").await.expect("ns");
    let alice = alice_client(&[]).await;
    let api = dynamic_crs(&alice, &ns);
    let probe = default_cr_object("probe");
    cp_tests::webhook::admitted(&api, "admission through the controller-issued certificate")
        .await
        .expect("admission through the webhook");

    let target = default_cr_object("load-target");
    api.create(&PostParams::default(), &target)
        .await
        .expect("create target");
    let ca_before = metric(
        &ctrl.metrics_addr,
        "cp_certificate_rotations_total{certificate=\"webhook-ca\"}",
    )
    .await;
    let reloads_before = metric(&wh.metrics_addr, "cp_webhook_certificate_reloads_total").await;
    let reloads2_before = metric(&wh2.metrics_addr, "cp_webhook_certificate_reloads_total").await;
    let served = |addr: String| async move {
        let Ok((_, body)) = cp_tests::webhook::http_get(&addr, "/metrics").await else {
            return 0.0;
        };
        body.lines()
            .filter(|l| l.starts_with("cp_webhook_admission_requests_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let served_before = [
        served(wh.metrics_addr.clone()).await,
        served(wh2.metrics_addr.clone()).await,
    ];

    // Two clients create (dry run) and update CRs through the API server for 60 s.
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for worker in 0..2 {
        let (api, ok, failures, probe) = (api.clone(), ok.clone(), failures.clone(), probe.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let r = if worker == 0 {
                    api.create(&PostParams { dry_run: true, ..Default::default() }, &probe).await.map(|_| ())
                } else {
                    let edit = json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": 20000 + (i % 1000)}}}}}});
                    api.patch("load-target", &PatchParams::default(), &Patch::Merge(&edit)).await.map(|_| ())
                };
                match r {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().await.push(e.to_string()),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    let ca_rotations = metric(
        &ctrl.metrics_addr,
        "cp_certificate_rotations_total{certificate=\"webhook-ca\"}",
    )
    .await
        - ca_before;
    let reloads =
        metric(&wh.metrics_addr, "cp_webhook_certificate_reloads_total").await - reloads_before;
    let failures = failures.lock().await.clone();
    println!(
        "{} admission requests succeeded, {} failed; {ca_rotations} CA rotations, {reloads} certificate reloads in the webhook",
        ok.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "failed admission requests: {:?}",
        &failures[..failures.len().min(5)]
    );
    assert!(
        ca_rotations >= 2.0,
        "the CA rotated only {ca_rotations} times"
    );
    assert!(
        reloads >= 4.0,
        "the webhook swapped its certificate only {reloads} times"
    );
    let reloads2 =
        metric(&wh2.metrics_addr, "cp_webhook_certificate_reloads_total").await - reloads2_before;
    assert!(
        reloads2 >= 4.0,
        "the second replica swapped its certificate only {reloads2} times"
    );
    // Both replicas answered admission requests during the rotations (the API server opens a new
    // connection whenever the CA bundle changes, and the front hands connections out in turn).
    let served_during = [
        served(wh.metrics_addr.clone()).await - served_before[0],
        served(wh2.metrics_addr.clone()).await - served_before[1],
    ];
    println!("admission requests per replica during the rotations: {served_during:?}");
    assert!(
        served_during.iter().all(|n| *n > 0.0),
        "one replica served nothing: {served_during:?}"
    );
    for name in ["cp-webhook", "cp-webhook-2"] {
        let log = std::fs::read_to_string(cp.dir.join(format!("{name}.log"))).unwrap_or_default();
        assert_eq!(
            log.matches("serving admission requests").count(),
            1,
            "{name} restarted"
        );
    }

    // The CR is deleted so that the next test's CR is the cluster's only one.
    api.delete("load-target", &Default::default())
        .await
        .expect("delete");
    let all: Api<ConnectivityProxy> = Api::all(admin.clone());
    cp_tests::wait::until("no CR left", Duration::from_secs(20), || async {
        Ok(cp_tests::wait::list(&all)
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
    .expect("clean");
}

fn secret_text(s: &Secret, key: &str) -> String {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .unwrap_or_default()
}

async fn install_dependencies(admin: &kube::Client) {
    fixtures::apply(admin, &[fixtures::ISTIO_CRDS, fixtures::BTP_CRDS], None)
        .await
        .expect("CRDs");
    manifest::apply_json(admin, fixtures::shoot_info(Some(DOMAIN)), None)
        .await
        .expect("shoot-info");
}

async fn delete_cr_and_wait(admin: &kube::Client) {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), "kyma-system");
    let _ = api.delete("connectivity-proxy", &Default::default()).await;
    cp_tests::wait::gone(&api, "connectivity-proxy", Duration::from_secs(20))
        .await
        .expect("the CR is gone");
}

#[tokio::test]
async fn built_in_tunnel_certificate_is_renewed_again_and_again() {
    let (_turn, _, admin) = take_turn(&TURN).await;
    controller().await;
    install_dependencies(&admin).await;
    let cr = default_connectivity_proxy("connectivity-proxy");
    Api::<ConnectivityProxy>::namespaced(admin.clone(), "kyma-system")
        .create(&PostParams::default(), &cr)
        .await
        .expect("create");
    let host = format!("cp.{DOMAIN}");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "istio-system");
    let name = names::tls_secret_name("connectivity-proxy", "kyma-system");
    cp_tests::wait::until("the tunnel TLS Secret", Duration::from_secs(20), || async {
        Ok(cp_tests::wait::get_opt(&secrets, &name).await?.map(|_| ()))
    })
    .await
    .expect("tunnel secret");
    // Watch the Secret for 50 s (2.5 lifetimes): at every read it holds a valid chain for the host.
    let mut serials = std::collections::BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(50);
    let mut checks = 0;
    while Instant::now() < end {
        let s = secrets.get(&name).await.expect("secret");
        let (crt, ca) = (secret_text(&s, "tls.crt"), secret_text(&s, "ca.crt"));
        let now = time::OffsetDateTime::now_utc();
        let valid = cp_certs::split_bundle(&ca)
            .iter()
            .any(|c| cp_certs::verify_chain(&crt, c, &host, now).is_ok());
        assert!(
            valid,
            "at {now} the tunnel Secret holds no valid chain for {host}"
        );
        let info = cp_certs::inspect(&crt).expect("parse");
        assert!(
            info.dns_names.contains(&format!("*.{host}")),
            "wildcard SAN missing: {:?}",
            info.dns_names
        );
        serials.insert(crt);
        checks += 1;
        tokio::time::sleep(Duration::from_millis(250)).await; // sampling interval of the observation
    }
    println!(
        "{checks} checks, {} distinct certificates in 50 s",
        serials.len()
    );
    assert!(
        serials.len() >= 3,
        "the 20-second certificate was renewed only {} times",
        serials.len() - 1
    );
    delete_cr_and_wait(&admin).await;
}

#[tokio::test]
async fn gardener_certificate_is_used_where_its_crd_exists() {
    let (_turn, _, admin) = take_turn(&TURN).await;
    controller().await;
    install_dependencies(&admin).await;
    manifest::apply_file(&admin, &fixtures::path(fixtures::GARDENER_CERT_CRD), None)
        .await
        .expect("Gardener CRD");
    // The previous test's built-in CA is gone with its CR (owner reference); start clean.
    let cas: Api<Secret> = Api::namespaced(admin.clone(), "kyma-system");
    let _ = cas
        .delete(names::TUNNEL_CA_SECRET, &Default::default())
        .await;
    let cr = default_connectivity_proxy("connectivity-proxy");
    Api::<ConnectivityProxy>::namespaced(admin.clone(), "kyma-system")
        .create(&PostParams::default(), &cr)
        .await
        .expect("create");
    let certs: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        "istio-system",
        &cp_api::kinds::Kind::GardenerCertificate.api_resource(),
    );
    let name = names::tls_secret_name("connectivity-proxy", "kyma-system");
    let cert = cp_tests::wait::until("a Gardener Certificate", Duration::from_secs(20), || {
        let (certs, name) = (certs.clone(), name.clone());
        async move { certs.get_opt(&name).await.map_err(|e| e.to_string()) }
    })
    .await
    .expect("gardener certificate");
    assert_eq!(cert.data["spec"]["commonName"], format!("cp.{DOMAIN}"));
    assert_eq!(cert.data["spec"]["secretRef"]["name"], name);
    assert!(
        cas.get_opt(names::TUNNEL_CA_SECRET)
            .await
            .expect("get")
            .is_none(),
        "no built-in CA with Gardener"
    );
    delete_cr_and_wait(&admin).await;
    manifest::delete_crd(&admin, names::GARDENER_CERT_CRD)
        .await
        .expect("remove Gardener CRD");
}

/// The CA bundle of every webhook in both configurations, decoded.
async fn ca_bundles(admin: &kube::Client) -> Vec<String> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let bundle = |c: k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| {
        String::from_utf8_lossy(&c.ca_bundle.unwrap_or_default().0).to_string()
    };
    let mutating = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get_opt(names::MUTATING_WEBHOOK_CONFIG)
        .await
        .expect("mutating configuration");
    let validating = Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get_opt(names::VALIDATING_WEBHOOK_CONFIG)
        .await
        .expect("validating configuration");
    let m = mutating.and_then(|m| m.webhooks).unwrap_or_default();
    let v = validating.and_then(|v| v.webhooks).unwrap_or_default();
    let m = m.into_iter().map(|h| bundle(h.client_config));
    m.chain(v.into_iter().map(|h| bundle(h.client_config)))
        .collect()
}

/// A `previous-ca.crt` written into the webhook CA Secret by hand (not by a rotation of the operator,
/// which records the previous CA's fingerprint) never reaches the webhook configurations' CA bundle:
/// whoever can write that Secret cannot make the API server trust a CA of their own.
#[tokio::test]
async fn a_hand_added_previous_ca_never_reaches_the_ca_bundle() {
    let (_turn, cp, admin) = take_turn(&TURN).await;
    controller().await;
    // The configurations exist (and admission keeps working) whichever test ran first.
    let wh = Webhook::start_from_secret(&cp, "cp-webhook-trust", &[])
        .await
        .expect("webhook starts on the controller's certificate");
    wh.register(&admin).await.expect("register");
    let what = "the controller's CA bundle in every webhook";
    cp_tests::wait::until(what, Duration::from_secs(20), || async {
        let b = ca_bundles(&admin).await;
        Ok((b.len() >= 2 && b.iter().all(|b| b.contains("BEGIN CERTIFICATE"))).then_some(()))
    })
    .await
    .expect("bundle");
    let now = time::OffsetDateTime::now_utc();
    let foreign = cp_certs::Ca::generate(
        "hand-added",
        now - time::Duration::minutes(1),
        now + time::Duration::days(30),
        cp_certs::KeyAlgorithm::EcdsaP256,
    )
    .expect("a CA of the attacker's own");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "kyma-system");
    use base64::Engine;
    let patch = json!({"data": {"previous-ca.crt":
        base64::engine::general_purpose::STANDARD.encode(&foreign.cert_pem)}});
    secrets
        .patch(
            names::WEBHOOK_CA_SECRET,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("hand-add previous-ca.crt");
    // The controller watches the Secret and re-plans within a moment; for 2 propagation times (and
    // many re-plans) no bundle may hold the hand-added CA.
    let needle = foreign.cert_pem.trim_end().to_string();
    let window = Instant::now() + Duration::from_secs(6);
    let mut samples = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < window {
        samples.tick().await;
        let bundles = ca_bundles(&admin).await;
        assert!(
            !bundles.iter().any(|b| b.contains(&needle)),
            "the hand-added previous-ca.crt is trusted by the API server"
        );
    }
    // And admission still works through the controller's own certificate.
    let ns = cp.namespace("trust-bundle").await.expect("ns");
    let api = dynamic_crs(&admin, &ns);
    cp_tests::webhook::admitted(&api, "admission after the hand-added CA")
        .await
        .expect("admission");
}
