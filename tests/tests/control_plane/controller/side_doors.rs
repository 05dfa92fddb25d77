//! A stolen controller token gets nothing the controller would not write itself (security round 3,
//! item 1): RBAC lets the controller's ServiceAccount write Secrets, StatefulSets, Services and its
//! PriorityClass in kyma-system, and the API server's admission policy rendered from the controller's
//! table (`cp_api::writes`, `manifests/rbac/controller-writes.yaml`) refuses every write that is not
//! one the controller renders. Every write here is a dry run as the controller's real token.

use std::time::Duration;

use cp_api::names;
use cp_tests::support::{scenario, v1_resource};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = names::KYMA_SYSTEM;

async fn create(token: &kube::Client, body: Value) -> Result<DynamicObject, kube::Error> {
    let kind = body["kind"].as_str().unwrap_or_default().to_string();
    let ar = match kind.as_str() {
        "Secret" => v1_resource("", "Secret", "secrets"),
        "ConfigMap" => v1_resource("", "ConfigMap", "configmaps"),
        "Service" => v1_resource("", "Service", "services"),
        "StatefulSet" => v1_resource("apps", "StatefulSet", "statefulsets"),
        "PriorityClass" => v1_resource("scheduling.k8s.io", "PriorityClass", "priorityclasses"),
        other => panic!("no resource for {other}"),
    };
    let api: Api<DynamicObject> = if kind == "PriorityClass" {
        Api::all_with(token.clone(), &ar)
    } else {
        Api::namespaced_with(token.clone(), NS, &ar)
    };
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // As the controller writes: server-side apply with its field manager (RBAC authorises an apply
    // that creates by name, as the controller's `resourceNames` grants need).
    let params = PatchParams::apply(names::FIELD_MANAGER).force().dry_run();
    api.patch(&name, &params, &Patch::Apply(&body)).await
}

fn refusal(what: &str, r: Result<DynamicObject, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
    }
}

/// The proxy's StatefulSet as the controller renders it, in the part the policy reads, with `pod`
/// merged into its pod spec.
fn statefulset(pod: Value) -> Value {
    let mut spec = json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000},
        "containers": [{"name": "connectivity-proxy", "image": "busybox",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "config", "configMap": {"name": names::CONFIGMAP_CONFIG}}],
    });
    if let (Some(s), Some(p)) = (spec.as_object_mut(), pod.as_object()) {
        for (k, v) in p {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": names::STATEFULSET, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "side-door"}}, "serviceName": names::SERVICE_TUNNEL,
            "template": {"metadata": {"labels": {"app": "side-door"}}, "spec": spec}}})
}

#[tokio::test]
async fn a_stolen_controller_token_cannot_open_a_side_door_to_cluster_admin() {
    let env = scenario().await;
    let token = cp_tests::shared::operator_client().await;
    let secret = |name: &str, ty: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": ty,
            "metadata": {"name": name, "namespace": NS, "annotations": annotations}})
    };
    let sa_token = |name: &str| {
        secret(
            name,
            "kubernetes.io/service-account-token",
            json!({"kubernetes.io/service-account.name": names::CONTROLLER_SERVICE_ACCOUNT}),
        )
    };
    // The policy is in force within seconds of its creation (the controller's RBAC was applied when
    // the controller started): probe with the first side door until it is refused.
    cp_tests::wait::until(
        "the writes policy in force",
        Duration::from_secs(20),
        || async {
            match create(&token, sa_token("planted-token")).await {
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(Some(s.message)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("a service-account-token Secret is refused");

    let side_doors: Vec<(&str, Value, &str)> = vec![
        (
            "a token Secret under the service key's name",
            sa_token(names::SECRET_SERVICE_KEY),
            "writes secrets only as it renders them",
        ),
        (
            "a docker config Secret under a rendered name",
            // A name nobody wrote yet: an existing Secret's type is immutable, refused before admission.
            {
                let mut s = secret(
                    "connectivity-proxy-service-key-backup-planted",
                    "kubernetes.io/dockerconfigjson",
                    json!({}),
                );
                s["data"] = json!({".dockerconfigjson": "e30="});
                s
            },
            "writes secrets only as it renders them",
        ),
        (
            "the proxy's pods as another ServiceAccount",
            statefulset(json!({"serviceAccountName": names::CONTROLLER_SERVICE_ACCOUNT})),
            "default ServiceAccount",
        ),
        (
            "a privileged container",
            statefulset(json!({"containers": [{"name": "c", "image": "busybox",
                "securityContext": {"privileged": true}}]})),
            "privileged",
        ),
        (
            "an added capability",
            statefulset(json!({"containers": [{"name": "c", "image": "busybox",
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]})),
            "capabilities",
        ),
        (
            "a privileged init container",
            statefulset(json!({"initContainers": [{"name": "i", "image": "busybox",
                "securityContext": {"privileged": true}}]})),
            "privileged",
        ),
        (
            "the host's PID namespace",
            statefulset(json!({"hostPID": true})),
            "PID",
        ),
        (
            "the host's network",
            statefulset(json!({"hostNetwork": true})),
            "network",
        ),
        (
            "a hostPath volume of /",
            statefulset(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})),
            "hostPath",
        ),
        (
            "a StatefulSet of another name",
            {
                let mut s = statefulset(json!({}));
                s["metadata"]["name"] = json!("planted");
                s
            },
            "statefulsets only as it renders them",
        ),
        (
            "a Service with externalIPs (CVE-2020-8554)",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": names::SERVICE, "namespace": NS},
                "spec": {"ports": [{"port": 80}], "externalIPs": ["10.0.0.1"]}}),
            "externalIPs",
        ),
        (
            "a LoadBalancer Service",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": names::SERVICE_TUNNEL, "namespace": NS},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            "ClusterIP",
        ),
        (
            "a Service of another name",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "planted", "namespace": NS},
                "spec": {"ports": [{"port": 80}]}}),
            "services only as it renders them",
        ),
        (
            "a ConfigMap of another name",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "planted", "namespace": NS}}),
            "configmaps only as it renders them",
        ),
        (
            "its PriorityClass as the cluster's default",
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": names::PRIORITY_CLASS}, "value": names::PRIORITY_CLASS_VALUE, "globalDefault": true}),
            "default",
        ),
        (
            "its PriorityClass above the proxy's value",
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": names::PRIORITY_CLASS}, "value": 1_000_000_000}),
            "raise its value",
        ),
    ];
    for (what, body, says) in side_doors {
        let msg = refusal(what, create(&token, body).await);
        assert!(msg.contains(says), "{what}: refused, but saying {msg:?}");
        println!("closed: {what}: {msg}");
    }

    // Another module's Secret in kyma-system: the token may not overwrite it, though RBAC allows it.
    let admin_secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(env.admin.clone(), NS);
    let theirs: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "other-module-credentials"}, "stringData": {"password": "theirs"}}))
    .expect("secret");
    let _ = admin_secrets.create(&PostParams::default(), &theirs).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(token.clone(), NS);
    let overwrite = secrets
        .patch(
            "other-module-credentials",
            &PatchParams {
                dry_run: true,
                ..PatchParams::default()
            },
            &Patch::Merge(&json!({"stringData": {"password": "planted"}})),
        )
        .await;
    match overwrite {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
            assert!(
                s.message.contains("secrets only as it renders them"),
                "{}",
                s.message
            )
        }
        other => panic!("overwriting another module's Secret: expected a refusal, got {other:?}"),
    }

    // What the controller renders is still admitted (the install tests run the controller under this
    // policy; these are the shapes of this test's refusals with the one bad field left out).
    let admitted: Vec<(&str, Value)> = vec![
        ("the proxy's StatefulSet", statefulset(json!({}))),
        (
            "the service key Secret",
            secret(names::SECRET_SERVICE_KEY, "Opaque", json!({})),
        ),
        (
            "a service key from secretData under the CR's name for it",
            secret("my-service-key", "Opaque", json!({})),
        ),
        (
            "the tunnel TLS Secret",
            secret(
                &names::tls_secret_name(names::DEFAULT_CR_NAME, NS),
                "kubernetes.io/tls",
                json!({}),
            ),
        ),
    ];
    for (what, mut body) in admitted {
        if body["type"] == "kubernetes.io/tls" {
            body["data"] = json!({"tls.crt": "", "tls.key": ""});
        }
        if let Err(e) = create(&token, body).await {
            // An object that exists already (the controller wrote it) is a conflict, not a refusal.
            match e {
                kube::Error::Api(s) if s.code == 409 => {}
                e => panic!("{what}: the controller's own write was refused: {e}"),
            }
        }
    }
    let _ = admin_secrets
        .delete("other-module-credentials", &Default::default())
        .await;
}

/// The controller patches the proxy's pods after a mapping shard changed (the kubelet then refreshes
/// their ConfigMap volumes at once), and RBAC lets its token patch pods in kyma-system: the policy
/// admits the one annotation on the StatefulSet's pods and nothing else — no image, label, other
/// annotation or finalizer, no other pod.
#[tokio::test]
async fn a_stolen_controller_token_changes_a_proxy_pod_only_in_its_mappings_annotation() {
    let env = scenario().await;
    let token = cp_tests::shared::operator_client().await;
    let key = cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION;
    let admin: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.admin.clone(), NS);
    // Pods no node runs (the control plane has none): the API server admits patches all the same.
    for name in ["connectivity-proxy-90", "side-door-pod"] {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"side-door": "pod"}},
            "spec": {"automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod");
        // The namespace's default ServiceAccount is created by the controller manager, shortly.
        cp_tests::wait::until("a pod in kyma-system", Duration::from_secs(30), || async {
            match admin.create(&PostParams::default(), &pod).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .expect("the test's pods");
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(token.clone(), NS);
    let patch = |name: &'static str, body: Value| {
        let pods = pods.clone();
        async move {
            let params = PatchParams {
                field_manager: Some(names::FIELD_MANAGER.into()),
                dry_run: true,
                ..PatchParams::default()
            };
            pods.patch(name, &params, &Patch::Merge(&body)).await
        }
    };
    let says = "only in their annotation";
    // The policy is in force within seconds of its creation: the first refusal is waited for.
    cp_tests::wait::until(
        "the writes policy in force for pods",
        Duration::from_secs(20),
        || async {
            match patch(
                "connectivity-proxy-90",
                json!({"metadata": {"labels": {"side-door": "opened"}}}),
            )
            .await
            {
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(Some(s.message)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("a label change is refused");
    let refused: Vec<(&str, &'static str, Value)> = vec![
        (
            "another image",
            "connectivity-proxy-90",
            json!({"spec": {"containers": [{"name": "c", "image": "planted"}]}}),
        ),
        (
            "another annotation",
            "connectivity-proxy-90",
            json!({"metadata": {"annotations": {"planted": "yes"}}}),
        ),
        (
            "a finalizer",
            "connectivity-proxy-90",
            json!({"metadata": {"finalizers": ["example.com/planted"]}}),
        ),
        (
            "the annotation on another pod",
            "side-door-pod",
            json!({"metadata": {"annotations": {key: "h"}}}),
        ),
    ];
    for (what, name, body) in refused {
        match patch(name, body).await {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                assert!(
                    s.message.contains(says),
                    "{what}: refused, but saying {:?}",
                    s.message
                );
                println!("closed: {what}: {}", s.message);
            }
            other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
        }
    }
    // What the controller writes is admitted, set or changed.
    for value in ["h1", "h2"] {
        patch(
            "connectivity-proxy-90",
            json!({"metadata": {"annotations": {key: value}}}),
        )
        .await
        .expect("the mappings annotation is the controller's own write");
    }
    // Creating a pod is not the controller's (RBAC refuses it before the policy is asked).
    let created = pods
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &serde_json::from_value(json!({"metadata": {"name": "connectivity-proxy-91"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
            .expect("pod"),
        )
        .await;
    assert!(
        matches!(&created, Err(kube::Error::Api(s)) if s.code == 403),
        "creating a pod: {created:?}"
    );
    for name in ["connectivity-proxy-90", "side-door-pod"] {
        let _ = admin.delete(name, &Default::default()).await;
    }
}
