//! Stand-ins for what runs in a real Kyma cluster but not on a local control plane: the SAP BTP service
//! operator, the Connectivity service's CA endpoint, the StatefulSet controller with its kubelets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

/// The BTP ServiceBinding kind.
fn binding_resource() -> ApiResource {
    ApiResource {
        group: "services.cloud.sap.com".into(),
        version: "v1".into(),
        api_version: "services.cloud.sap.com/v1".into(),
        kind: "ServiceBinding".into(),
        plural: "servicebindings".into(),
    }
}

/// Plays the SAP BTP service operator for CR `cr` in `ns`: waits for the operator's ServiceBinding,
/// writes its Secret (a service key whose Connectivity CA endpoint is served on loopback by this
/// process) and marks the binding Ready. The CA endpoint lives as long as the current tokio runtime.
pub async fn play_btp_operator(
    admin: &Client,
    ns: &str,
    cr: &str,
    subaccount: &str,
    subdomain: &str,
) -> anyhow::Result<()> {
    let binding = cp_api::names::service_binding_name(cr, ns);
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &binding_resource());
    let found = crate::wait::until("the ServiceBinding", Duration::from_secs(15), || {
        let (api, binding) = (api.clone(), binding.clone());
        async move { api.get_opt(&binding).await.map_err(|e| e.to_string()) }
    })
    .await?;
    let ca = crate::test_ca(
        "Connectivity service CA",
        time::OffsetDateTime::now_utc(),
        1,
    )?;
    // Dropping the handle detaches the task: it serves until the runtime ends.
    let (url, _server) = crate::serve_static(ca.cert_pem).await?;
    let key = json!({"clientid": "cid", "clientsecret": "very-secret-value", "subaccount_id": subaccount,
        "subaccount_subdomain": subdomain, "uaadomain": crate::CA_ENDPOINT_UAADOMAIN,
        "connectivity_service": {"CAs_path": "/api/v1/CAs", "url": url}});
    act_on_binding(admin, &found, &|_, _| key.clone()).await?;
    let after = api.get(&binding).await?;
    anyhow::ensure!(
        after.data["status"]["conditions"][0]["status"] == "True",
        "binding status not kept: {:?}",
        after.data["status"]
    );
    Ok(())
}

/// Plays the StatefulSet controller and its kubelets: marks every replica of the current generation ready.
pub async fn mark_statefulset_ready(admin: &Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<StatefulSet> = Api::namespaced(admin.clone(), ns);
    let Some(sts) = api.get_opt(cp_api::names::STATEFULSET).await? else {
        anyhow::bail!(
            "StatefulSet {ns}/{} does not exist",
            cp_api::names::STATEFULSET
        );
    };
    let replicas = sts.spec.replicas.unwrap_or(1);
    let status = json!({"status": {
        "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas,
        "currentReplicas": replicas, "availableReplicas": replicas,
        "observedGeneration": sts.metadata.generation.unwrap_or(1)
    }});
    api.patch_status(
        cp_api::names::STATEFULSET,
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    Ok(())
}

/// What a local control plane lacks for CR `ns/cr`, played as the CR's conditions ask for it: the SAP
/// BTP service operator (with `btp` = (subaccount, subdomain); once, when the CR waits for its service
/// key) and the StatefulSet's kubelets (whenever the CR waits for them).
pub struct StandIns<'a> {
    admin: &'a Client,
    ns: &'a str,
    cr: &'a str,
    btp: Option<(&'a str, &'a str)>,
    btp_played: AtomicBool,
}

impl<'a> StandIns<'a> {
    /// The stand-ins for CR `ns/cr`.
    pub fn new(
        admin: &'a Client,
        ns: &'a str,
        cr: &'a str,
        btp: Option<(&'a str, &'a str)>,
    ) -> Self {
        Self {
            admin,
            ns,
            cr,
            btp,
            btp_played: AtomicBool::new(false),
        }
    }

    /// Plays what the CR's condition `reasons` wait for: [`Self::play_btp_operator`], then
    /// [`Self::mark_statefulset_ready`].
    pub async fn react(&self, reasons: &[impl AsRef<str>]) -> anyhow::Result<()> {
        self.play_btp_operator(reasons)
            .await
            .context("playing the BTP operator")?;
        self.mark_statefulset_ready(reasons)
            .await
            .context("marking the StatefulSet ready")
    }

    /// Plays the SAP BTP service operator ([`play_btp_operator`]) if it has a service key to give and
    /// has not played yet, and `reasons` hold `ServiceKeyPending`.
    pub async fn play_btp_operator(&self, reasons: &[impl AsRef<str>]) -> anyhow::Result<()> {
        if let Some((subaccount, subdomain)) = self.btp
            && has(reasons, "ServiceKeyPending")
            && !self.btp_played.swap(true, Ordering::SeqCst)
        {
            play_btp_operator(self.admin, self.ns, self.cr, subaccount, subdomain).await?;
        }
        Ok(())
    }

    /// Plays the StatefulSet's kubelets ([`mark_statefulset_ready`]) if `reasons` hold
    /// `StatefulSetNotReady`.
    pub async fn mark_statefulset_ready(&self, reasons: &[impl AsRef<str>]) -> anyhow::Result<()> {
        if has(reasons, "StatefulSetNotReady") {
            mark_statefulset_ready(self.admin, self.ns).await?;
        }
        Ok(())
    }
}

fn has(reasons: &[impl AsRef<str>], reason: &str) -> bool {
    reasons.iter().any(|r| r.as_ref() == reason)
}

/// Plays what a local control plane lacks for CR `ns/cr` ([`StandIns`]) until the CR is Ready, or fails
/// after `timeout` with the CR's last state and reasons.
pub async fn play_until_ready(
    admin: &Client,
    ns: &str,
    cr: &str,
    btp: Option<(&str, &str)>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<cp_api::ConnectivityProxy> = Api::namespaced(admin.clone(), ns);
    let stand_ins = StandIns::new(admin, ns, cr, btp);
    crate::wait::until(&format!("{ns}/{cr} Ready"), timeout, || {
        let (api, stand_ins) = (api.clone(), &stand_ins);
        async move {
            let c = api.get(cr).await.map_err(|e| e.to_string())?;
            let st = c.status.unwrap_or_default();
            if st.state == Some(cp_api::State::Ready) {
                return Ok(Some(()));
            }
            let reasons: Vec<&str> = st.conditions.iter().map(|c| c.reason.as_str()).collect();
            stand_ins
                .react(&reasons)
                .await
                .map_err(|e| format!("{e:#}"))?;
            Err(format!(
                "{:?}: {:?}, reasons {reasons:?}",
                st.state, st.description
            ))
        }
    })
    .await
}

/// Plays the SAP BTP service operator for every ServiceBinding in the cluster, for as long as it runs (the
/// real operator acts on each binding, so must its stand-in: a CR deleted and created again gets its key
/// again): a binding without its Secret gets one (`spec.secretName`, key `spec.secretKey`, holding
/// `service_key(namespace, binding)`) and is marked Ready. Polls every `period`; errors are logged and
/// retried, never fatal.
pub async fn run_btp_operator(
    admin: Client,
    period: Duration,
    service_key: impl Fn(&str, &str) -> serde_json::Value,
) {
    let bindings: Api<DynamicObject> = Api::all_with(admin.clone(), &binding_resource());
    loop {
        if let Ok(list) = bindings.list(&Default::default()).await {
            for b in list.items {
                if let Err(e) = act_on_binding(&admin, &b, &service_key).await {
                    tracing::warn!("stand-in BTP operator: {e:#}");
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

async fn act_on_binding(
    admin: &Client,
    b: &DynamicObject,
    service_key: &impl Fn(&str, &str) -> serde_json::Value,
) -> anyhow::Result<()> {
    let ns = b.metadata.namespace.clone().unwrap_or_default();
    let name = b.metadata.name.clone().unwrap_or_default();
    if b.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let secret_name = b.data["spec"]["secretName"]
        .as_str()
        .unwrap_or(&name)
        .to_string();
    let key_name = b.data["spec"]["secretKey"]
        .as_str()
        .unwrap_or("service_key")
        .to_string();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let ready = b.data["status"]["ready"] == "True";
    if ready && secrets.get_opt(&secret_name).await?.is_some() {
        return Ok(());
    }
    let key = service_key(&ns, &name);
    // Owned by the binding, as the real operator's Secrets are: deleting the binding removes its key.
    let owner = json!({"apiVersion": "services.cloud.sap.com/v1", "kind": "ServiceBinding", "name": name,
        "uid": b.metadata.uid.clone().unwrap_or_default(), "controller": true});
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret_name, "namespace": ns, "labels": {"services.cloud.sap.com/stand-in": "true"},
            "ownerReferences": [owner]},
        "stringData": {key_name: key.to_string()}});
    secrets
        .patch(
            &secret_name,
            &PatchParams::apply("btp-operator").force(),
            &Patch::Apply(&secret),
        )
        .await
        .with_context(|| format!("writing Secret {ns}/{secret_name}"))?;
    let status = json!({"status": {"ready": "True", "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned",
        "message": "stand-in BTP operator", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &binding_resource())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("marking ServiceBinding {ns}/{name} Ready"))?;
    Ok(())
}
