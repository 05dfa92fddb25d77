//! Certificates the controller issues: the webhook's serving certificate (with its CA bundle kept in
//! both webhook configurations) and the built-in business-tunnel certificate. Planning is
//! `cp_certs::rotation`'s pure job; this module reads and writes Secrets.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cp_api::names;
use cp_certs::renewal::Policy;
use cp_certs::rotation::{self, Rotation, Spec, State};
use cp_certs::{Ca, Leaf};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::Error;
use crate::apply::Applier;
use crate::metrics::Metrics;
use crate::writer::Writer;

pub mod tunnel;
pub use tunnel::{Provider, TunnelCertSettings, provider};

use cp_api::keys::{
    CA_CREATED_ANNOTATION as CA_CREATED, LEAF_SWITCHED_ANNOTATION as LEAF_SWITCHED,
    PREVIOUS_CA_SHA256_ANNOTATION as PREVIOUS_CA_SHA256,
};

pub(crate) fn text(data: &BTreeMap<String, k8s_openapi::ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .filter(|s| !s.is_empty())
}

fn time_annotation(secret: &Secret, key: &str) -> Option<OffsetDateTime> {
    secret
        .annotations()
        .get(key)
        .and_then(|v| OffsetDateTime::parse(v, &Rfc3339).ok())
}

/// `previous-ca.crt` of the CA Secret if the operator recorded it ([`PREVIOUS_CA_SHA256`] matches):
/// `Ok(None)` when there is none, `Err` naming why one present is not trusted.
pub fn recorded_previous_ca(ca: Option<&Secret>) -> Result<Option<String>, String> {
    let data = ca.and_then(|s| s.data.as_ref());
    let Some(pem) = data.and_then(|d| text(d, "previous-ca.crt")) else {
        return Ok(None);
    };
    let recorded = ca.and_then(|s| s.annotations().get(PREVIOUS_CA_SHA256));
    match (recorded, cp_certs::fingerprint(&pem)) {
        (Some(r), Ok(f)) if r.eq_ignore_ascii_case(&f) => Ok(Some(pem)),
        (None, _) => Err(format!(
            "previous-ca.crt has no {PREVIOUS_CA_SHA256} record: the operator did not retire it in a rotation"
        )),
        (Some(_), Ok(f)) => Err(format!(
            "previous-ca.crt (sha256 {f}) is not the CA the operator retired ({PREVIOUS_CA_SHA256})"
        )),
        (Some(_), Err(e)) => Err(format!("previous-ca.crt does not parse: {e}")),
    }
}

/// Reads the rotation state from the CA and leaf Secrets. A `previous-ca.crt` the operator did not
/// record ([`recorded_previous_ca`]) is left out, so it never reaches a CA bundle.
pub fn state_from(ca: Option<&Secret>, leaf: Option<&Secret>) -> State {
    let ca_data = ca.and_then(|s| s.data.clone()).unwrap_or_default();
    let leaf_data = leaf.and_then(|s| s.data.clone()).unwrap_or_default();
    State {
        ca: match (text(&ca_data, "ca.crt"), text(&ca_data, "ca.key")) {
            (Some(cert_pem), Some(key_pem)) => Some(Ca { cert_pem, key_pem }),
            _ => None,
        },
        previous_ca_pem: recorded_previous_ca(ca).ok().flatten(),
        ca_created_at: ca.and_then(|s| time_annotation(s, CA_CREATED)),
        leaf_switched_at: ca.and_then(|s| time_annotation(s, LEAF_SWITCHED)),
        leaf: match (text(&leaf_data, "tls.crt"), text(&leaf_data, "tls.key")) {
            (Some(cert_pem), Some(key_pem)) => Some(Leaf { cert_pem, key_pem }),
            _ => None,
        },
    }
}

/// The CA Secret's content: `type`, `data` and the rotation annotations.
pub fn ca_secret_content(plan: &Rotation) -> Secret {
    let mut data = BTreeMap::new();
    if let Some(ca) = &plan.state.ca {
        data.insert("ca.crt".to_string(), ca.cert_pem.clone().into_bytes());
        data.insert("ca.key".to_string(), ca.key_pem.clone().into_bytes());
    }
    let mut annotations = BTreeMap::new();
    if let Some(p) = &plan.state.previous_ca_pem {
        data.insert("previous-ca.crt".to_string(), p.clone().into_bytes());
        if let Ok(f) = cp_certs::fingerprint(p) {
            annotations.insert(PREVIOUS_CA_SHA256.to_string(), f);
        }
    }
    let fmt = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
    if let Some(t) = plan.state.ca_created_at {
        annotations.insert(CA_CREATED.to_string(), fmt(t));
    }
    if let Some(t) = plan.state.leaf_switched_at {
        annotations.insert(LEAF_SWITCHED.to_string(), fmt(t));
    }
    crate::desired::secret("Opaque", Some(annotations), data)
}

/// The leaf Secret's content (`kubernetes.io/tls` with `ca.crt` = the bundle).
pub fn leaf_secret_content(plan: &Rotation) -> Secret {
    let leaf = plan.state.leaf.clone().unwrap_or(Leaf {
        cert_pem: String::new(),
        key_pem: String::new(),
    });
    let data = BTreeMap::from([
        ("tls.crt".to_string(), leaf.cert_pem.into_bytes()),
        ("tls.key".to_string(), leaf.key_pem.into_bytes()),
        ("ca.crt".to_string(), plan.bundle.clone().into_bytes()),
    ]);
    crate::desired::secret("kubernetes.io/tls", None, data)
}

/// A full Secret from its content, name, namespace and labels.
pub(crate) fn secret_body(
    namespace: &str,
    name: &str,
    owner: Option<&OwnerReference>,
    mut content: Secret,
) -> Value {
    content.metadata.name = Some(name.into());
    content.metadata.namespace = Some(namespace.into());
    content.metadata.labels = Some(names::managed_labels());
    content.metadata.owner_references = owner.map(|o| vec![o.clone()]);
    crate::desired::body(&content)
}

/// Settings of the webhook serving certificate.
#[derive(Clone, Debug)]
pub struct WebhookCertSettings {
    /// Namespace of the Secrets and the webhook Service.
    pub namespace: String,
    /// Name of the webhook Service.
    pub service: String,
    /// Extra IP SANs (127.0.0.1 for a local webhook).
    pub ips: Vec<IpAddr>,
    /// CA lifetime.
    pub ca_lifetime: time::Duration,
    /// Serving certificate lifetime.
    pub cert_lifetime: time::Duration,
    /// Time for a new bundle or certificate to reach the API server and the webhook replicas.
    pub propagation: time::Duration,
    /// Key algorithm of new certificates.
    pub algorithm: cp_certs::KeyAlgorithm,
    /// Owner of the Secrets (the module's CRD: uninstalling the module removes them).
    pub owner: Option<OwnerReference>,
}

impl WebhookCertSettings {
    fn spec(&self) -> Spec {
        let svc = &self.service;
        let ns = &self.namespace;
        Spec {
            ca_common_name: format!("{svc}-ca"),
            common_name: format!("{svc}.{ns}.svc"),
            dns_names: vec![
                format!("{svc}.{ns}.svc"),
                format!("{svc}.{ns}.svc.cluster.local"),
                format!("{svc}.{ns}"),
                svc.clone(),
            ],
            ips: self.ips.clone(),
            ca_policy: Policy::new(self.ca_lifetime),
            leaf_policy: Policy::new(self.cert_lifetime),
            propagation: self.propagation,
            algorithm: self.algorithm,
        }
    }
}

/// Applies the webhook Secret `name` with `content` if it differs from the live one (the
/// applied-hash annotation makes a removed key count as a difference); returns whether it wrote.
async fn ensure_secret(
    applier: &Applier,
    s: &WebhookCertSettings,
    name: &str,
    content: Secret,
) -> Result<bool, Error> {
    let desired = crate::desired::Desired {
        kind: crate::desired::Kind::Secret,
        namespace: Some(s.namespace.clone()),
        name: name.to_string(),
        body: secret_body(&s.namespace, name, s.owner.as_ref(), content),
    };
    applier
        .apply(&desired, true, "the webhook certificates")
        .await
}

/// Writes the CA bundle into every webhook of both configurations where it differs.
async fn ensure_ca_bundle(writer: &Writer, bundle: &str) -> Result<(), Error> {
    let want = bundle.as_bytes();
    ensure_bundle_in::<MutatingWebhookConfiguration>(writer, names::MUTATING_WEBHOOK_CONFIG, want)
        .await?;
    ensure_bundle_in::<ValidatingWebhookConfiguration>(
        writer,
        names::VALIDATING_WEBHOOK_CONFIG,
        want,
    )
    .await
}

/// Each webhook's name and `caBundle`, of either kind of webhook configuration.
trait CaBundles {
    fn ca_bundles(self) -> Vec<(String, Option<k8s_openapi::ByteString>)>;
}

impl CaBundles for MutatingWebhookConfiguration {
    fn ca_bundles(self) -> Vec<(String, Option<k8s_openapi::ByteString>)> {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|h| (h.name, h.client_config.ca_bundle)).collect()
    }
}

impl CaBundles for ValidatingWebhookConfiguration {
    fn ca_bundles(self) -> Vec<(String, Option<k8s_openapi::ByteString>)> {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|h| (h.name, h.client_config.ca_bundle)).collect()
    }
}

/// Applies `caBundle` to each webhook of the configuration `name` where it differs (absent
/// configuration: nothing to do).
async fn ensure_bundle_in<K>(writer: &Writer, name: &str, want: &[u8]) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + CaBundles
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let api = Api::<K>::all(writer.client().clone());
    let current = api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading {kind} {name}"), e))?;
    let Some(hooks) = current.map(CaBundles::ca_bundles) else {
        return Ok(());
    };
    if hooks
        .iter()
        .all(|(_, b)| b.as_ref().map(|b| b.0.as_slice()) == Some(want))
    {
        return Ok(());
    }
    let body = ca_bundle_patch(&K::api_version(&()), &kind, name, &hooks, want);
    writer
        .write(&api, name, &Patch::Apply(&body), "the webhook CA bundle")
        .await
        .map_err(|e| Error::kube(format!("writing the CA bundle into {kind} {name}"), e))?;
    Ok(())
}

/// The server-side apply patch that sets `caBundle` of each webhook in `hooks` of the webhook
/// configuration `kind`/`name`.
fn ca_bundle_patch(
    api_version: &str,
    kind: &str,
    name: &str,
    hooks: &[(String, Option<k8s_openapi::ByteString>)],
    want: &[u8],
) -> Value {
    let ca_bundle = STANDARD.encode(want);
    crate::desired::body(&CaBundlePatch {
        api_version,
        kind,
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: hooks
            .iter()
            .map(|(name, _)| WebhookCaBundle {
                name,
                client_config: CaBundle {
                    ca_bundle: &ca_bundle,
                },
            })
            .collect(),
    })
}

/// A webhook configuration with only the webhooks' names and `caBundle`s.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CaBundlePatch<'a> {
    api_version: &'a str,
    kind: &'a str,
    metadata: ObjectMeta,
    webhooks: Vec<WebhookCaBundle<'a>>,
}

/// One webhook with only its name and `clientConfig.caBundle`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WebhookCaBundle<'a> {
    name: &'a str,
    client_config: CaBundle<'a>,
}

/// `clientConfig` with only `caBundle` (base64).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CaBundle<'a> {
    ca_bundle: &'a str,
}

/// Records a certificate's expiry in `cp_certificate_expiry_timestamp_seconds{certificate=name}`.
pub fn observe(metrics: &Metrics, name: &str, pem: &str) {
    if let Ok(info) = cp_certs::inspect(pem) {
        metrics
            .cert_expiry
            .with_label_values(&[name])
            .set(info.not_after.unix_timestamp());
    }
}

/// One pass over the webhook certificates; returns when to look again.
pub async fn reconcile_webhook_certs(
    applier: &Applier,
    s: &WebhookCertSettings,
    metrics: &Metrics,
) -> Result<OffsetDateTime, Error> {
    let secrets: Api<Secret> = Api::namespaced(applier.writer().client().clone(), &s.namespace);
    let ca = secrets
        .get_opt(names::WEBHOOK_CA_SECRET)
        .await
        .map_err(|e| Error::kube("reading the webhook CA Secret", e))?;
    let leaf = secrets
        .get_opt(names::WEBHOOK_CERT_SECRET)
        .await
        .map_err(|e| Error::kube("reading the webhook certificate Secret", e))?;
    if let Err(why) = recorded_previous_ca(ca.as_ref()) {
        tracing::warn!(
            secret = %format!("{}/{}", s.namespace, names::WEBHOOK_CA_SECRET),
            %why,
            "previous-ca.crt dropped from the webhook CA bundle"
        );
    }
    let now = OffsetDateTime::now_utc();
    let plan =
        rotation::plan(now, &state_from(ca.as_ref(), leaf.as_ref()), &s.spec()).map_err(|e| {
            metrics
                .cert_failures
                .with_label_values(&["webhook-serving"])
                .inc();
            Error::Certificate(e.to_string())
        })?;
    // Order matters: trust first (CA Secret, then the bundle in the configurations), serve second.
    ensure_secret(
        applier,
        s,
        names::WEBHOOK_CA_SECRET,
        ca_secret_content(&plan),
    )
    .await?;
    ensure_ca_bundle(applier.writer(), &plan.bundle).await?;
    ensure_secret(
        applier,
        s,
        names::WEBHOOK_CERT_SECRET,
        leaf_secret_content(&plan),
    )
    .await?;
    if plan.ca_rotated {
        metrics
            .cert_rotations
            .with_label_values(&["webhook-ca"])
            .inc();
        tracing::info!(
            "webhook CA rotated; the old CA stays in the bundle until the new certificate has propagated"
        );
    }
    if plan.leaf_rotated {
        metrics
            .cert_rotations
            .with_label_values(&["webhook-serving"])
            .inc();
        tracing::info!("webhook serving certificate issued");
    }
    if let Some(ca) = &plan.state.ca {
        observe(metrics, "webhook-ca", &ca.cert_pem);
    }
    if let Some(leaf) = &plan.state.leaf {
        observe(metrics, "webhook-serving", &leaf.cert_pem);
    }
    Ok(plan.next)
}

/// Keeps the webhook certificates current: plans at each scheduled time (no polling) and whenever
/// one of the Secrets or webhook configurations changes (drift repair).
pub async fn run_webhook_certs(
    applier: Applier,
    settings: WebhookCertSettings,
    metrics: Arc<Metrics>,
) {
    use futures::StreamExt;
    let client = applier.writer().client().clone();
    let notify = Arc::new(tokio::sync::Notify::new());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let streams = futures::stream::select_all(vec![
        changes(secrets.clone(), names::WEBHOOK_CA_SECRET),
        changes(secrets, names::WEBHOOK_CERT_SECRET),
        changes(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            names::MUTATING_WEBHOOK_CONFIG,
        ),
        changes(
            Api::<ValidatingWebhookConfiguration>::all(client.clone()),
            names::VALIDATING_WEBHOOK_CONFIG,
        ),
    ]);
    let n = notify.clone();
    tokio::spawn(async move {
        let mut streams = streams;
        while streams.next().await.is_some() {
            n.notify_one();
        }
    });
    loop {
        let wait = match reconcile_webhook_certs(&applier, &settings, &metrics).await {
            Ok(next) => {
                let secs = (next - OffsetDateTime::now_utc())
                    .as_seconds_f64()
                    .max(0.05);
                StdDuration::from_secs_f64(secs)
            }
            Err(e) => {
                tracing::warn!(error = %e, "webhook certificates");
                StdDuration::from_secs(5)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = notify.notified() => {}
        }
    }
}

/// A stream that yields whenever the named object changes.
fn changes<K>(
    api: Api<K>,
    name: &str,
) -> futures::stream::BoxStream<'static, Result<(), kube::runtime::watcher::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .touched_objects()
    .map(|r| r.map(|_| ()))
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(cn: &str) -> Ca {
        let now = OffsetDateTime::now_utc();
        Ca::generate(
            cn,
            now - time::Duration::hours(1),
            now + time::Duration::days(1),
            cp_certs::KeyAlgorithm::EcdsaP256,
        )
        .expect("ca")
    }

    #[test]
    fn ca_bundle_patch_names_only_the_bundles() {
        let hooks = vec![
            ("a.example.org".to_string(), None),
            (
                "b.example.org".to_string(),
                Some(k8s_openapi::ByteString(b"old".to_vec())),
            ),
        ];
        let body = ca_bundle_patch(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "cp-validating",
            &hooks,
            b"PEM",
        );
        assert_eq!(
            body.to_string(),
            r#"{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{"name":"cp-validating"},"webhooks":[{"clientConfig":{"caBundle":"UEVN"},"name":"a.example.org"},{"clientConfig":{"caBundle":"UEVN"},"name":"b.example.org"}]}"#
        );
    }

    /// What the operator writes into the CA Secret for `state`, read back as a Secret.
    fn written(state: State) -> Secret {
        let plan = Rotation {
            state,
            bundle: String::new(),
            next: OffsetDateTime::now_utc(),
            ca_rotated: false,
            leaf_rotated: false,
        };
        ca_secret_content(&plan)
    }

    fn set_previous(s: &mut Secret, pem: &str) {
        s.data.get_or_insert_default().insert(
            "previous-ca.crt".into(),
            k8s_openapi::ByteString(pem.as_bytes().to_vec()),
        );
    }

    #[test]
    fn only_a_previous_ca_the_operator_retired_is_trusted() {
        let (current, retired, foreign) = (ca("current"), ca("retired"), ca("foreign"));
        // Hand-added to a Secret without a rotation in progress: dropped.
        let mut s = written(State {
            ca: Some(current.clone()),
            ..State::default()
        });
        assert_eq!(state_from(Some(&s), None).previous_ca_pem, None);
        set_previous(&mut s, &foreign.cert_pem);
        assert_eq!(state_from(Some(&s), None).previous_ca_pem, None);
        let why = recorded_previous_ca(Some(&s)).expect_err("no record");
        assert!(why.contains(PREVIOUS_CA_SHA256), "{why}");
        // Retired by the operator's rotation: trusted for the rotation window.
        let mut s = written(State {
            ca: Some(current.clone()),
            previous_ca_pem: Some(retired.cert_pem.clone()),
            ..State::default()
        });
        assert_eq!(
            state_from(Some(&s), None).previous_ca_pem.as_deref(),
            Some(retired.cert_pem.as_str())
        );
        // Swapped by hand during the rotation: not the CA the operator retired.
        set_previous(&mut s, &foreign.cert_pem);
        let state = state_from(Some(&s), None);
        assert_eq!(state.previous_ca_pem, None);
        let spec = WebhookCertSettings {
            namespace: "kyma-system".into(),
            service: "svc".into(),
            ips: vec![],
            ca_lifetime: time::Duration::days(1),
            cert_lifetime: time::Duration::hours(12),
            propagation: time::Duration::seconds(60),
            algorithm: cp_certs::KeyAlgorithm::EcdsaP256,
            owner: None,
        }
        .spec();
        let plan = rotation::plan(OffsetDateTime::now_utc(), &state, &spec).expect("plan");
        assert!(!plan.bundle.contains(foreign.cert_pem.trim_end()));
        assert!(plan.bundle.contains(current.cert_pem.trim_end()));
    }
}
