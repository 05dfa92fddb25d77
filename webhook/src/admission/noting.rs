//! A typed parse that notices when it skips a field. serde's derived `Deserialize` ignores a field it
//! does not know by deserializing it as [`IgnoredAny`](serde::de::IgnoredAny); this layer between the type and serde_json
//! forwards every call unchanged and raises a flag when that happens, at any depth. It formats no
//! paths and allocates nothing, so the usual request (no unknown field) costs one typed parse; the
//! fields are named afterwards, only when the flag is up ([`super::known`]).

use std::cell::Cell;
use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// Parses `text` into `S`; the flag says whether a field was skipped.
pub fn from_str<S: DeserializeOwned>(text: &str) -> Result<(S, bool), serde_json::Error> {
    let skipped = Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(text);
    let value = S::deserialize(De {
        inner: &mut de,
        skipped: &skipped,
    })?;
    de.end()?;
    Ok((value, skipped.get()))
}

struct De<'f, D> {
    inner: D,
    skipped: &'f Cell<bool>,
}

struct Vis<'f, V> {
    inner: V,
    skipped: &'f Cell<bool>,
}

struct Seed<'f, S> {
    inner: S,
    skipped: &'f Cell<bool>,
}

struct Access<'f, A> {
    inner: A,
    skipped: &'f Cell<bool>,
}

impl<'f, X> De<'f, X> {
    fn vis<V>(&self, inner: V) -> Vis<'f, V> {
        Vis {
            inner,
            skipped: self.skipped,
        }
    }
}

macro_rules! forward_deserialize {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            let visitor = self.vis(visitor);
            self.inner.$method($($arg,)* visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for De<'_, D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any(), deserialize_bool(), deserialize_i8(), deserialize_i16(),
        deserialize_i32(), deserialize_i64(), deserialize_i128(), deserialize_u8(),
        deserialize_u16(), deserialize_u32(), deserialize_u64(), deserialize_u128(),
        deserialize_f32(), deserialize_f64(), deserialize_char(), deserialize_str(),
        deserialize_string(), deserialize_bytes(), deserialize_byte_buf(), deserialize_option(),
        deserialize_unit(), deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str), deserialize_seq(),
        deserialize_tuple(len: usize), deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_map(), deserialize_struct(name: &'static str, fields: &'static [&'static str]),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
        deserialize_identifier(),
    );

    /// What a derived `Deserialize` calls for a field it does not know.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.skipped.set(true);
        self.inner.deserialize_ignored_any(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Vis<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>),
    );

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(De {
            inner: d,
            skipped: self.skipped,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(De {
            inner: d,
            skipped: self.skipped,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(Access {
            inner: seq,
            skipped: self.skipped,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(Access {
            inner: map,
            skipped: self.skipped,
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(Access {
            inner: data,
            skipped: self.skipped,
        })
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(De {
            inner: d,
            skipped: self.skipped,
        })
    }
}

impl<'f, X> Access<'f, X> {
    fn seed<S>(&self, inner: S) -> Seed<'f, S> {
        Seed {
            inner,
            skipped: self.skipped,
        }
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_element_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_key_seed(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'f, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Access<'f, A> {
    type Error = A::Error;
    type Variant = Access<'f, A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), A::Error> {
        let skipped = self.skipped;
        let (value, variant) = self.inner.variant_seed(Seed {
            inner: seed,
            skipped,
        })?;
        Ok((
            value,
            Access {
                inner: variant,
                skipped,
            },
        ))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.newtype_variant_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(
            len,
            Vis {
                inner: visitor,
                skipped: self.skipped,
            },
        )
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(
            fields,
            Vis {
                inner: visitor,
                skipped: self.skipped,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_flag_rises_for_a_skipped_field_at_any_depth_and_only_then() {
        let mut spec = json!({
            "config": {"servers": {"businessDataTunnel": {"externalHost": "h"}}},
            "ingress": {"istio": {"tls": {"ciphers": ["A"]}, "gateway": {"selector": {"a": "b"}}}},
        });
        spec["deployment"] = cp_api::defaults::deployment_defaults_value().clone();
        let text = serde_json::to_string(&spec).expect("json");
        let (typed, skipped) = from_str::<cp_api::ConnectivityProxySpec>(&text).expect("parse");
        assert!(!skipped);
        assert_eq!(
            typed,
            serde_json::from_str::<cp_api::ConnectivityProxySpec>(&text).expect("plain parse"),
            "the layer changes nothing about the value"
        );
        for pointer in [
            "",
            "/config/servers",
            "/ingress/istio/tls",
            "/deployment/image",
        ] {
            let mut with = spec.clone();
            with.pointer_mut(pointer)
                .and_then(serde_json::Value::as_object_mut)
                .expect("object")
                .insert("zz".into(), json!(null));
            let text = serde_json::to_string(&with).expect("json");
            let (_, skipped) = from_str::<cp_api::ConnectivityProxySpec>(&text).expect("parse");
            assert!(skipped, "{pointer}");
        }
        // A mapping's enum field and a type error keep serde_json's own answers.
        let (m, skipped) = from_str::<cp_api::ServiceMappingSpec>(
            r#"{"type": "TCP", "serviceId": "s", "internalAddress": "h:1"}"#,
        )
        .expect("mapping");
        assert!(!skipped && m.kind == cp_api::mapping::MappingType::Tcp);
        let bad = r#"{"type": "TCP", "serviceId": 1, "internalAddress": "h:1"}"#;
        assert_eq!(
            from_str::<cp_api::ServiceMappingSpec>(bad)
                .err()
                .map(|e| e.to_string()),
            serde_json::from_str::<cp_api::ServiceMappingSpec>(bad)
                .err()
                .map(|e| e.to_string())
        );
    }
}
