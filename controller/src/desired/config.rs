//! The ConfigMaps: the proxy's configuration file, the on-premise proxy info, the service mappings.

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, names};
use serde_json::{Value, json};

use super::{Desired, Kind, Resolved, body, object};

/// The effective `connectivity-proxy-config.yml`: `spec.config` with defaults filled in and every
/// `auto-provision` replaced by its resolved value.
pub fn render_config(cr: &ConnectivityProxy, resolved: &Resolved) -> String {
    let spec = &cr.spec;
    let mut cfg =
        serde_json::to_value(&spec.config).unwrap_or_else(|_| Value::Object(Default::default()));
    let proxies: serde_json::Map<String, Value> = spec
        .proxies()
        .into_iter()
        .map(|(name, p)| {
            (
                name.to_string(),
                serde_json::to_value(p).unwrap_or(Value::Null),
            )
        })
        .collect();
    let mut proxy = Value::Object(proxies);
    if let Some(auth) = spec
        .config
        .servers
        .proxy
        .as_ref()
        .and_then(|p| p.authorization.as_ref())
    {
        proxy["authorization"] = serde_json::to_value(auth).unwrap_or(Value::Null);
    }
    cfg["servers"]["proxy"] = proxy;
    cfg["servers"]["businessDataTunnel"]["externalHost"] = json!(resolved.external_host);
    if cfg["servers"]["businessDataTunnel"]
        .get("externalPort")
        .is_none()
    {
        cfg["servers"]["businessDataTunnel"]["externalPort"] =
            json!(cp_api::defaults::config::EXTERNAL_PORT);
    }
    let set_or_remove = |cfg: &mut Value, key: &str, v: &Option<String>| match v {
        Some(v) => cfg[key] = json!(v),
        None => {
            cfg.as_object_mut().map(|o| o.remove(key));
        }
    };
    set_or_remove(&mut cfg, "subaccountId", &resolved.subaccount_id);
    set_or_remove(
        &mut cfg,
        "subaccountSubdomain",
        &resolved.subaccount_subdomain,
    );
    for (key, default) in cp_api::defaults::config::rendered() {
        if cfg.get(key).is_none_or(Value::is_null) {
            cfg[key] = default;
        }
    }
    cp_api::yaml11::to_string(&cfg)
}

pub use cp_api::mapping::service_mappings_json;

pub(super) fn config_maps(
    cr: &ConnectivityProxy,
    ns: &str,
    resolved: &Resolved,
    shards: &[std::sync::Arc<crate::mappings::Shard>],
    marked: bool,
) -> Vec<Desired> {
    let port = |name: &str| {
        cr.spec
            .proxies()
            .into_iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, p)| p.port)
            .unwrap_or_default()
            .to_string()
    };
    let host = format!("{}.{ns}.svc.cluster.local", names::SERVICE);
    let config_map = |name: &str, data: BTreeMap<String, String>| {
        object(
            cr,
            Kind::ConfigMap,
            Some(ns),
            name,
            body(&super::config_map(data)),
        )
    };
    vec![
        config_map(
            names::CONFIGMAP_CONFIG,
            BTreeMap::from([(
                names::CONFIGMAP_CONFIG_KEY.to_string(),
                render_config(cr, resolved),
            )]),
        ),
        config_map(
            names::CONFIGMAP_INFO,
            [
                ("onpremise_proxy_host", host),
                ("onpremise_proxy_http_port", port("http")),
                ("onpremise_proxy_ldap_port", port("rfcAndLdap")),
                ("onpremise_proxy_port", port("http")),
                ("onpremise_proxy_rfc_port", port("rfcAndLdap")),
                ("onpremise_socks5_proxy_port", port("socks5")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ),
    ]
    .into_iter()
    // The mapping shards: the first always (the proxy has always read it), the others while in use.
    .chain(
        names::MAPPING_SHARD_CONFIGMAPS
            .iter()
            .zip(names::MAPPING_SHARD_KEYS)
            .zip(shards.iter().cloned().chain(std::iter::repeat_with(|| {
                std::sync::Arc::new(crate::mappings::Shard::of("[]".into()))
            })))
            .take(shards.len().max(1))
            .map(|((name, key), shard)| {
                // The plan's objects hold the text's marker; the text goes in when one is written.
                let text = if marked {
                    shard.marker()
                } else {
                    shard.text.to_string()
                };
                config_map(name, BTreeMap::from([(key.to_string(), text)]))
            }),
    )
    .collect()
}
