//! Desired state: a pure function of the CR and the cluster facts, producing the objects to apply.
//! Applying them is `crate::apply`'s job.

mod config;
mod istio;
pub mod network;
mod resolve;
pub mod types;
mod workload;

#[cfg(test)]
mod network_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, ServiceMapping, names};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;

pub use config::{render_config, service_mappings_json};
pub use resolve::{ClusterFacts, ConfigProblem, Resolved, resolve};
pub use workload::{APP, effective_deployment};

/// FNV-1a, 64 bit, hex: a stable hash across processes and releases (unlike `DefaultHasher`).
pub fn hash_str(s: &str) -> String {
    let mut h = Fnv::default();
    h.add(s.as_bytes());
    h.hex()
}

/// [`hash_str`] computed as the text is written, and the text's length.
pub struct Fnv {
    state: u64,
    /// Bytes hashed so far.
    pub len: usize,
}

impl Default for Fnv {
    fn default() -> Self {
        Self {
            state: 0xcbf29ce484222325,
            len: 0,
        }
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.state ^= u64::from(*b);
            self.state = self.state.wrapping_mul(0x100000001b3);
        }
        self.len += bytes.len();
    }

    /// The hash so far, as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.state)
    }
}

impl std::io::Write for Fnv {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.add(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The namespaces where the CR's objects may live: its own, the default Istio namespace and the one
/// its spec names (the controller's RoleBindings cover kyma-system and istio-system).
pub fn object_namespaces(cr: &ConnectivityProxy) -> Vec<String> {
    let mut out = vec![
        cr.namespace().unwrap_or_default(),
        names::ISTIO_NAMESPACE.to_string(),
        cr.spec.istio_namespace().to_string(),
    ];
    out.sort();
    out.dedup();
    out
}

/// The CR an object belongs to, from its owner labels (owner references cannot cross namespaces).
pub fn owner_of(labels: &BTreeMap<String, String>) -> Option<ObjectRef<ConnectivityProxy>> {
    let name = labels.get(names::LABEL_OWNER_NAME)?;
    let ns = labels.get(names::LABEL_OWNER_NAMESPACE)?;
    Some(ObjectRef::new(name).within(ns))
}

/// Whether `labels` mark an object as created by this operator.
pub fn is_managed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(names::LABEL_MANAGED_BY).map(String::as_str) == Some(names::MANAGED_BY_VALUE)
}

pub use cp_api::kinds::{Kind, Scope};

/// One object to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Its kind.
    pub kind: Kind,
    /// Namespace (`None` for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// The full object (apiVersion, kind, metadata, ...) as applied with server-side apply.
    pub body: Value,
}

/// A typed object as a body (the one place typed objects become JSON): a `k8s-openapi` object, or
/// one of [`types`] for kinds `k8s-openapi` does not have. [`object`] completes it (it sets
/// apiVersion, kind, name, namespace, labels and owner; metadata the object carries besides, e.g.
/// annotations, is kept). Serialising these types cannot fail (string-keyed maps, no floats); were it
/// to, the body would be `{}` and the apply would be refused for the missing fields, not panic.
pub fn body<T: serde::Serialize>(o: &T) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or_else(|_| Value::Object(serde_json::Map::new()));
    if let Some(m) = v.as_object_mut()
        && m.get("metadata")
            .is_some_and(|md| md.as_object().is_some_and(|o| o.is_empty()))
    {
        m.remove("metadata");
    }
    v
}

/// A ConfigMap with `data`.
pub fn config_map(data: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        data: Some(data),
        ..Default::default()
    }
}

/// A Secret of `type_` with `data` (raw bytes; serialised as base64).
pub fn secret(
    type_: &str,
    annotations: Option<BTreeMap<String, String>>,
    data: BTreeMap<String, Vec<u8>>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            annotations,
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, k8s_openapi::ByteString(v)))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Builds one desired object with the managed labels, the owner labels and, for objects in the CR's
/// namespace, an owner reference to the CR.
pub fn object(
    cr: &ConnectivityProxy,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    mut rest: Value,
) -> Desired {
    let ar = kind.api_resource();
    let mut labels: BTreeMap<String, String> = names::managed_labels();
    labels.insert(names::LABEL_OWNER_NAME.into(), cr.name_any());
    labels.insert(
        names::LABEL_OWNER_NAMESPACE.into(),
        cr.namespace().unwrap_or_default(),
    );
    let owner_references = namespace
        .filter(|ns| Some(*ns) == cr.namespace().as_deref())
        .map(|_| {
            vec![OwnerReference {
                api_version: "connectivityproxy.sap.com/v1".into(),
                kind: "ConnectivityProxy".into(),
                name: cr.name_any(),
                uid: cr.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        });
    let mut metadata = body(&ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(String::from),
        labels: Some(labels),
        owner_references,
        ..ObjectMeta::default()
    });
    if let Some(extra) = rest.get("metadata").and_then(Value::as_object).cloned() {
        for (k, v) in extra {
            match (metadata.get_mut(&k), v) {
                (Some(Value::Object(m)), Value::Object(add)) => m.extend(add),
                (_, v) => metadata[k] = v,
            }
        }
    }
    if let Some(obj) = rest.as_object_mut() {
        obj.insert("apiVersion".into(), Value::String(ar.api_version));
        obj.insert("kind".into(), Value::String(ar.kind));
        obj.insert("metadata".into(), metadata);
    }
    Desired {
        kind,
        namespace: namespace.map(String::from),
        name: name.into(),
        body: rest,
    }
}

/// [`desired_with`] the mappings (the oldest of each key) in one shard (the single ConfigMap, as long
/// as they fit into it).
pub fn desired(
    cr: &ConnectivityProxy,
    resolved: &Resolved,
    mappings: &[std::sync::Arc<ServiceMapping>],
) -> Vec<Desired> {
    desired_with(
        cr,
        resolved,
        &crate::mappings::MappingFacts::of_objects(mappings, 1),
    )
}

/// Everything the controller applies for `cr`, given the resolved values, the published mappings and
/// the text of each of their shards (`cp_api::mapping::service_mappings_shards`). Istio objects are left
/// out when `istio` is false (the caller reports the missing dependency instead).
pub fn desired_with(
    cr: &ConnectivityProxy,
    resolved: &Resolved,
    mappings: &crate::mappings::MappingFacts,
) -> Vec<Desired> {
    build(cr, resolved, mappings, false)
}

/// [`desired_with`] as the plan compares it: each mapping shard's text replaced by its marker
/// ([`crate::mappings::shard_marker`]; the caches hold the live shards so), put back only into the
/// shard a plan writes ([`crate::plan::Write::body`]).
pub fn planned(
    cr: &ConnectivityProxy,
    resolved: &Resolved,
    mappings: &crate::mappings::MappingFacts,
) -> Vec<Desired> {
    build(cr, resolved, mappings, true)
}

fn build(
    cr: &ConnectivityProxy,
    resolved: &Resolved,
    mappings: &crate::mappings::MappingFacts,
    marked: bool,
) -> Vec<Desired> {
    let ns = cr.namespace().unwrap_or_else(|| names::KYMA_SYSTEM.into());
    let mut out = Vec::new();
    out.push(workload::priority_class(cr));
    out.extend(config::config_maps(
        cr,
        &ns,
        resolved,
        &mappings.shards,
        marked,
    ));
    out.extend(workload::services(cr, &ns));
    out.push(workload::stateful_set(cr, &ns, resolved));
    out.extend(network::objects(
        cr,
        &ns,
        &workload::container_ports(cr),
        &mappings.channel_ports,
    ));
    if cr.spec.ingress_class() == "istio" {
        out.extend(istio::objects(cr, &ns, resolved));
    }
    out
}
