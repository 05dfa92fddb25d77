//! A takeover annotation on a CR in a cluster without a legacy installation: nothing with a legacy name
//! is deleted, adopted or imported (security round 2: an editor's annotations make the controller act).

use std::time::Duration;

use cp_api::ConnectivityProxy;
use cp_tests::fixtures::secret_json;
use cp_tests::support::{CR, NS, scenario, v1_resource};
use cp_tests::wait;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

/// Objects a user may own under names the legacy installation used, with no mark of it.
fn look_alikes() -> Vec<(ApiResource, Option<&'static str>, serde_json::Value)> {
    let core = |kind: &str, plural: &str| v1_resource("", kind, plural);
    vec![
        (
            core("Secret", "secrets"),
            Some("istio-system"),
            secret_json("cc-certs", json!({"mine": "yes"})),
        ),
        (
            core("Secret", "secrets"),
            Some(NS),
            secret_json(
                "connectivity-sm-operator-secrets-tls",
                json!({"mine": "yes"}),
            ),
        ),
        (
            v1_resource("rbac.authorization.k8s.io", "ClusterRole", "clusterroles"),
            None,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "connectivity-proxy-sm-operator"}, "rules": []}),
        ),
        (
            v1_resource(
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
            None,
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "webhook-secret"}, "webhooks": []}),
        ),
    ]
}

#[tokio::test]
async fn a_takeover_annotation_without_a_legacy_installation_deletes_nothing() {
    let admin = &scenario().await.admin;
    let mut created = Vec::new();
    for (ar, ns, body) in look_alikes() {
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
            None => Api::all_with(admin.clone(), &ar),
        };
        let obj: DynamicObject = serde_json::from_value(body).expect("object");
        let name = obj.name_any();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{} {name}: {e}", ar.kind));
        created.push((api, ar.kind, name));
    }
    // The CR as an editor (or an older operator) could have left it: "a takeover in progress".
    let mut cr = cp_tests::fixtures::default_connectivity_proxy("connectivity-proxy");
    cr.metadata.annotations = Some(
        [(
            cp_api::keys::MIGRATION_ANNOTATION.to_string(),
            "in-progress".to_string(),
        )]
        .into(),
    );
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let stored = crs.create(&PostParams::default(), &cr).await.expect("CR");
    // As stored: the CRD's schema defaults filled in.
    let config_before = serde_json::to_value(&stored.spec.config).expect("json");
    let what = "the takeover annotation closed";
    wait::until_object(&crs, CR, what, Duration::from_secs(30), |cr| {
        let a = cr.annotations();
        Ok((a
            .get(cp_api::keys::MIGRATION_ANNOTATION)
            .map(String::as_str)
            == Some("done"))
        .then_some(()))
    })
    .await
    .expect("takeover closed");
    // A takeover deletes before it writes "done": what is left now is what it left.
    let mut missing = Vec::new();
    for (api, kind, name) in &created {
        if api.get_opt(name).await.expect("get").is_none() {
            missing.push(format!("{kind} {name}"));
        }
    }
    let after = crs.get("connectivity-proxy").await.expect("CR");
    for (api, _, name) in &created {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    assert!(
        missing.is_empty(),
        "deleted by a takeover without a legacy installation: {missing:?}"
    );
    assert_eq!(
        serde_json::to_value(&after.spec.config).expect("json"),
        config_before,
        "spec.config untouched"
    );
    assert!(
        !after
            .annotations()
            .contains_key(cp_api::keys::IMPORTED_ANNOTATION),
        "nothing imported"
    );
}
