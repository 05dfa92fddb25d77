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

/// The share of [`MAPPINGS_TOTAL_BUDGET_BYTES`] (percent) from which the CR warns that the budget is near.
pub const MAPPINGS_WARNING_PERCENT: usize = 80;

/// At most this many ConfigMaps ([`crate::names::MAPPING_SHARD_CONFIGMAPS`]) hold the mappings.
pub const MAPPING_SHARDS_MAX: usize = crate::names::MAPPING_SHARD_CONFIGMAPS.len();

/// The bytes all mappings may take together: [`MAPPING_SHARDS_MAX`] shards, each filled to at most 85 %
/// of its [`MAPPINGS_BUDGET_BYTES`] on average (the split is by a hash of the name, so shards differ by
/// a few per cent; the rest is headroom for that). The webhook refuses a mapping beyond it.
pub const MAPPINGS_TOTAL_BUDGET_BYTES: usize =
    MAPPING_SHARDS_MAX * MAPPINGS_BUDGET_BYTES * 85 / 100;

/// A shard count grows once the mappings would fill its shards past this share (percent)...
const GROW_PERCENT: usize = 75;
/// ...and halves once half as many shards would be filled to at most this share.
const SHRINK_PERCENT: usize = 50;

/// Whether `total` bytes fit into `shards` shards filled to `percent` of their budget.
fn fits(total: usize, shards: usize, percent: usize) -> bool {
    total.saturating_mul(100) <= shards * MAPPINGS_BUDGET_BYTES * percent
}

/// How many shards mappings of `total` bytes (the sum of their [`entry_bytes`]) are split across,
/// given the `current` count (the shard ConfigMaps that exist): a power of two up to
/// [`MAPPING_SHARDS_MAX`], grown once the shards would be 75 % full and halved only once half as many
/// would be at most 50 % full, so that a count near a threshold does not flap (each change of the count
/// moves about half the entries). One shard is the single ConfigMap the proxy has always read.
pub fn shards_for(total: usize, current: usize) -> usize {
    let current = current.clamp(1, MAPPING_SHARDS_MAX).next_power_of_two();
    let mut need = 1;
    while need < MAPPING_SHARDS_MAX && !fits(total, need, GROW_PERCENT) {
        need *= 2;
    }
    if need > current || (current > 1 && fits(total, current / 2, SHRINK_PERCENT)) {
        need
    } else {
        current
    }
}

/// The shard (index into [`crate::names::MAPPING_SHARD_CONFIGMAPS`]) of mapping `name` among `shards`
/// (a power of two): the low bits of the name's 64-bit FNV-1a hash. Stable across releases and
/// restarts (it depends on the name alone), and a doubling splits each shard in two: a mapping in shard
/// `s` of `k` is in `s` or `s + k` of `2k`.
pub fn shard_of(name: &str, shards: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash & (shards.max(1) as u64 - 1)) as usize
}

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

/// The JSON text of mapping `name`'s entry, as it stands in the list the proxy reads.
pub fn entry_text(name: &str, spec: &ServiceMappingSpec) -> String {
    serde_json::to_string(&entry(Some(name), spec)).unwrap_or_default()
}

/// The mappings split across `shards` shards ([`shard_of`]): the text of each shard's list (sorted by
/// name, as [`service_mappings_json`] writes it; one shard is exactly that), index by index.
pub fn service_mappings_shards<M: std::borrow::Borrow<ServiceMapping>>(
    mappings: &[M],
    shards: usize,
) -> Vec<String> {
    let shards = shards.clamp(1, MAPPING_SHARDS_MAX);
    let mut split: Vec<Vec<&ServiceMapping>> = vec![Vec::new(); shards];
    for m in mappings {
        let m = m.borrow();
        let name = m.metadata.name.as_deref().unwrap_or_default();
        split[shard_of(name, shards)].push(m);
    }
    split.iter().map(|s| service_mappings_json(s)).collect()
}

/// What one mapping adds to the ConfigMap as applied: its entry, the comma before it, and the escaping
/// its text gets as a JSON string inside the object. O(size of the mapping), so the webhook can keep a
/// running total.
pub fn entry_bytes(name: &str, spec: &ServiceMappingSpec) -> usize {
    let text = entry_text(name, spec);
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

    #[test]
    fn the_shard_count_grows_and_shrinks_with_room_between() {
        let b = MAPPINGS_BUDGET_BYTES;
        // (total, current, expected)
        let cases = [
            (0, 0, 1),
            (0, 1, 1),
            (b * 3 / 4, 1, 1),
            (b * 3 / 4 + 1, 1, 2),
            (b * 3 / 2 + 1, 1, 4),
            // Between the thresholds the count stays where it is, either way.
            (b * 7 / 10, 2, 2),
            (b / 2, 2, 1),
            (b * 2, 4, 4),
            (b * 9 / 10, 4, 2),
            // The most there are; beyond it the shards fill up (the webhook refuses first).
            (b * 40, 1, MAPPING_SHARDS_MAX),
            (MAPPINGS_TOTAL_BUDGET_BYTES, 16, 16),
            // A count that is not a power of two (someone deleted a shard) is rounded up.
            (b * 2, 3, 4),
        ];
        for (total, current, want) in cases {
            assert_eq!(
                shards_for(total, current),
                want,
                "{total} bytes, {current} shards"
            );
        }
        // No flapping: whatever the start, the answer is a fixed point.
        for total in (0..b * 14).step_by(b / 7) {
            for current in [1, 2, 4, 8, 16] {
                let k = shards_for(total, current);
                assert_eq!(shards_for(total, k), k, "{total} bytes from {current}");
            }
        }
    }

    #[test]
    fn a_doubling_splits_each_shard_in_two_and_one_shard_is_the_single_list() {
        for i in 0..2000 {
            let name = format!("mapping-{i}");
            for k in [1, 2, 4, 8] {
                let s = shard_of(&name, k);
                assert!(s < k);
                let t = shard_of(&name, 2 * k);
                assert!(
                    t == s || t == s + k,
                    "{name}: {s} of {k} → {t} of {}",
                    2 * k
                );
            }
        }
        let mappings: Vec<ServiceMapping> = (0..300)
            .map(|i| {
                let mut m = ServiceMapping::new(
                    &format!("m-{i:03}"),
                    ServiceMappingSpec {
                        service_id: format!("svc-{i}"),
                        internal_address: "a:1".into(),
                        ..Default::default()
                    },
                );
                m.metadata.name = Some(format!("m-{i:03}"));
                m
            })
            .collect();
        assert_eq!(
            service_mappings_shards(&mappings, 1),
            vec![service_mappings_json(&mappings)]
        );
        let split = service_mappings_shards(&mappings, 4);
        let mut names: Vec<String> = Vec::new();
        for (s, text) in split.iter().enumerate() {
            let list: Vec<serde_json::Value> = serde_json::from_str(text).expect("a JSON list");
            // Every shard gets a fair share (a hash, not an order).
            assert!((40..110).contains(&list.len()), "shard {s}: {}", list.len());
            for e in list {
                let name = e["name"].as_str().unwrap_or_default().to_string();
                assert_eq!(shard_of(&name, 4), s);
                names.push(name);
            }
        }
        names.sort();
        assert_eq!(names.len(), 300, "every mapping in exactly one shard");
        names.dedup();
        assert_eq!(names.len(), 300);
    }
}
