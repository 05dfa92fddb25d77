//! The `ConnectivityProxy` custom resource.
//!
//! Field names, defaults and patterns follow the existing module's CRD (Connectivity Proxy 2.11.0) so
//! that every CR it accepts is accepted here with the same meaning. Its known slips are fixed:
//! `servers.proxy.http.port` defaults to 20003 (the documented port), and `spec.deployment` has no
//! schema default because the admission webhook injects the release's defaults (see [`crate::defaults`]).
//! Every field is optional in Rust so that nothing a user stored is lost on a round trip; accessor
//! methods return the effective value with the CRD's default applied.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config_defaults as C;
use crate::status::ModuleStatus;

/// Desired configuration of the Connectivity Proxy in this cluster.
///
/// `spec.config`, `spec.ingress` and `spec.secretConfig` belong to the user. `spec.deployment` is
/// filled and owned by the operator: only the operator (and configured privileged identities) may change it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "connectivityproxy.sap.com",
    version = "v1",
    kind = "ConnectivityProxy",
    plural = "connectivityproxies",
    singular = "connectivityproxy",
    shortname = "cp",
    category = "kyma-modules",
    namespaced,
    doc = "ConnectivityProxy installs and configures SAP's Connectivity Proxy; one per cluster, in kyma-system.",
    status = "ModuleStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state","description":"Module state: Processing, Ready, Warning, Error or Deleting"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectivityProxySpec {
    /// Connectivity Proxy configuration, rendered into ConfigMap `connectivity-proxy`
    /// (key `connectivity-proxy-config.yml`).
    pub config: Config,
    /// Workload settings (images, replicas, resources). Protected: injected by the admission webhook
    /// with this operator release's defaults and changed only by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<Deployment>,
    /// Ingress of the business data tunnel (Istio gateway or NGINX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"className": C::INGRESS_CLASS, "timeouts": {"proxy": {"connect": C::TIMEOUT_CONNECT, "read": C::TIMEOUT_READ, "send": C::TIMEOUT_SEND}}}))]
    pub ingress: Option<Ingress>,
    /// Secrets with service keys of the Connectivity and Audit Log services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"integration": {"connectivityService": {"secretName": crate::names::SECRET_SERVICE_KEY}}}))]
    pub secret_config: Option<SecretConfig>,
}

/// Connectivity Proxy configuration (`spec.config`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// High-availability mode of the business data tunnel: `off`, `path` or `subdomain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::HIGH_AVAILABILITY_MODE, "pattern" = "^(off|path|subdomain)$", "enum" = ["off", "path", "subdomain"]))]
    pub high_availability_mode: Option<String>,
    /// Integration with the Connectivity and Audit Log services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"auditlog": {"mode": C::AUDITLOG_MODE}, "connectivityService": {"serviceCredentialsKey": C::SERVICE_CREDENTIALS_KEY}}))]
    pub integration: Option<Integration>,
    /// Multi-region mode: the proxy serves several regions, listed in a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"enabled": C::MULTI_REGION_ENABLED}))]
    pub multi_region_mode: Option<MultiRegionMode>,
    /// Listening servers: the business data tunnel and the proxies.
    pub servers: Servers,
    /// Service channels: on-premise systems reaching cluster services through ServiceMappings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"enabled": C::SERVICE_CHANNELS_ENABLED}))]
    pub service_channels: Option<ServiceChannels>,
    /// BTP subaccount id. `auto-provision` takes `subaccount_id` from the BTP service binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[a-zA-Z0-9-]+$"))]
    pub subaccount_id: Option<String>,
    /// BTP subaccount subdomain. `auto-provision` takes `subaccount_subdomain` from the BTP service binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subaccount_subdomain: Option<String>,
    /// Tenant mode: `dedicated` (one subaccount, needs `subaccountId`) or `shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::TENANT_MODE, "pattern" = "^(dedicated|shared)$", "enum" = ["dedicated", "shared"]))]
    pub tenant_mode: Option<String>,
}

/// `spec.config.integration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Integration {
    /// Audit logging of the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"mode": C::AUDITLOG_MODE}))]
    pub auditlog: Option<Auditlog>,
    /// Connectivity service credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"serviceCredentialsKey": C::SERVICE_CREDENTIALS_KEY}))]
    pub connectivity_service: Option<ConnectivityServiceIntegration>,
}

/// `spec.config.integration.auditlog`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Auditlog {
    /// Where audit logs go: `console` or `service` (the Audit Log service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::AUDITLOG_MODE, "pattern" = "^(console|service)$"))]
    pub mode: Option<String>,
    /// Key of the Audit Log service credentials inside their secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_credentials_key: Option<String>,
}

/// `spec.config.integration.connectivityService`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectivityServiceIntegration {
    /// Key of the Connectivity service credentials inside their secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::SERVICE_CREDENTIALS_KEY))]
    pub service_credentials_key: Option<String>,
}

/// `spec.config.multiRegionMode`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultiRegionMode {
    /// Name of the ConfigMap listing the regions; required when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// Whether multi-region mode is on. Incompatible with service channels and dedicated tenant mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::MULTI_REGION_ENABLED))]
    pub enabled: Option<bool>,
}

/// `spec.config.serviceChannels`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceChannels {
    /// Whether service channels (ServiceMappings) are served. Cannot be disabled while ServiceMappings exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::SERVICE_CHANNELS_ENABLED))]
    pub enabled: Option<bool>,
}

/// `spec.config.servers`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Servers {
    /// The business data tunnel that the Cloud Connector connects to.
    pub business_data_tunnel: BusinessDataTunnel,
    /// The proxies workloads use to reach on-premise systems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {
        "http": {"enableProxyAuthorization": false, "enabled": true, "port": 20003},
        "rfcAndLdap": {"enableProxyAuthorization": false, "enabled": true, "port": 20001},
        "socks5": {"enableProxyAuthorization": false, "enabled": true, "port": 20004}
    }))]
    pub proxy: Option<Proxies>,
}

/// `spec.config.servers.businessDataTunnel`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BusinessDataTunnel {
    /// Public host of the tunnel. `auto-provision` derives `cp.<cluster domain>` from ConfigMap
    /// `kube-system/shoot-info` (`data.domain`). At most 64 characters (certificate common name).
    pub external_host: String,
    /// Public port of the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::EXTERNAL_PORT, "minimum" = 1, "maximum" = 65535))]
    pub external_port: Option<i32>,
}

/// `spec.config.servers.proxy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Proxies {
    /// OAuth authorization of proxy clients; needed when any proxy enables proxy authorization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
    /// HTTP proxy (default port 20003).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"enableProxyAuthorization": C::PROXY_AUTHORIZATION, "enabled": C::PROXY_ENABLED, "port": C::HTTP_PORT}))]
    #[schemars(transform = port_default::<{ C::HTTP_PORT as u16 }>)]
    pub http: Option<ProxyServer>,
    /// RFC and LDAP proxy (default port 20001).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"enableProxyAuthorization": C::PROXY_AUTHORIZATION, "enabled": C::PROXY_ENABLED, "port": C::RFC_AND_LDAP_PORT}))]
    #[schemars(transform = port_default::<{ C::RFC_AND_LDAP_PORT as u16 }>)]
    pub rfc_and_ldap: Option<ProxyServer>,
    /// SOCKS5 proxy (default port 20004).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"enableProxyAuthorization": C::PROXY_AUTHORIZATION, "enabled": C::PROXY_ENABLED, "port": C::SOCKS5_PORT}))]
    #[schemars(transform = port_default::<{ C::SOCKS5_PORT as u16 }>)]
    pub socks5: Option<ProxyServer>,
}

/// Sets the default of a proxy's `port` (the proxies share one type but not one default port).
fn port_default<const PORT: u16>(schema: &mut schemars::Schema) {
    if let Some(port) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("port"))
        .and_then(|p| p.as_object_mut())
    {
        port.insert("default".into(), PORT.into());
    }
}

/// `spec.config.servers.proxy.authorization`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// OAuth settings.
    pub oauth: OAuth,
}

/// `spec.config.servers.proxy.authorization.oauth`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OAuth {
    /// OAuth client id allowed to use the proxies.
    pub allowed_client_id: String,
}

/// One proxy server (HTTP, RFC/LDAP or SOCKS5).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyServer {
    /// Accept connections from outside the pod network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_remote_connections: Option<bool>,
    /// Require OAuth proxy authorization (then `authorization.oauth.allowedClientId` is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::PROXY_AUTHORIZATION))]
    pub enable_proxy_authorization: Option<bool>,
    /// Whether this proxy runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::PROXY_ENABLED))]
    pub enabled: Option<bool>,
    /// Listening port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 1, "maximum" = 65535))]
    pub port: Option<i32>,
}

/// `spec.deployment`: the workload, owned by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    /// Connectivity Proxy image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    /// Utility image (init container that checks the file-descriptor limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utility_image: Option<Image>,
    /// Number of proxy replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 1))]
    pub replica_count: Option<i32>,
    /// Resources of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Restart the proxy when its configuration or secrets change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_watcher: Option<RestartWatcher>,
    /// Node selector of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
}

/// A container image reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// Image digest; when set, the image is pulled by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Pull policy: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^(Always|IfNotPresent|Never)$"))]
    pub pull_policy: Option<String>,
    /// Name of an image pull secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// Registry host.
    pub registry: String,
    /// Repository in the registry.
    pub repository: String,
    /// Image tag.
    pub tag: String,
}

impl Image {
    /// The reference the pods run: `registry/repository:tag`, or `registry/repository@digest` when a
    /// digest is set (an empty digest counts as none).
    pub fn reference(&self) -> String {
        match self.digest.as_deref().filter(|d| !d.is_empty()) {
            Some(d) => format!("{}/{}@{d}", self.registry, self.repository),
            None => format!("{}/{}:{}", self.registry, self.repository, self.tag),
        }
    }
}

/// `spec.deployment.resources`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Open file descriptors the proxy needs (`ulimit -n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 10))]
    pub max_file_descriptor_count: Option<i64>,
    /// Resource limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CpuMemory>,
    /// Resource requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<CpuMemory>,
}

/// CPU and memory quantities.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuMemory {
    /// CPU quantity, e.g. `100m`.
    pub cpu: String,
    /// Memory quantity, e.g. `256M`.
    pub memory: String,
}

/// `spec.deployment.restartWatcher`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartWatcher {
    /// Whether the restart watcher is on.
    pub enabled: bool,
}

/// `spec.ingress`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ingress {
    /// Extra annotations of the NGINX ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Ingress class: `istio` (default) or `nginx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::INGRESS_CLASS, "pattern" = "^(nginx|istio)$"))]
    pub class_name: Option<String>,
    /// Istio gateway settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub istio: Option<IstioIngress>,
    /// Proxy timeouts in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"proxy": {"connect": C::TIMEOUT_CONNECT, "read": C::TIMEOUT_READ, "send": C::TIMEOUT_SEND}}))]
    pub timeouts: Option<Timeouts>,
    /// TLS of the business data tunnel; required with className `istio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<IngressTls>,
}

/// `spec.ingress.istio`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioIngress {
    /// Gateway settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IstioGateway>,
    /// Namespace of the Istio ingress gateway (default `istio-system`); the TLS secret lives there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Extra TLS settings of the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<IstioTls>,
}

/// `spec.ingress.istio.gateway`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioGateway {
    /// Pod selector of the Istio ingress gateway (default `istio: ingressgateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<BTreeMap<String, String>>,
}

/// `spec.ingress.istio.tls`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioTls {
    /// Cipher suites the gateway offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ciphers: Option<Vec<String>>,
}

/// `spec.ingress.timeouts`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Proxy timeouts in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"connect": C::TIMEOUT_CONNECT, "read": C::TIMEOUT_READ, "send": C::TIMEOUT_SEND}))]
    pub proxy: Option<ProxyTimeouts>,
}

/// `spec.ingress.timeouts.proxy`, seconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTimeouts {
    /// Connect timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::TIMEOUT_CONNECT_FIELD))]
    pub connect: Option<i64>,
    /// Read timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::TIMEOUT_READ))]
    pub read: Option<i64>,
    /// Send timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = C::TIMEOUT_SEND))]
    pub send: Option<i64>,
}

/// `spec.ingress.tls`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressTls {
    /// Secret with the tunnel's server certificate. `auto-provision` issues `cp-tls-<cr>-<ns>`
    /// in the Istio namespace.
    pub secret_name: String,
}

/// `spec.secretConfig`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretConfig {
    /// Service key secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"connectivityService": {"secretName": crate::names::SECRET_SERVICE_KEY}}))]
    pub integration: Option<SecretIntegration>,
}

/// `spec.secretConfig.integration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretIntegration {
    /// Audit Log service key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auditlog_service: Option<ServiceSecret>,
    /// Connectivity service key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"secretName": crate::names::SECRET_SERVICE_KEY}))]
    pub connectivity_service: Option<ConnectivityServiceSecret>,
}

/// The Audit Log service key: a secret name, optionally with its base64 content.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSecret {
    /// Base64-encoded service key; the operator writes it into the named secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"))]
    pub secret_data: Option<String>,
    /// Secret name.
    pub secret_name: String,
}

/// The Connectivity service key (`spec.secretConfig.integration.connectivityService`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectivityServiceSecret {
    /// Base64-encoded service key; the operator writes it into the named secret.
    /// While it is set, `secretName` may not change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"))]
    pub secret_data: Option<String>,
    /// Secret name (default `connectivity-proxy-service-key`). `auto-provision` creates a BTP
    /// ServiceInstance and ServiceBinding and takes the key from the binding's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = crate::names::SECRET_SERVICE_KEY))]
    pub secret_name: Option<String>,
}
