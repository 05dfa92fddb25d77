//! What a stolen controller token can do in the Istio namespace and to the ServiceMapping CRD: only
//! what the module needs there (security round 2, item 1), enforced by RBAC and by the API server's
//! admission policies bound to the controller's ServiceAccount.

use std::time::Duration;

use cp_tests::support::{scenario, v1_resource};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stolen_controller_token_runs_nothing_in_the_istio_namespace_and_cannot_rewrite_the_mapping_crd()
 {
    let env = scenario().await;
    let token = cp_tests::shared::operator_client().await;
    let core = |kind: &str, plural: &str| v1_resource("", kind, plural);
    let sts = v1_resource("apps", "StatefulSet", "statefulsets");
    let attempts = [
        (
            sts,
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "planted"},
                "spec": {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "x",
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"serviceAccountName": "istiod",
                        "containers": [{"name": "c", "image": "busybox"}]}}}}),
        ),
        (
            core("ConfigMap", "configmaps"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "planted"}}),
        ),
        (
            core("Service", "services"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "planted"},
                "spec": {"ports": [{"port": 80}]}}),
        ),
    ];
    for (ar, body) in attempts {
        let api: Api<DynamicObject> = Api::namespaced_with(token.clone(), "istio-system", &ar);
        let obj: DynamicObject = serde_json::from_value(body).expect("object");
        refused(
            &format!("create a {} in istio-system", ar.kind),
            api.create(&PostParams::default(), &obj).await,
        );
    }

    // Istio's own Secrets: neither listed nor read by name, nor overwritten.
    let ca: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "istio-ca-secret"}, "stringData": {"ca-key.pem": "not a real key"}}))
    .expect("secret");
    let admin_secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(env.admin.clone(), "istio-system");
    let _ = admin_secrets.create(&PostParams::default(), &ca).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(token.clone(), "istio-system");
    refused(
        "list Secrets in istio-system",
        secrets.list(&Default::default()).await,
    );
    refused(
        "read istio-system/istio-ca-secret",
        secrets.get("istio-ca-secret").await,
    );
    refused(
        "overwrite istio-system/istio-ca-secret",
        secrets
            .patch(
                "istio-ca-secret",
                &PatchParams::default(),
                &Patch::Merge(&json!({"stringData": {"ca-key.pem": "planted"}})),
            )
            .await,
    );
    // What the module needs there is still allowed: its tunnel Secret, by name.
    let tls = cp_api::names::tls_secret_name("connectivity-proxy", "kyma-system");
    match secrets.get_opt(&tls).await {
        Ok(_) => {}
        Err(e) => panic!("reading the tunnel Secret {tls} by name: {e}"),
    }

    // The ServiceMapping CRD: its takeover label, and nothing else.
    let crds: Api<CustomResourceDefinition> = Api::all(token.clone());
    let name = "servicemappings.connectivityproxy.sap.com";
    let label = json!({"metadata": {"labels": {"kyma-project.io/module": "connectivity-proxy"}}});
    // The policy is in force within seconds of its creation: probe with a label change it refuses,
    // a new value each time, so a probe admitted early changes nothing that matters.
    let (admin_crds, what) = (Api::all(env.admin.clone()), "the CRD policy in force");
    cp_tests::wait::label_change_refused(&crds, &admin_crds, name, what, Duration::from_secs(20))
        .await
        .expect("another label refused");
    let spec_edit: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/versions/0/served", "value": false}]),
    )
    .expect("patch");
    let msg = refused(
        "a spec edit of the CRD",
        crds.patch(name, &PatchParams::default(), &Patch::Json::<()>(spec_edit))
            .await,
    );
    assert!(msg.contains("kyma-project.io/module"), "{msg}");
    crds.patch(name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("the takeover's label is admitted");
}
