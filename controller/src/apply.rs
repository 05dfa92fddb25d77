//! Applying desired objects through the one [`Writer`](crate::writer::Writer), with the operator's
//! ownership proof: objects that already match are skipped (so a steady state issues no writes), and
//! only what is provably the operator's is pruned.

use cp_api::names;
use kube::api::{DynamicObject, Patch};
use serde_json::Value;

use crate::Error;
use crate::desired::{Desired, Kind};
use crate::writer::{Writer, api, forbidden_namespace, read};

/// The object as applied: the desired body with the hash of that body in an annotation, so that a
/// field dropped from the desired state (which a subset comparison cannot see) still triggers an apply.
pub fn with_hash(d: &Desired) -> Value {
    with_digest(d, &Digest::of(d))
}

/// [`with_hash`] with the body's digest already computed.
pub fn with_digest(d: &Desired, digest: &Digest) -> Value {
    let mut body = d.body.clone();
    if let Some(meta) = body.get_mut("metadata") {
        add_hash(meta, digest.hash.clone());
    }
    body
}

/// Puts the applied-hash annotation into an object's `metadata`.
fn add_hash(meta: &mut Value, hash: String) {
    if let Some(meta) = meta.as_object_mut() {
        let ann = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = ann.as_object_mut() {
            a.insert(names::ANNOTATION_APPLIED_HASH.into(), Value::String(hash));
        }
    }
}

/// The length and the hash ([`crate::desired::hash_str`]) of a desired body's compact JSON, computed
/// as it is written out, without holding the text: the aggregated mappings ConfigMap is most of a
/// megabyte with 10,000 mappings, and a reconcile needs both of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Digest {
    /// Bytes of the compact JSON.
    pub len: usize,
    /// Its FNV-1a hash, as [`crate::desired::hash_str`] computes it for the text.
    pub hash: String,
}

impl Digest {
    /// The digest of `d`'s body.
    pub fn of(d: &Desired) -> Self {
        let mut w = crate::desired::Fnv::default();
        // Writing a Value into this writer cannot fail (no I/O, string-keyed maps).
        let _ = serde_json::to_writer(&mut w, &d.body);
        Self {
            len: w.len,
            hash: w.hex(),
        }
    }
}

/// Whether every field of `desired` has the same value in `live` (extra live fields are fine; empty
/// desired values match missing ones; resource quantities compare by value).
pub fn matches(desired: &Value, live: &Value) -> bool {
    mismatch(desired, live, "").is_none()
}

/// The first path where `live` differs from `desired`, for the log line that explains an apply.
pub fn mismatch(desired: &Value, live: &Value, path: &str) -> Option<String> {
    let differs = || {
        Some(if path.is_empty() {
            "/".to_string()
        } else {
            path.to_string()
        })
    };
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().find_map(|(k, dv)| match l.get(k) {
            Some(lv) => mismatch(dv, lv, &format!("{path}/{k}")),
            None if is_empty(dv) => None,
            None => Some(format!("{path}/{k}")),
        }),
        (Value::Object(_) | Value::Array(_), Value::Null) => {
            if is_empty(desired) {
                None
            } else {
                differs()
            }
        }
        (Value::Array(d), Value::Array(l)) => {
            if d.len() != l.len() {
                return differs();
            }
            d.iter()
                .zip(l)
                .enumerate()
                .find_map(|(i, (a, b))| mismatch(a, b, &format!("{path}/{i}")))
        }
        (Value::Number(a), Value::Number(b)) => {
            if a.as_f64() == b.as_f64() {
                None
            } else {
                differs()
            }
        }
        (Value::String(a), Value::String(b)) => {
            if a == b || quantity(a).is_some_and(|qa| quantity(b) == Some(qa)) {
                None
            } else {
                differs()
            }
        }
        (a, b) => {
            if a == b {
                None
            } else {
                differs()
            }
        }
    }
}

/// Values the API server omits when serialising (`omitempty`): a desired one matches a missing field.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Parses a Kubernetes quantity (`100m`, `1`, `256M`, `1Gi`) into its value.
fn quantity(s: &str) -> Option<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some(n * factor)
}

fn d_ns(d: &Desired) -> &str {
    d.namespace.as_deref().unwrap_or("")
}

/// Why `d` must be applied over `live` (`None`: it matches, nothing to write).
pub fn apply_reason(d: &Desired, live: Option<&DynamicObject>) -> Option<String> {
    apply_reason_with(d, &Digest::of(d), live)
}

/// [`apply_reason`] with the body's digest already computed. The live object is compared field by
/// field where it is, without copying it into a JSON value of its own (a ConfigMap of most of a
/// megabyte would be copied on every reconcile); the paths are the same as for the whole object.
pub fn apply_reason_with(
    d: &Desired,
    digest: &Digest,
    live: Option<&DynamicObject>,
) -> Option<String> {
    let Some(live) = live else {
        return Some("absent".into());
    };
    let Some(body) = d.body.as_object() else {
        let live = serde_json::to_value(live).unwrap_or(Value::Null);
        return mismatch(&with_hash(d), &live, "").map(|path| format!("{path} differs"));
    };
    body.iter()
        .find_map(|(k, dv)| {
            let path = format!("/{k}");
            match k.as_str() {
                "metadata" => {
                    let mut meta = dv.clone();
                    add_hash(&mut meta, digest.hash.clone());
                    let lm = serde_json::to_value(&live.metadata).unwrap_or(Value::Null);
                    mismatch(&meta, &lm, &path)
                }
                "apiVersion" | "kind" => {
                    let lv = live.types.as_ref().map(|t| match k.as_str() {
                        "kind" => t.kind.as_str(),
                        _ => t.api_version.as_str(),
                    });
                    match lv {
                        Some(lv) => mismatch(dv, &Value::String(lv.to_string()), &path),
                        None if is_empty(dv) => None,
                        None => Some(path),
                    }
                }
                _ => match live.data.get(k) {
                    Some(lv) => mismatch(dv, lv, &path),
                    None if is_empty(dv) => None,
                    None => Some(path),
                },
            }
        })
        .map(|path| format!("{path} differs"))
}

/// The error for an object that exists under a desired name but was not created by the operator.
pub fn not_ours(d: &Desired) -> Error {
    let kind = d.kind.api_resource().kind;
    Error::NotOurs(match d.namespace.as_deref() {
        Some(ns) => format!("{kind} {ns}/{}", d.name),
        None => format!("{kind} {}", d.name),
    })
}

/// Applies desired objects and deletes managed ones through the [`Writer`]. Every body it writes
/// carries the operator's ownership proof ([`crate::ownership`]).
#[derive(Clone)]
pub struct Applier {
    writer: Writer,
    proof: std::sync::Arc<crate::ownership::Proof>,
}

impl Applier {
    /// An applier writing through `writer`, stamping `proof`.
    pub fn new(writer: Writer, proof: std::sync::Arc<crate::ownership::Proof>) -> Self {
        Self { writer, proof }
    }

    /// The writer.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// The ownership proof this applier stamps.
    pub fn proof(&self) -> &std::sync::Arc<crate::ownership::Proof> {
        &self.proof
    }

    /// Applies `d`; returns whether it wrote. When the caches did not hold it (`confirm_absent`), the
    /// API is asked first: an object of that name that the operator did not create is never written
    /// ([`Error::NotOurs`]), and one that already matches is left alone.
    pub async fn apply(&self, d: &Desired, confirm_absent: bool, why: &str) -> Result<bool, Error> {
        Ok(self
            .apply_with(d, &Digest::of(d), confirm_absent, why)
            .await?
            .is_some())
    }

    /// [`Applier::apply`] with the body's digest the plan computed (the mappings ConfigMap is not
    /// serialised again for its hash), logged with `why`: `Some` (the resourceVersion the write
    /// produced) when it wrote, `None` when the object already matched.
    pub async fn apply_with(
        &self,
        d: &Desired,
        digest: &Digest,
        confirm_absent: bool,
        why: &str,
    ) -> Result<Option<Option<String>>, Error> {
        // A shard whose text was not put back in place of its marker is never written (the proxy
        // would read the marker).
        if crate::mappings::holds_marker(d) {
            return Err(Error::Invalid(format!(
                "internal error: ConfigMap {} would be written without its mappings (a marker in place of the text)",
                d.name
            )));
        }
        if confirm_absent
            && let Some(l) = read(
                self.writer.client(),
                d.kind,
                d.namespace.as_deref(),
                &d.name,
            )
            .await?
        {
            match self.proof.standing(d.kind, &l.metadata) {
                crate::ownership::Standing::Proven => {
                    if apply_reason_with(d, digest, Some(&l)).is_none() {
                        return Ok(None);
                    }
                }
                // An earlier release's object: written once more, now with the proof.
                crate::ownership::Standing::Adopted => {}
                crate::ownership::Standing::Unproven | crate::ownership::Standing::Foreign => {
                    return Err(not_ours(d));
                }
            }
        }
        let mut body = with_digest(d, digest);
        self.proof.stamp(d.kind, &mut body, None);
        let what = format!("applying {} {}", d.kind.api_resource().kind, d.name);
        let api = api(self.writer.client(), d.kind, d.namespace.as_deref());
        let written = self
            .writer
            .write(&api, &d.name, &Patch::Apply(&body), why)
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") => {
                    Error::Invalid(format!(
                        "{what}: namespace {} does not exist (the Istio namespace is spec.ingress.istio.namespace, default istio-system: is Istio installed?)",
                        d_ns(d)
                    ))
                }
                kube::Error::Api(s) if s.code == 403 && d.namespace.is_some() => {
                    forbidden_namespace(&what, d_ns(d))
                }
                e => Error::kube(what, e),
            })?;
        Ok(Some(written.metadata.resource_version))
    }

    /// Deletes a managed object the operator proved it owns, if it is still the object read.
    pub async fn remove(
        &self,
        kind: Kind,
        obj: &kube::api::ObjectMeta,
        why: &str,
    ) -> Result<(), Error> {
        let name = obj.name.as_deref().unwrap_or_default();
        let api = api(self.writer.client(), kind, obj.namespace.as_deref());
        let read = (obj.uid.clone(), obj.resource_version.clone());
        self.writer
            .remove(&api, name, &read, why)
            .await
            .map(|_| ())
            .map_err(|e| Error::kube(format!("deleting {} {name}", kind.api_resource().kind), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_match_ignores_server_defaults_and_normalises_quantities() {
        let desired = json!({"spec": {"replicas": 1, "res": {"cpu": "1000m", "memory": "256M"}, "empty": {}}});
        let live =
            json!({"spec": {"replicas": 1, "res": {"cpu": "1", "memory": "256M"}, "extra": true}});
        assert!(matches(&desired, &live));
        assert!(!matches(&json!({"spec": {"replicas": 2}}), &live));
        assert!(!matches(&json!({"a": [1, 2]}), &json!({"a": [1]})));
        assert!(
            matches(&json!({"globalDefault": false}), &json!({})),
            "omitempty false"
        );
        assert!(!matches(&json!({"globalDefault": true}), &json!({})));
        assert_eq!(
            mismatch(&json!({"a": {"b": 1}}), &json!({"a": {"b": 2}}), ""),
            Some("/a/b".into())
        );
    }

    /// The field-by-field comparison says what comparing the whole live object as JSON says.
    #[test]
    fn the_apply_reason_is_that_of_the_whole_object() {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "kyma-system", "labels": {"a": "b"}},
            "data": {"k": "v"}});
        let d = Desired {
            kind: Kind::ConfigMap,
            namespace: Some("kyma-system".into()),
            name: "c".into(),
            body: body.clone(),
        };
        let digest = Digest::of(&d);
        assert_eq!(digest.len, body.to_string().len());
        assert_eq!(digest.hash, crate::desired::hash_str(&body.to_string()));
        let applied = with_hash(&d);
        let whole = |live: &DynamicObject| {
            let live = serde_json::to_value(live).expect("JSON");
            mismatch(&applied, &live, "").map(|p| format!("{p} differs"))
        };
        let live = |v: Value| -> DynamicObject { serde_json::from_value(v).expect("object") };
        let mut extra = applied.clone();
        extra["metadata"]["resourceVersion"] = json!("7");
        extra["metadata"]["annotations"]["x"] = json!("y");
        let mut edited = applied.clone();
        edited["data"]["k"] = json!("w");
        let mut unhashed = applied.clone();
        unhashed["metadata"]["annotations"] = json!({});
        let mut relabelled = applied.clone();
        relabelled["metadata"]["labels"]["a"] = json!("c");
        let mut no_data = applied.clone();
        no_data.as_object_mut().expect("object").remove("data");
        let mut other_kind = applied.clone();
        other_kind["kind"] = json!("Secret");
        for (what, l, want) in [
            ("as applied", applied.clone(), None),
            ("server fields", extra, None),
            ("data edited", edited, Some("/data/k differs")),
            (
                "hash removed",
                unhashed,
                Some("/metadata/annotations/connectivityproxy.sap.com/applied-hash differs"),
            ),
            (
                "label edited",
                relabelled,
                Some("/metadata/labels/a differs"),
            ),
            ("data missing", no_data, Some("/data differs")),
            ("another kind", other_kind, Some("/kind differs")),
        ] {
            let l = live(l);
            let got = apply_reason_with(&d, &digest, Some(&l));
            assert_eq!(got.as_deref(), want, "{what}");
            assert_eq!(got, whole(&l), "{what}: as the whole object says");
        }
        assert_eq!(apply_reason(&d, None).as_deref(), Some("absent"));
    }
}
