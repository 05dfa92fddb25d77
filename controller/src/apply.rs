//! The controller's one writer: every write to the API server (the leader Lease and Events aside)
//! goes through [`Writer`] — server-side apply with the one field manager, merge and JSON patches
//! under the same manager, creates, deletes with UID and resourceVersion preconditions — and is
//! counted (`cp_controller_writes_total{resource,verb,result}`) and logged once with its reason.
//! [`Applier`] adds the ownership proof: it applies desired objects, skipping those that already
//! match (so a steady state issues no writes), and prunes what is provably the operator's.

use std::fmt::Debug;

use cp_api::names;
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use prometheus::IntCounterVec;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Error;
use crate::desired::{Desired, Kind};

/// The object as applied: the desired body with the hash of that body in an annotation, so that a
/// field dropped from the desired state (which a subset comparison cannot see) still triggers an apply.
pub fn with_hash(d: &Desired) -> Value {
    with_digest(d, &Digest::of(d))
}

/// [`with_hash`] with the body's digest already computed.
fn with_digest(d: &Desired, digest: &Digest) -> Value {
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

/// A 403 in a namespace: name the RoleBinding that would allow it.
fn forbidden_namespace(what: &str, ns: &str) -> Error {
    Error::Invalid(format!(
        "{what}: the controller may not write in namespace {ns}; outside kyma-system it writes the tunnel's Secrets and certificates only where ClusterRole connectivity-proxy-operator-istio is bound (istio-system): kubectl create rolebinding connectivity-proxy-operator-controller -n {ns} --clusterrole=connectivity-proxy-operator-istio --serviceaccount=kyma-system:connectivity-proxy-controller"
    ))
}

fn d_ns(d: &Desired) -> &str {
    d.namespace.as_deref().unwrap_or("")
}

fn api(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = kind.api_resource();
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Reads one object from the API.
pub async fn read(
    client: &Client,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<DynamicObject>, Error> {
    let what = format!("reading {} {name}", kind.api_resource().kind);
    api(client, kind, namespace)
        .get_opt(name)
        .await
        .map_err(|e| match (e, namespace) {
            (kube::Error::Api(s), Some(ns)) if s.code == 403 => forbidden_namespace(&what, ns),
            (e, _) => Error::kube(what, e),
        })
}

/// Lists the managed objects of one kind in one scope that belong to the CR `owner` (`namespace/name`).
pub async fn list_owned(
    client: &Client,
    kind: Kind,
    namespace: Option<&str>,
    owner: (&str, &str),
) -> Result<Vec<DynamicObject>, Error> {
    let selector = format!(
        "{}={},{}={},{}={}",
        names::LABEL_MANAGED_BY,
        names::MANAGED_BY_VALUE,
        names::LABEL_OWNER_NAMESPACE,
        owner.0,
        names::LABEL_OWNER_NAME,
        owner.1
    );
    let plural = kind.api_resource().plural;
    api(client, kind, namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .map_err(|e| {
            Error::kube(
                match namespace {
                    Some(ns) => format!("listing {plural} in {ns}"),
                    None => format!("listing {plural}"),
                },
                e,
            )
        })
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

/// A managed object to delete, as read: it is deleted only while its UID and resourceVersion are
/// still these.
#[derive(Clone, Debug, PartialEq)]
pub struct Prune {
    /// Its kind.
    pub kind: Kind,
    /// Its metadata as cached.
    pub meta: kube::api::ObjectMeta,
}

impl Prune {
    /// The managed object `o` of `kind`, as cached.
    pub fn of(kind: Kind, o: &DynamicObject) -> Self {
        Self {
            kind,
            meta: o.metadata.clone(),
        }
    }

    /// The cache key.
    pub fn key(&self) -> crate::cache::Key {
        (
            self.kind,
            self.meta.namespace.clone(),
            self.meta.name.clone().unwrap_or_default(),
        )
    }
}

/// How a write goes out (the `verb` label of the writes metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Server-side apply (forced, the one field manager).
    Apply,
    /// A merge patch.
    Merge,
    /// A JSON patch.
    JsonPatch,
    /// A create.
    Create,
    /// A delete with preconditions.
    Delete,
}

impl Verb {
    fn label(self, status: bool) -> &'static str {
        match (self, status) {
            (Verb::Apply, false) => "apply",
            (Verb::Apply, true) => "apply-status",
            (Verb::Merge, false) => "merge",
            (Verb::Merge, true) => "merge-status",
            (Verb::JsonPatch, _) => "json-patch",
            (Verb::Create, _) => "create",
            (Verb::Delete, _) => "delete",
        }
    }
}

/// The typed body of a server-side apply that sets a part of an object: its metadata (labels,
/// annotations) or its status, nothing else.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Partial<S: Serialize> {
    api_version: String,
    kind: String,
    metadata: kube::api::ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<S>,
}

impl<S: Serialize> Partial<S> {
    /// The apply body of object `K` `name` with `metadata` (its name set) and `status`.
    pub fn of<K: kube::Resource<DynamicType = ()>>(
        name: &str,
        mut metadata: kube::api::ObjectMeta,
        status: Option<S>,
    ) -> Self {
        metadata.name = Some(name.into());
        Self {
            api_version: K::api_version(&()).into(),
            kind: K::kind(&()).into(),
            metadata,
            status,
        }
    }
}

/// A merge patch of an object's labels and annotations (a `None` value removes the key), and of its
/// `spec` where one is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MergePatch {
    metadata: MetadataFields,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct MetadataFields {
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    labels: std::collections::BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    annotations: std::collections::BTreeMap<String, Option<String>>,
}

impl MergePatch {
    /// Sets (or, with `None`, removes) a label.
    pub fn label(mut self, key: &str, value: Option<&str>) -> Self {
        self.metadata
            .labels
            .insert(key.into(), value.map(String::from));
        self
    }

    /// Merges `spec`.
    pub fn spec(mut self, spec: Value) -> Self {
        self.spec = Some(spec);
        self
    }

    /// Sets (or, with `None`, removes) an annotation.
    pub fn annotation(mut self, key: &str, value: Option<&str>) -> Self {
        self.metadata
            .annotations
            .insert(key.into(), value.map(String::from));
        self
    }
}

/// Typed JSON-patch operations.
pub mod json_op {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
    use serde::Serialize;
    use serde_json::Value;

    fn at(path: &[&str]) -> PointerBuf {
        PointerBuf::from_tokens(path.iter().copied())
    }

    fn value(v: impl Serialize) -> Value {
        serde_json::to_value(v).unwrap_or(Value::Null)
    }

    /// `add` of `v` at `path` (tokens, `-` appends to an array).
    pub fn add(path: &[&str], v: impl Serialize) -> PatchOperation {
        PatchOperation::Add(AddOperation {
            path: at(path),
            value: value(v),
        })
    }

    /// `test` that `path` holds `v`.
    pub fn test(path: &[&str], v: impl Serialize) -> PatchOperation {
        PatchOperation::Test(TestOperation {
            path: at(path),
            value: value(v),
        })
    }

    /// `replace` of `path` with `v`.
    pub fn replace(path: &[&str], v: impl Serialize) -> PatchOperation {
        PatchOperation::Replace(ReplaceOperation {
            path: at(path),
            value: value(v),
        })
    }
}

/// The one door of the controller's writes: each one uses the one field manager, is counted by
/// resource, verb and result, and is logged once with why it is made.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    writes: IntCounterVec,
}

/// The resource a URL of an [`Api`] names (`configmaps`, `connectivityproxies`).
fn resource_of<K: kube::Resource>(api: &Api<K>) -> &str {
    api.resource_url().rsplit('/').next().unwrap_or_default()
}

/// The params of a patch: server-side apply is forced, every patch carries the one field manager.
fn patch_params<P: Serialize>(patch: &Patch<P>) -> PatchParams {
    match patch {
        Patch::Apply(_) => PatchParams::apply(names::FIELD_MANAGER).force(),
        _ => PatchParams {
            field_manager: Some(names::FIELD_MANAGER.into()),
            ..PatchParams::default()
        },
    }
}

fn verb_of<P: Serialize>(patch: &Patch<P>) -> Verb {
    match patch {
        Patch::Apply(_) => Verb::Apply,
        Patch::Json(_) => Verb::JsonPatch,
        _ => Verb::Merge,
    }
}

impl Writer {
    /// A writer using `client`, counting into `writes` (`resource`, `verb`, `result`).
    pub fn new(client: Client, writes: IntCounterVec) -> Self {
        Self { client, writes }
    }

    /// The client (for reads).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn done<T>(
        &self,
        resource: &str,
        verb: &'static str,
        name: &str,
        why: &str,
        r: &Result<T, kube::Error>,
    ) {
        let result = match r {
            Ok(_) => "ok",
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => "conflict",
            Err(_) => "error",
        };
        self.writes
            .with_label_values(&[resource, verb, result])
            .inc();
        match r {
            Ok(_) => tracing::info!(resource, verb, name, why, "wrote"),
            Err(e) => tracing::debug!(resource, verb, name, why, error = %e, "write refused"),
        }
    }

    /// Patches `name` (server-side apply forced, or a merge or JSON patch), under the one field manager.
    pub async fn write<K, P>(
        &self,
        api: &Api<K>,
        name: &str,
        patch: &Patch<P>,
        why: &str,
    ) -> Result<K, kube::Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug,
        P: Serialize + Debug,
    {
        let r = api.patch(name, &patch_params(patch), patch).await;
        self.done(resource_of(api), verb_of(patch).label(false), name, why, &r);
        r
    }

    /// [`Writer::write`] of the status subresource.
    pub async fn write_status<K, P>(
        &self,
        api: &Api<K>,
        name: &str,
        patch: &Patch<P>,
        why: &str,
    ) -> Result<K, kube::Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug,
        P: Serialize + Debug,
    {
        let r = api.patch_status(name, &patch_params(patch), patch).await;
        self.done(resource_of(api), verb_of(patch).label(true), name, why, &r);
        r
    }

    /// Creates `obj` under the one field manager.
    pub async fn insert<K>(
        &self,
        api: &Api<K>,
        name: &str,
        obj: &K,
        why: &str,
    ) -> Result<K, kube::Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
    {
        let pp = PostParams {
            field_manager: Some(names::FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let r = api.create(&pp, obj).await;
        self.done(resource_of(api), Verb::Create.label(false), name, why, &r);
        r
    }

    /// Deletes `name` in the background if it is still the object read (its UID and
    /// resourceVersion): `Ok(false)` when it is gone already; a 409 when it changed since.
    pub async fn remove<K>(
        &self,
        api: &Api<K>,
        name: &str,
        (uid, resource_version): &(Option<String>, Option<String>),
        why: &str,
    ) -> Result<bool, kube::Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug,
    {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: uid.clone(),
                resource_version: resource_version.clone(),
            }),
            ..DeleteParams::background()
        };
        let r = api.delete(name, &dp).await;
        self.done(resource_of(api), Verb::Delete.label(false), name, why, &r);
        match r {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }
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
        self.apply_with(d, &Digest::of(d), confirm_absent, why)
            .await
    }

    /// [`Applier::apply`] with the body's digest the plan computed (the mappings ConfigMap is not
    /// serialised again for its hash), logged with `why`.
    pub async fn apply_with(
        &self,
        d: &Desired,
        digest: &Digest,
        confirm_absent: bool,
        why: &str,
    ) -> Result<bool, Error> {
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
                        return Ok(false);
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
        self.writer
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
        Ok(true)
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
