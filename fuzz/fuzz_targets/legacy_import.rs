//! The legacy-install import (`cp_controller::migration::import`) on fuzzer-made ConfigMap data.
//!
//! Input layout (sections separated by NUL, which YAML text cannot contain):
//! `<connectivity-proxy-config.yml> \0 <connectivity-proxy-info data, one key=value a line> \0 <spec.config JSON>`.
//! Missing sections mean an empty info ConfigMap and the default CR's `spec.config`.
//!
//! Nothing may panic. When `spec.config` is a valid CR config (as in the controller, which passes
//! the typed CR's config), an import that succeeds must yield a config the CR can store: one that
//! parses as `spec.config` and has the same shape as its typed round trip.
#![no_main]

use std::collections::BTreeMap;

use cp_api::cp::Config;
use cp_controller::migration::import;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// `spec.config` of manifests/default-cr.yaml.
fn default_config() -> Value {
    json!({
        "servers": {"businessDataTunnel": {"externalHost": "auto-provision"}},
        "subaccountId": "auto-provision",
        "subaccountSubdomain": "auto-provision"
    })
}

fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect()
}

/// Whether `out` has the shape of `canonical` (its typed round trip): the same objects, arrays and
/// scalars, where a null in `out` stands for an absent field.
fn same_shape(out: &Value, canonical: &Value) -> bool {
    match (out, canonical) {
        (Value::Null, _) => true,
        (Value::Object(o), Value::Object(c)) => o
            .iter()
            .all(|(k, v)| v.is_null() || c.get(k).is_some_and(|cv| same_shape(v, cv))),
        (Value::Array(o), Value::Array(c)) => {
            o.len() == c.len() && o.iter().zip(c).all(|(a, b)| same_shape(a, b))
        }
        (o, c) => o == c,
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut sections = text.splitn(3, '\0');
    let legacy_yaml = sections.next().unwrap_or_default();
    let info = sections.next().map(parse_info).unwrap_or_default();
    let raw_config: Option<Value> = sections.next().and_then(|s| serde_json::from_str(s).ok());

    // Any JSON as the current config: `import` is public and must not panic on it.
    if let Some(raw) = &raw_config {
        let _ = import(raw, legacy_yaml, &info);
    }

    // The controller's case: the typed CR's config.
    let typed: Config = raw_config
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(|| serde_json::from_value(default_config()).expect("default config"));
    let config = serde_json::to_value(&typed).expect("config serialises");
    if let Ok((out, _imported)) = import(&config, legacy_yaml, &info) {
        let parsed: Config = serde_json::from_value(out.clone())
            .unwrap_or_else(|e| panic!("imported config is not a valid spec.config: {e}: {out}"));
        let canonical = serde_json::to_value(&parsed).expect("config serialises");
        assert!(
            same_shape(&out, &canonical),
            "imported config differs in shape from spec.config: {out} vs {canonical}"
        );
    }
});
