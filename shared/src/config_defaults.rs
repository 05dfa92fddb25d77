//! `spec.config` and `spec.ingress` defaults: the one source of the CRD schema's `default`s
//! ([`crate::cp`]), of the effective values the webhook validates and the controller renders
//! (`ConnectivityProxySpec::tenant_mode` and the others), and of what the proxy's configuration file gets
//! where the CR leaves a field out ([`rendered`]). The values are the existing module's.
//!
//! A leaf module (it imports nothing of this crate): `cp` reads its values for the CRD schema and
//! `defaults` re-exports it as `defaults::config`.

/// `spec.config.highAvailabilityMode`.
pub const HIGH_AVAILABILITY_MODE: &str = "off";
/// `spec.config.tenantMode`.
pub const TENANT_MODE: &str = "dedicated";
/// `spec.config.multiRegionMode.enabled`.
pub const MULTI_REGION_ENABLED: bool = false;
/// `spec.config.serviceChannels.enabled`.
pub const SERVICE_CHANNELS_ENABLED: bool = true;
/// `spec.config.integration.auditlog.mode`.
pub const AUDITLOG_MODE: &str = "console";
/// `spec.config.integration.connectivityService.serviceCredentialsKey`.
pub const SERVICE_CREDENTIALS_KEY: &str = "service_key";
/// `spec.config.servers.businessDataTunnel.externalPort`.
pub const EXTERNAL_PORT: i32 = 443;
/// `spec.config.servers.proxy.http.port`.
pub const HTTP_PORT: i32 = 20003;
/// `spec.config.servers.proxy.rfcAndLdap.port`.
pub const RFC_AND_LDAP_PORT: i32 = 20001;
/// `spec.config.servers.proxy.socks5.port`.
pub const SOCKS5_PORT: i32 = 20004;
/// `spec.config.servers.proxy.*.enabled`.
pub const PROXY_ENABLED: bool = true;
/// `spec.config.servers.proxy.*.enableProxyAuthorization`.
pub const PROXY_AUTHORIZATION: bool = false;
/// `spec.ingress.className`.
pub const INGRESS_CLASS: &str = "istio";
/// `spec.ingress.timeouts.proxy.connect` where the whole `timeouts` object is defaulted.
pub const TIMEOUT_CONNECT: i64 = 20;
/// `spec.ingress.timeouts.proxy.connect` where only that field is missing: the existing module's
/// CRD defaults the field to 10 but the object to 20; kept for compatibility.
pub const TIMEOUT_CONNECT_FIELD: i64 = 10;
/// `spec.ingress.timeouts.proxy.read`.
pub const TIMEOUT_READ: i64 = 120;
/// `spec.ingress.timeouts.proxy.send`.
pub const TIMEOUT_SEND: i64 = 120;

/// Every `spec.config` default the CRD schema declares, as the object they make up (a CR value equal
/// to one of them was not chosen by the user: the API server filled it in).
pub fn spec_config() -> serde_json::Value {
    use serde_json::json;
    let proxy = |port: i32| json!({"enableProxyAuthorization": PROXY_AUTHORIZATION, "enabled": PROXY_ENABLED, "port": port});
    let mut config = serde_json::Map::new();
    for (key, value) in rendered() {
        config.insert(key.to_string(), value);
    }
    config.insert(
        "servers".into(),
        json!({
            "businessDataTunnel": {"externalPort": EXTERNAL_PORT},
            "proxy": {
                "http": proxy(HTTP_PORT),
                "rfcAndLdap": proxy(RFC_AND_LDAP_PORT),
                "socks5": proxy(SOCKS5_PORT)
            }
        }),
    );
    serde_json::Value::Object(config)
}

/// The top-level `spec.config` fields the proxy's configuration file gets when the CR leaves them
/// out (the API server applies the same schema defaults on write; an object stored before them
/// may lack them).
pub fn rendered() -> [(&'static str, serde_json::Value); 5] {
    use serde_json::json;
    [
        ("highAvailabilityMode", json!(HIGH_AVAILABILITY_MODE)),
        ("tenantMode", json!(TENANT_MODE)),
        (
            "serviceChannels",
            json!({"enabled": SERVICE_CHANNELS_ENABLED}),
        ),
        ("multiRegionMode", json!({"enabled": MULTI_REGION_ENABLED})),
        (
            "integration",
            json!({"auditlog": {"mode": AUDITLOG_MODE},
                   "connectivityService": {"serviceCredentialsKey": SERVICE_CREDENTIALS_KEY}}),
        ),
    ]
}
