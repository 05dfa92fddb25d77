//! Ownership that a label cannot forge.
//!
//! Anyone who may label a ConfigMap or Secret in `kyma-system` can give it the operator's
//! `app.kubernetes.io/managed-by` and owner labels. Those labels still select what the caches watch,
//! but what the controller overwrites, prunes, deletes with its CR or restores a migration from is
//! decided here: an object is the operator's when it carries an HMAC-SHA256 of its identity (group,
//! kind, namespace, name; for a migration backup also its data) under
//! [`OWNERSHIP_PROOF_ANNOTATION`], keyed by the Secret [`names::OWNERSHIP_KEY_SECRET`] that only the
//! controller reads. A copied proof is worth nothing elsewhere: it names the object it was made for.
//!
//! Objects an earlier release labelled carry no proof. When the controller creates the key it marks
//! the key Secret with [`ADOPTING_ANNOTATION`]: until the first install reconcile that ends Ready,
//! labelled objects created *before* the key are adopted (and stamped by that reconcile); then the
//! window closes for good. An object labelled later, or created after the key, without a proof is
//! left alone and named in a Warning.

use std::collections::BTreeMap;
use std::sync::Mutex;

use cp_api::keys::{ADOPTING_ANNOTATION, OWNERSHIP_PROOF_ANNOTATION};
use cp_api::names;
use cp_certs::crypto::backend::hmac;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::Value;

use crate::Error;
use crate::desired::{Kind, is_managed};

/// Key bytes in the key Secret.
const KEY_FIELD: &str = "key";
/// Length of a generated key (HMAC-SHA256's block-size-safe minimum is 32 bytes).
const KEY_LEN: usize = 32;
/// Version prefix of a proof (a later scheme gets another).
const PREFIX: &str = "v1.";

/// Where an object stands with the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Labelled and carries a valid proof: the operator created it.
    Proven,
    /// Labelled by an earlier release, created before the key (or in its second), and the adoption
    /// window is open.
    Adopted,
    /// Labelled but without a valid proof: someone else's object wearing the operator's labels.
    Unproven,
    /// Not labelled as the operator's.
    Foreign,
}

impl Standing {
    /// Whether the operator may overwrite, prune or restore from the object.
    pub fn ours(self) -> bool {
        matches!(self, Standing::Proven | Standing::Adopted)
    }
}

/// The ownership key and the adoption window.
pub struct Proof {
    key: hmac::Key,
    /// Labelled objects created before this time are adopted while it is set.
    adopt_before: Mutex<Option<Time>>,
}

impl std::fmt::Debug for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proof")
            .field("adopting", &self.adopting())
            .finish_non_exhaustive()
    }
}

impl Proof {
    /// A proof keyed by `key`, adopting labelled objects created before `adopt_before`.
    pub fn new(key: &[u8], adopt_before: Option<Time>) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            adopt_before: Mutex::new(adopt_before),
        }
    }

    /// A fixed, public key with the window closed: nothing in a cluster carries its proofs (unit
    /// tests, and `migrate-plan` where the real key cannot be read).
    pub fn without_key() -> Self {
        Self::new(b"connectivity-proxy-operator-tests-only-key", None)
    }

    /// What is signed: `group/kind`, namespace and name, one per line, then `content` (a backup's).
    fn message(
        ar: &kube::core::ApiResource,
        namespace: Option<&str>,
        name: &str,
        content: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut m = format!(
            "{}/{}\n{}\n{}\n",
            ar.group,
            ar.kind,
            namespace.unwrap_or(""),
            name
        )
        .into_bytes();
        if let Some(c) = content {
            m.extend_from_slice(c);
        }
        m
    }

    /// The proof of the object `kind` `namespace/name` (with `content` for a backup).
    pub fn token(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
        content: Option<&[u8]>,
    ) -> String {
        self.token_of(&kind.api_resource(), namespace, name, content)
    }

    /// [`Proof::token`] of an object of any API (a legacy object the takeover adopts).
    pub fn token_of(
        &self,
        ar: &kube::core::ApiResource,
        namespace: Option<&str>,
        name: &str,
        content: Option<&[u8]>,
    ) -> String {
        use base64::Engine;
        let tag = hmac::sign(&self.key, &Self::message(ar, namespace, name, content));
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    fn verifies(&self, kind: Kind, meta: &ObjectMeta, content: Option<&[u8]>) -> bool {
        use base64::Engine;
        let Some(token) = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNERSHIP_PROOF_ANNOTATION))
        else {
            return false;
        };
        let Some(tag) = token.strip_prefix(PREFIX).and_then(|t| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(t)
                .ok()
        }) else {
            return false;
        };
        let name = meta.name.as_deref().unwrap_or_default();
        let message = Self::message(
            &kind.api_resource(),
            meta.namespace.as_deref(),
            name,
            content,
        );
        hmac::verify(&self.key, &message, &tag).is_ok()
    }

    /// Where the object `kind` with `meta` stands.
    pub fn standing(&self, kind: Kind, meta: &ObjectMeta) -> Standing {
        self.standing_with(kind, meta, None)
    }

    /// [`Proof::standing`] of a backup, whose proof covers its `content` too.
    pub fn standing_with(&self, kind: Kind, meta: &ObjectMeta, content: Option<&[u8]>) -> Standing {
        let labelled = meta.labels.as_ref().is_some_and(is_managed);
        if !labelled {
            return Standing::Foreign;
        }
        if self.verifies(kind, meta, content) {
            return Standing::Proven;
        }
        let before = self.adopt_before.lock().ok().and_then(|g| g.clone());
        let created = meta.creation_timestamp.as_ref();
        match (before, created) {
            // Timestamps have whole seconds: an object of the key's second is from before it.
            (Some(b), Some(c)) if c.0 <= b.0 => Standing::Adopted,
            _ => Standing::Unproven,
        }
    }

    /// Whether the object is the operator's (proven or adopted).
    pub fn ours(&self, kind: Kind, meta: &ObjectMeta) -> bool {
        self.standing(kind, meta).ours()
    }

    /// Puts the proof of the object `body` describes into its `metadata.annotations`.
    pub fn stamp(&self, kind: Kind, body: &mut Value, content: Option<&[u8]>) {
        let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) else {
            return;
        };
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        let ns = meta.get("namespace").and_then(Value::as_str);
        let token = self.token(kind, ns, name, content);
        let ann = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = ann.as_object_mut() {
            a.insert(OWNERSHIP_PROOF_ANNOTATION.into(), Value::String(token));
        }
    }

    /// Whether labelled objects from before the key may still be adopted.
    pub fn adopting(&self) -> bool {
        self.adopt_before.lock().ok().is_some_and(|g| g.is_some())
    }

    /// Closes the adoption window: in memory now, and on the key Secret so a restart keeps it closed.
    pub async fn close_adoption(&self, writer: &crate::writer::Writer) -> Result<(), Error> {
        if !self.adopting() {
            return Ok(());
        }
        let patch = crate::writer::MergePatch::default().annotation(ADOPTING_ANNOTATION, None);
        let api = Api::<Secret>::namespaced(writer.client().clone(), names::KYMA_SYSTEM);
        writer
            .write(
                &api,
                names::OWNERSHIP_KEY_SECRET,
                &Patch::Merge(&patch),
                "closing the ownership adoption window",
            )
            .await
            .map_err(|e| Error::kube("closing the ownership adoption window", e))?;
        if let Ok(mut g) = self.adopt_before.lock() {
            *g = None;
        }
        tracing::info!(
            "adoption window closed: from now on only objects with an ownership proof are the operator's"
        );
        Ok(())
    }
}

/// The content a backup's proof covers: its data, as canonical JSON (keys sorted).
pub fn backup_content<V: serde::Serialize>(data: &BTreeMap<String, V>) -> Vec<u8> {
    serde_json::to_vec(data).unwrap_or_default()
}

/// A Secret's data as the strings a backup holds (base64 of each value).
pub fn secret_strings(data: &BTreeMap<String, ByteString>) -> BTreeMap<String, String> {
    use base64::Engine;
    data.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                base64::engine::general_purpose::STANDARD.encode(&v.0),
            )
        })
        .collect()
}

/// Reads the key Secret, or creates it (with a fresh random key and the adoption window open) when
/// it does not exist yet: the first start of a release with ownership proofs.
///
/// `owner` (the module's CRD) owns the key as it owns the webhook Secrets and the Lease: the key goes
/// when the module is uninstalled.
pub async fn load_or_create(
    writer: &crate::writer::Writer,
    owner: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> Result<Proof, Error> {
    let secrets: Api<Secret> = Api::namespaced(writer.client().clone(), names::KYMA_SYSTEM);
    for _ in 0..3 {
        if let Some(s) = secrets
            .get_opt(names::OWNERSHIP_KEY_SECRET)
            .await
            .map_err(|e| Error::kube("reading the ownership key Secret", e))?
        {
            return from_secret(&s);
        }
        let key = random_key()?;
        let body = Secret {
            metadata: ObjectMeta {
                name: Some(names::OWNERSHIP_KEY_SECRET.into()),
                namespace: Some(names::KYMA_SYSTEM.into()),
                labels: Some(names::managed_labels()),
                annotations: Some([(ADOPTING_ANNOTATION.to_string(), "true".to_string())].into()),
                owner_references: owner.map(|o| vec![o.clone()]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some([(KEY_FIELD.to_string(), ByteString(key))].into()),
            ..Default::default()
        };
        match writer
            .insert(
                &secrets,
                names::OWNERSHIP_KEY_SECRET,
                &body,
                "creating the ownership key",
            )
            .await
        {
            Ok(s) => {
                tracing::info!(
                    secret = names::OWNERSHIP_KEY_SECRET,
                    "ownership key created; objects an earlier release labelled are adopted until the first Ready reconcile"
                );
                return from_secret(&s);
            }
            // Created meanwhile (another replica): read it.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(Error::kube("creating the ownership key Secret", e)),
        }
    }
    Err(Error::Invalid(format!(
        "the ownership key Secret {}/{} could not be read or created",
        names::KYMA_SYSTEM,
        names::OWNERSHIP_KEY_SECRET
    )))
}

fn random_key() -> Result<Vec<u8>, Error> {
    use cp_certs::crypto::backend::rand::SecureRandom;
    let mut key = vec![0u8; KEY_LEN];
    cp_certs::crypto::backend::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| Error::Invalid("no randomness for the ownership key".into()))?;
    Ok(key)
}

/// The proof a key Secret holds.
pub fn from_secret(s: &Secret) -> Result<Proof, Error> {
    let key = s
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_FIELD))
        .map(|k| k.0.clone())
        .unwrap_or_default();
    if key.len() < KEY_LEN {
        return Err(Error::Invalid(format!(
            "the ownership key Secret {}/{} holds no key of at least {KEY_LEN} bytes under data.{KEY_FIELD}: delete it and the controller creates a new one (objects labelled before are adopted once more)",
            names::KYMA_SYSTEM,
            names::OWNERSHIP_KEY_SECRET
        )));
    }
    let adopting = s.annotations().get(ADOPTING_ANNOTATION).map(String::as_str) == Some("true");
    let before = adopting
        .then(|| s.metadata.creation_timestamp.clone())
        .flatten();
    Ok(Proof::new(&key, before))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(name: &str, labelled: bool, created: i64) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kyma-system".into()),
            labels: labelled.then(names::managed_labels),
            creation_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
            )),
            ..Default::default()
        }
    }

    fn stamped(p: &Proof, kind: Kind, m: &ObjectMeta, content: Option<&[u8]>) -> ObjectMeta {
        let mut m = m.clone();
        let token = p.token(
            kind,
            m.namespace.as_deref(),
            m.name.as_deref().unwrap(),
            content,
        );
        m.annotations = Some([(OWNERSHIP_PROOF_ANNOTATION.to_string(), token)].into());
        m
    }

    #[test]
    fn a_label_alone_is_not_ownership() {
        let p = Proof::without_key();
        let m = meta("user-cm", true, 100);
        assert_eq!(p.standing(Kind::ConfigMap, &m), Standing::Unproven);
        assert_eq!(
            p.standing(Kind::ConfigMap, &meta("x", false, 1)),
            Standing::Foreign
        );
        let proven = stamped(&p, Kind::ConfigMap, &m, None);
        assert_eq!(p.standing(Kind::ConfigMap, &proven), Standing::Proven);
    }

    #[test]
    fn a_proof_is_bound_to_its_object_and_key() {
        let p = Proof::without_key();
        let proven = stamped(&p, Kind::ConfigMap, &meta("a", true, 1), None);
        // Copied onto another name, another kind, or checked with another key: worthless.
        let mut other = proven.clone();
        other.name = Some("b".into());
        assert_eq!(p.standing(Kind::ConfigMap, &other), Standing::Unproven);
        assert_eq!(p.standing(Kind::Secret, &proven), Standing::Unproven);
        let q = Proof::new(&[7u8; 32], None);
        assert_eq!(q.standing(Kind::ConfigMap, &proven), Standing::Unproven);
        // Labels removed: not the operator's at all.
        let mut unlabelled = proven;
        unlabelled.labels = None;
        assert_eq!(p.standing(Kind::ConfigMap, &unlabelled), Standing::Foreign);
    }

    #[test]
    fn a_backup_proof_covers_its_data() {
        let p = Proof::without_key();
        let data: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
        let m = stamped(
            &p,
            Kind::ConfigMap,
            &meta("bk", true, 1),
            Some(&backup_content(&data)),
        );
        assert_eq!(
            p.standing_with(Kind::ConfigMap, &m, Some(&backup_content(&data))),
            Standing::Proven
        );
        let forged: BTreeMap<String, String> = [("a".to_string(), "2".to_string())].into();
        assert_eq!(
            p.standing_with(Kind::ConfigMap, &m, Some(&backup_content(&forged))),
            Standing::Unproven
        );
    }

    #[test]
    fn only_objects_older_than_the_key_are_adopted_and_only_while_the_window_is_open() {
        let key_created = Time(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let p = Proof::new(&[1u8; 32], Some(key_created));
        // Timestamps have whole seconds: the key's own second counts as before it.
        for (name, labelled, created, want) in [
            ("old", true, 999, Standing::Adopted),
            ("same", true, 1000, Standing::Adopted),
            ("new", true, 1001, Standing::Unproven),
            ("old", false, 999, Standing::Foreign),
        ] {
            assert_eq!(
                p.standing(Kind::Secret, &meta(name, labelled, created)),
                want,
                "{name}"
            );
        }
        *p.adopt_before.lock().unwrap() = None;
        assert_eq!(
            p.standing(Kind::Secret, &meta("old", true, 999)),
            Standing::Unproven
        );
    }

    #[test]
    fn stamping_writes_the_proof_the_check_accepts() {
        let p = Proof::without_key();
        let mut body = json!({"metadata": {"name": "n", "namespace": "kyma-system", "labels": names::managed_labels()}});
        p.stamp(Kind::Service, &mut body, None);
        let m: ObjectMeta = serde_json::from_value(body["metadata"].clone()).unwrap();
        assert_eq!(p.standing(Kind::Service, &m), Standing::Proven);
    }

    #[test]
    fn a_short_or_missing_key_is_refused_with_the_fix() {
        let s = Secret::default();
        let e = from_secret(&s).unwrap_err().to_string();
        assert!(e.contains("delete it"), "{e}");
    }
}
