//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::sync::Arc;

use cp_tests::ControlPlane;
use cp_tests::manifest;
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

/// Path of a file under `../shared/reference/`.
pub fn reference(path: &str) -> PathBuf {
    cp_tests::reference_dir().join(path)
}

/// Path of a file under the project's `manifests/`.
pub fn manifest_path(path: &str) -> PathBuf {
    cp_tests::workspace_root().join("manifests").join(path)
}

/// Installs our CRDs once per test binary.
pub async fn install_our_crds(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        for f in [
            "crds/connectivityproxies.connectivityproxy.sap.com.yaml",
            "crds/servicemappings.connectivityproxy.sap.com.yaml",
        ] {
            manifest::apply_file(client, &manifest_path(f), None)
                .await
                .unwrap_or_else(|e| panic!("applying {f}: {e:#}"));
        }
    })
    .await;
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
