//! Typed bodies of the desired objects whose kinds `k8s-openapi` does not have: Istio's Gateway,
//! VirtualService, DestinationRule and PeerAuthentication, the SAP BTP service operator's
//! ServiceInstance and ServiceBinding, Gardener's and cert-manager's Certificate. Only the fields the
//! operator sets are modelled; [`super::body`] turns a value into JSON and [`super::object`] adds
//! apiVersion, kind and metadata.
//!
//! Field order does not matter for the applied JSON: `serde_json` here has no `preserve_order`, so
//! a body's keys are sorted once it is a `Value` (the golden test in `tests.rs` pins the result).

use std::collections::BTreeMap;

use serde::Serialize;

/// An object that is just its `spec` (apiVersion, kind and metadata come from [`super::object`]).
#[derive(Clone, Debug, Serialize)]
pub struct WithSpec<S> {
    /// The spec.
    pub spec: S,
}

/// `{"mode": ...}`: Istio's TLS/mTLS mode settings.
#[derive(Clone, Debug, Serialize)]
pub struct Mode {
    /// The mode, e.g. `MUTUAL`, `STRICT`, `PERMISSIVE`, `DISABLE`.
    pub mode: &'static str,
}

/// `networking.istio.io` Gateway spec.
#[derive(Clone, Debug, Serialize)]
pub struct GatewaySpec {
    /// Labels of the ingress gateway pods.
    pub selector: BTreeMap<String, String>,
    /// The servers.
    pub servers: Vec<GatewayServer>,
}

/// One server of a Gateway.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayServer {
    /// Hosts served.
    pub hosts: Vec<String>,
    /// The port.
    pub port: GatewayPort,
    /// TLS settings.
    pub tls: ServerTls,
}

/// A Gateway server's port.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayPort {
    /// Port name.
    pub name: &'static str,
    /// Port number.
    pub number: i32,
    /// Protocol.
    pub protocol: &'static str,
}

/// A Gateway server's TLS settings.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    /// TLS mode.
    pub mode: &'static str,
    /// The Secret with the server certificate (in the gateway's namespace).
    pub credential_name: String,
    /// Minimum TLS version.
    pub min_protocol_version: &'static str,
    /// Cipher suites, when the CR restricts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cipher_suites: Option<Vec<String>>,
}

/// `networking.istio.io` VirtualService spec.
#[derive(Clone, Debug, Serialize)]
pub struct VirtualServiceSpec {
    /// Hosts.
    pub hosts: Vec<String>,
    /// Gateways (`namespace/name`).
    pub gateways: Vec<String>,
    /// HTTP routes.
    pub http: Vec<HttpRoute>,
}

/// One HTTP route of a VirtualService.
#[derive(Clone, Debug, Serialize)]
pub struct HttpRoute {
    /// Match conditions.
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatch>,
    /// Request timeout (e.g. `120s`).
    pub timeout: String,
    /// Destinations.
    pub route: Vec<RouteDestination>,
}

/// A match condition of an HTTP route.
#[derive(Clone, Debug, Serialize)]
pub struct HttpMatch {
    /// URI match.
    pub uri: UriPrefix,
}

/// A URI prefix match.
#[derive(Clone, Debug, Serialize)]
pub struct UriPrefix {
    /// The prefix.
    pub prefix: &'static str,
}

/// A route's destination.
#[derive(Clone, Debug, Serialize)]
pub struct RouteDestination {
    /// The destination.
    pub destination: Destination,
}

/// A destination host and port.
#[derive(Clone, Debug, Serialize)]
pub struct Destination {
    /// Service host.
    pub host: String,
    /// Port.
    pub port: PortNumber,
}

/// `{"number": ...}`.
#[derive(Clone, Debug, Serialize)]
pub struct PortNumber {
    /// The port number.
    pub number: i32,
}

/// `networking.istio.io` DestinationRule spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    /// Service host.
    pub host: String,
    /// Traffic policy.
    pub traffic_policy: TrafficPolicy,
}

/// A DestinationRule's traffic policy.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    /// Connection pool settings.
    pub connection_pool: ConnectionPool,
    /// TLS towards the destination.
    pub tls: Mode,
}

/// Connection pool settings.
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionPool {
    /// TCP settings.
    pub tcp: TcpSettings,
}

/// TCP connection pool settings.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpSettings {
    /// Connect timeout (e.g. `20s`).
    pub connect_timeout: String,
}

/// `security.istio.io` PeerAuthentication spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    /// The workloads it applies to.
    pub selector: WorkloadSelector,
    /// The default mTLS mode.
    pub mtls: Mode,
    /// mTLS mode by port number.
    pub port_level_mtls: BTreeMap<String, Mode>,
}

/// Istio's workload selector.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Pod labels.
    pub match_labels: BTreeMap<String, String>,
}

/// `services.cloud.sap.com` ServiceInstance spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInstanceSpec {
    /// Service offering.
    pub service_offering_name: &'static str,
    /// Service plan.
    pub service_plan_name: &'static str,
    /// Name in SAP BTP.
    pub external_name: String,
}

/// `services.cloud.sap.com` ServiceBinding spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingSpec {
    /// The ServiceInstance bound.
    pub service_instance_name: String,
    /// The Secret the service operator writes the credentials into.
    pub secret_name: String,
    /// The key of the credentials in that Secret.
    pub secret_key: String,
    /// Name in SAP BTP.
    pub external_name: String,
}

/// `cert.gardener.cloud` Certificate spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GardenerCertificateSpec {
    /// Common name.
    pub common_name: String,
    /// DNS names.
    pub dns_names: Vec<String>,
    /// The Secret to issue into.
    pub secret_ref: SecretRef,
}

/// A Secret reference with namespace.
#[derive(Clone, Debug, Serialize)]
pub struct SecretRef {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// `cert-manager.io` Certificate spec.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerCertificateSpec {
    /// The Secret to issue into.
    pub secret_name: String,
    /// Common name.
    pub common_name: String,
    /// DNS names.
    pub dns_names: Vec<String>,
    /// The issuer.
    pub issuer_ref: IssuerRef,
}

/// A cert-manager issuer reference.
#[derive(Clone, Debug, Serialize)]
pub struct IssuerRef {
    /// API group (`cert-manager.io`).
    pub group: &'static str,
    /// `Issuer` or `ClusterIssuer`.
    pub kind: String,
    /// Name.
    pub name: String,
}
