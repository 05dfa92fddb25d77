//! Applying YAML manifests (several documents, any kind) with server-side apply.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{Client, ResourceExt};
use serde::Deserialize;

/// Field manager the harness applies with.
pub const HARNESS_MANAGER: &str = "cp-test-harness";

/// Parses every non-empty YAML document.
pub fn parse_documents(yaml: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let value = serde_norway::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        out.push(serde_norway::from_value(value)?);
    }
    Ok(out)
}

/// Every non-empty YAML document of the file `path`, as JSON; panics naming the file (for tests).
pub fn yaml_values(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_documents(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("json"))
        .collect()
}

/// Applies every document of `yaml`; namespaced objects without a namespace go to `default_ns`.
/// Returns the applied objects.
pub async fn apply_yaml(
    client: &Client,
    yaml: &str,
    default_ns: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for obj in parse_documents(yaml)? {
        applied.push(apply_object(client, obj, default_ns).await?);
    }
    Ok(applied)
}

/// Applies one object given as JSON (e.g. a [`crate::fixtures`] builder's).
pub async fn apply_json(
    client: &Client,
    obj: serde_json::Value,
    default_ns: Option<&str>,
) -> anyhow::Result<DynamicObject> {
    apply_object(client, serde_json::from_value(obj)?, default_ns).await
}

/// Applies one object.
pub async fn apply_object(
    client: &Client,
    mut obj: DynamicObject,
    default_ns: Option<&str>,
) -> anyhow::Result<DynamicObject> {
    let types = obj
        .types
        .clone()
        .context("object without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (ar, caps) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("resolving {}/{}", types.api_version, types.kind))?;
    let name = obj.name_any();
    let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
        let ns = obj
            .metadata
            .namespace
            .clone()
            .or(default_ns.map(String::from))
            .unwrap_or_else(|| "default".into());
        obj.metadata.namespace = Some(ns.clone());
        Api::namespaced_with(client.clone(), &ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    api.patch(
        &name,
        &PatchParams::apply(HARNESS_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .with_context(|| format!("applying {} {name}", types.kind))
}

/// The controller's RBAC and the admission policies bound to its ServiceAccount, as shipped
/// (`rbac/controller.yaml` and the generated `rbac/controller-writes.yaml`).
pub async fn apply_controller_rbac(client: &Client) -> anyhow::Result<()> {
    for rel in ["rbac/controller.yaml", cp_api::bundle::CONTROLLER_WRITES] {
        apply_file(
            client,
            &crate::workspace_root().join("manifests").join(rel),
            None,
        )
        .await?;
    }
    Ok(())
}

/// Applies a YAML file and waits until every CRD in it is Established.
pub async fn apply_file(
    client: &Client,
    path: &Path,
    default_ns: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let applied = apply_yaml(client, &yaml, default_ns).await?;
    for obj in &applied {
        if obj
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "CustomResourceDefinition")
        {
            wait_crd_established(client, &obj.name_any()).await?;
        }
    }
    Ok(applied)
}

/// Waits until a CRD is Established (its API is served).
pub async fn wait_crd_established(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    crate::wait::until(
        &format!("CRD {name} established"),
        Duration::from_secs(30),
        || async {
            let crd = api.get(name).await.map_err(|e| e.to_string())?;
            let ok = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(ok.then_some(()))
        },
    )
    .await
}

/// Deletes a CRD and waits until it is gone.
pub async fn delete_crd(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    crate::wait::until(
        &format!("CRD {name} deleted"),
        Duration::from_secs(60),
        || async {
            Ok(crate::wait::get_opt(&api, name)
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await
}

/// The first container of the Deployment in `manifests/<file>`, as JSON.
pub fn deployment_container(file: &str) -> anyhow::Result<serde_json::Value> {
    let path = crate::workspace_root().join("manifests").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_documents(&text)?
        .into_iter()
        .find(|d| d.types.as_ref().is_some_and(|t| t.kind == "Deployment"))
        .and_then(|d| d.data.pointer("/spec/template/spec/containers/0").cloned())
        .with_context(|| format!("{}: no Deployment with a container", path.display()))
}

/// The literal `env` values (`value`, not `valueFrom`) of the first container of the Deployment in
/// `manifests/<file>`: the harness starts the binaries with them, as the kubelet would.
pub fn deployment_env(file: &str) -> anyhow::Result<Vec<(String, String)>> {
    let container = deployment_container(file)?;
    let env = container["env"].as_array().cloned().unwrap_or_default();
    Ok(env
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect())
}

#[cfg(test)]
mod env_tests {
    #[test]
    fn both_deployments_set_the_allocator_env_the_bench_measured() {
        // The controller allocates with glibc's malloc, the webhook with mimalloc (cp_webhook::memory).
        for (file, keys) in [
            (
                "controller/deployment.yaml",
                &["MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_"][..],
            ),
            ("webhook/deployment.yaml", &["MIMALLOC_PURGE_DELAY"][..]),
        ] {
            let env = super::deployment_env(file).expect("env");
            for key in keys {
                assert!(env.iter().any(|(k, _)| k == key), "{file}: {key} missing");
            }
        }
    }
}
