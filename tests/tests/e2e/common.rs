//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::sync::Arc;

use cp_tests::ControlPlane;
use cp_tests::manifest;
use cp_tests::webhook::Webhook;
use kube::Client;
use serde_json::Value;
use tokio::sync::OnceCell;

/// The shared control plane.
pub fn control_plane() -> Arc<ControlPlane> {
    match ControlPlane::shared() {
        Ok(cp) => cp,
        Err(e) => panic!("local control plane failed to start: {e:#}"),
    }
}

/// Path of a file under the project's `tests/fixtures/`.
pub fn fixture(path: &str) -> PathBuf {
    cp_tests::fixtures::path(path)
}

/// Path of a file under the project's `manifests/`.
pub fn manifest_path(path: &str) -> PathBuf {
    cp_tests::workspace_root().join("manifests").join(path)
}

/// Installs our CRDs once per test binary (into the shared control plane).
pub async fn install_our_crds(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| apply_our_crds(client)).await;
}

/// Applies our CRDs (for a control plane of a test's own).
pub async fn apply_our_crds(client: &Client) {
    for f in [
        "crds/connectivityproxies.connectivityproxy.sap.com.yaml",
        "crds/servicemappings.connectivityproxy.sap.com.yaml",
    ] {
        manifest::apply_file(client, &manifest_path(f), None)
            .await
            .unwrap_or_else(|e| panic!("applying {f}: {e:#}"));
    }
}

/// Every leaf of `expected` must be present with the same value in `actual`; returns the paths
/// that are missing or differ.
pub fn missing_leaves(expected: &Value, actual: &Value, path: &str) -> Vec<String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .flat_map(|(k, v)| {
                missing_leaves(v, a.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"))
            })
            .collect(),
        (e, a) if e == a => vec![],
        _ => vec![format!("{path}: expected {expected}, got {actual}")],
    }
}

/// A user with edit rights on both kinds (and nothing else).
pub const ALICE: &str = "alice";

/// The webhook started once per test binary and registered in the API server, with `system:masters`
/// privileged (cluster admins may override `spec.deployment`), plus RBAC for [`ALICE`] and the
/// operator's ServiceAccount. Returns once the API server routes admission through it.
pub async fn webhook() -> &'static Webhook {
    static WEBHOOK: OnceCell<Webhook> = OnceCell::const_new();
    WEBHOOK
        .get_or_init(|| async {
            let cp = control_plane();
            let client = cp.admin().await.expect("admin");
            install_our_crds(&client).await;
            manifest::apply_yaml(&client, EDITOR_RBAC, None)
                .await
                .expect("editor RBAC");
            let wh = Webhook::start(&cp, "cp-webhook", &["--privileged-groups=system:masters"])
                .await
                .expect("webhook starts");
            wh.register(&client).await.expect("register");
            wait_admission_active(&client).await;
            wh
        })
        .await
}

pub const EDITOR_RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: cp-test-editor
rules:
- apiGroups: ["connectivityproxy.sap.com"]
  resources: ["connectivityproxies", "servicemappings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: cp-test-editor
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cp-test-editor
subjects:
- kind: User
  name: alice
  apiGroup: rbac.authorization.k8s.io
- kind: User
  name: carol
  apiGroup: rbac.authorization.k8s.io
- kind: ServiceAccount
  name: connectivity-proxy-controller
  namespace: kyma-system
"#;

async fn wait_admission_active(client: &Client) {
    let ns = "webhook-probe";
    cp_tests::cluster::ensure_namespace(client, ns)
        .await
        .expect("probe namespace");
    let api = kube::api::Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<cp_api::ConnectivityProxy>(&()),
    );
    wait_admitted(&api, "the API server to call the webhook").await;
}

/// Waits until a dry-run create of the default CR through `api` comes back defaulted by the webhook,
/// i.e. the API server calls the webhook and trusts its certificate.
pub async fn wait_admitted(api: &kube::api::Api<kube::api::DynamicObject>, what: &str) {
    use kube::api::{DynamicObject, PostParams};
    let obj: DynamicObject = serde_json::from_value(default_cr("probe")).expect("object");
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    cp_tests::wait::until(what, std::time::Duration::from_secs(30), || {
        let (api, obj, pp) = (api.clone(), obj.clone(), pp.clone());
        async move {
            let created = api.create(&pp, &obj).await.map_err(|e| e.to_string())?;
            Ok(created.data["spec"].get("deployment").map(|_| ()))
        }
    })
    .await
    .expect("admission through the webhook");
}

/// The Kyma default CR (from the reference example) with another name.
pub fn default_cr(name: &str) -> Value {
    let yaml = std::fs::read_to_string(cp_tests::fixtures::default_cr_path()).expect("default CR");
    let mut v: Value =
        serde_norway::from_str(yaml.split("\n---").next().unwrap_or(&yaml)).expect("yaml");
    v["metadata"] = serde_json::json!({"name": name});
    v
}

/// ServiceMappings are cluster-scoped: tests that create them, or that need none to exist, hold this.
pub static MAPPINGS_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
