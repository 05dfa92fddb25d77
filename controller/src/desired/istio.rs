//! Istio objects of the business data tunnel.

use std::collections::BTreeMap;

use cp_api::{ConnectivityProxy, names};

use super::types::{
    ConnectionPool, Destination, DestinationRuleSpec, GatewayPort, GatewayServer, GatewaySpec,
    HttpMatch, HttpRoute, Mode, PeerAuthenticationSpec, PortNumber, RouteDestination, ServerTls,
    TcpSettings, TrafficPolicy, UriPrefix, VirtualServiceSpec, WithSpec, WorkloadSelector,
};
use super::{Desired, Kind, Resolved, body, object};

pub(super) fn objects(cr: &ConnectivityProxy, ns: &str, resolved: &Resolved) -> Vec<Desired> {
    let ingress = cr.spec.ingress.clone().unwrap_or_default();
    let selector = ingress
        .istio
        .as_ref()
        .and_then(|i| i.gateway.as_ref())
        .and_then(|g| g.selector.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            [("istio".to_string(), "ingressgateway".to_string())]
                .into_iter()
                .collect()
        });
    let cipher_suites = ingress
        .istio
        .as_ref()
        .and_then(|i| i.tls.as_ref())
        .and_then(|t| t.ciphers.clone())
        .filter(|c| !c.is_empty());
    let host = &resolved.external_host;
    let tunnel_host = format!("{}.{ns}.svc.cluster.local", names::SERVICE_TUNNEL);
    let timeouts = ingress.timeouts.and_then(|t| t.proxy).unwrap_or_default();
    let read = timeouts.read.unwrap_or(120);
    let connect = timeouts.connect.unwrap_or(20);
    let gateway = GatewaySpec {
        selector,
        servers: vec![GatewayServer {
            hosts: vec![host.clone()],
            // The port the Cloud Connector dials and every mapping's endpoint advertises.
            port: GatewayPort {
                name: "https-tunnel",
                number: cp_api::validation::external_port(&cr.spec),
                protocol: "HTTPS",
            },
            tls: ServerTls {
                mode: "MUTUAL",
                credential_name: resolved.tls_secret.clone(),
                min_protocol_version: "TLSV1_2",
                cipher_suites,
            },
        }],
    };
    let virtual_service = VirtualServiceSpec {
        hosts: vec![host.clone()],
        gateways: vec![format!("{ns}/{}", names::GATEWAY)],
        http: vec![HttpRoute {
            matches: vec![HttpMatch {
                uri: UriPrefix { prefix: "/" },
            }],
            timeout: format!("{read}s"),
            route: vec![RouteDestination {
                destination: Destination {
                    host: tunnel_host.clone(),
                    port: PortNumber {
                        number: names::TUNNEL_PORT,
                    },
                },
            }],
        }],
    };
    let destination_rule = DestinationRuleSpec {
        host: tunnel_host,
        traffic_policy: TrafficPolicy {
            connection_pool: ConnectionPool {
                tcp: TcpSettings {
                    connect_timeout: format!("{connect}s"),
                },
            },
            tls: Mode { mode: "DISABLE" },
        },
    };
    let peer_authentication = PeerAuthenticationSpec {
        selector: WorkloadSelector {
            match_labels: BTreeMap::from([("app".to_string(), super::workload::APP.to_string())]),
        },
        mtls: Mode { mode: "STRICT" },
        port_level_mtls: cr
            .spec
            .proxies()
            .iter()
            .filter_map(|(_, p)| p.port)
            .chain([names::TUNNEL_PORT])
            .map(|p| (p.to_string(), Mode { mode: "PERMISSIVE" }))
            .collect(),
    };
    vec![
        object(
            cr,
            Kind::Gateway,
            Some(ns),
            names::GATEWAY,
            body(&WithSpec { spec: gateway }),
        ),
        object(
            cr,
            Kind::VirtualService,
            Some(ns),
            names::VIRTUAL_SERVICE,
            body(&WithSpec {
                spec: virtual_service,
            }),
        ),
        object(
            cr,
            Kind::DestinationRule,
            Some(ns),
            names::DESTINATION_RULE,
            body(&WithSpec {
                spec: destination_rule,
            }),
        ),
        object(
            cr,
            Kind::PeerAuthentication,
            Some(ns),
            names::PEER_AUTHENTICATION,
            body(&WithSpec {
                spec: peer_authentication,
            }),
        ),
    ]
}
