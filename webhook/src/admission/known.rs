//! The paths of a spec's unknown fields, named without building anything: one walk over the spec's
//! JSON text against the field tree of its CRD schema (the schema the API server serves, generated
//! from the Rust types, so the same fields the typed parse knows). Keys are borrowed from the text and
//! a path is formatted only for a field that is unknown. Asked only once the typed parse has noticed
//! that it skipped a field ([`super::noting`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a schema node lets through.
#[derive(Debug, PartialEq)]
pub enum Shape {
    /// A scalar, or a value whose fields the schema leaves open (`x-kubernetes-preserve-unknown-fields`).
    Leaf,
    /// An object with exactly these fields, sorted by name.
    Fields(Vec<(Box<str>, Shape)>),
    /// A map: any key, each value of this shape.
    Map(Box<Shape>),
    /// A list of items of this shape.
    List(Box<Shape>),
}

impl Shape {
    /// The shape of a structural schema.
    pub fn of(schema: &JSONSchemaProps) -> Shape {
        if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
            return Shape::Leaf;
        }
        if let Some(props) = &schema.properties {
            // A BTreeMap: already sorted by name.
            return Shape::Fields(
                props
                    .iter()
                    .map(|(k, v)| (k.as_str().into(), Shape::of(v)))
                    .collect(),
            );
        }
        match (&schema.additional_properties, &schema.items) {
            (Some(JSONSchemaPropsOrBool::Schema(s)), _) => Shape::Map(Box::new(Shape::of(s))),
            (Some(JSONSchemaPropsOrBool::Bool(true)), _) => Shape::Map(Box::new(Shape::Leaf)),
            (_, Some(JSONSchemaPropsOrArray::Schema(s))) => Shape::List(Box::new(Shape::of(s))),
            // An object without properties prunes every field, like a struct without fields.
            _ if schema.type_.as_deref() == Some("object") => Shape::Fields(Vec::new()),
            _ => Shape::Leaf,
        }
    }

    /// The shape of a CRD's `spec` (its first version; ours serve one).
    fn spec_of(
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Shape {
        crd.spec
            .versions
            .first()
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("spec"))
            .map_or(Shape::Leaf, Shape::of)
    }

    fn field(&self, key: &str) -> Option<&Shape> {
        match self {
            Shape::Fields(fields) => fields
                .binary_search_by(|(k, _)| k.as_ref().cmp(key))
                .ok()
                .map(|i| &fields[i].1),
            _ => None,
        }
    }
}

/// `spec` of ConnectivityProxy, built once per process.
pub static CONNECTIVITY_PROXY_SPEC: LazyLock<Shape> =
    LazyLock::new(|| Shape::spec_of(&cp_api::ConnectivityProxy::crd()));

/// `spec` of ServiceMapping, built once per process.
pub static SERVICE_MAPPING_SPEC: LazyLock<Shape> =
    LazyLock::new(|| Shape::spec_of(&cp_api::ServiceMapping::crd()));

/// The paths of the fields of `spec` that `shape` does not know (`spec.a.b[0].c`), in the order of
/// the text.
pub fn unknown(spec: &str, shape: &Shape) -> Result<Vec<String>, serde_json::Error> {
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_str(spec);
    Walk {
        shape,
        path: &Path::Root,
        unknown: &mut unknown,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(unknown)
}

/// Where a value is, as a linked list on the stack; formatted only for an unknown field.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("spec"),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

struct Walk<'s, 'p, 'o> {
    shape: &'s Shape,
    path: &'p Path<'p>,
    unknown: &'o mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.shape {
            Shape::Leaf => d.deserialize_ignored_any(IgnoredAny).map(|_| ()),
            _ => d.deserialize_any(self),
        }
    }
}

/// A map key, borrowed from the text unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Walk {
            shape,
            path,
            unknown,
        } = self;
        while let Some(Key(key)) = map.next_key::<Key>()? {
            let here = Path::Key(path, &key);
            let child = match shape {
                Shape::Map(values) => Some(values.as_ref()),
                _ => shape.field(&key),
            };
            match child {
                Some(child) => map.next_value_seed(Walk {
                    shape: child,
                    path: &here,
                    unknown: &mut *unknown,
                })?,
                None => {
                    unknown.push(here.to_string());
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Walk {
            shape,
            path,
            unknown,
        } = self;
        let item = match shape {
            Shape::List(item) => item.as_ref(),
            // Not the type the schema says: the typed parse names the mismatch.
            _ => &Shape::Leaf,
        };
        let mut i = 0;
        loop {
            let here = Path::Index(path, i);
            let seed = Walk {
                shape: item,
                path: &here,
                unknown: &mut *unknown,
            };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    // Scalars where the schema expects an object or a list: the typed parse names the mismatch.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The reference: the fields serde's typed parse skips, reported by `serde_ignored`.
    fn skipped_by_serde<S: serde::de::DeserializeOwned>(text: &str) -> Vec<String> {
        fn path(p: &serde_ignored::Path) -> String {
            use serde_ignored::Path;
            match p {
                Path::Root => "spec".to_string(),
                Path::Seq { parent, index } => format!("{}[{index}]", path(parent)),
                Path::Map { parent, key } => format!("{}.{key}", path(parent)),
                Path::Some { parent }
                | Path::NewtypeStruct { parent }
                | Path::NewtypeVariant { parent } => path(parent),
            }
        }
        let mut out = Vec::new();
        let mut de = serde_json::Deserializer::from_str(text);
        let _: S = serde_ignored::deserialize(&mut de, |p| out.push(path(&p))).expect("typed");
        out
    }

    /// Every object in `v` (with its JSON pointer), the root included.
    fn objects(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                out.push(at.clone());
                for (k, c) in m {
                    objects(c, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    objects(c, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    /// Inserts an unknown field (null and non-null alternately) into every object of `spec` in turn,
    /// and a few at once, and checks the walk names exactly the fields serde's typed parse skips.
    fn agrees_with_serde<S: serde::de::DeserializeOwned>(spec: Value, shape: &Shape) {
        let mut at = Vec::new();
        objects(&spec, String::new(), &mut at);
        assert!(at.len() > 1, "the fixture has nested objects");
        let mut all = spec.clone();
        for (n, pointer) in at.iter().enumerate() {
            let extra = if MAPS.contains(&pointer.as_str()) {
                // Any key is allowed in a map; its values are strings.
                json!("v")
            } else if n % 2 == 0 {
                json!({"deep": [1]})
            } else {
                Value::Null
            };
            let mut one = spec.clone();
            for target in [&mut one, &mut all] {
                if let Some(Value::Object(m)) = target.pointer_mut(pointer) {
                    m.insert(format!("zz\\\"Unknown{n}"), extra.clone());
                }
            }
            for v in [&one, &spec] {
                let text = serde_json::to_string(v).expect("json");
                let found = unknown(&text, shape).expect("walk");
                assert_eq!(found, skipped_by_serde::<S>(&text), "{text}");
            }
        }
        let text = serde_json::to_string(&all).expect("json");
        let want = skipped_by_serde::<S>(&text);
        assert_eq!(want.len(), at.len() - count_maps(&spec));
        assert_eq!(unknown(&text, shape).expect("walk"), want);
    }

    /// The objects of the fixtures that are maps (any key allowed): an extra key there is no unknown
    /// field.
    const MAPS: [&str; 3] = [
        "/deployment/nodeSelector",
        "/ingress/annotations",
        "/ingress/istio/gateway/selector",
    ];

    fn count_maps(spec: &Value) -> usize {
        MAPS.iter().filter(|p| spec.pointer(p).is_some()).count()
    }

    /// A spec that sets every object the type has, lists and maps included.
    fn full_cp_spec() -> Value {
        let mut spec = json!({
            "config": {
                "subaccountId": "a", "subaccountSubdomain": "b", "tenantMode": "dedicated",
                "highAvailabilityMode": "off",
                "multiRegionMode": {"enabled": false, "configMapName": "m"},
                "serviceChannels": {"enabled": true},
                "servers": {
                    "businessDataTunnel": {"externalHost": "h", "externalPort": 443},
                    "proxy": {
                        "http": {"enabled": true, "port": 20003, "enableProxyAuthorization": false, "allowRemoteConnections": true},
                        "rfcAndLdap": {"enabled": true, "port": 20001, "enableProxyAuthorization": false},
                        "socks5": {"enabled": true, "port": 20004, "enableProxyAuthorization": false},
                        "authorization": {"oauth": {"allowedClientId": "c"}}
                    }
                },
                "integration": {
                    "auditlog": {"mode": "console", "serviceCredentialsKey": "a"},
                    "connectivityService": {"serviceCredentialsKey": "k"}
                }
            },
            "ingress": {
                "className": "istio",
                "annotations": {"a": "b"},
                "istio": {
                    "namespace": "istio-system",
                    "gateway": {"selector": {"istio": "ingressgateway"}},
                    "tls": {"ciphers": ["A", "B"]}
                },
                "timeouts": {"proxy": {"connect": 20, "read": 120, "send": 120}},
                "tls": {"secretName": "s"}
            },
            "secretConfig": {"integration": {
                "auditlogService": {"secretName": "a", "secretData": "e30="},
                "connectivityService": {"secretName": "x", "secretData": "e30="}
            }}
        });
        spec["deployment"] = cp_api::defaults::deployment_defaults_value().clone();
        spec["deployment"]["nodeSelector"] = json!({"k": "v"});
        spec
    }

    #[test]
    fn connectivity_proxy_walk_names_what_serde_skips() {
        let spec = full_cp_spec();
        // The fixture must set only known fields, or the comparison proves less than it seems.
        let text = serde_json::to_string(&spec).expect("json");
        assert!(skipped_by_serde::<cp_api::ConnectivityProxySpec>(&text).is_empty());
        agrees_with_serde::<cp_api::ConnectivityProxySpec>(spec, &CONNECTIVITY_PROXY_SPEC);
    }

    #[test]
    fn service_mapping_walk_names_what_serde_skips() {
        let spec = json!({"type": "RFC", "subaccountId": "s", "serviceId": "i", "internalAddress": "h:1",
            "locationIds": ["l1", "l2"]});
        let text = serde_json::to_string(&spec).expect("json");
        assert!(skipped_by_serde::<cp_api::ServiceMappingSpec>(&text).is_empty());
        let mut one = spec.clone();
        one["zz"] = json!(1);
        let text = serde_json::to_string(&one).expect("json");
        assert_eq!(
            unknown(&text, &SERVICE_MAPPING_SPEC).expect("walk"),
            skipped_by_serde::<cp_api::ServiceMappingSpec>(&text)
        );
        assert_eq!(
            skipped_by_serde::<cp_api::ServiceMappingSpec>(&text),
            ["spec.zz"]
        );
    }

    #[test]
    fn a_value_of_another_type_is_left_to_the_typed_parse() {
        let text = r#"{"config": "text", "ingress": [1, {"a": 2}], "deployment": {"replicaCount": {"x": 1}}}"#;
        // `replicaCount` is a scalar in the schema: its content is not walked.
        let found = unknown(text, &CONNECTIVITY_PROXY_SPEC).expect("walk");
        assert!(found.is_empty(), "{found:?}");
    }
}
