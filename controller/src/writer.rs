//! The controller's one writer: every write to the API server (the leader Lease and Events aside)
//! goes through [`Writer`] — server-side apply with the one field manager, merge and JSON patches
//! under the same manager, creates, deletes with UID and resourceVersion preconditions — and is
//! counted (`cp_controller_writes_total{resource,verb,result}`) and logged once with its reason.
//! The typed bodies it writes ([`Partial`], [`MergePatch`], [`json_op`]) and the reads of single
//! objects ([`read`], [`list_owned`]) are here too.

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
use crate::desired::Kind;

/// A 403 in a namespace: name the RoleBinding that would allow it.
pub(crate) fn forbidden_namespace(what: &str, ns: &str) -> Error {
    Error::Invalid(format!(
        "{what}: the controller may not write in namespace {ns}; outside kyma-system it writes the tunnel's Secrets and certificates only where ClusterRole connectivity-proxy-operator-istio is bound (istio-system): kubectl create rolebinding connectivity-proxy-operator-controller -n {ns} --clusterrole=connectivity-proxy-operator-istio --serviceaccount=kyma-system:connectivity-proxy-controller"
    ))
}

pub(crate) fn api(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
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
    pub fn key(&self) -> (Kind, Option<String>, String) {
        (
            self.kind,
            self.meta.namespace.clone(),
            self.meta.name.clone().unwrap_or_default(),
        )
    }
}

/// What the writer writes: any API object.
pub trait Object: kube::Resource + Clone + DeserializeOwned + Debug {}
impl<K: kube::Resource + Clone + DeserializeOwned + Debug> Object for K {}

/// What a patch carries.
pub trait Body: Serialize + Debug {}
impl<P: Serialize + Debug> Body for P {}

/// The part of an object a patch writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The object (everything but its status).
    Object,
    /// The status subresource.
    Status,
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
    pub async fn write<K: Object, P: Body>(
        &self,
        api: &Api<K>,
        name: &str,
        patch: &Patch<P>,
        why: &str,
    ) -> Result<K, kube::Error> {
        self.write_part(api, Part::Object, name, patch, why).await
    }

    /// [`Writer::write`] of the object or its status subresource.
    pub async fn write_part<K: Object, P: Body>(
        &self,
        api: &Api<K>,
        part: Part,
        name: &str,
        patch: &Patch<P>,
        why: &str,
    ) -> Result<K, kube::Error> {
        let pp = patch_params(patch);
        let status = part == Part::Status;
        let r = if status {
            api.patch_status(name, &pp, patch).await
        } else {
            api.patch(name, &pp, patch).await
        };
        self.done(
            resource_of(api),
            verb_of(patch).label(status),
            name,
            why,
            &r,
        );
        r
    }

    /// Creates `obj` under the one field manager.
    pub async fn insert<K: Object + Serialize>(
        &self,
        api: &Api<K>,
        name: &str,
        obj: &K,
        why: &str,
    ) -> Result<K, kube::Error> {
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
    pub async fn remove<K: Object>(
        &self,
        api: &Api<K>,
        name: &str,
        (uid, resource_version): &(Option<String>, Option<String>),
        why: &str,
    ) -> Result<bool, kube::Error> {
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
