//! The takeover decided before it acts: [`gather`] reads what a legacy installation left (read-only);
//! [`plan`] (pure) says what the takeover would import, back up, delete, adopt and keep, and what
//! blocks it with the fix. The controller's migration step ([`super::decide`]) builds on it;
//! `cp-controller migrate-plan` prints it.

use std::collections::BTreeMap;

use cp_api::validation::{ClusterFacts, validate_mapping};
use cp_api::{ConnectivityProxySpec, ServiceMapping, names};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use super::import::import;
use super::legacy::{Action, LEGACY_KINDS, LEGACY_SERVICE_KEY};
use crate::Error;
use crate::desired::Kind;

use cp_api::keys::{BACKUP_NAMESPACE, backup_name};

/// A legacy object found in the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Kind.
    pub kind: String,
    /// Namespace (empty: cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Carries the operator's managed-by label (adopted earlier): left alone.
    pub ours: bool,
    /// Carries a mark of the legacy installation ([`super::legacy_marked`]). An object with a legacy
    /// name and no such mark may be a user's own: the takeover never deletes or adopts it.
    pub marked: bool,
    /// Index into [`LEGACY_KINDS`].
    #[serde(skip)]
    pub kind_index: usize,
    /// Its UID and resourceVersion as read: it is deleted only while they are still these.
    #[serde(skip)]
    pub read: (Option<String>, Option<String>),
}

impl Found {
    /// Whether the takeover may act on it: it carries a mark of the legacy installation. The service
    /// key is the one exception: the legacy installation's own key carries no mark (the user or the
    /// BTP operator wrote it), so it is handled only in a takeover that found the legacy StatefulSet,
    /// always backed up first and kept in shared tenant mode.
    pub fn touchable(&self, action: Option<Action>) -> bool {
        self.marked || action == Some(Action::ServiceKey)
    }

    /// `Kind namespace/name` (or `Kind name`).
    pub fn display(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// What [`gather`] read.
#[derive(Clone, Debug, Default)]
pub struct Leftovers {
    /// A StatefulSet the legacy reconciler manages is present.
    pub legacy_statefulset: bool,
    /// Data of the legacy ConfigMaps as they are in the cluster now (absent or adopted: `None`).
    pub live: BTreeMap<String, BTreeMap<String, String>>,
    /// Data of this takeover's backups, by legacy ConfigMap name (only those with the operator's
    /// ownership proof over their data).
    pub backups: BTreeMap<String, BTreeMap<String, String>>,
    /// Objects under this takeover's backup names without that proof (`Kind ns/name`): never
    /// restored from, never overwritten.
    pub unproven_backups: Vec<String>,
    /// The legacy service-key Secret exists and is not the operator's.
    pub legacy_service_key: bool,
    /// Every legacy object present.
    pub found: Vec<Found>,
    /// Every ServiceMapping: name and spec.
    pub mappings: Vec<(String, cp_api::ServiceMappingSpec)>,
}

/// Something that stops the takeover, with its fix. The legacy installation keeps running untouched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Blocker {
    /// The object or legacy key at fault.
    pub subject: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

/// What the takeover does.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Takeover {
    /// A legacy installation is present.
    pub legacy_installation: bool,
    /// `spec.config` after the import.
    pub config: Option<Value>,
    /// The `spec.config` paths the import sets.
    pub imported: Vec<String>,
    /// Shared tenant mode: the CR will reference the user's legacy service-key Secret.
    pub service_key_secret: Option<String>,
    /// The backups it writes (`Kind namespace/name`).
    pub backups: Vec<String>,
    /// Legacy objects it removes, in order.
    pub delete: Vec<String>,
    /// Legacy objects it adopts (same name as the operator's).
    pub adopt: Vec<String>,
    /// Legacy objects it keeps.
    pub keep: Vec<String>,
    /// ServiceMappings it takes over (labels only; uid and spec kept).
    pub mappings: Vec<String>,
    /// Objects with a legacy name but no mark of the legacy installation: never touched (a user's
    /// own, or a look-alike), named in a Warning.
    pub left_alone: Vec<String>,
    /// What stops it.
    pub blockers: Vec<Blocker>,
    /// Every legacy object that is not the operator's, in the order found, with what the teardown
    /// does to it (the lists above as the teardown carries them out).
    #[serde(skip)]
    pub teardown: Vec<Teardown>,
}

/// What the teardown does to one legacy object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// No mark of the legacy installation: never touched, named in a Warning.
    LeaveAlone,
    /// Relabelled as the operator's (same name as one of its objects).
    Adopt,
    /// Kept as it is (the user's service key in shared tenant mode).
    Keep,
    /// Removed.
    Delete,
}

/// One legacy object and what the teardown does to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Teardown {
    /// The object.
    pub found: Found,
    /// What happens to it.
    pub disposition: Disposition,
}

/// Whether an object carries the operator's managed-by label.
pub fn is_ours(labels: &BTreeMap<String, String>) -> bool {
    labels.get(names::LABEL_MANAGED_BY).map(String::as_str) == Some(names::MANAGED_BY_VALUE)
}

/// Reads everything the plan needs, with reads only. `legacy_statefulset`: whether the StatefulSet
/// is the legacy reconciler's, when the caller read it already (the reconcile); `None` reads it.
pub async fn gather(
    client: &Client,
    proof: &crate::ownership::Proof,
    ns: &str,
    id: &str,
    legacy_statefulset: Option<bool>,
) -> Result<Leftovers, Error> {
    let legacy_statefulset = match legacy_statefulset {
        Some(known) => known,
        None => Api::<StatefulSet>::namespaced(client.clone(), ns)
            .get_opt(names::STATEFULSET)
            .await
            .map_err(|e| Error::kube("reading the StatefulSet", e))?
            .is_some_and(|s| super::is_legacy(&s.metadata)),
    };
    let mut facts = Leftovers {
        legacy_statefulset,
        ..Default::default()
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let backups: Api<ConfigMap> = Api::namespaced(client.clone(), BACKUP_NAMESPACE);
    for name in [names::CONFIGMAP_CONFIG, names::CONFIGMAP_INFO] {
        if let Some(cm) = cms
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("reading ConfigMap {ns}/{name}"), e))?
            && !is_ours(cm.labels())
        {
            facts.live.insert(name.into(), cm.data.unwrap_or_default());
        }
        if !id.is_empty()
            && let Some(b) = backups
                .get_opt(&backup_name(name, id))
                .await
                .map_err(|e| Error::kube("reading a backup", e))?
        {
            let data = b.data.clone().unwrap_or_default();
            let content = crate::ownership::backup_content(&data);
            if proof
                .standing_with(Kind::ConfigMap, &b.metadata, Some(&content))
                .ours()
            {
                facts.backups.insert(name.into(), data);
            } else {
                facts.unproven_backups.push(format!(
                    "ConfigMap {BACKUP_NAMESPACE}/{}",
                    backup_name(name, id)
                ));
            }
        }
    }
    facts.legacy_service_key = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(LEGACY_SERVICE_KEY)
        .await
        .map_err(|e| Error::kube("reading the legacy service-key Secret", e))?
        .is_some_and(|s| !is_ours(s.labels()));
    for (i, k) in LEGACY_KINDS.iter().enumerate() {
        let ar = k.api_resource();
        let target_ns = k.namespace(ns);
        let api: Api<DynamicObject> = match target_ns {
            Some(n) => Api::namespaced_with(client.clone(), n, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        for name in k.names {
            let live = match api.get_opt(name).await {
                Ok(o) => o,
                // The API does not exist here (e.g. no Gardener): nothing of that kind to take over.
                Err(kube::Error::Api(s)) if s.code == 404 => None,
                Err(e) => return Err(Error::kube(format!("reading legacy {} {name}", k.kind), e)),
            };
            if let Some(o) = live {
                facts.found.push(Found {
                    kind: k.kind.into(),
                    namespace: target_ns.unwrap_or_default().into(),
                    name: (*name).into(),
                    // Ours unless the legacy reconciler labelled it again (a rollback re-rendered it).
                    ours: is_ours(o.labels())
                        && !o.labels().contains_key(names::LEGACY_LABEL_MANAGED_BY),
                    marked: super::legacy_marked(&o.metadata),
                    kind_index: i,
                    read: (o.metadata.uid.clone(), o.metadata.resource_version.clone()),
                });
            }
        }
    }
    let mappings: Api<ServiceMapping> = Api::all(client.clone());
    match mappings.list(&ListParams::default()).await {
        Ok(list) => {
            facts.mappings = list
                .items
                .into_iter()
                .map(|m| (m.name_any(), m.spec))
                .collect();
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::kube("listing ServiceMappings", e)),
    }
    Ok(facts)
}

/// The takeover of the installation in `facts` for a CR with `spec`, as takeover `id`.
pub fn plan(spec: &ConnectivityProxySpec, facts: &Leftovers, id: &str) -> Takeover {
    let mut p = Takeover {
        legacy_installation: facts.legacy_statefulset,
        ..Default::default()
    };
    if !facts.legacy_statefulset && facts.found.iter().all(|f| f.ours) {
        return p;
    }
    // A backup someone else wrote (or edited) is neither restored from nor overwritten.
    p.left_alone.extend(
        facts
            .unproven_backups
            .iter()
            .map(|b| format!("{b} (a backup without the operator's ownership proof)")),
    );
    // The legacy ConfigMap in the cluster is the truth while it exists; the backup covers a crash
    // after it was adopted.
    let source = |name: &str| facts.live.get(name).or_else(|| facts.backups.get(name));
    for name in [names::CONFIGMAP_CONFIG, names::CONFIGMAP_INFO] {
        if facts.live.contains_key(name) {
            p.backups.push(format!(
                "ConfigMap {BACKUP_NAMESPACE}/{}",
                backup_name(name, id)
            ));
        }
    }
    if facts.legacy_service_key {
        p.backups.push(format!(
            "Secret {BACKUP_NAMESPACE}/{}",
            backup_name(LEGACY_SERVICE_KEY, id)
        ));
    }
    let config = serde_json::to_value(&spec.config).unwrap_or(Value::Null);
    let legacy_yaml =
        source(names::CONFIGMAP_CONFIG).and_then(|d| d.get(names::CONFIGMAP_CONFIG_KEY));
    let info = source(names::CONFIGMAP_INFO).cloned().unwrap_or_default();
    let subject = |field: &str| {
        if field.starts_with(names::CONFIGMAP_INFO) {
            format!("ConfigMap {}", field.replacen('.', " key ", 1))
        } else {
            format!(
                "ConfigMap {} key {} field {field}",
                names::CONFIGMAP_CONFIG,
                names::CONFIGMAP_CONFIG_KEY
            )
        }
    };
    match legacy_yaml.map(|y| import(&config, y, &info)) {
        Some(Err(e)) => p.blockers.push(Blocker {
            subject: subject(&e.field),
            message: e.message,
        }),
        Some(Ok((new_config, imported))) => {
            p.config = Some(new_config);
            p.imported = imported;
        }
        None => p.config = Some(config),
    }
    let mut new_spec = spec.clone();
    if let Some(cfg) = &p.config {
        match serde_json::from_value(cfg.clone()) {
            Ok(c) => new_spec.config = c,
            Err(e) => p.blockers.push(Blocker {
                subject: subject(""),
                message: format!("the imported configuration does not fit spec.config: {e}"),
            }),
        }
    }
    let shared = new_spec.tenant_mode() == "shared";
    let (secret_name, _) = new_spec.connectivity_secret();
    if shared && facts.legacy_service_key && names::is_auto_provision(Some(&secret_name)) {
        p.service_key_secret = Some(LEGACY_SERVICE_KEY.into());
        let sc = new_spec.secret_config.get_or_insert_with(Default::default);
        let integ = sc.integration.get_or_insert_with(Default::default);
        integ
            .connectivity_service
            .get_or_insert_with(Default::default)
            .secret_name = Some(LEGACY_SERVICE_KEY.into());
    }
    // Validate the result against the webhook's rules before anything is written: a denial can never
    // leave the CR half-migrated.
    let cluster = ClusterFacts {
        service_mapping_count: facts.mappings.len(),
        service_mappings: facts
            .mappings
            .iter()
            .take(3)
            .map(|(n, _)| n.clone())
            .collect(),
    };
    for e in new_spec.validate(None, &cluster) {
        p.blockers.push(Blocker {
            subject: format!("imported {}", e.field),
            message: format!(
                "{}; fix the legacy ConfigMap {} (or the CR) so that the result is valid",
                e.message,
                names::CONFIGMAP_CONFIG
            ),
        });
    }
    for (name, mspec) in &facts.mappings {
        let errors = validate_mapping(mspec, shared);
        if errors.is_empty() {
            p.mappings.push(name.clone());
        } else {
            p.blockers.push(Blocker {
                subject: format!("ServiceMapping {name}"),
                message: format!(
                    "cannot be taken over: {}; fix the mapping (kubectl edit servicemapping {name})",
                    cp_api::validation::join(&errors)
                ),
            });
        }
    }
    for f in facts.found.iter().filter(|f| !f.ours) {
        let action = LEGACY_KINDS.get(f.kind_index).map(|k| k.action);
        let disposition = if !f.touchable(action) {
            p.left_alone.push(f.display());
            Disposition::LeaveAlone
        } else {
            match action {
                Some(Action::Adopt) => {
                    p.adopt.push(f.display());
                    Disposition::Adopt
                }
                Some(Action::ServiceKey) if p.service_key_secret.is_some() || shared => {
                    p.keep.push(f.display());
                    Disposition::Keep
                }
                _ => {
                    p.delete.push(f.display());
                    Disposition::Delete
                }
            }
        };
        p.teardown.push(Teardown {
            found: f.clone(),
            disposition,
        });
    }
    p
}

/// The plan as text for a person: what would be imported (YAML), backed up, deleted, adopted, kept,
/// and every blocker with its fix.
pub fn render_text(p: &Takeover) -> String {
    if !p.legacy_installation && p.delete.is_empty() && p.adopt.is_empty() {
        return "No legacy reconciler installation found: nothing to take over.\n".into();
    }
    let mut out = String::from("Takeover of the legacy reconciler installation\n\n");
    if let Some(cfg) = &p.config {
        out.push_str("spec.config after the import:\n");
        for line in cp_api::yaml11::to_string(cfg).lines() {
            out.push_str(&format!("  {line}\n"));
        }
        out.push_str(&format!(
            "imported fields: {}\n",
            if p.imported.is_empty() {
                "none".to_string()
            } else {
                p.imported.join(", ")
            }
        ));
    }
    if let Some(s) = &p.service_key_secret {
        out.push_str(&format!(
            "service key: shared tenant mode, the CR will use your Secret {s} (kept)\n"
        ));
    }
    let list = |out: &mut String, title: &str, items: &[String]| {
        out.push_str(&format!("\n{title} ({}):\n", items.len()));
        for i in items {
            out.push_str(&format!("  - {i}\n"));
        }
    };
    list(&mut out, "backups written", &p.backups);
    list(&mut out, "legacy objects deleted, in this order", &p.delete);
    list(
        &mut out,
        "legacy objects adopted (same name as the operator's)",
        &p.adopt,
    );
    list(&mut out, "legacy objects kept", &p.keep);
    list(
        &mut out,
        "left alone (a legacy name but no mark of the legacy installation)",
        &p.left_alone,
    );
    list(
        &mut out,
        "ServiceMappings taken over (labels only; uid and spec kept)",
        &p.mappings,
    );
    let blockers: Vec<String> = p.blockers.iter().map(ToString::to_string).collect();
    list(&mut out, "BLOCKERS", &blockers);
    out.push_str(if p.blockers.is_empty() {
        "\nReady: the takeover can proceed.\n"
    } else {
        "\nBlocked: fix the blockers above; the legacy installation keeps running untouched until then.\n"
    });
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use cp_api::testing::default_spec;

    /// A complete legacy installation (every legacy object, marked) whose config is `config`.
    pub(in crate::migration) fn legacy_facts(config: &str) -> Leftovers {
        let mut f = Leftovers {
            legacy_statefulset: true,
            legacy_service_key: true,
            ..Default::default()
        };
        f.live.insert(
            names::CONFIGMAP_CONFIG.into(),
            [(names::CONFIGMAP_CONFIG_KEY.to_string(), config.to_string())].into(),
        );
        f.live.insert(
            names::CONFIGMAP_INFO.into(),
            [("onpremise_proxy_http_port".to_string(), "20003".to_string())].into(),
        );
        for (i, k) in LEGACY_KINDS.iter().enumerate() {
            for n in k.names {
                f.found.push(Found {
                    kind: k.kind.into(),
                    namespace: k.namespace("kyma-system").unwrap_or_default().into(),
                    name: (*n).into(),
                    ours: false,
                    marked: true,
                    kind_index: i,
                    read: Default::default(),
                });
            }
        }
        f
    }

    pub(in crate::migration) const DEDICATED: &str = "highAvailabilityMode: \"off\"\nservers:\n  businessDataTunnel:\n    externalHost: cp.example.com\nsubaccountId: sub-1\nsubaccountSubdomain: dom\ntenantMode: dedicated\n";

    #[test]
    fn objects_with_a_legacy_name_but_no_legacy_mark_are_left_alone_and_named() {
        let mut facts = legacy_facts(DEDICATED);
        for f in facts.found.iter_mut() {
            if f.name == "cc-certs"
                || f.name == super::super::legacy::LEGACY_WEBHOOK
                || f.kind == "ClusterRole"
            {
                f.marked = false;
            }
        }
        let p = plan(&default_spec(), &facts, "1");
        assert!(p.blockers.is_empty(), "{:?}", p.blockers);
        for name in [
            "Secret istio-system/cc-certs",
            "Certificate istio-system/cc-certs",
            "ValidatingWebhookConfiguration webhook-secret",
            "ClusterRole connectivity-proxy-restart-watcher",
        ] {
            assert!(
                p.left_alone.iter().any(|l| l == name),
                "{name}: {:?}",
                p.left_alone
            );
            assert!(!p.delete.iter().any(|d| d == name), "{name} deleted");
        }
        // The marked ones are still taken over, and the service key (which carries no mark in a real
        // installation) is handled as before.
        assert!(
            p.delete
                .iter()
                .any(|d| d == "Secret istio-system/cc-certs-cacert")
        );
        assert!(p.delete.iter().any(|d| d.ends_with(LEGACY_SERVICE_KEY)));
        assert!(render_text(&p).contains("left alone"));
    }

    #[test]
    fn a_legacy_mark_is_a_reconciler_label_or_annotation_or_the_charts_labels() {
        use kube::api::ObjectMeta;
        let meta = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        let marked = super::super::legacy_marked;
        assert!(marked(&meta(
            &[(names::LEGACY_LABEL_MANAGED_BY, "reconciler")],
            &[]
        )));
        assert!(marked(&meta(
            &[],
            &[(names::LEGACY_DISCLAIMER_ANNOTATION, "DO NOT EDIT")]
        )));
        assert!(marked(&meta(
            &[],
            &[(cp_api::keys::LEGACY_SKIP_RENDERING_ANNOTATION, "true")]
        )));
        assert!(marked(&meta(
            &[
                ("heritage", "Helm"),
                ("chart", "connectivity-proxy-2.9.3"),
                ("release", "connectivity-proxy")
            ],
            &[]
        )));
        // A name is no mark; neither is another chart's Helm label or a look-alike value.
        assert!(!marked(&ObjectMeta::default()));
        assert!(!marked(&meta(&[("app", "connectivity-proxy")], &[])));
        assert!(!marked(&meta(
            &[("heritage", "Helm"), ("release", "my-app")],
            &[]
        )));
        assert!(!marked(&meta(
            &[(names::LEGACY_LABEL_MANAGED_BY, "someone-else")],
            &[]
        )));
    }

    #[test]
    fn a_clean_cluster_has_nothing_to_do() {
        let p = plan(&default_spec(), &Leftovers::default(), "1");
        assert!(!p.legacy_installation && p.delete.is_empty() && p.blockers.is_empty());
        assert!(render_text(&p).contains("nothing to take over"));
    }

    #[test]
    fn dedicated_imports_deletes_the_legacy_webhook_first_and_adopts_same_names() {
        let p = plan(&default_spec(), &legacy_facts(DEDICATED), "20261130-1");
        assert!(p.blockers.is_empty(), "{:?}", p.blockers);
        assert_eq!(
            p.config.as_ref().map(|c| c["subaccountId"].clone()),
            Some("sub-1".into())
        );
        assert_eq!(p.delete[0], "ValidatingWebhookConfiguration webhook-secret");
        assert!(
            p.adopt
                .contains(&"PriorityClass connectivity-proxy-priority-class".to_string())
        );
        assert!(
            p.adopt
                .contains(&"ConfigMap kyma-system/connectivity-proxy".to_string())
        );
        assert!(
            p.delete
                .contains(&"Secret kyma-system/connectivity-proxy-service-key".to_string())
        );
        assert!(p.keep.is_empty());
        assert!(
            p.backups.contains(
                &"ConfigMap kyma-system/connectivity-proxy-backup-20261130-1".to_string()
            )
        );
        assert_eq!(p.delete.len() + p.adopt.len(), 35);
    }

    #[test]
    fn shared_tenant_keeps_and_references_the_users_key() {
        let cfg = DEDICATED.replace("tenantMode: dedicated", "tenantMode: shared");
        let p = plan(&default_spec(), &legacy_facts(&cfg), "1");
        assert!(p.blockers.is_empty(), "{:?}", p.blockers);
        assert_eq!(p.service_key_secret.as_deref(), Some(LEGACY_SERVICE_KEY));
        assert_eq!(
            p.keep,
            vec!["Secret kyma-system/connectivity-proxy-service-key".to_string()]
        );
    }

    #[test]
    fn the_live_legacy_config_wins_over_an_older_backup() {
        let mut f = legacy_facts(&DEDICATED.replace("sub-1", "sub-now"));
        f.backups.insert(
            names::CONFIGMAP_CONFIG.into(),
            [(
                names::CONFIGMAP_CONFIG_KEY.to_string(),
                DEDICATED.to_string(),
            )]
            .into(),
        );
        let p = plan(&default_spec(), &f, "2");
        assert_eq!(
            p.config.as_ref().map(|c| c["subaccountId"].clone()),
            Some("sub-now".into())
        );
        f.live.clear();
        let p = plan(&default_spec(), &f, "2");
        assert_eq!(
            p.config.as_ref().map(|c| c["subaccountId"].clone()),
            Some("sub-1".into()),
            "backup after a crash"
        );
    }

    #[test]
    fn blockers_name_the_key_or_object_and_the_fix() {
        let bad_port = legacy_facts(&DEDICATED.replace(
            "tenantMode: dedicated",
            "tenantMode: dedicated\nunknownKey: 1",
        ));
        let p = plan(&default_spec(), &bad_port, "1");
        assert_eq!(p.blockers.len(), 1, "{:?}", p.blockers);
        assert!(
            p.blockers[0].to_string().contains("unknownKey"),
            "{}",
            p.blockers[0]
        );

        let mut f = legacy_facts(DEDICATED);
        f.live
            .get_mut(names::CONFIGMAP_INFO)
            .map(|d| d.insert("onpremise_proxy_http_port".into(), "70000".into()));
        let p = plan(&default_spec(), &f, "1");
        assert!(
            p.blockers
                .iter()
                .any(|b| b.subject.contains("connectivity-proxy-info")
                    && b.message.contains("70000")),
            "{:?}",
            p.blockers
        );

        let mut f = legacy_facts(DEDICATED);
        f.mappings.push((
            "broken".into(),
            serde_json::from_value(
                serde_json::json!({"type": "RFC", "serviceId": "s", "internalAddress": "no-port"}),
            )
            .unwrap_or_else(|e| panic!("{e}")),
        ));
        let p = plan(&default_spec(), &f, "1");
        assert!(p.blockers.iter().any(|b| b.subject == "ServiceMapping broken" && b.message.contains("kubectl edit")), "{:?}", p.blockers);
        assert!(render_text(&p).contains("Blocked"));
    }
}
