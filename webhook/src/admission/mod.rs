//! Admission decisions as pure functions of the request and the cluster facts the webhook caches.
//!
//! The HTTP layer decodes bytes into [`Request`] and encodes the [`Response`]; everything here is
//! synchronous and testable without a server. Decoding reads only what the decisions use (the
//! envelope, the user, each object's `spec` and two metadata fields); the rest of an object is
//! skipped while parsing, never built. The common defaulting patch is encoded once per process.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use cp_api::policy::{PrivilegedIdentities, changed_paths};
use cp_api::validation::{ClusterFacts, FieldError, Stored, join, validate_mapping};
use cp_api::{ConnectivityProxySpec, ServiceMappingSpec, defaults, names};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// The request of an AdmissionReview, with the fields the decisions read, borrowed from the body
/// (strings are copied only when they hold JSON escapes).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    /// Copied into the answer.
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    /// The object's kind.
    #[serde(borrow)]
    pub kind: Kind<'a>,
    /// The object's name (empty on a CREATE with `generateName`).
    #[serde(default, borrow)]
    pub name: Cow<'a, str>,
    /// The object's namespace.
    #[serde(default, borrow)]
    pub namespace: Option<Cow<'a, str>>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: Operation,
    /// Who sent the request.
    #[serde(default)]
    pub user_info: UserInfo,
    /// The object as it would be stored.
    #[serde(default, borrow)]
    pub object: Option<Object<'a>>,
    /// The stored object (UPDATE, DELETE).
    #[serde(default, borrow)]
    pub old_object: Option<Object<'a>>,
}

/// Group and kind of the object under review.
#[derive(Debug, Default, Deserialize)]
pub struct Kind<'a> {
    /// API group.
    #[serde(default, borrow)]
    pub group: Cow<'a, str>,
    /// Kind.
    #[serde(default, borrow)]
    pub kind: Cow<'a, str>,
}

/// The requesting user.
#[derive(Debug, Default, Deserialize)]
pub struct UserInfo {
    /// User name.
    #[serde(default)]
    pub username: Option<String>,
    /// Groups.
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

/// An object under review: its `spec` as sent (parsed only by the rules that need it) and the
/// metadata the rules read.
#[derive(Debug, Default, Deserialize)]
pub struct Object<'a> {
    /// Name and deletion timestamp.
    #[serde(default, borrow)]
    pub metadata: ObjectMeta<'a>,
    /// The spec's JSON text, unparsed, borrowed from the body.
    #[serde(default, borrow)]
    pub spec: Option<&'a RawValue>,
}

/// The metadata the rules read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta<'a> {
    /// `metadata.name`.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// `metadata.deletionTimestamp`: set while the object is being deleted.
    #[serde(default, borrow)]
    pub deletion_timestamp: Option<Cow<'a, str>>,
    /// The operator's annotations (`connectivityproxy.sap.com/*`); the others are skipped unread.
    #[serde(default, borrow)]
    pub annotations: OperatorAnnotations<'a>,
}

/// The `metadata.annotations` whose key is in the operator's domain
/// ([`names::OPERATOR_ANNOTATION_PREFIX`]), sorted by key; every other entry is skipped while
/// parsing, so the usual object costs no allocation here.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OperatorAnnotations<'a>(pub Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'de: 'a, 'a> Deserialize<'de> for OperatorAnnotations<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = OperatorAnnotations<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of annotations or null")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(OperatorAnnotations::default())
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(OperatorAnnotations::default())
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key.starts_with(names::OPERATOR_ANNOTATION_PREFIX) {
                        out.push((key, map.next_value::<Cow<'de, str>>()?));
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                out.sort();
                Ok(OperatorAnnotations(out))
            }
        }
        d.deserialize_option(V(std::marker::PhantomData))
    }
}

impl OperatorAnnotations<'_> {
    /// The keys whose presence or value differs between `self` (old) and `new`, sorted.
    pub fn changed_keys(&self, new: &OperatorAnnotations) -> Vec<String> {
        let mut keys: Vec<String> = self
            .0
            .iter()
            .filter(|(k, v)| !new.0.iter().any(|(nk, nv)| nk == k && nv == v))
            .chain(
                new.0
                    .iter()
                    .filter(|(k, v)| !self.0.iter().any(|(ok, ov)| ok == k && ov == v)),
            )
            .map(|(k, _)| k.to_string())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// An admission operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// CREATE.
    Create,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
    /// CONNECT.
    Connect,
}

impl Operation {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The answer to one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// The request's uid.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why not (empty when allowed).
    pub result: Outcome,
    /// The JSON patch, base64-encoded as the API defines a `[]byte` (shared when it is the release's
    /// defaulting patch).
    pub patch: Option<Cow<'static, str>>,
    /// Warnings shown to the client.
    pub warnings: Option<Vec<String>>,
}

/// The status of a denial.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// HTTP-like code (400, 403, 422, 500).
    pub code: u16,
    /// `BadRequest`, `Forbidden`, `Invalid`, `InternalError`.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Response {
    /// The JSON patch bytes (tests, logs).
    pub fn patch_bytes(&self) -> Option<Vec<u8>> {
        use base64::Engine;
        let p = self.patch.as_ref()?;
        base64::engine::general_purpose::STANDARD
            .decode(p.as_bytes())
            .ok()
    }
}

/// Which endpoint a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/mutate`: ConnectivityProxy defaulting.
    Mutate,
    /// `/validate`: ConnectivityProxy validation.
    Validate,
    /// `/validate-servicemapping`.
    ValidateServiceMapping,
}

impl Endpoint {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
            Endpoint::ValidateServiceMapping => "validate-servicemapping",
        }
    }

    fn expected_kind(self) -> &'static str {
        match self {
            Endpoint::Mutate | Endpoint::Validate => "ConnectivityProxy",
            Endpoint::ValidateServiceMapping => "ServiceMapping",
        }
    }
}

/// The outcome, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed unchanged.
    Allowed,
    /// Allowed with a patch.
    Patched,
    /// Denied.
    Denied,
}

impl Decision {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Patched => "patched",
            Decision::Denied => "denied",
        }
    }
}

/// Why a body could not be decoded into a request: answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON or not an AdmissionReview.
    #[error("body is not a valid admission.k8s.io/v1 AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    /// Another apiVersion/kind.
    #[error(
        "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got {api_version:?} {kind:?}"
    )]
    WrongType {
        /// The apiVersion sent.
        api_version: String,
        /// The kind sent.
        kind: String,
    },
    /// `request` missing.
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// Decodes an AdmissionReview body.
pub fn decode(body: &[u8]) -> Result<Request<'_>, DecodeError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Review<'a> {
        #[serde(default, borrow)]
        api_version: Cow<'a, str>,
        #[serde(default, borrow)]
        kind: Cow<'a, str>,
        #[serde(default, borrow)]
        request: Option<Request<'a>>,
    }
    let review: Review = serde_json::from_slice(body)?;
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return Err(DecodeError::WrongType {
            api_version: review.api_version.into_owned(),
            kind: review.kind.into_owned(),
        });
    }
    review.request.ok_or(DecodeError::NoRequest)
}

/// What the webhook knows about the cluster when it decides.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// Existing ServiceMappings, indexed by their uniqueness key (shared with the watch: no copy).
    pub service_mappings: crate::index::SharedIndex,
    /// Whether any ConnectivityProxy runs in shared tenant mode.
    pub shared_tenant: bool,
}

/// The webhook's fixed configuration.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Who may change `spec.deployment`.
    pub privileged: PrivilegedIdentities,
}

/// Answers one request. `facts` is read only by the endpoints that need it.
pub fn review(
    endpoint: Endpoint,
    req: &Request,
    policy: &Policy,
    facts: &dyn Fn() -> ClusterView,
) -> (Response, Decision) {
    let mut resp = Response {
        uid: req.uid.to_string(),
        allowed: true,
        ..Response::default()
    };
    if req.kind.kind != endpoint.expected_kind() || req.kind.group != names::GROUP {
        let msg = format!(
            "this endpoint admits {}.{}, not {}.{}; check the webhook configuration's rules",
            endpoint.expected_kind(),
            names::GROUP,
            req.kind.kind,
            req.kind.group
        );
        return (deny(resp, 400, "BadRequest", msg), Decision::Denied);
    }
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (resp, Decision::Allowed);
    }
    if endpoint != Endpoint::Mutate
        && let Err((code, reason, msg)) = operator_annotations(req, policy)
    {
        return (deny(resp, code, reason, msg), Decision::Denied);
    }
    let result = match endpoint {
        Endpoint::Mutate => mutate(req).and_then(|patch| match patch {
            Some(p) => p
                .base64()
                .map(|b64| (Some(b64), None, Decision::Patched))
                .map_err(|e| (500, "InternalError", e.to_string())),
            None => Ok((None, None, Decision::Allowed)),
        }),
        Endpoint::Validate => validate_cp(req, policy, facts).map(|ignored| {
            let warnings: Vec<String> = outside_module_namespace(req)
                .into_iter()
                .chain(ignored)
                .collect();
            (
                None,
                (!warnings.is_empty()).then_some(warnings),
                Decision::Allowed,
            )
        }),
        Endpoint::ValidateServiceMapping => {
            validate_sm(req, &facts()).map(|()| (None, None, Decision::Allowed))
        }
    };
    match result {
        Ok((patch, warnings, decision)) => {
            resp.patch = patch;
            resp.warnings = warnings;
            (resp, decision)
        }
        Err((code, reason, msg)) => (deny(resp, code, reason, msg), Decision::Denied),
    }
}

type Denial = (u16, &'static str, String);

fn deny(mut resp: Response, code: u16, reason: &'static str, message: String) -> Response {
    resp.allowed = false;
    resp.patch = None;
    resp.result = Outcome {
        code,
        reason,
        message,
    };
    resp
}

fn invalid(message: String) -> Denial {
    (422, "Invalid", message)
}

/// The object's `spec` text, borrowed from the request; refused unless it is a JSON object.
fn spec_raw<'a>(obj: Option<&Object<'a>>, which: &str) -> Result<&'a RawValue, Denial> {
    let obj = obj.ok_or_else(|| {
        (
            400,
            "BadRequest",
            format!("AdmissionRequest has no {which}"),
        )
    })?;
    obj.spec
        .filter(|s| s.get().trim_start().starts_with('{'))
        .ok_or_else(|| invalid(format!("{which} has no spec")))
}

/// Whether an UPDATE leaves the spec text exactly as stored (the API server writes both objects the
/// same way, so this is the usual metadata-only update, decided without parsing either spec).
fn same_spec_text(req: &Request, new: &RawValue) -> bool {
    matches!(req.operation, Operation::Update)
        && req
            .old_object
            .as_ref()
            .and_then(|o| o.spec)
            .is_some_and(|old| old.get() == new.get())
}

/// Parses a spec's text into its typed form and refuses fields the type does not know (the API
/// server prunes unknown fields, so an unknown field here means a request that bypassed it or a
/// schema mismatch). The parse only notices a skipped field; the fields are then named with their
/// paths by a walk against the CRD schema (`shape`), so the usual request pays for one typed parse.
fn typed_spec<S: serde::de::DeserializeOwned>(
    raw: &RawValue,
    shape: &known::Shape,
    which: &str,
) -> Result<S, Denial> {
    let spec_error = |e: serde_json::Error| invalid(format!("{which}: spec: {e}"));
    let (parsed, skipped) = noting::from_str(raw.get()).map_err(spec_error)?;
    if skipped {
        let unknown = known::unknown(raw.get(), shape).map_err(spec_error)?;
        // The schema is generated from the type; should they ever disagree, the field still is refused.
        let named = if unknown.is_empty() {
            "a field of the spec that its schema cannot name".to_string()
        } else {
            unknown.join(", ")
        };
        return Err(invalid(format!("{which} has unknown fields: {named}")));
    }
    Ok(parsed)
}

/// The text of `spec.deployment` (`None` when absent or null), read without parsing the rest.
fn deployment_raw(spec: &RawValue) -> Result<Option<&RawValue>, Denial> {
    #[derive(Deserialize)]
    struct Spec<'a> {
        #[serde(default, borrow)]
        deployment: Option<&'a RawValue>,
    }
    serde_json::from_str::<Spec>(spec.get())
        .map(|s| s.deployment)
        .map_err(|e| invalid(format!("spec: {e}")))
}

/// What `/mutate` does to a ConnectivityProxy that lacks some `spec.deployment` fields.
#[derive(Debug)]
pub enum Defaulting {
    /// `spec.deployment` is absent (the usual create): add the whole defaults.
    Add,
    /// `spec.deployment` is null: replace it with the whole defaults.
    Replace,
    /// Some fields are missing: this patch fills them.
    Fill(json_patch::Patch),
}

/// The JSON patch of `op` with the whole defaults at `/spec/deployment`, base64-encoded.
fn whole_defaults_patch(op: &str) -> Result<String, serde_json::Error> {
    use base64::Engine;
    let patch = serde_json::to_vec(&[serde_json::json!({
        "op": op,
        "path": "/spec/deployment",
        "value": defaults::deployment_defaults_value(),
    })])?;
    Ok(base64::engine::general_purpose::STANDARD.encode(patch))
}

/// The two whole-defaults patches, encoded once per process (they depend only on the release).
static ADD_DEFAULTS: LazyLock<Result<String, Arc<serde_json::Error>>> =
    LazyLock::new(|| whole_defaults_patch("add").map_err(Arc::new));
static REPLACE_DEFAULTS: LazyLock<Result<String, Arc<serde_json::Error>>> =
    LazyLock::new(|| whole_defaults_patch("replace").map_err(Arc::new));

impl Defaulting {
    /// The JSON patch.
    pub fn patch(&self) -> json_patch::Patch {
        use json_patch::jsonptr::PointerBuf;
        use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
        let path = PointerBuf::from_tokens(["spec", "deployment"]);
        let value = defaults::deployment_defaults_json();
        match self {
            Defaulting::Add => {
                json_patch::Patch(vec![PatchOperation::Add(AddOperation { path, value })])
            }
            Defaulting::Replace => {
                json_patch::Patch(vec![PatchOperation::Replace(ReplaceOperation {
                    path,
                    value,
                })])
            }
            Defaulting::Fill(p) => p.clone(),
        }
    }

    /// The JSON patch base64-encoded for the answer; the whole-defaults patches are shared.
    pub fn base64(&self) -> Result<Cow<'static, str>, Arc<serde_json::Error>> {
        use base64::Engine;
        match self {
            Defaulting::Add => ADD_DEFAULTS
                .as_deref()
                .map(Cow::Borrowed)
                .map_err(Clone::clone),
            Defaulting::Replace => REPLACE_DEFAULTS
                .as_deref()
                .map(Cow::Borrowed)
                .map_err(Clone::clone),
            Defaulting::Fill(p) => serde_json::to_vec(p)
                .map(|b| Cow::Owned(base64::engine::general_purpose::STANDARD.encode(b)))
                .map_err(Arc::new),
        }
    }
}

/// How to fill missing `spec.deployment` fields with this release's defaults, or `None` when
/// nothing is missing (an already-defaulted object gets no patch). Only `spec.deployment` is parsed.
pub fn mutate(req: &Request) -> Result<Option<Defaulting>, Denial> {
    #[derive(Deserialize)]
    struct Spec<'a> {
        /// Absent: `None`; null: `Some(None)`.
        #[serde(default, borrow, deserialize_with = "present")]
        deployment: Option<Option<&'a RawValue>>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<&'de RawValue>>, D::Error> {
        Option::<&'de RawValue>::deserialize(d).map(Some)
    }
    let raw = spec_raw(req.object.as_ref(), "object")?;
    let spec: Spec =
        serde_json::from_str(raw.get()).map_err(|e| invalid(format!("object: spec: {e}")))?;
    match spec.deployment {
        None => Ok(Some(Defaulting::Add)),
        Some(None) => Ok(Some(Defaulting::Replace)),
        Some(Some(current)) => {
            let current: Value = serde_json::from_str(current.get())
                .map_err(|e| invalid(format!("object: spec.deployment: {e}")))?;
            let mut filled = current.clone();
            if !defaults::fill_missing(&mut filled, defaults::deployment_defaults_value()) {
                // The usual update: everything is set already.
                return Ok(None);
            }
            let wrap = |d: Value| serde_json::json!({"spec": {"deployment": d}});
            Ok(Some(Defaulting::Fill(json_patch::diff(
                &wrap(current),
                &wrap(filled),
            ))))
        }
    }
}

/// Refuses a change of `spec.deployment` by anyone but the operator and the privileged identities.
/// `old_d` is the stored spec's `spec.deployment` text (`None` on CREATE: compared with this
/// release's defaults; `Some(None)` when the stored spec has none), `new_d` the new one's.
fn protected_fields(
    req: &Request,
    policy: &Policy,
    old_d: Option<Option<&RawValue>>,
    new_d: Option<&RawValue>,
) -> Result<(), Denial> {
    let user = req.user_info.username.as_deref().unwrap_or_default();
    let groups = req.user_info.groups.as_deref().unwrap_or_default();
    if policy.privileged.allows(user, groups) {
        return Ok(());
    }
    if let (Some(a), Some(b)) = (old_d.flatten(), new_d)
        && a.get() == b.get()
    {
        return Ok(());
    }
    let value = |d: Option<&RawValue>| -> Result<Value, Denial> {
        d.map(|d| serde_json::from_str(d.get()))
            .transpose()
            .map(Option::unwrap_or_default)
            .map_err(|e| invalid(format!("spec.deployment: {e}")))
    };
    let after = value(new_d)?;
    let before = match old_d {
        Some(d) => value(d)?,
        None => defaults::deployment_defaults_json(),
    };
    let changed = changed_paths(&before, &after);
    if changed.is_empty() {
        return Ok(());
    }
    Err((
        403,
        "Forbidden",
        format!(
            "spec.deployment is managed by the Connectivity Proxy operator and cannot be changed by {user}: \
             refused {}. Only {PRIVILEGED} may change it; edit spec.config, spec.ingress or spec.secretConfig instead",
            changed.join(", "),
        ),
    ))
}

/// Who may change the operator's fields, as denials say it. The identities themselves are not named:
/// the extra ones come from a ConfigMap the caller may not read, and the caller may not be the API
/// server (see [`crate::tls::Callers`]).
const PRIVILEGED: &str = "the operator's ServiceAccount and the privileged identities the module is configured with \
     (--privileged-users, --privileged-groups and the ConfigMap --privileged-config)";

/// Refuses a change of the operator's annotations (`connectivityproxy.sap.com/*`: the takeover state,
/// the defaults release, the adoption marks) by anyone but the operator and the privileged
/// identities: they make the controller act (start a takeover, rewrite `spec.deployment`), so they
/// are the operator's to write. Checked on every CREATE and UPDATE, metadata-only ones included.
fn operator_annotations(req: &Request, policy: &Policy) -> Result<(), Denial> {
    static NONE: OperatorAnnotations<'static> = OperatorAnnotations(Vec::new());
    let new = req
        .object
        .as_ref()
        .map_or(&NONE, |o| &o.metadata.annotations);
    let old = match req.operation {
        Operation::Update => req
            .old_object
            .as_ref()
            .map_or(&NONE, |o| &o.metadata.annotations),
        _ => &NONE,
    };
    if old.0.is_empty() && new.0.is_empty() {
        return Ok(());
    }
    let changed = old.changed_keys(new);
    if changed.is_empty() {
        return Ok(());
    }
    let user = req.user_info.username.as_deref().unwrap_or_default();
    let groups = req.user_info.groups.as_deref().unwrap_or_default();
    if policy.privileged.allows(user, groups) {
        return Ok(());
    }
    Err((
        403,
        "Forbidden",
        format!(
            "the annotations {prefix}* belong to the Connectivity Proxy operator and cannot be set, changed or removed by {user}: \
             refused metadata.annotations[{keys}]. Only {PRIVILEGED} may write them; leave them as they are \
             (kubectl apply keeps annotations it did not set)",
            prefix = names::OPERATOR_ANNOTATION_PREFIX,
            keys = changed.join(", "),
        ),
    ))
}

/// The warning for a CR created outside `kyma-system`: admitted (the existing module's CRD allows any
/// namespace) but never installed.
fn outside_module_namespace(req: &Request) -> Option<String> {
    let ns = req.namespace.as_deref().unwrap_or_default();
    (matches!(req.operation, Operation::Create) && ns != names::KYMA_SYSTEM).then(|| {
        format!(
            "ConnectivityProxy {ns}/{}: the operator installs the Connectivity Proxy only from a ConnectivityProxy in {ks}; this one will report state Warning (OutsideModuleNamespace) and install nothing",
            req.name,
            ks = names::KYMA_SYSTEM
        )
    })
}

/// Validates a ConnectivityProxy: protected fields, then every cross-field rule. Returns the warnings
/// for accepted fields that have no effect (only when the spec is written, not on metadata-only updates).
pub fn validate_cp(
    req: &Request,
    policy: &Policy,
    facts: &dyn Fn() -> ClusterView,
) -> Result<Vec<String>, Denial> {
    let new_raw = spec_raw(req.object.as_ref(), "object")?;
    if same_spec_text(req, new_raw) {
        // Finalizers, labels and annotations: nothing in the spec, so nothing protected, changed.
        return Ok(vec![]);
    }
    let old_raw = match req.operation {
        Operation::Update => Some(spec_raw(req.old_object.as_ref(), "oldObject")?),
        _ => None,
    };
    // A CR on its way out is judged like any other: an update that leaves its spec as stored (the
    // finalizer's removal) was admitted above, so deletion never hangs on a newer rule, and a spec
    // written while a finalizer holds the object is not a way around the rules.
    let new: ConnectivityProxySpec =
        typed_spec(new_raw, &known::CONNECTIVITY_PROXY_SPEC, "object")?;
    match check_cp(req, policy, facts, old_raw, new_raw, &new) {
        Ok(warnings) if warnings.is_empty() => Ok(warnings),
        // The same spec written differently: a metadata-only update of a CR that may have been stored
        // under older rules. Asked only when the answer would change (parsing the stored spec whole is
        // the dearest step of an edit): such an update is admitted without warnings.
        _ if same_typed_spec(old_raw, &new) => Ok(vec![]),
        verdict => verdict,
    }
}

/// Whether the stored spec, parsed whole, equals `new`.
fn same_typed_spec(old: Option<&RawValue>, new: &ConnectivityProxySpec) -> bool {
    old.and_then(|o| serde_json::from_str::<ConnectivityProxySpec>(o.get()).ok())
        .is_some_and(|o| &o == new)
}

/// The protected fields, then every cross-field rule, of a written spec.
fn check_cp(
    req: &Request,
    policy: &Policy,
    facts: &dyn Fn() -> ClusterView,
    old_raw: Option<&RawValue>,
    new_raw: &RawValue,
    new: &ConnectivityProxySpec,
) -> Result<Vec<String>, Denial> {
    // The stored object was admitted before: only what the rules about a change and the protected
    // fields read is parsed (in one pass), with no unknown-field check.
    let old: Option<Stored> = old_raw
        .map(|o| serde_json::from_str(o.get()))
        .transpose()
        .map_err(|e| invalid(format!("oldObject: spec: {e}")))?;
    protected_fields(
        req,
        policy,
        old.as_ref().map(|o| o.deployment),
        deployment_raw(new_raw)?,
    )?;
    // Mapping names matter only to the rule about switching service channels off: list them (and ask
    // for the facts at all) only then.
    let cluster = if new.service_channels_enabled() {
        ClusterFacts::default()
    } else {
        // A count and three names, O(1) in the number of mappings: the message stays short at 10,000.
        facts().service_mappings.read(|i| ClusterFacts {
            service_mapping_count: i.len(),
            service_mappings: i.some_names(3),
        })
    };
    let errors: Vec<FieldError> = new.validate(old.as_ref(), &cluster);
    if errors.is_empty() {
        Ok(cp_api::validation::ignored_fields(new))
    } else {
        Err(invalid(format!(
            "ConnectivityProxy {} is invalid: {}",
            req.name,
            join(&errors)
        )))
    }
}

/// Validates a ServiceMapping: its fields and the uniqueness of (type, subaccountId, serviceId).
pub fn validate_sm(req: &Request, facts: &ClusterView) -> Result<(), Denial> {
    let raw = spec_raw(req.object.as_ref(), "object")?;
    if same_spec_text(req, raw) {
        // Labels (the operator's adoption), finalizers: a mapping stored under older rules stays
        // writable and deletable. A mapping being deleted is judged like any other when its spec
        // changes (a foreign finalizer must not hold a door open to an unvalidated spec).
        return Ok(());
    }
    let spec: ServiceMappingSpec = typed_spec(raw, &known::SERVICE_MAPPING_SPEC, "object")?;
    let unchanged = matches!(req.operation, Operation::Update)
        && req
            .old_object
            .as_ref()
            .and_then(|o| o.spec)
            .and_then(|o| serde_json::from_str::<ServiceMappingSpec>(o.get()).ok())
            .is_some_and(|old| old == spec);
    if unchanged {
        return Ok(());
    }
    let mut errors = validate_mapping(&spec, facts.shared_tenant);
    let key = cp_api::mapping::mapping_key(&spec);
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.as_deref())
        .unwrap_or(&req.name);
    // The other mapping is not named: whoever reaches the webhook's port may post a review (the
    // platform authenticates no caller unless --client-ca-file is set), and its name is not in the
    // request. Those who may list ServiceMappings find it with the selector the message gives.
    if facts
        .service_mappings
        .read(|i| i.other_with(&key, name).is_some())
    {
        errors.push(FieldError {
            field: "spec.serviceId".into(),
            message: format!(
                "another ServiceMapping already maps type {} subaccountId {:?} serviceId {:?}; (type, subaccountId, serviceId) must be unique \
                 (find it with kubectl get servicemappings -o custom-columns=NAME:.metadata.name,TYPE:.spec.type,SUBACCOUNT:.spec.subaccountId,SERVICE:.spec.serviceId)",
                key.0.as_str(),
                key.1,
                key.2
            ),
        });
    }
    if errors.is_empty() {
        mapping_budget(name, &spec, facts)
    } else {
        Err(invalid(format!(
            "ServiceMapping {name} is invalid: {}",
            join(&errors)
        )))
    }
}

/// Refuses a mapping whose entry would take the mappings past what their ConfigMaps can hold together
/// ([`cp_api::mapping::MAPPINGS_TOTAL_BUDGET_BYTES`]): the controller could not publish it (it keeps
/// the last configuration that fitted), so it is refused here, saying why. A mapping that does not
/// grow its entry is always admitted.
fn mapping_budget(
    name: &str,
    spec: &ServiceMappingSpec,
    facts: &ClusterView,
) -> Result<(), Denial> {
    use cp_api::mapping::{MAPPING_SHARDS_MAX, MAPPINGS_TOTAL_BUDGET_BYTES, entry_bytes};
    let needed = entry_bytes(name, spec);
    let (used, old) = facts
        .service_mappings
        .read(|i| (i.bytes(), i.bytes_of(name)));
    if needed <= old {
        return Ok(());
    }
    let after = used - old + needed;
    if after <= MAPPINGS_TOTAL_BUDGET_BYTES {
        return Ok(());
    }
    Err((
        403,
        "Forbidden",
        format!(
            "ServiceMapping {name} is refused: the ServiceMappings fill the {} KiB that the {MAPPING_SHARDS_MAX} \
             ConfigMaps {}[-1…-{}] can hold (a Kubernetes object is at most 1 MiB) and this one needs {needed} \
             bytes of it; delete ServiceMappings you no longer need, or shorten their names and fields (the \
             ConnectivityProxy's status says how full they are)",
            MAPPINGS_TOTAL_BUDGET_BYTES / 1024,
            cp_api::names::CONFIGMAP_SERVICE_MAPPINGS,
            MAPPING_SHARDS_MAX - 1,
        ),
    ))
}

mod known;
mod noting;

#[cfg(test)]
mod tests;

/// The AdmissionReview answer as JSON. Written directly: the fixed parts are literals, the strings
/// that come from the request or the rules are escaped by serde_json, and the patch is base64 (whose
/// alphabet needs no escaping), so the usual answer costs one buffer and a copy of the patch.
pub fn encode_response(resp: Response) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    struct Status<'a> {
        status: &'static str,
        code: u16,
        reason: &'a str,
        message: &'a str,
    }
    let patch = resp.patch.as_deref();
    let mut out = Vec::with_capacity(
        160 + resp.uid.len() + patch.map_or(0, str::len) + resp.result.message.len(),
    );
    out.extend_from_slice(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#,
    );
    serde_json::to_writer(&mut out, &resp.uid)?;
    if resp.allowed {
        out.extend_from_slice(br#","allowed":true"#);
    } else {
        out.extend_from_slice(br#","allowed":false,"status":"#);
        serde_json::to_writer(
            &mut out,
            &Status {
                status: "Failure",
                code: resp.result.code,
                reason: resp.result.reason,
                message: &resp.result.message,
            },
        )?;
    }
    if let Some(patch) = patch {
        debug_assert!(
            patch
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        );
        out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
        out.extend_from_slice(patch.as_bytes());
        out.push(b'"');
    }
    if let Some(warnings) = &resp.warnings {
        out.extend_from_slice(br#","warnings":"#);
        serde_json::to_writer(&mut out, warnings)?;
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}
