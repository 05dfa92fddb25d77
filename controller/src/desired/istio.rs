//! Istio objects of the business data tunnel.

use cp_api::{ConnectivityProxy, names};
use serde_json::json;

use super::{Desired, Kind, Resolved, object};

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
    let mut tls = json!({
        "mode": "MUTUAL",
        "credentialName": resolved.tls_secret,
        "minProtocolVersion": "TLSV1_2",
    });
    if let Some(ciphers) = ingress
        .istio
        .as_ref()
        .and_then(|i| i.tls.as_ref())
        .and_then(|t| t.ciphers.clone())
        .filter(|c| !c.is_empty())
    {
        tls["cipherSuites"] = json!(ciphers);
    }
    let host = &resolved.external_host;
    let tunnel_host = format!("{}.{ns}.svc.cluster.local", names::SERVICE_TUNNEL);
    let timeouts = ingress.timeouts.and_then(|t| t.proxy).unwrap_or_default();
    let read = timeouts.read.unwrap_or(120);
    let connect = timeouts.connect.unwrap_or(20);
    vec![
        object(
            cr,
            Kind::Gateway,
            Some(ns),
            names::GATEWAY,
            json!({"spec": {
                "selector": selector,
                "servers": [{
                    "hosts": [host],
                    // The port the Cloud Connector dials and every mapping's endpoint advertises.
                    "port": {"name": "https-tunnel", "number": cp_api::validation::external_port(&cr.spec), "protocol": "HTTPS"},
                    "tls": tls
                }]
            }}),
        ),
        object(
            cr,
            Kind::VirtualService,
            Some(ns),
            names::VIRTUAL_SERVICE,
            json!({"spec": {
                "hosts": [host],
                "gateways": [format!("{ns}/{}", names::GATEWAY)],
                "http": [{
                    "match": [{"uri": {"prefix": "/"}}],
                    "timeout": format!("{read}s"),
                    "route": [{"destination": {"host": tunnel_host, "port": {"number": names::TUNNEL_PORT}}}]
                }]
            }}),
        ),
        object(
            cr,
            Kind::DestinationRule,
            Some(ns),
            names::DESTINATION_RULE,
            json!({"spec": {
                "host": tunnel_host,
                "trafficPolicy": {
                    "connectionPool": {"tcp": {"connectTimeout": format!("{connect}s")}},
                    "tls": {"mode": "DISABLE"}
                }
            }}),
        ),
        object(
            cr,
            Kind::PeerAuthentication,
            Some(ns),
            names::PEER_AUTHENTICATION,
            json!({"spec": {
                "selector": {"matchLabels": {"app": super::workload::APP}},
                "mtls": {"mode": "STRICT"},
                "portLevelMtls": cr.spec.proxies().iter()
                    .filter_map(|(_, p)| p.port)
                    .chain([names::TUNNEL_PORT])
                    .map(|p| (p.to_string(), json!({"mode": "PERMISSIVE"})))
                    .collect::<serde_json::Map<_, _>>()
            }}),
        ),
    ]
}
