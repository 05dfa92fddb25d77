//! Cross-field validation of both kinds, shared by the webhook (which refuses) and the controller
//! (which reports Warning for a CR admitted before a rule existed).
//!
//! Each rule is an early check that names the field and says how to fix it.

use serde::Deserialize;

use crate::cp::{ConnectivityProxySpec, ProxyServer, SecretConfig, ServiceChannels};
use crate::mapping::ServiceMappingSpec;
use crate::names::is_auto_provision;

/// Longest host usable as a certificate common name.
pub const MAX_HOST_LEN: usize = 64;

/// One validation failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the offending field.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// Joins errors into one admission/status message.
pub fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Facts about the cluster that some rules need.
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    /// How many ServiceMappings exist.
    pub service_mapping_count: usize,
    /// Some of their names (a few, for the message; never the whole list).
    pub service_mappings: Vec<String>,
}

/// What admission reads of the stored spec: what the rules about a change read (`spec.secretConfig`
/// and `spec.config.serviceChannels`) and the text of `spec.deployment` (for the protected-field
/// check), borrowed. The webhook parses it straight from the stored object's text in one pass, the
/// rest of which it never builds; [`From`] takes the rules' part from a typed spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored<'a> {
    #[serde(default)]
    config: StoredConfig,
    #[serde(default)]
    secret_config: Option<SecretConfig>,
    /// `spec.deployment` as stored (`None` when absent or null; always `None` from a typed spec).
    #[serde(default, borrow)]
    pub deployment: Option<&'a serde_json::value::RawValue>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredConfig {
    #[serde(default)]
    service_channels: Option<ServiceChannels>,
}

impl From<&ConnectivityProxySpec> for Stored<'static> {
    fn from(spec: &ConnectivityProxySpec) -> Self {
        Stored {
            config: StoredConfig {
                service_channels: spec.config.service_channels.clone(),
            },
            secret_config: spec.secret_config.clone(),
            deployment: None,
        }
    }
}

impl Stored<'_> {
    /// Connectivity service secret name and data.
    pub fn connectivity_secret(&self) -> (String, Option<String>) {
        connectivity_secret(self.secret_config.as_ref())
    }

    /// Whether service channels are enabled (default true).
    pub fn service_channels_enabled(&self) -> bool {
        service_channels_enabled(self.config.service_channels.as_ref())
    }
}

fn service_channels_enabled(channels: Option<&ServiceChannels>) -> bool {
    channels
        .and_then(|s| s.enabled)
        .unwrap_or(crate::defaults::config::SERVICE_CHANNELS_ENABLED)
}

fn connectivity_secret(secret_config: Option<&SecretConfig>) -> (String, Option<String>) {
    let s = secret_config
        .and_then(|s| s.integration.as_ref())
        .and_then(|i| i.connectivity_service.as_ref());
    (
        s.and_then(|s| s.secret_name.clone())
            .unwrap_or_else(|| crate::names::SECRET_SERVICE_KEY.to_string()),
        s.and_then(|s| s.secret_data.clone()),
    )
}

impl ConnectivityProxySpec {
    /// Effective tenant mode (`dedicated` by default).
    pub fn tenant_mode(&self) -> &str {
        self.config
            .tenant_mode
            .as_deref()
            .unwrap_or(crate::defaults::config::TENANT_MODE)
    }

    /// Whether service channels are enabled (default true).
    pub fn service_channels_enabled(&self) -> bool {
        service_channels_enabled(self.config.service_channels.as_ref())
    }

    /// Whether multi-region mode is enabled (default false).
    pub fn multi_region_enabled(&self) -> bool {
        self.config
            .multi_region_mode
            .as_ref()
            .and_then(|m| m.enabled)
            .unwrap_or(crate::defaults::config::MULTI_REGION_ENABLED)
    }

    /// The Istio namespace (`spec.ingress.istio.namespace`, default `istio-system`): the tunnel's TLS
    /// Secrets and certificate live there.
    pub fn istio_namespace(&self) -> &str {
        self.ingress
            .as_ref()
            .and_then(|i| i.istio.as_ref())
            .and_then(|i| i.namespace.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or(crate::names::ISTIO_NAMESPACE)
    }

    /// Effective ingress class (`istio` by default).
    pub fn ingress_class(&self) -> &str {
        self.ingress
            .as_ref()
            .and_then(|i| i.class_name.as_deref())
            .unwrap_or(crate::defaults::config::INGRESS_CLASS)
    }

    /// The three proxies with their field names and effective settings (schema defaults applied).
    pub fn proxies(&self) -> [(&'static str, ProxyServer); 3] {
        use crate::defaults::config as C;
        let p = self.config.servers.proxy.clone().unwrap_or_default();
        let eff = |s: Option<ProxyServer>, port: i32| {
            let s = s.unwrap_or_default();
            ProxyServer {
                allow_remote_connections: s.allow_remote_connections,
                enable_proxy_authorization: Some(
                    s.enable_proxy_authorization
                        .unwrap_or(C::PROXY_AUTHORIZATION),
                ),
                enabled: Some(s.enabled.unwrap_or(C::PROXY_ENABLED)),
                port: Some(s.port.unwrap_or(port)),
            }
        };
        [
            ("http", eff(p.http, C::HTTP_PORT)),
            ("rfcAndLdap", eff(p.rfc_and_ldap, C::RFC_AND_LDAP_PORT)),
            ("socks5", eff(p.socks5, C::SOCKS5_PORT)),
        ]
    }

    /// Connectivity service secret name and data.
    pub fn connectivity_secret(&self) -> (String, Option<String>) {
        connectivity_secret(self.secret_config.as_ref())
    }

    /// The Audit Log service key's Secret name (`spec.secretConfig.integration.auditlogService`), if
    /// set: projected whole into the proxy pod, so it gets the same name check as every user-named Secret.
    pub fn auditlog_secret(&self) -> Option<&str> {
        self.secret_config
            .as_ref()
            .and_then(|s| s.integration.as_ref())
            .and_then(|i| i.auditlog_service.as_ref())
            .map(|a| a.secret_name.as_str())
    }

    /// Validates every cross-field rule. `old` is what the rules about a change read of the stored
    /// spec, on update.
    pub fn validate(&self, old: Option<&Stored<'_>>, facts: &ClusterFacts) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let cfg = &self.config;
        let dedicated = self.tenant_mode() == "dedicated";
        if dedicated && cfg.subaccount_id.as_deref().is_none_or(str::is_empty) {
            errors.push(err(
                "spec.config.subaccountId",
                "required when spec.config.tenantMode is dedicated; set the BTP subaccount id or auto-provision",
            ));
        }
        let proxies = self.proxies();
        let enabled = |p: &ProxyServer| p.enabled.unwrap_or(true);
        if let Some((name, _)) = proxies
            .iter()
            .find(|(_, p)| enabled(p) && !p.enable_proxy_authorization.unwrap_or(false))
            && cfg
                .subaccount_subdomain
                .as_deref()
                .is_none_or(str::is_empty)
        {
            errors.push(err(
                "spec.config.subaccountSubdomain",
                format!(
                    "required because spec.config.servers.proxy.{name}.enableProxyAuthorization is false; \
                     set the subaccount subdomain or auto-provision"
                ),
            ));
        }
        if let Some((name, _)) = proxies
            .iter()
            .find(|(_, p)| enabled(p) && p.enable_proxy_authorization.unwrap_or(false))
        {
            let client = cfg
                .servers
                .proxy
                .as_ref()
                .and_then(|p| p.authorization.as_ref())
                .map(|a| a.oauth.allowed_client_id.as_str());
            if client.is_none_or(str::is_empty) {
                errors.push(err(
                    "spec.config.servers.proxy.authorization.oauth.allowedClientId",
                    format!("required because spec.config.servers.proxy.{name}.enableProxyAuthorization is true"),
                ));
            }
        }
        if self.multi_region_enabled() {
            let cm = cfg
                .multi_region_mode
                .as_ref()
                .and_then(|m| m.config_map_name.as_deref());
            if cm.is_none_or(str::is_empty) {
                errors.push(err(
                    "spec.config.multiRegionMode.configMapName",
                    "required when multiRegionMode.enabled is true",
                ));
            }
            if self.service_channels_enabled() {
                errors.push(err(
                    "spec.config.serviceChannels.enabled",
                    "must be false when multiRegionMode.enabled is true (multi-region mode does not support service channels)",
                ));
            }
            if dedicated {
                errors.push(err(
                    "spec.config.tenantMode",
                    "must be shared when multiRegionMode.enabled is true",
                ));
            }
        }
        let host = &cfg.servers.business_data_tunnel.external_host;
        if host.trim().is_empty() {
            errors.push(err(
                "spec.config.servers.businessDataTunnel.externalHost",
                "must not be empty; set the tunnel host or auto-provision",
            ));
        } else if !is_auto_provision(Some(host)) && host.len() > MAX_HOST_LEN {
            errors.push(err(
                "spec.config.servers.businessDataTunnel.externalHost",
                format!(
                    "{} characters is longer than the {MAX_HOST_LEN}-character certificate common-name limit; use a shorter host",
                    host.len()
                ),
            ));
        }
        if self.ingress_class() == "nginx" {
            errors.push(err(
                "spec.ingress.className",
                "nginx is not supported by the Kyma module: the tunnel is exposed through the Istio ingress gateway \
                 (Kyma's Istio module), which verifies the Cloud Connector's client certificate; set className to istio",
            ));
        }
        if self.ingress_class() == "istio" {
            let tls = self
                .ingress
                .as_ref()
                .and_then(|i| i.tls.as_ref())
                .map(|t| t.secret_name.as_str());
            if tls.is_none_or(str::is_empty) {
                errors.push(err(
                    "spec.ingress.tls.secretName",
                    "required when spec.ingress.className is istio; name a TLS secret or auto-provision",
                ));
            }
        }
        let tls_name = self
            .ingress
            .as_ref()
            .and_then(|i| i.tls.as_ref())
            .map(|t| t.secret_name.as_str());
        for (path, name) in [
            ("spec.ingress.tls.secretName", tls_name),
            (
                "spec.secretConfig.integration.connectivityService.secretName",
                Some(self.connectivity_secret().0.as_str()),
            ),
            (
                "spec.secretConfig.integration.auditlogService.secretName",
                self.auditlog_secret(),
            ),
        ] {
            if let Some(msg) = name.and_then(user_secret_name_problem) {
                errors.push(err(path, msg));
            }
        }
        if let Some(old) = old {
            let (old_name, old_data) = old.connectivity_secret();
            let (new_name, new_data) = self.connectivity_secret();
            if old_name != new_name && (old_data.is_some() || new_data.is_some()) {
                errors.push(err(
                    "spec.secretConfig.integration.connectivityService.secretName",
                    format!(
                        "cannot change from {old_name:?} to {new_name:?} while secretData is set; remove secretData first"
                    ),
                ));
            }
        }
        if !self.service_channels_enabled()
            && old.is_none_or(|o| o.service_channels_enabled())
            && facts.service_mapping_count > 0
        {
            let more = facts
                .service_mapping_count
                .saturating_sub(facts.service_mappings.len());
            errors.push(err(
                "spec.config.serviceChannels.enabled",
                format!(
                    "cannot be disabled while {} ServiceMapping{} exist ({}{}); delete them first",
                    facts.service_mapping_count,
                    if facts.service_mapping_count == 1 {
                        ""
                    } else {
                        "s"
                    },
                    facts.service_mappings.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        errors
    }
}

/// Fields the existing CRD accepts that have no effect with the Istio ingress (the only class this
/// module serves): each is named in an admission warning, never silently ignored.
pub fn ignored_fields(spec: &ConnectivityProxySpec) -> Vec<String> {
    let mut out = Vec::new();
    let Some(ingress) = spec.ingress.as_ref() else {
        return out;
    };
    if ingress.annotations.as_ref().is_some_and(|a| !a.is_empty()) {
        out.push("spec.ingress.annotations is for an NGINX ingress and has no effect with the Istio gateway".to_string());
    }
    if ingress
        .timeouts
        .as_ref()
        .and_then(|t| t.proxy.as_ref())
        .and_then(|p| p.send)
        .is_some_and(|s| s != 120)
    {
        out.push(
            "spec.ingress.timeouts.proxy.send has no effect with the Istio gateway (the VirtualService has one request timeout: timeouts.proxy.read)"
                .to_string(),
        );
    }
    out
}

/// The port the business data tunnel is reached on (`externalPort`, default 443): the Gateway listens on
/// it and every ServiceMapping's endpoint advertises it.
pub fn external_port(spec: &ConnectivityProxySpec) -> i32 {
    spec.config
        .servers
        .business_data_tunnel
        .external_port
        .unwrap_or(crate::defaults::config::EXTERNAL_PORT)
}

/// The operator's own Secrets: a user-chosen name may never point the controller at them.
pub const OPERATOR_SECRETS: [&str; 3] = [
    crate::names::WEBHOOK_CERT_SECRET,
    crate::names::WEBHOOK_CA_SECRET,
    crate::names::TUNNEL_CA_SECRET,
];

/// Whether `name` is one of the operator's own Secrets ([`OPERATOR_SECRETS`]): never handed to the proxy.
pub fn is_operator_secret(name: &str) -> bool {
    OPERATOR_SECRETS.contains(&name)
}

/// Why `name` cannot be the name of a Secret a user chooses (TLS secret, service-key secret, audit log
/// secret): it must
/// name a Secret in the CR's own namespace (the Istio namespace for the TLS secret), so a plain DNS-1123
/// subdomain without a namespace prefix, and not one of the operator's own Secrets.
pub fn user_secret_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || is_auto_provision(Some(name)) {
        return None;
    }
    if name.contains('/') {
        return Some(format!(
            "{name:?} names another namespace; only a Secret name is accepted (the Secret lives in the CR's namespace, the TLS secret in the Istio namespace)"
        ));
    }
    let valid_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let alnum = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.len() > 253
        || !valid_chars
        || !alnum(name.as_bytes().first())
        || !alnum(name.as_bytes().last())
    {
        return Some(format!(
            "{name:?} is not a valid Secret name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        ));
    }
    if is_operator_secret(name) {
        return Some(format!(
            "{name:?} is one of the operator's own Secrets; choose another name or auto-provision"
        ));
    }
    None
}

/// Validates one ServiceMapping. `shared_tenant` is whether the cluster's ConnectivityProxy runs in
/// shared tenant mode.
pub fn validate_mapping(spec: &ServiceMappingSpec, shared_tenant: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.service_id.trim().is_empty() {
        errors.push(err(
            "spec.serviceId",
            "required: the virtual host of the channel",
        ));
    }
    if shared_tenant && spec.subaccount_id.as_deref().is_none_or(str::is_empty) {
        errors.push(err(
            "spec.subaccountId",
            "required because the ConnectivityProxy runs in shared tenant mode",
        ));
    }
    if let Err(e) = parse_host_port(&spec.internal_address) {
        errors.push(err("spec.internalAddress", e.to_string()));
    }
    errors
}

/// Dotted paths of the fields in `sent` that a typed round trip (`known`, the same value parsed into
/// the Rust types and serialised again) dropped: fields the CRD cannot express. `path` prefixes the
/// result (empty for none). Used wherever input must not lose a field silently.
pub fn unknown_fields(
    sent: &serde_json::Value,
    known: &serde_json::Value,
    path: &str,
) -> Vec<String> {
    // One path buffer, extended and truncated while walking: nothing is allocated for the (usual)
    // fields that are known.
    fn walk(
        sent: &serde_json::Value,
        known: &serde_json::Value,
        path: &mut String,
        out: &mut Vec<String>,
    ) {
        use serde_json::Value;
        match (sent, known) {
            (Value::Object(s), Value::Object(k)) => {
                for (key, v) in s {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                    match k.get(key) {
                        None if !v.is_null() => out.push(path.clone()),
                        None => {}
                        Some(kv) => walk(v, kv, path, out),
                    }
                    path.truncate(len);
                }
            }
            (Value::Array(s), Value::Array(k)) => {
                for (i, (a, b)) in s.iter().zip(k).enumerate() {
                    let len = path.len();
                    let _ = std::fmt::Write::write_fmt(path, format_args!("[{i}]"));
                    walk(a, b, path, out);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(sent, known, &mut path.to_string(), &mut out);
    out
}

/// Why an address is not `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// No `:port`.
    #[error("{0:?} is not host:port")]
    NoPort(String),
    /// The host is empty, too long or has characters a host name cannot have.
    #[error("{address:?}: {host:?} is not a valid host")]
    Host {
        /// The address.
        address: String,
        /// Its host part.
        host: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("{address:?}: port {port:?} is not a number from 1 to 65535")]
    Port {
        /// The address.
        address: String,
        /// Its port part.
        port: String,
    },
}

/// Parses `host:port` (IPv6 in brackets), port 1..=65535.
pub fn parse_host_port(s: &str) -> Result<(&str, u16), AddressError> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| AddressError::NoPort(s.into()))?;
    let host_ok = if let Some(h) = host.strip_prefix('[') {
        h.strip_suffix(']')
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    };
    if !host_ok {
        return Err(AddressError::Host {
            address: s.into(),
            host: host.into(),
        });
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host, p)),
        _ => Err(AddressError::Port {
            address: s.into(),
            port: port.into(),
        }),
    }
}
