//! Faults and hostile users: the webhook down, two controller replicas with a failover, edits through
//! the status subresource, and secret values in logs; the webhook process's memory settings; slow and
//! idle clients on the admission port (`starvation`).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use cp_api::ConnectivityProxy;
use cp_tests::cluster::Identity;
use cp_tests::controller::ControllerProcess;
use cp_tests::fixtures::{
    default_connectivity_proxy, default_cr_object, dynamic_crs, install_our_crds,
};
use cp_tests::shared::{EDITOR_RBAC, alice_client, take_turn};
use cp_tests::webhook::Webhook;
use cp_tests::{manifest, support};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;

mod starvation;

static TURN: Mutex<()> = Mutex::const_new(());

/// A test's turn, its control plane, a cluster-admin client and its webhook.
type WebhookTurn = (
    tokio::sync::MutexGuard<'static, ()>,
    std::sync::Arc<cp_tests::ControlPlane>,
    kube::Client,
    Webhook,
);

/// A test's turn ([`take_turn`]) with our CRDs, the editors' RBAC, and webhook `name` started (ready
/// once its caches have listed our kinds).
async fn started_webhook(name: &str) -> WebhookTurn {
    let (turn, cp, admin) = take_turn(&TURN).await;
    install_our_crds(&admin).await;
    manifest::apply_yaml(&admin, EDITOR_RBAC, None)
        .await
        .expect("RBAC");
    let wh = Webhook::start(&cp, name, &[]).await.expect("webhook");
    (turn, cp, admin, wh)
}

/// [`started_webhook`], registered in the API server.
async fn registered_webhook(name: &str) -> WebhookTurn {
    let (turn, cp, admin, wh) = started_webhook(name).await;
    wh.register(&admin).await.expect("register");
    (turn, cp, admin, wh)
}

#[tokio::test]
async fn webhook_down_fails_closed_for_connectivity_proxies_only() {
    let (_turn, cp, admin, _wh) = registered_webhook("webhook-to-kill").await;
    let ns = cp.namespace("webhook-down").await.expect("ns");
    let alice = alice_client(&[]).await;
    let api = dynamic_crs(&alice, &ns);
    let cr = default_cr_object("down");
    cp_tests::webhook::admitted(&api, "admission through the webhook")
        .await
        .expect("admission through the webhook");

    cp.kill_process("webhook-to-kill")
        .expect("kill the webhook");
    let err = api
        .create(&PostParams::default(), &cr)
        .await
        .expect_err("fails closed");
    let msg = err.to_string();
    assert!(
        msg.contains("failed calling webhook") && msg.contains("connectivityproxy.sap.com"),
        "unclear: {msg}"
    );
    // Nothing else in the cluster passes through the webhook.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "unaffected"}, "data": {"a": "b"}}))
            .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("other resources are not affected");
    // Put a working webhook back for the other tests.
    let wh = Webhook::start(&cp, "webhook-restarted", &[])
        .await
        .expect("webhook");
    wh.register(&admin).await.expect("register");
}

/// cp-webhook turns transparent huge pages off for itself at start (`cp_webhook::memory`): with them,
/// its allocator's regions cost 6 MiB more at idle. The kernel reports the flag per process.
#[tokio::test]
async fn the_webhook_process_runs_without_transparent_huge_pages() {
    let (_turn, cp, _, _wh) = started_webhook("webhook-thp").await;
    let pid = cp.pid("webhook-thp").expect("the webhook's pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim)
        .expect("THP_enabled in /proc/<pid>/status (Linux 5.0 and later)");
    assert_eq!(thp, "0", "cp-webhook (pid {pid}) still has THP enabled");
}

#[tokio::test]
async fn hostile_user_cannot_change_deployment_through_the_status_subresource() {
    let (_turn, cp, admin, _wh) = registered_webhook("webhook-status").await;
    let ns = cp.namespace("status-edit").await.expect("ns");
    let cr = default_connectivity_proxy("victim");
    let admin_api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), &ns);
    cp_tests::wait::until(
        "create through the webhook",
        Duration::from_secs(30),
        || async {
            let created = admin_api.create(&PostParams::default(), &cr).await;
            created.map(|_| Some(())).map_err(|e| e.to_string())
        },
    )
    .await
    .expect("created");
    // Even a user allowed to write the status (granted here on purpose) cannot reach the spec through it.
    let status_rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: status-writer, namespace: {ns}}}\nrules:\n- apiGroups: [connectivityproxy.sap.com]\n  resources: [connectivityproxies/status]\n  verbs: [get, patch, update]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: status-writer, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: status-writer}}\nsubjects: [{{kind: User, name: mallory, apiGroup: rbac.authorization.k8s.io}}]\n"
    );
    manifest::apply_yaml(&admin, &status_rbac, None)
        .await
        .expect("status RBAC");
    let mallory = cp
        .client(&Identity::User {
            name: "mallory".into(),
            groups: vec![],
        })
        .await
        .expect("mallory");
    let api: Api<ConnectivityProxy> = Api::namespaced(mallory, &ns);
    let patch = json!({"spec": {"deployment": {"replicaCount": 9, "image": {"tag": "evil"}}}, "status": {"state": "Ready"}});
    // The write itself goes through (RBAC grants it), so the test exercises the subresource: only
    // the status may change.
    let patched = api
        .patch_status("victim", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the status patch is admitted (RBAC grants it)");
    assert_eq!(
        patched
            .status
            .and_then(|s| s.state)
            .map(|s| s.to_string())
            .as_deref(),
        Some("Ready"),
        "the status part was written"
    );
    let after = admin_api.get("victim").await.expect("get");
    let d = serde_json::to_value(&after.spec.deployment).expect("json");
    assert_eq!(
        d,
        cp_api::defaults::deployment_defaults_json(),
        "the status subresource changed the spec"
    );
    // Nor through the main resource with edit rights.
    let alice = alice_client(&[]).await;
    let api = Api::<ConnectivityProxy>::namespaced(alice, &ns);
    let edit = Patch::Merge(json!({"spec": {"deployment": {"replicaCount": 9}}}));
    let refused = api.patch("victim", &PatchParams::default(), &edit).await;
    let err = refused.expect_err("refused").to_string();
    assert!(err.contains("spec.deployment.replicaCount"), "{err}");
    // One ConnectivityProxy per cluster: leave none behind for the next test.
    admin_api
        .delete("victim", &Default::default())
        .await
        .expect("cleanup");
}

#[tokio::test]
async fn two_controller_replicas_only_the_leader_reconciles_and_a_standby_takes_over() {
    let (_turn, cp, admin) = take_turn(&TURN).await;
    install_our_crds(&admin).await;
    cp_tests::fixtures::apply(
        &admin,
        &[cp_tests::fixtures::ISTIO_CRDS, cp_tests::fixtures::BTP_CRDS],
        None,
    )
    .await
    .expect("CRDs");
    for ns in ["kyma-system", "istio-system"] {
        cp_tests::cluster::ensure_namespace(&admin, ns)
            .await
            .expect("ns");
    }
    support::set_domain(&admin, Some("ha.example.com")).await;
    let lease = 6u64;
    let args = [
        "--leader-elect=true",
        "--lease-seconds=6",
        "--resync-seconds=3",
        "--manage-webhook-certs=false",
    ];
    let a = ControllerProcess::start(&cp, "replica-a", &args)
        .await
        .expect("replica a");
    let b = ControllerProcess::start_standby(&cp, "replica-b", &args)
        .await
        .expect("replica b");
    assert_eq!(a.metric("cp_controller_leader").await, 1.0, "a leads");
    assert_eq!(b.metric("cp_controller_leader").await, 0.0, "b waits");
    support::create_default_cr(&admin, "kyma-system", "connectivity-proxy").await;
    support::make_ready(&admin, "kyma-system", "connectivity-proxy").await;
    assert_eq!(
        b.metric("cp_controller_reconcile_total{result=\"success\"}")
            .await,
        0.0,
        "the standby reconciled"
    );

    cp.kill_process("replica-a").expect("kill the leader");
    let killed = Instant::now();
    cp_tests::wait::until(
        "the standby leads",
        Duration::from_secs(lease * 3),
        || async { Ok((b.metric("cp_controller_leader").await == 1.0).then_some(())) },
    )
    .await
    .expect("failover");
    let failover = killed.elapsed();
    println!(
        "failover after {failover:?} (lease {lease} s, renewed every {} s)",
        lease / 3
    );
    assert!(
        failover <= Duration::from_secs(lease + lease / 3 + 2),
        "failover took {failover:?}"
    );
    // The new leader reconciles changes.
    support::set_http_port(&admin, "kyma-system", "connectivity-proxy", 20999).await;
    support::wait_info_port(
        &admin,
        "kyma-system",
        "connectivity-proxy",
        20999,
        "the new leader applies the edit",
        Duration::from_secs(10),
    )
    .await;
    // The edit rolled the StatefulSet: play the kubelets once more, then the new leader reports Ready.
    support::play_until_ready(&admin, "kyma-system", "connectivity-proxy").await;

    // A graceful stop (SIGTERM, as on a rollout) hands the lease over at once: the next standby leads
    // within one acquisition interval, not after the lease lapses.
    let c = ControllerProcess::start_standby(&cp, "replica-c", &args)
        .await
        .expect("replica c");
    assert_eq!(c.metric("cp_controller_leader").await, 0.0, "c waits");
    let stopped = Instant::now();
    let status = cp
        .terminate_process("replica-b", Duration::from_secs(10))
        .expect("b stops on SIGTERM");
    assert!(status.success(), "b exited with {status}");
    cp_tests::wait::until(
        "the next standby leads",
        Duration::from_secs(lease * 2),
        || async { Ok((c.metric("cp_controller_leader").await == 1.0).then_some(())) },
    )
    .await
    .expect("handover");
    let handover = stopped.elapsed();
    println!("handover after SIGTERM in {handover:?} (lease {lease} s)");
    assert!(
        handover < Duration::from_secs(lease / 3 + 2),
        "handover took {handover:?}: the lease was not released"
    );
    assert!(
        cp.log_tail("replica-b", 20)
            .contains("leader lease released"),
        "{}",
        cp.log_tail("replica-b", 20)
    );

    // No secret value of the service key reaches any log line of any process.
    let secret = "very-secret-value";
    let forms = leak_forms(secret);
    let mut leaks = Vec::new();
    for entry in std::fs::read_dir(&cp.dir).expect("dir").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(f) = forms.iter().find(|f| text.contains(f.as_str())) {
                leaks.push(format!("{} ({f})", path.display()));
            }
        }
    }
    assert!(leaks.is_empty(), "secret values in logs: {leaks:?}");

    // Nor anything else the operator writes that a CR editor can read: the CR (spec and status), its
    // Events, the ServiceMappings and the module's ConfigMaps. The key's own Secret stays out of an
    // editor's reach.
    let key = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), "kyma-system")
        .get("connectivity-proxy-service-key")
        .await
        .expect("the service-key Secret");
    assert!(
        key.data
            .unwrap_or_default()
            .values()
            .any(|v| String::from_utf8_lossy(&v.0).contains(secret)),
        "the probe value is in the service key, so finding it elsewhere would show"
    );
    let mut exposed = Vec::new();
    let readable: [(&str, ApiResource); 4] = [
        (
            "ConnectivityProxies",
            ApiResource::erase::<ConnectivityProxy>(&()),
        ),
        (
            "Events",
            ApiResource::erase::<k8s_openapi::api::core::v1::Event>(&()),
        ),
        (
            "ServiceMappings",
            ApiResource::erase::<cp_api::ServiceMapping>(&()),
        ),
        ("ConfigMaps", ApiResource::erase::<ConfigMap>(&())),
    ];
    for (what, ar) in readable {
        let list = Api::<DynamicObject>::all_with(admin.clone(), &ar)
            .list(&Default::default())
            .await
            .expect("list");
        assert!(
            what != "ConnectivityProxies" || !list.items.is_empty(),
            "the CR is listed"
        );
        let text = serde_json::to_string(&list).expect("json");
        if forms.iter().any(|f| text.contains(f.as_str())) {
            exposed.push(what);
        }
    }
    assert!(
        exposed.is_empty(),
        "the service key's secret is readable in {exposed:?}"
    );
    manifest::apply_yaml(&admin, EDITOR_RBAC, None)
        .await
        .expect("editor RBAC");
    let alice = alice_client(&[]).await;
    match Api::<k8s_openapi::api::core::v1::Secret>::namespaced(alice, "kyma-system")
        .get("connectivity-proxy-service-key")
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("a CR editor read the service-key Secret: {other:?}"),
    }
}

/// The ways a secret can appear in text: as it is, JSON-escaped (`\uXXXX` per character), and
/// base64-encoded at each of the three alignments it can have inside a longer encoded value (only the
/// characters that do not depend on the neighbours).
fn leak_forms(secret: &str) -> Vec<String> {
    use base64::Engine;
    let mut forms = vec![
        secret.to_string(),
        secret
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
    ];
    for pad in 0..3 {
        let mut bytes = vec![b'x'; pad];
        bytes.extend_from_slice(secret.as_bytes());
        let enc = base64::engine::general_purpose::STANDARD.encode(&bytes);
        // Drop the characters that encode the filler or the next unknown byte.
        let start = (pad * 4).div_ceil(3);
        let end = enc.trim_end_matches('=').len().saturating_sub(2);
        if start < end {
            forms.push(enc[start..end].to_string());
        }
    }
    forms
}

#[test]
fn leak_forms_find_a_secret_embedded_in_base64_and_escaped_json() {
    use base64::Engine;
    let forms = leak_forms("very-secret-value");
    for prefix in ["", "a", "ab", "abc", "{\"clientsecret\":\""] {
        let embedded = format!("{prefix}very-secret-value\"}}");
        let enc = base64::engine::general_purpose::STANDARD.encode(embedded.as_bytes());
        assert!(
            forms.iter().any(|f| enc.contains(f.as_str())),
            "{prefix:?}: {enc} vs {forms:?}"
        );
    }
    let escaped: String = "very-secret-value"
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    assert!(forms.iter().any(|f| escaped.contains(f.as_str())));
}

/// Test-only RBAC: the controller may read and renew the two Leases of the clock-skew test (the shipped
/// Role names only the operator's own Lease).
const SKEW_LEASE_RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: cp-test-skew-leases
  namespace: kyma-system
rules:
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: ["cp-skew-past", "cp-skew-future"]
  verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: cp-test-skew-leases
  namespace: kyma-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: cp-test-skew-leases
subjects:
- kind: ServiceAccount
  name: connectivity-proxy-controller
  namespace: kyma-system
"#;

/// A Lease held by `holder` with `renewTime` `renew` (RFC 3339) and a 6 s duration.
fn skewed_lease(
    name: &str,
    holder: &str,
    renew: &str,
) -> k8s_openapi::api::coordination::v1::Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kyma-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 6, "renewTime": renew,
                 "acquireTime": renew, "leaseTransitions": 0}
    }))
    .expect("lease")
}

/// Lease expiry is judged by the candidate's own monotonic clock since the lease record last changed,
/// never by comparing the holder's `renewTime` with the local wall clock: a holder whose clock is far
/// behind but who keeps renewing keeps its lease; one whose clock is far ahead but who stopped renewing
/// loses it after a lease duration.
#[tokio::test]
async fn lease_expiry_is_judged_by_the_candidates_clock_not_the_holders_renew_time() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (_turn, cp, admin) = take_turn(&TURN).await;
    install_our_crds(&admin).await;
    cp_tests::cluster::ensure_namespace(&admin, "kyma-system")
        .await
        .expect("ns");
    manifest::apply_yaml(&admin, SKEW_LEASE_RBAC, None)
        .await
        .expect("lease RBAC");
    let lease = 6u64;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kyma-system");
    let holder_of = |name: &'static str| {
        let leases = leases.clone();
        async move {
            leases
                .get(name)
                .await
                .expect("lease")
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default()
        }
    };
    let args = |name: &'static str| {
        [
            "--leader-elect=true".to_string(),
            format!("--lease-seconds={lease}"),
            format!("--lease-name={name}"),
            "--manage-webhook-certs=false".to_string(),
        ]
    };

    // 1. renewTime far in the past (the holder's clock is behind), but the holder keeps renewing.
    for name in ["cp-skew-past", "cp-skew-future"] {
        let _ = leases.delete(name, &Default::default()).await;
    }
    leases
        .create(
            &PostParams::default(),
            &skewed_lease("cp-skew-past", "behind", "2001-01-01T00:00:00.000000Z"),
        )
        .await
        .expect("create the past lease");
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            // The holder's renewals, once a second (a third of what the lease allows).
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            for k in 1u32.. {
                tick.tick().await;
                let renew = format!("2001-01-01T00:{:02}:{:02}.000000Z", (k / 60) % 60, k % 60);
                let patch = json!({"spec": {"renewTime": renew}});
                let _ = leases
                    .patch(
                        "cp-skew-past",
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
            }
        })
    };
    let a_args = args("cp-skew-past");
    let a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let a = ControllerProcess::start_standby(&cp, "skew-past", &a_args)
        .await
        .expect("candidate a");
    // For three lease durations of the candidate's clock it never leads.
    let window = Instant::now() + Duration::from_secs(lease * 3);
    let mut samples = tokio::time::interval(Duration::from_millis(250));
    while Instant::now() < window {
        samples.tick().await;
        assert_eq!(
            a.metric("cp_controller_leader").await,
            0.0,
            "took over a lease that is being renewed (renewTime in the past):\n{}",
            cp.log_tail("skew-past", 20)
        );
    }
    renewer.abort();
    assert_eq!(holder_of("cp-skew-past").await, "behind");
    cp.kill_process("skew-past").expect("stop a");

    // 2. renewTime far in the future (the holder's clock is ahead), and the holder is gone.
    leases
        .create(
            &PostParams::default(),
            &skewed_lease("cp-skew-future", "ahead", "2100-01-01T00:00:00.000000Z"),
        )
        .await
        .expect("create the future lease");
    let started = Instant::now();
    let b_args = args("cp-skew-future");
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let b = ControllerProcess::start_standby(&cp, "skew-future", &b_args)
        .await
        .expect("candidate b");
    cp_tests::wait::until(
        "the candidate takes over the abandoned lease",
        Duration::from_secs(lease * 3),
        || async { Ok((b.metric("cp_controller_leader").await == 1.0).then_some(())) },
    )
    .await
    .unwrap_or_else(cp.panic_with_log("skew-future", 20));
    let took = started.elapsed();
    println!("took over the abandoned lease after {took:?} (lease {lease} s)");
    assert!(
        took >= Duration::from_secs(lease),
        "took over after {took:?}, before a lease duration of its own clock"
    );
    assert_eq!(holder_of("cp-skew-future").await, "skew-future");
    cp.kill_process("skew-future").expect("stop b");
    for name in ["cp-skew-past", "cp-skew-future"] {
        let _ = leases.delete(name, &Default::default()).await;
    }
}

/// A webhook replica that cannot serve the current certificate leaves the Service: `/readyz` fails
/// while the newest certificate published cannot be loaded (a failed reload after a rotation) and once
/// the certificate it serves has expired; it is ready again as soon as it serves a good one.
#[tokio::test]
async fn a_webhook_that_cannot_serve_the_current_certificate_is_not_ready() {
    let (_turn, cp, _, wh) = started_webhook("webhook-cert-health").await;
    let ca = wh.ca.clone().expect("the harness's CA");
    let addr = wh.metrics_addr.clone();
    // Waits `secs` seconds for /readyz to answer `want`; fails with the webhook's log.
    let ready_is = |want: u16, what: &'static str, secs: u64| {
        let (addr, cp) = (addr.clone(), &cp);
        async move {
            cp_tests::wait::until(what, Duration::from_secs(secs), || async {
                match cp_tests::webhook::http_get(&addr, "/readyz").await {
                    Ok((code, _)) if code == want => Ok(Some(())),
                    Ok((code, body)) => Err(format!("{code} {body}")),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await
            .unwrap_or_else(cp.panic_with_log("webhook-cert-health", 10))
        }
    };
    let write = |cert: &str, key: &str| {
        std::fs::write(&wh.cert_file, cert).expect("cert file");
        std::fs::write(&wh.key_file, key).expect("key file");
    };
    let a = cp_tests::webhook::serving_cert(&ca, time::Duration::days(1)).expect("a");
    let b = cp_tests::webhook::serving_cert(&ca, time::Duration::days(1)).expect("b");
    // A rotation whose new certificate cannot be loaded (the key of another certificate).
    write(&b.cert_pem, &a.key_pem);
    ready_is(
        503,
        "not ready while the new certificate cannot be loaded",
        10,
    )
    .await;
    write(&b.cert_pem, &b.key_pem);
    ready_is(200, "ready again with a certificate it can serve", 10).await;
    // A certificate that expires in a few seconds (issued from 30 s ago for 35 s): served, then expired.
    let short = cp_tests::webhook::serving_cert(&ca, time::Duration::seconds(35)).expect("short");
    write(&short.cert_pem, &short.key_pem);
    ready_is(503, "not ready once the served certificate expired", 20).await;
    write(&a.cert_pem, &a.key_pem);
    ready_is(200, "ready again after a renewal", 10).await;
    cp.kill_process("webhook-cert-health").expect("stop");
}
