//! Taking over an installation left by the legacy reconciler. [`plan`] decides (read-only, pure
//! where it can be): what to import into the CR, what to back up, what to delete, adopt or keep, and
//! what blocks the takeover. [`migrate`] carries it out one step per reconcile, each step checking its
//! own state first, so a crash at any point resumes where it stopped and loses nothing:
//! start (takeover id) → backups → import (validated first) → teardown (the legacy ServiceMapping
//! webhook first) → done.

pub mod import;
pub mod legacy;
pub mod plan;

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, names};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

pub use import::{ImportError, import};
pub use plan::{Blocker, Plan};

use crate::Error;
use legacy::{Action, LEGACY_KINDS, LEGACY_SERVICE_KEY};

use cp_api::keys::{
    BACKUP_NAMESPACE, BACKUP_OF_ANNOTATION, IMPORTED_ANNOTATION, MIGRATION_ANNOTATION,
    TAKEOVER_ID_ANNOTATION,
};

/// Whether a StatefulSet was left by the legacy reconciler.
pub fn is_legacy(meta: &kube::api::ObjectMeta) -> bool {
    let managed_by_us = meta.labels.as_ref().is_some_and(plan::is_ours);
    let reconciler_label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LEGACY_LABEL_MANAGED_BY))
        .is_some_and(|v| v == names::LEGACY_MANAGED_BY_VALUE);
    let disclaimer = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(names::LEGACY_DISCLAIMER_ANNOTATION));
    !managed_by_us && (reconciler_label || disclaimer)
}

/// Whether an object carries a mark of the legacy reconciler's installation, as the real legacy
/// objects do: the reconciler's labels (`reconciler.kyma-project.io/managed-by: reconciler`), any of
/// its annotations (the disclaimer, `skip-rendering-on-upgrade`), or the Helm chart's labels
/// (`heritage: Helm` with release or chart `connectivity-proxy`, or `app.kubernetes.io/managed-by:
/// Helm` with the release annotation). A name alone is no mark.
pub fn legacy_marked(meta: &kube::api::ObjectMeta) -> bool {
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let reconciler_label =
        label(names::LEGACY_LABEL_MANAGED_BY) == Some(names::LEGACY_MANAGED_BY_VALUE);
    let reconciler_annotation = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.keys().any(|k| k.starts_with(LEGACY_RECONCILER_DOMAIN)));
    let chart = label("heritage") == Some("Helm")
        && (label("release") == Some(names::STATEFULSET)
            || label("chart").is_some_and(|c| c.starts_with("connectivity-proxy-")));
    let helm = label("app.kubernetes.io/managed-by") == Some("Helm")
        && meta
            .annotations
            .as_ref()
            .and_then(|a| a.get("meta.helm.sh/release-name"))
            .is_some_and(|r| r == names::STATEFULSET);
    reconciler_label || reconciler_annotation || chart || helm
}

/// The legacy reconciler's label and annotation domain.
const LEGACY_RECONCILER_DOMAIN: &str = "reconciler.kyma-project.io/";

/// What the migration step concluded.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing to migrate (or done): continue with the install.
    NotNeeded,
    /// A step changed the CR or the cluster; the next reconcile takes the next step.
    Progressed(cp_api::reason::Reason),
    /// The takeover cannot proceed; the legacy installation was not touched.
    Blocked(Vec<Blocker>),
    /// The takeover is done, but these objects with legacy names carry no mark of the legacy
    /// installation and were left as they are (a Warning names them).
    LeftAlone(Vec<String>),
}

/// A takeover id: UTC time to the second, usable in object names.
fn new_takeover_id() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

async fn patch_cr(
    client: &Client,
    cr: &ConnectivityProxy,
    patch: serde_json::Value,
    what: &str,
) -> Result<(), Error> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(client.clone(), &cr.namespace().unwrap_or_default());
    api.patch(
        &cr.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| Error::kube(what.to_string(), e))?;
    Ok(())
}

/// Runs the next migration step, if any.
pub async fn migrate(client: &Client, cr: &ConnectivityProxy) -> Result<Outcome, Error> {
    let ns = cr.namespace().unwrap_or_default();
    let state = cr.annotations().get(MIGRATION_ANNOTATION).cloned();
    let id = cr
        .annotations()
        .get(TAKEOVER_ID_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let legacy_present = {
        let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns)
            .get_opt(names::STATEFULSET)
            .await
            .map_err(|e| Error::kube("reading the StatefulSet", e))?;
        sts.as_ref().is_some_and(|s| is_legacy(&s.metadata))
    };
    // Only "in-progress" continues a takeover; any other value (the webhook refuses the annotation
    // from anyone but the operator, but an older release or an admin may have written one) counts as
    // no takeover, and a new one starts only where a legacy StatefulSet with its marks exists.
    if state.as_deref() != Some("in-progress") {
        if !legacy_present {
            return Ok(Outcome::NotNeeded);
        }
        // First takeover, or a legacy installation back after a rollback: a new takeover with its
        // own backups; earlier backups stay as history.
        let id = new_takeover_id();
        patch_cr(
            client,
            cr,
            json!({"metadata": {"annotations": {MIGRATION_ANNOTATION: "in-progress",
                TAKEOVER_ID_ANNOTATION: id, IMPORTED_ANNOTATION: null}}}),
            "starting the takeover",
        )
        .await?;
        tracing::info!(takeover = %id, "legacy reconciler installation detected; takeover started");
        return Ok(Outcome::Progressed(
            cp_api::reason::Reason::LegacyInstallationDetected,
        ));
    }
    if id.is_empty() {
        // Started by an operator release without takeover ids.
        patch_cr(
            client,
            cr,
            json!({"metadata": {"annotations": {TAKEOVER_ID_ANNOTATION: new_takeover_id()}}}),
            "recording the takeover id",
        )
        .await?;
        return Ok(Outcome::Progressed(
            cp_api::reason::Reason::LegacyTakeoverIdRecorded,
        ));
    }

    let facts = plan::gather(client, &ns, &id).await?;
    let evidence = facts.legacy_statefulset
        || facts.found.iter().any(|f| !f.ours && f.marked)
        || !facts.backups.is_empty();
    if !evidence && !cr.annotations().contains_key(IMPORTED_ANNOTATION) {
        // A takeover "in progress" with no legacy installation, no backup of one and nothing imported:
        // not a takeover this operator started. Nothing is imported, deleted or adopted.
        tracing::warn!(takeover = %id, "takeover annotation without any legacy installation: nothing taken over");
        patch_cr(
            client,
            cr,
            json!({"metadata": {"annotations": {MIGRATION_ANNOTATION: "done"}}}),
            "closing a takeover without a legacy installation",
        )
        .await?;
        return Ok(Outcome::Progressed(
            cp_api::reason::Reason::NoLegacyInstallation,
        ));
    }
    let plan = plan::plan(&cr.spec, &facts, &id);
    if !plan.blockers.is_empty() {
        return Ok(Outcome::Blocked(plan.blockers));
    }
    backup(client, &ns, &id, &facts).await?;

    if !cr.annotations().contains_key(IMPORTED_ANNOTATION) {
        let summary = if plan.imported.is_empty() {
            "nothing".to_string()
        } else {
            plan.imported.join(",")
        };
        let mut spec = json!({"config": plan.config});
        if let Some(secret) = &plan.service_key_secret {
            spec["secretConfig"] =
                json!({"integration": {"connectivityService": {"secretName": secret}}});
        }
        patch_cr(
            client,
            cr,
            json!({"metadata": {"annotations": {IMPORTED_ANNOTATION: summary}}, "spec": spec}),
            "importing the legacy configuration into the CR",
        )
        .await?;
        tracing::info!(imported = ?plan.imported, "legacy configuration imported into the CR");
        return Ok(Outcome::Progressed(
            cp_api::reason::Reason::LegacyConfigurationImported,
        ));
    }

    take_over_mapping_crd(client).await?;
    let shared_key_kept = !plan.keep.is_empty();
    for found in facts.found.iter().filter(|f| !f.ours) {
        let Some(kind) = LEGACY_KINDS.get(found.kind_index) else {
            continue;
        };
        if !found.touchable(Some(kind.action)) {
            tracing::warn!(object = %found.display(), "an object with a legacy name but no mark of the legacy installation: left alone");
            continue;
        }
        let ar = kind.api_resource();
        let api: Api<DynamicObject> = if found.namespace.is_empty() {
            Api::all_with(client.clone(), &ar)
        } else {
            Api::namespaced_with(client.clone(), &found.namespace, &ar)
        };
        match kind.action {
            Action::Adopt => {
                // Relabel as ours; the install then applies our content over it.
                let patch = json!({"metadata": {"labels": {
                    names::LABEL_MANAGED_BY: names::MANAGED_BY_VALUE,
                    names::LABEL_MODULE: names::MODULE_VALUE,
                    names::LEGACY_LABEL_MANAGED_BY: null}}});
                api.patch(&found.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| Error::kube(format!("adopting legacy {}", found.display()), e))?;
                tracing::info!(object = %found.display(), "legacy object adopted");
            }
            Action::ServiceKey if shared_key_kept => {}
            Action::Delete | Action::ServiceKey => {
                match api.delete(&found.name, &DeleteParams::background()).await {
                    Ok(_) => tracing::info!(object = %found.display(), "legacy object removed"),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(Error::kube(
                            format!("removing legacy {}", found.display()),
                            e,
                        ));
                    }
                }
            }
        }
    }
    patch_cr(
        client,
        cr,
        json!({"metadata": {"annotations": {MIGRATION_ANNOTATION: "done"}}}),
        "finishing the takeover",
    )
    .await?;
    tracing::info!(takeover = %id, "legacy takeover done");
    if plan.left_alone.is_empty() {
        Ok(Outcome::Progressed(
            cp_api::reason::Reason::LegacyMigrationDone,
        ))
    } else {
        Ok(Outcome::LeftAlone(plan.left_alone))
    }
}

/// The ServiceMapping CRD becomes the module's (metadata only, never deleted).
async fn take_over_mapping_crd(client: &Client) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = "servicemappings.connectivityproxy.sap.com";
    if crds
        .get_opt(crd_name)
        .await
        .map_err(|e| Error::kube("reading the ServiceMapping CRD", e))?
        .is_some()
    {
        let patch = json!({"metadata": {"labels": {names::LABEL_MODULE: names::MODULE_VALUE}}});
        crds.patch(crd_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("taking over the ServiceMapping CRD", e))?;
    }
    Ok(())
}

/// Writes this takeover's backups of the live legacy ConfigMaps and the legacy service key, each once.
async fn backup(client: &Client, ns: &str, id: &str, facts: &plan::Facts) -> Result<(), Error> {
    let meta = |name: &str, original: &str| {
        json!({"name": cp_api::keys::backup_name(name, id), "namespace": BACKUP_NAMESPACE, "labels": names::managed_labels(),
            "annotations": {BACKUP_OF_ANNOTATION: format!("{ns}/{original}"), TAKEOVER_ID_ANNOTATION: id}})
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), BACKUP_NAMESPACE);
    for (name, data) in &facts.live {
        if facts.backups.contains_key(name) {
            continue;
        }
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, name), "data": data});
        cms.patch(
            &cp_api::keys::backup_name(name, id),
            &PatchParams::apply(names::FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| Error::kube(format!("backing up ConfigMap {name}"), e))?;
        tracing::info!(
            name,
            takeover = id,
            "legacy ConfigMap backed up to {BACKUP_NAMESPACE}"
        );
    }
    if facts.legacy_service_key {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), BACKUP_NAMESPACE);
        let backup_name = cp_api::keys::backup_name(LEGACY_SERVICE_KEY, id);
        let exists = secrets
            .get_opt(&backup_name)
            .await
            .map_err(|e| Error::kube("reading the service-key backup", e))?
            .is_some();
        if !exists
            && let Some(key) = Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(LEGACY_SERVICE_KEY)
                .await
                .map_err(|e| Error::kube("reading the legacy service-key Secret", e))?
        {
            let data: BTreeMap<String, String> = key
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    use base64::Engine;
                    (k, base64::engine::general_purpose::STANDARD.encode(v.0))
                })
                .collect();
            let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(LEGACY_SERVICE_KEY, LEGACY_SERVICE_KEY), "data": data});
            secrets
                .patch(
                    &backup_name,
                    &PatchParams::apply(names::FIELD_MANAGER),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(|e| Error::kube("backing up the legacy service key", e))?;
        }
    }
    Ok(())
}
