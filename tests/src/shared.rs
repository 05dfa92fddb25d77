//! What the tests of one binary share: its control plane, the webhook registered in it, the test user
//! [`ALICE`] and her RBAC, and the lock on cluster-scoped ServiceMappings.
//!
//! Each test binary is a process of its own, so "shared" means shared by the tests of one binary. These
//! helpers panic on failure: they are for tests.

use std::sync::Arc;

use crate::ControlPlane;
use crate::manifest;
use crate::webhook::Webhook;

/// The shared control plane ([`ControlPlane::shared`]); panics if it does not start.
pub fn control_plane() -> Arc<ControlPlane> {
    match ControlPlane::shared() {
        Ok(cp) => cp,
        Err(e) => panic!("local control plane failed to start: {e:#}"),
    }
}

/// One test's turn on the shared control plane, for a group whose tests must not overlap: `turn` (the
/// group's lock) held, then the control plane and a cluster-admin client.
pub async fn take_turn(
    turn: &'static tokio::sync::Mutex<()>,
) -> (
    tokio::sync::MutexGuard<'static, ()>,
    Arc<ControlPlane>,
    kube::Client,
) {
    let guard = turn.lock().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    (guard, cp, admin)
}

/// A user with edit rights on both kinds (and nothing else).
pub const ALICE: &str = "alice";

/// The group of every authenticated user, for [`alice_client`].
pub const AUTHENTICATED: &[&str] = &["system:authenticated"];

/// A client of the shared control plane as [`ALICE`], member of `groups`.
pub async fn alice_client(groups: &[&str]) -> kube::Client {
    control_plane()
        .client(&crate::Identity::User {
            name: ALICE.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        })
        .await
        .expect("a client for alice")
}

/// A client of the shared control plane as the operator's ServiceAccount
/// (`kyma-system/connectivity-proxy-controller`): what a stolen controller token can do.
pub async fn operator_client() -> kube::Client {
    control_plane()
        .client(&crate::Identity::ServiceAccount {
            namespace: cp_api::names::KYMA_SYSTEM.into(),
            name: cp_api::names::CONTROLLER_SERVICE_ACCOUNT.into(),
        })
        .await
        .expect("a client as the operator's ServiceAccount")
}

/// The webhook started once per test binary and registered in the API server, with `system:masters`
/// privileged (cluster admins may override `spec.deployment`), plus RBAC for [`ALICE`] and the
/// operator's ServiceAccount. Returns once the API server routes admission through it.
pub async fn webhook() -> &'static Webhook {
    static WEBHOOK: crate::group::Slot<Webhook> = crate::group::Slot::new();
    WEBHOOK
        .get_or_init(|| async {
            let cp = control_plane();
            let client = cp.admin().await.expect("admin");
            crate::fixtures::install_our_crds(&client).await;
            manifest::apply_yaml(&client, EDITOR_RBAC, None)
                .await
                .expect("editor RBAC");
            let wh = Webhook::start(&cp, "cp-webhook", &["--privileged-groups=system:masters"])
                .await
                .expect("webhook starts");
            wh.register(&client).await.expect("register");
            crate::webhook::admission_active(&client)
                .await
                .expect("admission through the webhook");
            wh
        })
        .await
}

/// [`webhook`] running, and a fresh namespace named after `prefix` ([`ControlPlane::namespace`]).
pub async fn webhook_and_namespace(prefix: &str) -> String {
    webhook().await;
    control_plane().namespace(prefix).await.expect("ns")
}

/// Edit rights on both kinds for [`ALICE`], `carol` and the operator's ServiceAccount.
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

/// ServiceMappings are cluster-scoped: tests that create them, or that need none to exist, hold this.
pub static MAPPINGS_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
