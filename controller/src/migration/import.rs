//! The pure part of the takeover: the legacy `connectivity-proxy-config.yml` and the
//! `connectivity-proxy-info` ports merged into the CR's `spec.config`, refusing anything the CRD
//! cannot express rather than dropping it.

use std::collections::BTreeMap;

use cp_api::names;
use serde_json::{Value, json};

/// Why the legacy configuration cannot be imported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ImportError {
    /// The legacy field (dotted path in `connectivity-proxy-config.yml`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The CRD's defaults of `spec.config`: a CR value equal to one of these was not chosen by the user
/// (the API server filled it in), so the legacy value replaces it, as `auto-provision` is replaced.
fn config_defaults() -> Value {
    cp_api::defaults::config::spec_config()
}

fn replaceable(current: Option<&Value>, default: Option<&Value>) -> bool {
    match current {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) if names::is_auto_provision(Some(s)) => true,
        Some(v) => default == Some(v),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The first field (dotted path, empty for the whole file) where the legacy file (`sent`) is
/// shaped differently from its typed round trip (`known`), with both shapes. serde reads a struct
/// from a list too, so a list where spec.config has a mapping passes the typed parse; it must not
/// reach the CR (the API server refuses it) nor the merge below.
fn shape_mismatch(
    sent: &Value,
    known: &Value,
    path: &str,
) -> Option<(String, &'static str, &'static str)> {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (sent, known) {
        (Value::Null, _) => None,
        (Value::Object(s), Value::Object(k)) => s
            .iter()
            .find_map(|(key, v)| k.get(key).and_then(|kv| shape_mismatch(v, kv, &join(key)))),
        (Value::Array(s), Value::Array(k)) => s
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (a, b))| shape_mismatch(a, b, &format!("{path}[{i}]"))),
        (s, k) if std::mem::discriminant(s) != std::mem::discriminant(k) => {
            Some((path.to_string(), kind_of(s), kind_of(k)))
        }
        _ => None,
    }
}

/// Sets `value` at the object path `keys`, creating missing (or null) mappings on the way; `None`
/// when something on the way is not a mapping.
fn set_path(target: &mut Value, keys: &[&str], value: Value) -> Option<()> {
    let (last, parents) = keys.split_last()?;
    let mut node = target;
    for key in parents {
        if node.is_null() {
            *node = Value::Object(Default::default());
        }
        node = node.as_object_mut()?.entry(*key).or_insert(Value::Null);
    }
    if node.is_null() {
        *node = Value::Object(Default::default());
    }
    node.as_object_mut()?.insert((*last).to_string(), value);
    Some(())
}

fn merge(
    target: &mut Value,
    legacy: &Value,
    defaults: Option<&Value>,
    path: &str,
    imported: &mut Vec<String>,
) {
    let Value::Object(legacy) = legacy else {
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    for (k, lv) in legacy {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let d = defaults.and_then(|d| d.get(k));
        if lv.is_object() {
            let child = &mut target[k.as_str()];
            merge(child, lv, d, &p, imported);
        } else if replaceable(target.get(k), d) && target.get(k) != Some(lv) {
            target[k.as_str()] = lv.clone();
            imported.push(p);
        }
    }
}

/// Imports the legacy `connectivity-proxy-config.yml` and the `connectivity-proxy-info` ports into
/// `config` (the CR's `spec.config` as JSON). Returns the new config and the imported paths.
pub fn import(
    config: &Value,
    legacy_yaml: &str,
    info: &BTreeMap<String, String>,
) -> Result<(Value, Vec<String>), ImportError> {
    let legacy: Value = serde_norway::from_str(legacy_yaml).map_err(|e| ImportError {
        field: names::CONFIGMAP_CONFIG_KEY.into(),
        message: format!("not valid YAML: {e}"),
    })?;
    // Everything the legacy file says must be expressible in the CRD: never drop a field silently.
    let typed: cp_api::cp::Config =
        serde_json::from_value(legacy.clone()).map_err(|e| ImportError {
            field: names::CONFIGMAP_CONFIG_KEY.into(),
            message: format!("does not fit spec.config: {e}"),
        })?;
    let back = serde_json::to_value(&typed).map_err(|e| ImportError {
        field: names::CONFIGMAP_CONFIG_KEY.into(),
        message: format!("cannot be represented as spec.config: {e}"),
    })?;
    if let Some((field, sent, expected)) = shape_mismatch(&legacy, &back, "") {
        let field = if field.is_empty() {
            names::CONFIGMAP_CONFIG_KEY.to_string()
        } else {
            field
        };
        return Err(ImportError {
            message: format!(
                "the legacy configuration has {sent} at {field}, where spec.config expects {expected}; fix it in ConfigMap connectivity-proxy"
            ),
            field,
        });
    }
    if let Some(field) = cp_api::validation::unknown_fields(&legacy, &back, "")
        .into_iter()
        .next()
    {
        return Err(ImportError {
            field: field.clone(),
            message: format!(
                "the legacy configuration sets {field}, which spec.config cannot express; move it by hand and delete it from ConfigMap connectivity-proxy"
            ),
        });
    }
    let mut legacy = legacy;
    for (key, proxy) in [
        ("onpremise_proxy_http_port", "http"),
        ("onpremise_proxy_rfc_port", "rfcAndLdap"),
        ("onpremise_socks5_proxy_port", "socks5"),
    ] {
        if let Some(port) = info.get(key) {
            let field = format!("{}.{key}", names::CONFIGMAP_INFO);
            // The CRD's port range: anything else would make the CR patch fail on every retry.
            let Some(port) = port.trim().parse::<u16>().ok().filter(|p| *p > 0) else {
                return Err(ImportError {
                    field,
                    message: format!("{port:?} is not a port number from 1 to 65535"),
                });
            };
            set_path(&mut legacy, &["servers", "proxy", proxy, "port"], json!(port)).ok_or_else(
                || ImportError {
                    field,
                    message: format!(
                        "cannot be set as servers.proxy.{proxy}.port: the legacy configuration's servers.proxy.{proxy} is not a mapping"
                    ),
                },
            )?;
        }
    }
    let mut out = config.clone();
    let mut imported = Vec::new();
    merge(
        &mut out,
        &legacy,
        Some(&config_defaults()),
        "",
        &mut imported,
    );
    Ok((out, imported))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY: &str = "highAvailabilityMode: \"off\"\nintegration:\n  auditlog:\n    mode: console\n  connectivityService:\n    serviceCredentialsKey: service_key\nservers:\n  businessDataTunnel:\n    externalHost: cp.legacy.kyma.example.com\n    externalPort: 443\n  proxy:\n    http:\n      enableProxyAuthorization: false\n      enabled: true\n    rfcAndLdap:\n      enableProxyAuthorization: false\n      enabled: true\n    socks5:\n      enableProxyAuthorization: false\n      enabled: true\nsubaccountId: 3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f\nsubaccountSubdomain: legacy-subdomain\ntenantMode: shared\n";

    fn default_config() -> Value {
        json!({
            "servers": {"businessDataTunnel": {"externalHost": "auto-provision", "externalPort": 443},
                "proxy": {"http": {"port": 20003, "enabled": true, "enableProxyAuthorization": false}}},
            "subaccountId": "auto-provision", "subaccountSubdomain": "auto-provision", "tenantMode": "dedicated"
        })
    }

    #[test]
    fn imports_auto_provisioned_and_defaulted_values() {
        let info: BTreeMap<String, String> = [
            ("onpremise_proxy_http_port", "20013"),
            ("onpremise_proxy_rfc_port", "20011"),
            ("onpremise_socks5_proxy_port", "20014"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (cfg, imported) = import(&default_config(), LEGACY, &info).expect("imports");
        assert_eq!(
            cfg["servers"]["businessDataTunnel"]["externalHost"],
            "cp.legacy.kyma.example.com"
        );
        assert_eq!(cfg["subaccountId"], "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f");
        assert_eq!(cfg["subaccountSubdomain"], "legacy-subdomain");
        assert_eq!(
            cfg["tenantMode"], "shared",
            "a defaulted value is replaced by the legacy one"
        );
        assert_eq!(cfg["servers"]["proxy"]["http"]["port"], 20013);
        assert_eq!(cfg["servers"]["proxy"]["socks5"]["port"], 20014);
        assert!(imported.contains(&"servers.businessDataTunnel.externalHost".to_string()));
    }

    #[test]
    fn a_users_own_value_is_kept() {
        let mut cfg = default_config();
        cfg["servers"]["businessDataTunnel"]["externalHost"] = json!("mine.example.com");
        let (out, _) = import(&cfg, LEGACY, &BTreeMap::new()).expect("imports");
        assert_eq!(
            out["servers"]["businessDataTunnel"]["externalHost"],
            "mine.example.com"
        );
    }

    fn info(key: &str, port: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_string(), port.to_string())])
    }

    /// serde reads a struct from a list, so a list where spec.config has a mapping passed the typed
    /// check, and setting an info port into it panicked ("cannot access key ... in JSON array").
    /// Seen while writing the fuzz/ legacy_import target; these inputs crashed it.
    #[test]
    fn fuzz_regression_list_in_place_of_a_mapping_is_refused_not_a_panic() {
        let cases = [
            (
                "servers:\n  businessDataTunnel:\n    externalHost: x\n  proxy: []\n",
                "onpremise_proxy_http_port",
                "servers.proxy",
            ),
            (
                "servers:\n  businessDataTunnel:\n    externalHost: x\n  proxy:\n    socks5: []\n",
                "onpremise_socks5_proxy_port",
                "servers.proxy.socks5",
            ),
            (
                "[null, null, null, {businessDataTunnel: {externalHost: x}}]\n",
                "onpremise_proxy_rfc_port",
                names::CONFIGMAP_CONFIG_KEY,
            ),
        ];
        for (legacy, key, field) in cases {
            let err = import(&default_config(), legacy, &info(key, "20001"))
                .expect_err("a list is not a mapping");
            assert_eq!(err.field, field, "{legacy}");
            assert!(err.message.contains("a list"), "{err}");
        }
    }

    /// Found by the fuzz/ legacy_import target (minimised crash input): without info ports nothing
    /// panicked, but the lists were copied into the CR's spec.config (which the API server refuses
    /// on every retry), and the unknown-field check never looked inside them.
    #[test]
    fn fuzz_regression_list_is_never_imported_into_the_cr() {
        let legacy = "integration:\n-\nservers:\n- - b\n";
        let err = import(&default_config(), legacy, &BTreeMap::new()).expect_err("refused");
        assert_eq!(err.field, "integration");
        let legacy =
            "servers:\n  businessDataTunnel:\n    externalHost: x\nintegration: [{bogus: 1}]\n";
        let err = import(&default_config(), legacy, &BTreeMap::new()).expect_err("refused");
        assert_eq!(err.field, "integration");
    }

    /// An info port was parsed as i64 and imported as is, so `2002147483648` produced a spec.config
    /// that no longer parses (ports are i32, 1-65535 in the CRD). Seen while writing the fuzz/
    /// legacy_import target; this input crashed it.
    #[test]
    fn fuzz_regression_info_port_outside_the_port_range_is_refused() {
        for bad in ["2002147483648", "70000", "0", "-1", "20003x", ""] {
            let err = import(
                &default_config(),
                LEGACY,
                &info("onpremise_proxy_http_port", bad),
            )
            .expect_err(bad);
            assert_eq!(
                err.field,
                "connectivity-proxy-info.onpremise_proxy_http_port"
            );
            assert!(err.message.contains("1 to 65535"), "{err}");
        }
        let (cfg, _) = import(
            &default_config(),
            LEGACY,
            &info("onpremise_proxy_http_port", " 65535 "),
        )
        .expect("in range");
        assert_eq!(cfg["servers"]["proxy"]["http"]["port"], 65535);
        let parsed: cp_api::cp::Config = serde_json::from_value(cfg).expect("a valid spec.config");
        assert_eq!(
            parsed
                .servers
                .proxy
                .and_then(|p| p.http)
                .and_then(|h| h.port),
            Some(65535)
        );
    }

    #[test]
    fn inexpressible_legacy_field_is_an_error_naming_it() {
        let legacy = format!("{LEGACY}servers2: x\n");
        let err = import(&default_config(), &legacy, &BTreeMap::new()).expect_err("refused");
        assert_eq!(err.field, "servers2");
        let legacy = LEGACY.replace("    socks5:\n", "    socks5:\n      bogus: 1\n");
        let err = import(&default_config(), &legacy, &BTreeMap::new()).expect_err("refused");
        assert_eq!(err.field, "servers.proxy.socks5.bogus");
    }
}
