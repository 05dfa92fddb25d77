//! Taking over an installation left by the legacy reconciler, one step per reconcile, as gather →
//! decide → execute within the reconcile's one gather and one plan: [`gather`] (called by
//! [`crate::gather`]) reads the CR's takeover annotations and (read-only) what the legacy
//! installation left; [`decide`] (pure, called by [`crate::plan`]) picks the next [`Step`], building on [`plan`] (what to import
//! into the CR, back up, delete, adopt or keep, and what blocks the takeover); [`execute`] performs
//! exactly that step's writes. Each step's state is in the CR or the cluster, so a crash at any point
//! resumes where it stopped and loses nothing: start (takeover id) → backups → import (validated
//! first) → teardown (the ServiceMapping CRD, then the legacy objects, the legacy ServiceMapping
//! webhook first) → done.

pub mod import;
pub mod legacy;
pub mod plan;

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, ConnectivityProxySpec, names};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch};
use kube::{Client, ResourceExt};
use serde_json::Value;

pub use import::{ImportError, import};
pub use plan::{Blocker, Takeover};

use crate::Error;
use crate::apply::Applier;
use crate::desired::Kind;
use crate::writer::{MergePatch, Writer};
use legacy::{LEGACY_KINDS, LEGACY_SERVICE_KEY};
use plan::Disposition;

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

/// The value of [`MIGRATION_ANNOTATION`] while a takeover runs.
const IN_PROGRESS: &str = "in-progress";
/// The value of [`MIGRATION_ANNOTATION`] once a takeover is done.
const DONE: &str = "done";

/// A takeover's progress as the CR's annotations record it, with what the legacy installation left
/// while one runs: what the next migration step is decided from ([`gather`], part of
/// [`crate::gather::Facts`]).
#[derive(Clone, Debug)]
pub enum Progress {
    /// No takeover in progress: the annotation is absent, `done`, or any other value (the webhook
    /// refuses the annotation from anyone but the operator, but an older release or an admin may have
    /// written one).
    Idle {
        /// A StatefulSet with the legacy reconciler's marks is present ([`is_legacy`]).
        legacy_statefulset: bool,
    },
    /// A takeover in progress that an operator release without takeover ids started.
    WithoutId,
    /// Takeover `id` in progress.
    InProgress {
        /// The takeover id.
        id: String,
        /// The CR carries [`IMPORTED_ANNOTATION`]: the import is done.
        imported: bool,
        /// What the legacy installation left ([`plan::gather`]).
        takeover: plan::Leftovers,
    },
}

/// This takeover's backups still to write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backups {
    /// Live legacy ConfigMaps without a backup in this takeover: name and data.
    pub config_maps: Vec<(String, BTreeMap<String, String>)>,
    /// The legacy service-key Secret is backed up unless its backup exists (checked when written:
    /// its data is read only then).
    pub service_key: bool,
}

/// The next migration step, decided by [`decide`] and carried out by [`execute`].
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing to migrate (or done).
    NotNeeded,
    /// Start a takeover (first, or a legacy installation back after a rollback) under a new id; a
    /// started import is forgotten.
    Start,
    /// Record a takeover id for a takeover started without one.
    RecordId,
    /// A takeover "in progress" with no legacy installation, no backup of one and nothing imported:
    /// not a takeover this operator started. It is closed; nothing is imported, deleted or adopted.
    CloseNoEvidence {
        /// The takeover id.
        id: String,
    },
    /// The takeover cannot proceed; nothing is written.
    Blocked(Vec<Blocker>),
    /// Write the backups, then import the legacy configuration into the CR.
    Import {
        /// The takeover id.
        id: String,
        /// Backups to write first.
        backups: Backups,
        /// The CR merge patch: the imported `spec` and the imported annotation.
        patch: MergePatch,
        /// The `spec.config` paths imported.
        imported: Vec<String>,
    },
    /// Write any backup still missing, take over the ServiceMapping CRD, then adopt, delete or keep
    /// each legacy object in order, and finish the takeover.
    Teardown {
        /// The takeover id.
        id: String,
        /// Backups to write first.
        backups: Backups,
        /// Every legacy object that is not the operator's, in order, with what happens to it.
        objects: Vec<plan::Teardown>,
        /// The objects left alone (named in a Warning once done).
        left_alone: Vec<String>,
    },
}

/// Whether a reconcile of `cr` takes the legacy installation over first: a takeover runs (the
/// annotation is neither absent nor `done`), or a StatefulSet with the legacy reconciler's marks is
/// present ([`is_legacy`]).
pub fn wanted(cr: &ConnectivityProxy, legacy_statefulset: bool) -> bool {
    let state = cr
        .annotations()
        .get(MIGRATION_ANNOTATION)
        .map(String::as_str);
    !matches!(state, Some(DONE) | None) || legacy_statefulset
}

/// Reads what the next migration step is decided from: the CR's takeover annotations, and (with
/// reads only) the takeover's leftovers ([`plan::gather`]) while one runs. `legacy_statefulset`:
/// the StatefulSet under the proxy's name carries the legacy reconciler's marks.
pub async fn gather(
    client: &Client,
    proof: &crate::ownership::Proof,
    cr: &ConnectivityProxy,
    legacy_statefulset: bool,
) -> Result<Progress, Error> {
    let ns = cr.namespace().unwrap_or_default();
    let annotations = cr.annotations();
    if annotations.get(MIGRATION_ANNOTATION).map(String::as_str) != Some(IN_PROGRESS) {
        return Ok(Progress::Idle { legacy_statefulset });
    }
    let id = match annotations.get(TAKEOVER_ID_ANNOTATION) {
        Some(id) if !id.is_empty() => id.clone(),
        _ => return Ok(Progress::WithoutId),
    };
    Ok(Progress::InProgress {
        imported: annotations.contains_key(IMPORTED_ANNOTATION),
        takeover: plan::gather(client, proof, &ns, &id, Some(legacy_statefulset)).await?,
        id,
    })
}

/// The next migration step for a CR with `spec`, from `facts` alone. Each step's state is in the
/// CR's annotations or the cluster, so a crash at any point resumes with the step it stopped in.
pub fn decide(spec: &ConnectivityProxySpec, facts: &Progress) -> Step {
    let (id, imported, takeover) = match facts {
        // Only "in-progress" continues a takeover; a new one starts only where a legacy
        // StatefulSet with its marks exists.
        Progress::Idle { legacy_statefulset } => {
            return if *legacy_statefulset {
                Step::Start
            } else {
                Step::NotNeeded
            };
        }
        Progress::WithoutId => return Step::RecordId,
        Progress::InProgress {
            id,
            imported,
            takeover,
        } => (id, *imported, takeover),
    };
    let evidence = takeover.legacy_statefulset
        || takeover.found.iter().any(|f| !f.ours && f.marked)
        || !takeover.backups.is_empty();
    if !evidence && !imported {
        return Step::CloseNoEvidence { id: id.clone() };
    }
    let plan = plan::plan(spec, takeover, id);
    if !plan.blockers.is_empty() {
        return Step::Blocked(plan.blockers);
    }
    let backups = Backups {
        config_maps: takeover
            .live
            .iter()
            .filter(|(name, _)| !takeover.backups.contains_key(*name))
            .map(|(name, data)| (name.clone(), data.clone()))
            .collect(),
        service_key: takeover.legacy_service_key,
    };
    if !imported {
        let summary = if plan.imported.is_empty() {
            "nothing".to_string()
        } else {
            plan.imported.join(",")
        };
        let spec = ImportedSpec {
            config: plan.config,
            secret_config: plan
                .service_key_secret
                .map(|secret| cp_api::cp::SecretConfig {
                    integration: Some(cp_api::cp::SecretIntegration {
                        connectivity_service: Some(cp_api::cp::ConnectivityServiceSecret {
                            secret_name: Some(secret),
                            secret_data: None,
                        }),
                        auditlog_service: None,
                    }),
                }),
        };
        return Step::Import {
            id: id.clone(),
            backups,
            patch: MergePatch::default()
                .annotation(IMPORTED_ANNOTATION, Some(&summary))
                .spec(crate::desired::body(&spec)),
            imported: plan.imported,
        };
    }
    Step::Teardown {
        id: id.clone(),
        backups,
        objects: plan.teardown,
        left_alone: plan.left_alone,
    }
}

/// The `spec` the import merges into the CR: the imported `spec.config` and, in shared tenant mode,
/// the user's service-key Secret.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ImportedSpec {
    config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_config: Option<cp_api::cp::SecretConfig>,
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
    writer: &Writer,
    cr: &ConnectivityProxy,
    patch: &(impl serde::Serialize + std::fmt::Debug),
    what: &str,
) -> Result<(), Error> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(writer.client().clone(), &cr.namespace().unwrap_or_default());
    writer
        .write(&api, &cr.name_any(), &Patch::Merge(patch), what)
        .await
        .map_err(|e| Error::kube(what.to_string(), e))?;
    Ok(())
}

/// Marks the CR's takeover `done`.
async fn mark_done(writer: &Writer, cr: &ConnectivityProxy, what: &str) -> Result<(), Error> {
    let done = annotations(&[(MIGRATION_ANNOTATION, Some(DONE))]);
    patch_cr(writer, cr, &done, what).await
}

/// The CR's takeover annotations as a merge patch (`None` removes one).
fn annotations(pairs: &[(&str, Option<&str>)]) -> MergePatch {
    pairs
        .iter()
        .fold(MergePatch::default(), |p, (k, v)| p.annotation(k, *v))
}

/// Carries out `step`: exactly its writes, in order (a new takeover id is taken from the clock here).
pub async fn execute(
    applier: &Applier,
    cr: &ConnectivityProxy,
    step: Step,
) -> Result<Outcome, Error> {
    use cp_api::reason::Reason;
    let ns = cr.namespace().unwrap_or_default();
    let writer = applier.writer();
    match step {
        Step::NotNeeded => Ok(Outcome::NotNeeded),
        Step::Start => {
            // Earlier backups stay as history; this takeover writes its own.
            let id = new_takeover_id();
            patch_cr(
                writer,
                cr,
                &annotations(&[
                    (MIGRATION_ANNOTATION, Some(IN_PROGRESS)),
                    (TAKEOVER_ID_ANNOTATION, Some(&id)),
                    (IMPORTED_ANNOTATION, None),
                ]),
                "starting the takeover",
            )
            .await?;
            tracing::info!(takeover = %id, "legacy reconciler installation detected; takeover started");
            Ok(Outcome::Progressed(Reason::LegacyInstallationDetected))
        }
        Step::RecordId => {
            patch_cr(
                writer,
                cr,
                &annotations(&[(TAKEOVER_ID_ANNOTATION, Some(&new_takeover_id()))]),
                "recording the takeover id",
            )
            .await?;
            Ok(Outcome::Progressed(Reason::LegacyTakeoverIdRecorded))
        }
        Step::CloseNoEvidence { id } => {
            tracing::warn!(takeover = %id, "takeover annotation without any legacy installation: nothing taken over");
            mark_done(
                writer,
                cr,
                "closing a takeover without a legacy installation",
            )
            .await?;
            Ok(Outcome::Progressed(Reason::NoLegacyInstallation))
        }
        Step::Blocked(blockers) => Ok(Outcome::Blocked(blockers)),
        Step::Import {
            id,
            backups,
            patch,
            imported,
        } => {
            backup(applier, &ns, &id, &backups).await?;
            patch_cr(
                writer,
                cr,
                &patch,
                "importing the legacy configuration into the CR",
            )
            .await?;
            tracing::info!(imported = ?imported, "legacy configuration imported into the CR");
            Ok(Outcome::Progressed(Reason::LegacyConfigurationImported))
        }
        Step::Teardown {
            id,
            backups,
            objects,
            left_alone,
        } => {
            backup(applier, &ns, &id, &backups).await?;
            take_over_mapping_crd(writer).await?;
            for object in &objects {
                tear_down(applier, object).await?;
            }
            mark_done(writer, cr, "finishing the takeover").await?;
            tracing::info!(takeover = %id, "legacy takeover done");
            if left_alone.is_empty() {
                Ok(Outcome::Progressed(Reason::LegacyMigrationDone))
            } else {
                Ok(Outcome::LeftAlone(left_alone))
            }
        }
    }
}

/// Adopts, deletes or keeps one legacy object (a deletion of an object already gone succeeds).
async fn tear_down(applier: &Applier, object: &plan::Teardown) -> Result<(), Error> {
    let (client, proof) = (applier.writer().client(), applier.proof());
    let found = &object.found;
    let Some(kind) = LEGACY_KINDS.get(found.kind_index) else {
        return Ok(());
    };
    let ar = kind.api_resource();
    let api: Api<DynamicObject> = if found.namespace.is_empty() {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), &found.namespace, &ar)
    };
    match object.disposition {
        Disposition::LeaveAlone => {
            tracing::warn!(object = %found.display(), "an object with a legacy name but no mark of the legacy installation: left alone");
        }
        Disposition::Adopt => {
            // Relabel as ours, with the ownership proof; the install then applies our content over it.
            let ns = (!found.namespace.is_empty()).then_some(found.namespace.as_str());
            let token = proof.token_of(&ar, ns, &found.name, None);
            let patch = MergePatch::default()
                .label(names::LABEL_MANAGED_BY, Some(names::MANAGED_BY_VALUE))
                .label(names::LABEL_MODULE, Some(names::MODULE_VALUE))
                .label(names::LEGACY_LABEL_MANAGED_BY, None)
                .annotation(cp_api::keys::OWNERSHIP_PROOF_ANNOTATION, Some(&token));
            applier
                .writer()
                .write(
                    &api,
                    &found.name,
                    &Patch::Merge(&patch),
                    "adopting a legacy object",
                )
                .await
                .map_err(|e| Error::kube(format!("adopting legacy {}", found.display()), e))?;
        }
        Disposition::Keep => {}
        Disposition::Delete => {
            applier
                .writer()
                .remove(&api, &found.name, &found.read, "removing a legacy object")
                .await
                .map_err(|e| Error::kube(format!("removing legacy {}", found.display()), e))?;
        }
    }
    Ok(())
}

/// The ServiceMapping CRD becomes the module's (metadata only, never deleted).
async fn take_over_mapping_crd(writer: &Writer) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(writer.client().clone());
    let crd_name = "servicemappings.connectivityproxy.sap.com";
    if crds
        .get_opt(crd_name)
        .await
        .map_err(|e| Error::kube("reading the ServiceMapping CRD", e))?
        .is_some()
    {
        let patch = MergePatch::default().label(names::LABEL_MODULE, Some(names::MODULE_VALUE));
        writer
            .write(
                &crds,
                crd_name,
                &Patch::Merge(&patch),
                "taking over the ServiceMapping CRD",
            )
            .await
            .map_err(|e| Error::kube("taking over the ServiceMapping CRD", e))?;
    }
    Ok(())
}

/// Writes this takeover's backups of the live legacy ConfigMaps and the legacy service key, each once.
/// Each backup carries the ownership proof over its data; an object already under a backup's name
/// that is not the operator's is never overwritten ([`Error::NotOurs`]).
async fn backup(applier: &Applier, ns: &str, id: &str, backups: &Backups) -> Result<(), Error> {
    let (client, proof) = (applier.writer().client(), applier.proof());
    let meta = |name: &str, original: &str| kube::api::ObjectMeta {
        name: Some(cp_api::keys::backup_name(name, id)),
        namespace: Some(BACKUP_NAMESPACE.into()),
        labels: Some(names::managed_labels()),
        annotations: Some(
            [
                (BACKUP_OF_ANNOTATION.to_string(), format!("{ns}/{original}")),
                (TAKEOVER_ID_ANNOTATION.to_string(), id.to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), BACKUP_NAMESPACE);
    for (name, data) in &backups.config_maps {
        let backup_name = cp_api::keys::backup_name(name, id);
        if cms
            .get_opt(&backup_name)
            .await
            .map_err(|e| Error::kube("reading a backup", e))?
            .is_some()
        {
            // Not among this takeover's proven backups (those are not written again): someone else's.
            return Err(Error::NotOurs(format!(
                "ConfigMap {BACKUP_NAMESPACE}/{backup_name}"
            )));
        }
        let mut body = crate::desired::body(&ConfigMap {
            metadata: meta(name, name),
            data: Some(data.clone()),
            ..Default::default()
        });
        proof.stamp(
            Kind::ConfigMap,
            &mut body,
            Some(&crate::ownership::backup_content(data)),
        );
        applier
            .writer()
            .write(
                &cms,
                &backup_name,
                &Patch::Apply(&body),
                "backing up a legacy ConfigMap",
            )
            .await
            .map_err(|e| Error::kube(format!("backing up ConfigMap {name}"), e))?;
    }
    if backups.service_key {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), BACKUP_NAMESPACE);
        let backup_name = cp_api::keys::backup_name(LEGACY_SERVICE_KEY, id);
        let existing = secrets
            .get_opt(&backup_name)
            .await
            .map_err(|e| Error::kube("reading the service-key backup", e))?;
        let exists = existing.is_some();
        if let Some(b) = existing {
            let strings = b.data.as_ref().map(crate::ownership::secret_strings);
            let content = crate::ownership::backup_content(&strings.unwrap_or_default());
            if !proof
                .standing_with(Kind::Secret, &b.metadata, Some(&content))
                .ours()
            {
                return Err(Error::NotOurs(format!(
                    "Secret {BACKUP_NAMESPACE}/{backup_name}"
                )));
            }
        }
        if !exists
            && let Some(key) = Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(LEGACY_SERVICE_KEY)
                .await
                .map_err(|e| Error::kube("reading the legacy service-key Secret", e))?
        {
            let data =
                crate::ownership::secret_strings(&key.data.as_ref().cloned().unwrap_or_default());
            let mut body = crate::desired::body(&Secret {
                metadata: meta(LEGACY_SERVICE_KEY, LEGACY_SERVICE_KEY),
                data: key.data,
                ..Default::default()
            });
            proof.stamp(
                Kind::Secret,
                &mut body,
                Some(&crate::ownership::backup_content(&data)),
            );
            applier
                .writer()
                .write(
                    &secrets,
                    &backup_name,
                    &Patch::Apply(&body),
                    "backing up the legacy service key",
                )
                .await
                .map_err(|e| Error::kube("backing up the legacy service key", e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
