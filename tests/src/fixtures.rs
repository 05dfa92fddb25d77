//! The project's own test fixtures under `tests/fixtures/` (see its README): minimal third-party CRDs
//! and a legacy installation, written by this project, so a clone with nothing beside it runs and tests.

use std::path::PathBuf;

use anyhow::Context;
use kube::Client;

use crate::manifest;

/// Istio's Gateway, VirtualService, DestinationRule, EnvoyFilter and PeerAuthentication CRDs.
pub const ISTIO_CRDS: &str = "crds/istio.yaml";
/// The BTP service operator's ServiceInstance and ServiceBinding CRDs.
pub const BTP_CRDS: &str = "crds/btp-operator.yaml";
/// Gardener cert-management's Certificate CRD.
pub const GARDENER_CERT_CRD: &str = "crds/gardener-certificate.yaml";
/// cert-manager's Certificate CRD.
pub const CERT_MANAGER_CRD: &str = "crds/cert-manager-certificate.yaml";
/// The legacy reconciler's objects in `kyma-system`.
pub const LEGACY_INSTALL: [&str; 3] = [
    "legacy-install/statefulset.yaml",
    "legacy-install/configmap.yaml",
    "legacy-install/configmap-info.yaml",
];
/// The legacy configuration ConfigMap alone.
pub const LEGACY_CONFIG: &str = "legacy-install/configmap.yaml";

/// Path of a file under `tests/fixtures/`.
pub fn path(rel: &str) -> PathBuf {
    crate::workspace_root().join("tests/fixtures").join(rel)
}

/// The module's default CR as shipped (`manifests/default-cr.yaml`).
pub fn default_cr_path() -> PathBuf {
    crate::workspace_root().join("manifests/default-cr.yaml")
}

/// Applies fixture files (server-side) and waits for any CRDs among them to be established.
pub async fn apply(client: &Client, files: &[&str], namespace: Option<&str>) -> anyhow::Result<()> {
    for f in files {
        manifest::apply_file(client, &path(f), namespace)
            .await
            .with_context(|| format!("applying fixture tests/fixtures/{f}"))?;
    }
    Ok(())
}
