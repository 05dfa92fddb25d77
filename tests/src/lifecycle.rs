//! What kyma-project/lifecycle-manager does with this module, step by step, each step naming the
//! source file and function it follows. Read at lifecycle-manager@c5b83f1b542602bb27a5fd950319cca354d189f1
//! with the search tool's `fetch`: the Go module proxy here refuses every `github.com/kyma-project/*`
//! module (403, checked again on 2026-12-03), so the program itself cannot be built or run here. Nothing
//! of its code is copied; these are the steps as its code performs them, re-done against a real API
//! server and node.
//!
//! One [`Manifest`] plays one Manifest CR of lifecycle-manager: a reconcile is [`Manifest::reconcile`],
//! called again (as lifecycle-manager requeues) until the module is where the test wants it.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use futures::future::join_all;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Client, ResourceExt};
use serde_json::Value;

use cp_api::images::ImageRef;

/// Field manager of every server-side apply (`internal/common/fieldowners/const.go`).
pub const APPLIER: &str = "declarative.kyma-project.io/applier";
/// Field owner of the default CR's create (`internal/manifest/modulecr/client.go`, `SyncDefaultModuleCR`).
pub const DEFAULT_CR_OWNER: &str = "resource.kyma-project.io/finalizer";
/// Labels stamped on every object (`internal/service/manifest/render/default_transforms.go`), besides
/// `app.kubernetes.io/component: <manifest name>`.
pub const STAMPED_LABELS: [(&str, &str); 2] = [
    ("operator.kyma-project.io/managed-by", "kyma"),
    ("app.kubernetes.io/part-of", "Kyma"),
];
/// The annotation naming the owning Manifest (`default_transforms.go`).
pub const OWNED_BY: &str = "deprecated-operator.kyma-project.io/owned-by";
/// The disclaimer annotation (`default_transforms.go`).
pub const DISCLAIMER: &str = "operator.kyma-project.io/managed-by-reconciler-disclaimer";
const DISCLAIMER_TEXT: &str = "DO NOT EDIT - This resource is managed by Kyma.\nAny modifications are discarded and the resource is reverted to the original state.";

/// Kinds deleted in the second phase of a prune (`internal/pkg/resources/cleanup.go`,
/// `DeleteDiffResources`): the operator's own scaffolding goes last.
const SECOND_PHASE: [&str; 9] = [
    "CustomResourceDefinition",
    "Namespace",
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "Service",
    "Deployment",
];

/// A module state as lifecycle-manager writes it on the Manifest (and so on the Kyma CR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleState {
    /// Applied and the manager workload ready.
    Ready,
    /// Applying, or the manager not ready yet.
    Processing,
    /// Something failed (the manager workload in error, an apply refused).
    Error,
    /// Prune or removal waiting for objects to go.
    Warning,
    /// Removal waiting for the module's CRs.
    Deleting,
}

/// One object of a manifest: `(apiVersion, kind, namespace, name)`.
pub type ObjRef = (String, String, Option<String>, String);

/// Docker's split of an image reference as lifecycle-manager's rewrite compares it
/// (`internal/imagerewrite/rewrite.go`, `NewDockerImageReference`): host and path, the last path segment
/// with its tag, the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerRef {
    /// Registry and every path segment but the last.
    pub host_and_path: String,
    /// The last path segment, with `:tag` when there is one.
    pub name_and_tag: String,
    /// `sha256:...`, if any.
    pub digest: Option<String>,
}

impl DockerRef {
    /// Parses as `reference.ParseNormalizedNamed` normalises (Docker Hub names get `docker.io/library`).
    pub fn parse(s: &str) -> Option<DockerRef> {
        let r = ImageRef::parse(s).ok()?;
        let (path, last) = match r.repository.rsplit_once('/') {
            Some((p, l)) => (format!("{}/{p}", r.registry), l.to_string()),
            None => (r.registry.clone(), r.repository.clone()),
        };
        let name_and_tag = if r.tag.is_empty() {
            last
        } else {
            format!("{last}:{}", r.tag)
        };
        Some(DockerRef {
            host_and_path: path,
            name_and_tag,
            digest: r.digest,
        })
    }

    /// `HostAndPath/NameAndTag[@Digest]` (`String()`).
    pub fn render(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}/{}@{d}", self.host_and_path, self.name_and_tag),
            None => format!("{}/{}", self.host_and_path, self.name_and_tag),
        }
    }
}

/// The image localization (`internal/service/manifest/render/default_transforms.go`,
/// `DockerImageLocalizationTransform` → `internal/imagerewrite/resource_rewriter.go`, `ReplaceImages`):
/// in every Deployment and StatefulSet, every container's and init container's `image` is replaced by
/// the first target with the same last-segment-and-tag, and every env `value` that parses as an image
/// with that last-segment-and-tag likewise (`isImageRefForReplacement`); `valueFrom` entries are left
/// alone. Returns how many fields changed.
pub fn localize_images(objects: &mut [Value], targets: &[String]) -> anyhow::Result<usize> {
    if targets.is_empty() {
        return Ok(0);
    }
    let targets: Vec<DockerRef> = targets
        .iter()
        .map(|t| {
            DockerRef::parse(t).with_context(|| format!("failed to parse localized image {t}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut changed = 0;
    for o in objects.iter_mut() {
        if o["kind"] != "Deployment" && o["kind"] != "StatefulSet" {
            continue;
        }
        let spec = &mut o["spec"]["template"]["spec"];
        for list in ["containers", "initContainers"] {
            let Some(containers) = spec[list].as_array_mut() else {
                continue;
            };
            for c in containers {
                if let Some(image) = c["image"].as_str() {
                    let current = DockerRef::parse(image)
                        .with_context(|| format!("container image {image} does not parse"))?;
                    if let Some(t) = targets
                        .iter()
                        .find(|t| t.name_and_tag == current.name_and_tag)
                    {
                        c["image"] = Value::String(t.render());
                        changed += 1;
                    }
                }
                for e in c["env"].as_array_mut().into_iter().flatten() {
                    let Some(value) = e["value"].as_str() else {
                        continue;
                    };
                    let hit = targets.iter().find(|t| {
                        value.contains(&t.name_and_tag)
                            && DockerRef::parse(value)
                                .is_some_and(|v| v.name_and_tag == t.name_and_tag)
                    });
                    if let Some(t) = hit {
                        e["value"] = Value::String(t.render());
                        changed += 1;
                    }
                }
            }
        }
    }
    Ok(changed)
}

/// The images modulectl finds in a manifest and lists in the module's component descriptor, which
/// is where lifecycle-manager's localization takes its targets from
/// (modulectl@902c4f8f88 `internal/service/contentprovider/manifest.go` `ExtractImagesFromManifest`,
/// `internal/service/image/image.go` `IsImageReferenceCandidate`): the `image` of every container and
/// init container of every Deployment and StatefulSet, and every env value of 3 to 256 characters with
/// a `:` or `@` and no white space.
pub fn modulectl_images(docs: &[Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for d in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
    {
        for list in ["containers", "initContainers"] {
            for c in d["spec"]["template"]["spec"][list]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.extend(c["image"].as_str().map(String::from));
                for e in c["env"].as_array().into_iter().flatten() {
                    if let Some(v) = e["value"].as_str()
                        && (3..=256).contains(&v.len())
                        && (v.contains(':') || v.contains('@'))
                        && !v.contains(char::is_whitespace)
                    {
                        out.insert(v.to_string());
                    }
                }
            }
        }
    }
    out
}

/// The labels and annotations stamped on every object (`default_transforms.go`): stamped values
/// overwrite the manifest's.
pub fn stamp(objects: &mut [Value], manifest_namespace: &str, manifest_name: &str) {
    for o in objects.iter_mut() {
        let md = &mut o["metadata"];
        if !md["labels"].is_object() {
            md["labels"] = Value::Object(Default::default());
        }
        for (k, v) in STAMPED_LABELS {
            md["labels"][k] = Value::String(v.into());
        }
        md["labels"]["app.kubernetes.io/component"] = Value::String(manifest_name.into());
        if !md["annotations"].is_object() {
            md["annotations"] = Value::Object(Default::default());
        }
        md["annotations"][OWNED_BY] =
            Value::String(format!("{manifest_namespace}/{manifest_name}"));
        md["annotations"][DISCLAIMER] = Value::String(DISCLAIMER_TEXT.into());
    }
}

fn obj_ref(o: &Value) -> ObjRef {
    (
        o["apiVersion"].as_str().unwrap_or_default().to_string(),
        o["kind"].as_str().unwrap_or_default().to_string(),
        o["metadata"]["namespace"].as_str().map(String::from),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// The manager's state as lifecycle-manager reads a Deployment
/// (`internal/manifest/statecheck/deployment_state_check.go`, `determineDeploymentState`).
pub fn deployment_state(deployment: &Value) -> ModuleState {
    let cond = |t: &str| {
        deployment["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t)
            .cloned()
    };
    let progressing = cond("Progressing");
    let available = cond("Available").is_some_and(|c| c["status"] == "True");
    let Some(p) = progressing.filter(|p| p["status"] == "True") else {
        return ModuleState::Error;
    };
    let reason = p["reason"].as_str().unwrap_or_default();
    let rolling = [
        "FoundNewReplicaSet",
        "NewReplicaSetCreated",
        "ReplicaSetUpdated",
    ];
    match (available, reason) {
        (true, "NewReplicaSetAvailable") => ModuleState::Ready,
        (_, r) if rolling.contains(&r) => ModuleState::Processing,
        (false, "NewReplicaSetAvailable") => ModuleState::Processing,
        _ => ModuleState::Error,
    }
}

/// One reconcile's outcome: the state written and the operation text (or the error that requeues).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The Manifest's state after the pass.
    pub state: ModuleState,
    /// What lifecycle-manager writes as the operation, or the error it requeues with.
    pub operation: String,
}

/// One Manifest CR of lifecycle-manager.
pub struct Manifest {
    client: Client,
    /// The Manifest's namespace and name (the owned-by annotation).
    pub namespace: String,
    /// The Manifest's name.
    pub name: String,
    /// `status.synced`: what the last successful apply applied.
    pub synced: Vec<ObjRef>,
    /// The ModuleCR condition: the default CR was created (never re-created once True).
    pub default_cr_synced: bool,
    resources: BTreeMap<(String, String), (ApiResource, bool)>,
}

impl Manifest {
    /// A Manifest for the module on `client`'s cluster.
    pub fn new(client: Client, namespace: &str, name: &str) -> Manifest {
        Manifest {
            client,
            namespace: namespace.into(),
            name: name.into(),
            synced: Vec::new(),
            default_cr_synced: false,
            resources: BTreeMap::new(),
        }
    }

    async fn api(
        &mut self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> anyhow::Result<Api<DynamicObject>> {
        let key = (api_version.to_string(), kind.to_string());
        if !self.resources.contains_key(&key) {
            let (ar, caps) = kube::discovery::pinned_kind(&self.client, &gvk(api_version, kind))
                .await
                .with_context(|| format!("discovering {api_version} {kind}"))?;
            self.resources
                .insert(key.clone(), (ar, caps.scope == Scope::Namespaced));
        }
        let (ar, namespaced) = self.resources[&key].clone();
        Ok(match (namespaced, ns) {
            // `internal/service/manifest/render/normalise.go` (`NormaliseNamespace`): a namespaced
            // object without a namespace goes to `default`, a cluster-scoped one loses its namespace.
            (true, ns) => Api::namespaced_with(self.client.clone(), ns.unwrap_or("default"), &ar),
            (false, _) => Api::all_with(self.client.clone(), &ar),
        })
    }

    /// Server-side apply of every object at once, forced, with [`APPLIER`]
    /// (`internal/manifest/skrresources/ssa.go`, `ConcurrentDefaultSSA.Run` and
    /// `serverSideApplyObject`): no order (CRDs are not applied first); failures are joined.
    async fn apply(&mut self, objects: &[Value]) -> Vec<String> {
        let mut apis = Vec::new();
        for o in objects {
            let (av, kind, ns, _) = obj_ref(o);
            apis.push(self.api(&av, &kind, ns.as_deref()).await);
        }
        let pp = PatchParams::apply(APPLIER).force();
        let writes = objects.iter().zip(apis).map(|(o, api)| {
            let pp = pp.clone();
            let mut o = o.clone();
            if let Some(md) = o["metadata"].as_object_mut() {
                md.remove("managedFields");
            }
            async move {
                let (_, kind, _, name) = obj_ref(&o);
                let api = api.map_err(|e| format!("{kind} {name}: {e:#}"))?;
                api.patch(&name, &pp, &Patch::Apply(&o))
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{kind} {name}: {e}"))
            }
        });
        join_all(writes)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect()
    }

    /// Deletes `gone` in two phases with background propagation (`internal/pkg/resources/cleanup.go`,
    /// `DeleteDiffResources`); `true` once none of them is found any more.
    async fn delete(&mut self, gone: &[ObjRef]) -> anyhow::Result<bool> {
        let (first, second): (Vec<&ObjRef>, Vec<&ObjRef>) = gone
            .iter()
            .filter(|(_, kind, _, name)| !(kind == "Namespace" && name == "kyma-system"))
            .partition(|(_, kind, _, _)| !SECOND_PHASE.contains(&kind.as_str()));
        for phase in [first, second] {
            let mut found = false;
            for (av, kind, ns, name) in phase {
                let api = self.api(av, kind, ns.as_deref()).await?;
                match api.delete(name, &DeleteParams::background()).await {
                    Ok(_) => found = true,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e).with_context(|| format!("deleting {kind} {name}")),
                }
            }
            if found {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One install reconcile (`internal/controller/manifest/controller.go`, `install`): prune what the
    /// new target no longer has, apply the target, record it as `status.synced` (a changed list ends
    /// the pass in Processing), create the default CR once (`SyncDefaultModuleCR`), then judge the
    /// manager (the first Deployment of the target; `statecheck/state_check.go`, `findManager`).
    pub async fn reconcile(
        &mut self,
        target: &[Value],
        default_cr: Option<&Value>,
    ) -> anyhow::Result<Outcome> {
        let refs: Vec<ObjRef> = target.iter().map(obj_ref).collect();
        let wanted: BTreeSet<&ObjRef> = refs.iter().collect();
        let gone: Vec<ObjRef> = self
            .synced
            .iter()
            .filter(|r| !wanted.contains(r))
            .cloned()
            .collect();
        if !gone.is_empty() && !self.delete(&gone).await? {
            return Ok(Outcome {
                state: ModuleState::Warning,
                operation: "deletion of resources not finished".into(),
            });
        }
        let failed = self.apply(target).await;
        if !failed.is_empty() {
            return Ok(Outcome {
                state: ModuleState::Error,
                operation: failed.join("; "),
            });
        }
        if self.synced != refs {
            self.synced = refs;
            return Ok(Outcome {
                state: ModuleState::Processing,
                operation: "resource syncTarget state diff detected".into(),
            });
        }
        if let Some(cr) = default_cr
            && !self.default_cr_synced
        {
            if let Err(e) = self.create_default_cr(cr).await {
                return Ok(Outcome {
                    state: ModuleState::Error,
                    // `controller.go` `syncDefaultModuleCR`: Error with the create's error as the
                    // operation; requeued with the failure backoff (5 s, 10 s, 20 s, then 30 s).
                    operation: format!("failed to create resource: {e:#}"),
                });
            }
            self.default_cr_synced = true;
        }
        let manager = target
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .or_else(|| target.iter().find(|o| o["kind"] == "StatefulSet"))
            .map(obj_ref);
        let state = match manager {
            None => ModuleState::Ready,
            Some((av, kind, ns, name)) => {
                let api = self.api(&av, &kind, ns.as_deref()).await?;
                let live = api.get(&name).await?;
                deployment_state(&serde_json::to_value(&live)?)
            }
        };
        let operation = if state == ModuleState::Ready {
            "resources are ready"
        } else {
            "waiting for resources to become ready"
        };
        Ok(Outcome {
            state,
            operation: operation.into(),
        })
    }

    /// `SyncDefaultModuleCR` (`internal/manifest/modulecr/client.go`): Get, and on NotFound a plain
    /// Create with [`DEFAULT_CR_OWNER`], the template's data unchanged (no label or annotation added).
    async fn create_default_cr(&mut self, cr: &Value) -> anyhow::Result<()> {
        let (av, kind, ns, name) = obj_ref(cr);
        let api = self.api(&av, &kind, ns.as_deref()).await?;
        if api.get_opt(&name).await?.is_some() {
            return Ok(());
        }
        let obj: DynamicObject = serde_json::from_value(cr.clone())?;
        let pp = PostParams {
            field_manager: Some(DEFAULT_CR_OWNER.into()),
            ..Default::default()
        };
        match api.create(&pp, &obj).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// One removal reconcile (`controller.go`, `delete`): while CRs of the module's kind other than the
    /// default one exist, Deleting (`modulecr.CheckModuleCRsDeletion`); while the default CR exists,
    /// the manifest is applied as before and the default CR deleted and waited for
    /// (`RemoveDefaultModuleCR`); then every synced object is pruned (Warning until none is left).
    /// `Ok(None)` when the module is gone.
    pub async fn remove(
        &mut self,
        target: &[Value],
        default_cr: &Value,
    ) -> anyhow::Result<Option<Outcome>> {
        let (av, kind, ns, name) = obj_ref(default_cr);
        // Every CR of the kind, in all namespaces (a cluster-wide Api of the same resource).
        let Ok(api) = self.api(&av, &kind, ns.as_deref()).await else {
            // The CRD is gone already: nothing of the kind is left.
            return self.prune_all().await;
        };
        let crs: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &self.resources[&(av.clone(), kind.clone())].0,
        );
        let items = match crs.list(&Default::default()).await {
            Ok(l) => l.items,
            // The CRD went with the first prune pass: nothing of the kind is left.
            Err(kube::Error::Api(e)) if e.code == 404 => return self.prune_all().await,
            Err(e) => return Err(e.into()),
        };
        let others: Vec<String> = items
            .into_iter()
            .filter(|c| !(c.name_any() == name && c.namespace() == ns))
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        if !others.is_empty() {
            return Ok(Some(Outcome {
                state: ModuleState::Deleting,
                operation: format!("waiting for module crs deletion: {others:?}"),
            }));
        }
        let exists = match api.get(&name).await {
            Ok(_) => true,
            // Gone, or its resource no longer served (the CRD pruned).
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => return Err(e.into()),
        };
        if exists {
            let failed = self.apply(target).await;
            if !failed.is_empty() {
                bail!("applying during removal: {}", failed.join("; "));
            }
            let _ = api.delete(&name, &DeleteParams::background()).await;
            return Ok(Some(Outcome {
                state: ModuleState::Deleting,
                // `controller.go`: Deleting while the module's own finalizer holds the default CR.
                operation: "waiting as other finalizers are present".into(),
            }));
        }
        self.prune_all().await
    }

    async fn prune_all(&mut self) -> anyhow::Result<Option<Outcome>> {
        let all = self.synced.clone();
        if self.delete(&all).await? {
            self.synced.clear();
            Ok(None)
        } else {
            Ok(Some(Outcome {
                state: ModuleState::Warning,
                operation: "deletion of resources not finished".into(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// lifecycle-manager's own vectors (`podcontainer_envs_rewriter_test.go`, `rewrite_test.go`).
    #[test]
    fn the_rewrite_matches_lifecycle_managers_vectors() {
        let targets = vec![
            "private-registry.com/prod/foo-image:1.2.3".to_string(),
            "private-registry.com/stage/bar-image:4.5.6".to_string(),
        ];
        let mut objs = vec![json!({"kind": "Deployment", "spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "image": "example.com/x/bar-image:4.5.6"}],
        "containers": [{"name": "c", "image": "docker.io/foo-image:1.2.3", "env": [
            {"name": "A", "value": "localhost:5000/foo-image:1.2.3"},
            {"name": "B", "value": "example.com/myrepo/bar-image:4.5.6"},
            {"name": "C", "value": "example.com/myrepo/bar-image:9.9.9"},
            {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "E", "value": "not an image"}
        ]}]}}}})];
        assert_eq!(localize_images(&mut objs, &targets).expect("rewrite"), 4);
        let c = &objs[0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "private-registry.com/prod/foo-image:1.2.3");
        assert_eq!(
            c["env"][0]["value"],
            "private-registry.com/prod/foo-image:1.2.3"
        );
        assert_eq!(
            c["env"][1]["value"],
            "private-registry.com/stage/bar-image:4.5.6"
        );
        assert_eq!(c["env"][2]["value"], "example.com/myrepo/bar-image:9.9.9");
        assert_eq!(c["env"][4]["value"], "not an image");
        assert_eq!(
            objs[0]["spec"]["template"]["spec"]["initContainers"][0]["image"],
            "private-registry.com/stage/bar-image:4.5.6"
        );
        let r = DockerRef::parse(
            "example.pkg.io/example-project/prod/external/gcr.io/kaniko-project/executor:v1.24.0",
        )
        .expect("parses");
        assert_eq!(
            r.host_and_path,
            "example.pkg.io/example-project/prod/external/gcr.io/kaniko-project"
        );
        assert_eq!(r.name_and_tag, "executor:v1.24.0");
    }

    #[test]
    fn the_manager_state_is_read_as_lifecycle_manager_reads_a_deployment() {
        let d = |p: (&str, &str), a: &str| {
            json!({"status": {"conditions": [
                {"type": "Progressing", "status": p.0, "reason": p.1},
                {"type": "Available", "status": a}]}})
        };
        assert_eq!(
            deployment_state(&d(("True", "NewReplicaSetAvailable"), "True")),
            ModuleState::Ready
        );
        assert_eq!(
            deployment_state(&d(("True", "ReplicaSetUpdated"), "False")),
            ModuleState::Processing
        );
        assert_eq!(
            deployment_state(&d(("True", "NewReplicaSetCreated"), "True")),
            ModuleState::Processing
        );
        assert_eq!(
            deployment_state(&d(("False", "ProgressDeadlineExceeded"), "False")),
            ModuleState::Error
        );
        assert_eq!(deployment_state(&json!({})), ModuleState::Error);
    }
}
