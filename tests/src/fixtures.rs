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
/// Everything the legacy reconciler left in a cluster but its ServiceMapping webhook registration
/// ([`LEGACY_WEBHOOK`], applied once the mappings exist, as in a live cluster). Needs the Istio and
/// Gardener Certificate CRDs ([`LEGACY_CRDS`]).
pub const LEGACY_INSTALL: [&str; 10] = [
    "legacy-install/statefulset.yaml",
    "legacy-install/configmap.yaml",
    "legacy-install/configmap-info.yaml",
    "legacy-install/configmap-service-mappings.yaml",
    "legacy-install/workloads.yaml",
    "legacy-install/services.yaml",
    "legacy-install/istio.yaml",
    "legacy-install/secrets.yaml",
    "legacy-install/priorityclass.yaml",
    "legacy-install/gardener-certificate.yaml",
];
/// The legacy ServiceMapping validator's registration (`failurePolicy: Fail`, its Service has no
/// endpoints here: while it exists every ServiceMapping write fails).
pub const LEGACY_WEBHOOK: &str = "legacy-install/webhook.yaml";
/// The third-party CRDs a legacy installation needs.
pub const LEGACY_CRDS: [&str; 3] = [ISTIO_CRDS, BTP_CRDS, GARDENER_CERT_CRD];
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
