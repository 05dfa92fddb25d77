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
    (
        spec.kind,
        normalise(spec.subaccount_id.as_deref().unwrap_or_default()),
        normalise(&spec.service_id),
    )
}

fn normalise(id: &str) -> String {
    id.trim().to_lowercase()
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
