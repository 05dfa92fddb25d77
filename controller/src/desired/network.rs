//! The module's NetworkPolicies: the operator's pods and the proxy's pods talk to nothing but what they
//! need (Kyma modules ship NetworkPolicies and are tested with deny-all). The controller applies them
//! with the CR, so one annotation switches them all off ([`keys::DISABLE_NETWORK_POLICIES_ANNOTATION`],
//! in the operator's domain: only the operator and privileged identities may set it, never an editor).
//!
//! Flows, as on Gardener (checked by a NetworkPolicy engine on the test node):
//! - API server → webhook on 9443, from any source: on Gardener the kube-apiserver reaches the shoot
//!   through the VPN (with or without its address depending on the VPN's NAT), elsewhere from the node;
//!   no selector names it on every landscape, and a wrong one fails every CR write (failurePolicy Fail).
//!   The webhook caps connections and request bodies per source address instead.
//! - scrapers (pods labelled `networking.kyma-project.io/metrics-scraping: allowed`) → metrics on 8080;
//! - operator → API server and the Connectivity CA endpoint (HTTPS: 443, 6443);
//! - every pod of the module → DNS: kube-dns on 53 and 8053 (CoreDNS listens on 8053 on Gardener; the
//!   Service maps 53 to it, and policies see the pod's port), UDP and TCP, and node-local DNS on its
//!   link-local address;
//! - anyone → the proxy's tunnel and proxy ports (the Istio ingress gateway for the tunnel, the
//!   cluster's workloads for HTTP, SOCKS5 and RFC/LDAP); the proxy → the Connectivity service (HTTPS),
//!   its sidecar → istiod on 15012, the proxy → the service channels' targets (every pod of the cluster
//!   on the ports the ServiceMappings' `internalAddress` names); the proxy's pods carry
//!   `networking.kyma-project.io/from-ingressgateway: allowed`, which the Istio module's policies require
//!   of what its ingress gateway may reach.
//!
//! Kubelet probes come from the node, which policies do not restrict on Gardener's CNIs.

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, keys, names};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Desired, Kind, body, object};

/// The operator's pods (`app.kubernetes.io/name` of the bundle's Deployments).
pub const OPERATOR_POD_NAMES: [&str; 2] = [
    "connectivity-proxy-operator-webhook",
    "connectivity-proxy-operator-controller",
];
/// The pod label scrapers carry (Kyma's convention).
pub const METRICS_SCRAPER_LABEL: (&str, &str) =
    ("networking.kyma-project.io/metrics-scraping", "allowed");
/// istiod's pods (`istio: pilot`) and its xDS/CA port, which every sidecar dials.
pub const ISTIOD_LABEL: (&str, &str) = ("istio", "pilot");
/// istiod's secure xDS port.
pub const ISTIOD_XDS_PORT: i32 = 15012;
/// The label the Istio module's NetworkPolicies require on pods its ingress gateway may reach
/// (`kyma-project.io--istio-ingressgateway-egress`): the proxy's pods carry it for the tunnel.
pub const FROM_INGRESS_GATEWAY_LABEL: (&str, &str) =
    ("networking.kyma-project.io/from-ingressgateway", "allowed");
/// The kube-dns ports a pod's DNS traffic reaches after the Service's translation: 53 and CoreDNS's
/// 8053 on Gardener.
pub const DNS_PORTS: [i32; 2] = [53, 8053];
/// The webhook's serving port and both operator pods' metrics port (the bundle's Deployments).
pub const WEBHOOK_PORT: i32 = 9443;
/// The operator pods' metrics port.
pub const METRICS_PORT: i32 = 8080;

/// The NetworkPolicies' names (Kyma's `kyma-project.io--` prefix), in apply order.
pub use cp_api::names::NETWORK_POLICIES as NAMES;

/// Whether the CR switches the module's NetworkPolicies off.
pub fn disabled(cr: &ConnectivityProxy) -> bool {
    cr.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::DISABLE_NETWORK_POLICIES_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

fn operator_pods() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "app.kubernetes.io/name".into(),
            operator: "In".into(),
            values: Some(OPERATOR_POD_NAMES.iter().map(|s| s.to_string()).collect()),
        }]),
        ..Default::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

fn proxy_pods() -> LabelSelector {
    labels(&[(names::APP_LABEL, super::APP)])
}

fn module_pods() -> LabelSelector {
    labels(&[(names::LABEL_MODULE, names::MODULE_VALUE)])
}

fn port(protocol: &str, port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(port)),
        ..Default::default()
    }
}

fn tcp(ports: impl IntoIterator<Item = i32>) -> Vec<NetworkPolicyPort> {
    ports.into_iter().map(|p| port("TCP", p)).collect()
}

fn udp_and_tcp(ports: impl IntoIterator<Item = i32>) -> Vec<NetworkPolicyPort> {
    ports
        .into_iter()
        .flat_map(|p| [port("UDP", p), port("TCP", p)])
        .collect()
}

fn policy(
    cr: &ConnectivityProxy,
    ns: &str,
    name: &str,
    pod_selector: LabelSelector,
    ingress: Option<Vec<NetworkPolicyIngressRule>>,
    egress: Option<Vec<NetworkPolicyEgressRule>>,
) -> Desired {
    let mut types = Vec::new();
    // A deny-all has both types and no rules; an allow policy names the direction it opens.
    let deny_all = ingress.is_none() && egress.is_none();
    if deny_all || ingress.is_some() {
        types.push("Ingress".to_string());
    }
    if deny_all || egress.is_some() {
        types.push("Egress".to_string());
    }
    let np = NetworkPolicy {
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pod_selector),
            policy_types: Some(types),
            ingress,
            egress,
        }),
        ..Default::default()
    };
    object(cr, Kind::NetworkPolicy, Some(ns), name, body(&np))
}

/// The module's NetworkPolicies for `cr` (none when its annotation switches them off); `proxy_ports`
/// are the proxy's container ports (the tunnel and every enabled proxy), `channel_ports` the ports the
/// published ServiceMappings' service channels dial (sorted, distinct).
pub(super) fn objects(
    cr: &ConnectivityProxy,
    ns: &str,
    proxy_ports: &[i32],
    channel_ports: &[i32],
) -> Vec<Desired> {
    if disabled(cr) {
        return Vec::new();
    }
    let [
        op_deny,
        op_admission,
        op_metrics,
        op_egress,
        dns,
        proxy_deny,
        proxy_ingress,
        proxy_egress,
    ] = NAMES;
    let kube_dns = NetworkPolicyPeer {
        namespace_selector: Some(labels(&[("kubernetes.io/metadata.name", "kube-system")])),
        pod_selector: Some(labels(&[("k8s-app", "kube-dns")])),
        ..Default::default()
    };
    let node_local_dns = NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: format!("{}/32", names::NODE_LOCAL_DNS_IP),
            except: None,
        }),
        ..Default::default()
    };
    let scrapers = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        pod_selector: Some(labels(&[METRICS_SCRAPER_LABEL])),
        ..Default::default()
    };
    let mut ports: Vec<i32> = proxy_ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    vec![
        policy(cr, ns, op_deny, operator_pods(), None, None),
        policy(
            cr,
            ns,
            op_admission,
            labels(&[("app.kubernetes.io/name", OPERATOR_POD_NAMES[0])]),
            Some(vec![NetworkPolicyIngressRule {
                from: None,
                ports: Some(tcp([WEBHOOK_PORT])),
            }]),
            None,
        ),
        policy(
            cr,
            ns,
            op_metrics,
            operator_pods(),
            Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![scrapers]),
                ports: Some(tcp([METRICS_PORT])),
            }]),
            None,
        ),
        policy(
            cr,
            ns,
            op_egress,
            operator_pods(),
            None,
            Some(vec![NetworkPolicyEgressRule {
                to: None,
                ports: Some(tcp([443, 6443])),
            }]),
        ),
        policy(
            cr,
            ns,
            dns,
            module_pods(),
            None,
            Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![kube_dns]),
                    ports: Some(udp_and_tcp(DNS_PORTS)),
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![node_local_dns]),
                    ports: Some(udp_and_tcp([53])),
                },
            ]),
        ),
        policy(cr, ns, proxy_deny, proxy_pods(), None, None),
        policy(
            cr,
            ns,
            proxy_ingress,
            proxy_pods(),
            Some(vec![NetworkPolicyIngressRule {
                from: None,
                ports: Some(tcp(ports)),
            }]),
            None,
        ),
        policy(
            cr,
            ns,
            proxy_egress,
            proxy_pods(),
            None,
            Some(proxy_egress_rules(cr, channel_ports)),
        ),
    ]
}

/// Beyond this many distinct service-channel ports the proxy may reach every port of the cluster's
/// pods (a NetworkPolicy lists ports one by one).
pub const MAX_CHANNEL_PORTS: usize = 64;

/// The proxy's egress: the Connectivity service (HTTPS, outside the cluster); its Istio sidecar to
/// istiod on 15012 (xDS and certificates; the Istio module's own policies open istiod's side, `kyma-project/istio`
/// `docs/contributor/adr/0015-networkpolicies-istio-kyma-system.md`); and the service channels' targets
/// (an `internalAddress` names a cluster host and port: any pod of the cluster on the channels' ports,
/// as Services reach pods after the Service's translation).
fn proxy_egress_rules(cr: &ConnectivityProxy, ports: &[i32]) -> Vec<NetworkPolicyEgressRule> {
    let istiod = NetworkPolicyPeer {
        namespace_selector: Some(labels(&[(
            "kubernetes.io/metadata.name",
            cr.spec.istio_namespace(),
        )])),
        pod_selector: Some(labels(&[ISTIOD_LABEL])),
        ..Default::default()
    };
    let mut rules = vec![
        NetworkPolicyEgressRule {
            to: None,
            ports: Some(tcp([443])),
        },
        NetworkPolicyEgressRule {
            to: Some(vec![istiod]),
            ports: Some(tcp([ISTIOD_XDS_PORT])),
        },
    ];
    if !ports.is_empty() {
        let every_pod = NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector::default()),
            ..Default::default()
        };
        rules.push(NetworkPolicyEgressRule {
            to: Some(vec![every_pod]),
            ports: (ports.len() <= MAX_CHANNEL_PORTS).then(|| tcp(ports.iter().copied())),
        });
    }
    rules
}
