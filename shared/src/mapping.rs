//! The cluster-scoped `ServiceMapping` custom resource: a service channel from an on-premise system
//! to a cluster service. Mappings belong to users: the operator never deletes them or rewrites their spec.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A service channel exposed to the Cloud Connector.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "connectivityproxy.sap.com",
    version = "v1",
    kind = "ServiceMapping",
    plural = "servicemappings",
    singular = "servicemapping",
    shortname = "sm",
    category = "kyma-modules",
    doc = "ServiceMapping exposes a cluster service to on-premise systems through the Cloud Connector (a service channel).",
    status = "ServiceMappingStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.serviceId"}"#,
    printcolumn = r#"{"name":"Internal Address","type":"string","jsonPath":".spec.internalAddress"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMappingSpec {
    /// Protocol of the channel: `RFC` or `TCP`.
    #[serde(rename = "type")]
    pub kind: MappingType,
    /// BTP subaccount of the on-premise side; required in shared tenant mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subaccount_id: Option<String>,
    /// Virtual host the Cloud Connector uses for this channel. Unique per (type, subaccountId).
    pub service_id: String,
    /// Tenant id (shared tenant mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// Cluster address the channel leads to, as `host:port`.
    pub internal_address: String,
    /// Cloud Connector location ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_ids: Option<Vec<String>>,
}

/// Channel protocol.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    JsonSchema,
)]
pub enum MappingType {
    /// SAP RFC.
    #[default]
    #[serde(rename = "RFC")]
    Rfc,
    /// Plain TCP.
    #[serde(rename = "TCP")]
    Tcp,
}

impl MappingType {
    /// The type as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            MappingType::Rfc => "RFC",
            MappingType::Tcp => "TCP",
        }
    }
}

/// Status of a ServiceMapping.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMappingStatus {
    /// Where the channel is reachable: `[<protocol>://]<clusterHost>[:<port>]/<serviceId>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// The uniqueness key of a mapping: (type, subaccountId, serviceId), the ids compared without
/// surrounding whitespace and case (a virtual host and a subaccount GUID name the same thing either
/// way). The webhook's uniqueness index and the controller's duplicate resolution both use it.
pub type MappingKey = (MappingType, String, String);

/// The normalised uniqueness key of a mapping ([`MappingKey`]); an absent `subaccountId` is empty.
pub fn mapping_key(spec: &ServiceMappingSpec) -> MappingKey {
    let (kind, subaccount, service) = mapping_key_ref(spec);
    (kind, subaccount.into_owned(), service.into_owned())
}

/// [`MappingKey`] borrowing the ids where they are normalised already (the usual case), so that
/// keying 10,000 mappings allocates nothing; equal to [`mapping_key`] in every other respect.
pub type MappingKeyRef<'a> = (
    MappingType,
    std::borrow::Cow<'a, str>,
    std::borrow::Cow<'a, str>,
);

/// The [`MappingKeyRef`] of a mapping.
pub fn mapping_key_ref(spec: &ServiceMappingSpec) -> MappingKeyRef<'_> {
    (
        spec.kind,
        normalise(spec.subaccount_id.as_deref().unwrap_or_default()),
        normalise(&spec.service_id),
    )
}

fn normalise(id: &str) -> std::borrow::Cow<'_, str> {
    let id = id.trim();
    if id.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        std::borrow::Cow::Borrowed(id)
    } else {
        std::borrow::Cow::Owned(id.to_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: MappingType, subaccount: Option<&str>, service: &str) -> ServiceMappingSpec {
        ServiceMappingSpec {
            kind,
            subaccount_id: subaccount.map(String::from),
            service_id: service.into(),
            internal_address: "a:1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn keys_compare_without_case_and_surrounding_whitespace() {
        use MappingType::{Rfc, Tcp};
        let key = |k, sub, svc| mapping_key(&spec(k, sub, svc));
        let same = [
            (
                key(Rfc, Some("Sub-1"), "ERP"),
                key(Rfc, Some("sub-1"), "erp"),
            ),
            (
                key(Rfc, Some(" sub-1\t"), " erp "),
                key(Rfc, Some("sub-1"), "erp"),
            ),
            (key(Tcp, None, "erp"), key(Tcp, Some(""), "erp")),
            (key(Tcp, None, "erp"), key(Tcp, Some("  "), "ERP")),
        ];
        for (a, b) in same {
            assert_eq!(a, b);
        }
        let different = [
            (
                key(Rfc, Some("sub-1"), "erp"),
                key(Tcp, Some("sub-1"), "erp"),
            ),
            (
                key(Rfc, Some("sub-1"), "erp"),
                key(Rfc, Some("sub-2"), "erp"),
            ),
            (
                key(Rfc, Some("sub-1"), "erp"),
                key(Rfc, Some("sub-1"), "e rp"),
            ),
        ];
        for (a, b) in different {
            assert_ne!(a, b);
        }
    }
}

/// The bytes the aggregated ServiceMappings may take in ConfigMap `connectivity-proxy-service-mappings`:
/// a Kubernetes object is at most 1 MiB, and this leaves 64 KiB for its metadata. The controller keeps
/// the last configuration that fitted beyond it; the webhook refuses a mapping that would cross it.
pub const MAPPINGS_BUDGET_BYTES: usize = 1024 * 1024 - 64 * 1024;

/// The share of [`MAPPINGS_BUDGET_BYTES`] (percent) from which the CR warns that the budget is near.
pub const MAPPINGS_WARNING_PERCENT: usize = 80;

/// The ConfigMap around the entries, as the controller applies it: the brackets of the list and the
/// object's metadata, generously (names, labels, owner reference, annotations).
pub const MAPPINGS_CONFIGMAP_OVERHEAD_BYTES: usize = 2 * 1024;

/// One mapping in the service-mappings ConfigMap. Serialised straight to text, so the fields are
/// declared in the alphabetical order of their JSON names: the order the proxy has always been given
/// (the controller's golden test pins it).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MappingEntry<'a> {
    internal_address: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    location_ids: Option<&'a [String]>,
    name: Option<&'a str>,
    service_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subaccount_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'a str,
}

fn entry<'a>(name: Option<&'a str>, s: &'a ServiceMappingSpec) -> MappingEntry<'a> {
    MappingEntry {
        internal_address: &s.internal_address,
        location_ids: s.location_ids.as_deref().filter(|l| !l.is_empty()),
        name,
        service_id: &s.service_id,
        subaccount_id: s.subaccount_id.as_deref(),
        tenant_id: s.tenant_id.as_deref(),
        kind: s.kind.as_str(),
    }
}

/// The mappings as the proxy reads them (ConfigMap `connectivity-proxy-service-mappings`): a JSON list
/// sorted by name. Optional fields that are not set (`subaccountId`, `tenantId`, empty `locationIds`)
/// are left out rather than written as `null`/`[]`: the ConfigMap must stay under the 1 MiB object
/// limit, and this keeps 10,000 mappings with short names within it.
pub fn service_mappings_json<M: std::borrow::Borrow<ServiceMapping>>(mappings: &[M]) -> String {
    let mut sorted: Vec<&ServiceMapping> = mappings.iter().map(|m| m.borrow()).collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let entries: Vec<MappingEntry<'_>> = sorted
        .into_iter()
        .map(|m| entry(m.metadata.name.as_deref(), &m.spec))
        .collect();
    serde_json::to_string(&entries).unwrap_or_else(|_| "[]".into())
}

/// What one mapping adds to the ConfigMap as applied: its entry, the comma before it, and the escaping
/// its text gets as a JSON string inside the object. O(size of the mapping), so the webhook can keep a
/// running total.
pub fn entry_bytes(name: &str, spec: &ServiceMappingSpec) -> usize {
    let text = serde_json::to_string(&entry(Some(name), spec)).unwrap_or_default();
    let escaped = text.len() + text.bytes().filter(|b| *b == b'"' || *b == b'\\').count();
    escaped + 1
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn entry_bytes_add_up_to_the_configmap_as_applied() {
        let mappings: Vec<ServiceMapping> = (0..500)
            .map(|i| {
                let mut m = ServiceMapping::new(
                    &format!("m-{i:04}"),
                    ServiceMappingSpec {
                        kind: MappingType::Tcp,
                        subaccount_id: (i % 2 == 0).then(|| format!("sub-{i}")),
                        service_id: format!("svc-{i}.\"quoted\"\\"),
                        tenant_id: None,
                        internal_address: format!("host-{i}.ns.svc:443"),
                        location_ids: (i % 3 == 0).then(|| vec!["loc".into()]),
                    },
                );
                m.metadata.name = Some(format!("m-{i:04}"));
                m
            })
            .collect();
        let text = service_mappings_json(&mappings);
        // As it sits in the applied object: a JSON string value.
        let applied = serde_json::to_string(&serde_json::Value::String(text)).unwrap_or_default();
        let sum: usize = mappings
            .iter()
            .map(|m| entry_bytes(m.metadata.name.as_deref().unwrap_or_default(), &m.spec))
            .sum();
        // The string's quotes and brackets, minus the first entry's comma.
        assert_eq!(sum + 2 + 2 - 1, applied.len());
    }
}
