//! The module's NetworkPolicies against the pods they select: the bundle's two Deployments and the
//! proxy's StatefulSet as rendered. Which flows a real engine lets through is the node test's part.

use serde_json::{Value, json};

use super::network::{DNS_PORTS, NAMES};
use super::*;

fn default_cr(annotations: Value) -> ConnectivityProxy {
    serde_json::from_value(json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ConnectivityProxy",
        "metadata": {"name": "connectivity-proxy", "namespace": "kyma-system", "uid": "u-1",
                     "annotations": annotations},
        "spec": cp_api::testing::default_spec_json()
    }))
    .expect("cr")
}

fn rendered(annotations: Value) -> Vec<Desired> {
    let c = default_cr(annotations);
    let facts = ClusterFacts {
        cluster_domain: Some("d.example.com".into()),
        ..Default::default()
    };
    let r = resolve(&c, &facts).expect("resolves");
    desired(&c, &r, &[])
}

/// Whether a `podSelector` (matchLabels / matchExpressions with In) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels[k].as_str().map(String::from);
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k).as_deref() == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            assert_eq!(e["operator"], "In", "only In is evaluated here: {e}");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            label(e["key"].as_str().unwrap_or_default())
                .is_some_and(|l| values.contains(&l.as_str()))
        });
    by_labels && by_expressions
}

/// `(protocol, port)` of a rule's ports.
fn ports(rule: &Value) -> Vec<(String, u64)> {
    rule["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["protocol"].as_str().unwrap_or("TCP").to_string(),
                p["port"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// A workload's pod labels and declared container ports.
fn pods_of(doc: &Value) -> (Value, Vec<u64>) {
    let template = &doc["spec"]["template"];
    let declared = template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["containerPort"].as_u64())
        .collect();
    (template["metadata"]["labels"].clone(), declared)
}

fn deployment(text: &str) -> Value {
    text.split("\n---")
        .filter_map(|d| serde_norway::from_str::<Value>(d).ok())
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")
}

/// What the policies that select `labels` allow: ingress ports (with whether each rule restricts its
/// sources) and egress ports; whether a deny-all selects them.
struct Allowed {
    deny_all: bool,
    ingress: Vec<(String, u64, Value)>,
    egress: Vec<(String, u64, Value)>,
}

fn allowed(policies: &[&Value], labels: &Value) -> Allowed {
    let mut out = Allowed {
        deny_all: false,
        ingress: Vec::new(),
        egress: Vec::new(),
    };
    for p in policies
        .iter()
        .filter(|p| selects(&p["spec"]["podSelector"], labels))
    {
        let types = p["spec"]["policyTypes"].to_string();
        if types.contains("Ingress")
            && types.contains("Egress")
            && p["spec"]["ingress"].is_null()
            && p["spec"]["egress"].is_null()
        {
            out.deny_all = true;
        }
        for rule in p["spec"]["ingress"].as_array().into_iter().flatten() {
            let ps = ports(rule);
            assert!(!ps.is_empty(), "an ingress rule without ports: {rule}");
            out.ingress.extend(
                ps.into_iter()
                    .map(|(pr, po)| (pr, po, rule["from"].clone())),
            );
        }
        for rule in p["spec"]["egress"].as_array().into_iter().flatten() {
            let ps = ports(rule);
            assert!(!ps.is_empty(), "an egress rule without ports: {rule}");
            out.egress
                .extend(ps.into_iter().map(|(pr, po)| (pr, po, rule["to"].clone())));
        }
    }
    out
}

fn port_set(flows: &[(String, u64, Value)]) -> Vec<u64> {
    let mut v: Vec<u64> = flows.iter().map(|(_, p, _)| *p).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn network_policies_deny_all_but_the_flows_each_pod_needs() {
    let objs = rendered(json!({}));
    let policies: Vec<&Value> = objs
        .iter()
        .filter(|d| d.kind == Kind::NetworkPolicy)
        .map(|d| &d.body)
        .collect();
    let names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, NAMES, "the names RBAC grants by resourceNames");
    let webhook = deployment(include_str!("../../../manifests/webhook/deployment.yaml"));
    let controller = deployment(include_str!(
        "../../../manifests/controller/deployment.yaml"
    ));
    let proxy = objs
        .iter()
        .find(|d| d.kind == Kind::StatefulSet)
        .expect("the proxy's StatefulSet")
        .body
        .clone();
    for (name, doc) in [("webhook", &webhook), ("controller", &controller)] {
        let (labels, declared) = pods_of(doc);
        let a = allowed(&policies, &labels);
        assert!(a.deny_all, "{name}: no deny-all policy selects it");
        for (_, port, _) in &a.ingress {
            assert!(
                declared.contains(port),
                "{name}: ingress on undeclared {port}"
            );
        }
        assert_eq!(
            port_set(&a.ingress).contains(&9443),
            name == "webhook",
            "{name}: {:?}",
            a.ingress
        );
        for (_, port, from) in &a.ingress {
            if *port == 8080 {
                assert!(
                    from.to_string()
                        .contains("networking.kyma-project.io/metrics-scraping"),
                    "{name}: metrics open to everyone: {from}"
                );
            }
        }
        assert!(
            port_set(&a.ingress).contains(&8080),
            "{name}: metrics not reachable"
        );
        assert_eq!(port_set(&a.egress), vec![53, 443, 6443, 8053], "{name}");
        assert_eq!(
            doc["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"], "false",
            "{name}: kyma-system injects Istio sidecars; the operator opts out"
        );
    }
    // The proxy's pods: a deny-all of their own, ingress on exactly the ports they declare (the
    // tunnel and each enabled proxy, from anyone), egress to HTTPS and DNS only; no operator policy.
    let (labels, declared) = pods_of(&proxy);
    let a = allowed(&policies, &labels);
    assert!(a.deny_all, "proxy: no deny-all policy selects it");
    let mut declared = declared;
    declared.sort_unstable();
    assert_eq!(port_set(&a.ingress), declared, "proxy ingress");
    assert_eq!(
        port_set(&a.egress),
        vec![53, 443, 8053, 15012],
        "proxy egress without mappings: DNS, HTTPS, its sidecar to istiod"
    );
    assert_eq!(
        labels["networking.kyma-project.io/from-ingressgateway"], "allowed",
        "the Istio module's gateway policy lets the gateway reach only pods with this label"
    );
    for p in &policies {
        let selector = &p["spec"]["podSelector"];
        if p["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("-operator-"))
        {
            assert!(
                !selects(selector, &labels),
                "{} selects the proxy",
                p["metadata"]["name"]
            );
        }
    }
    // DNS: kube-dns on 53 and 8053 (Gardener's CoreDNS port), UDP and TCP each; node-local DNS on 53.
    for (name, labels) in [
        ("webhook", pods_of(&webhook).0),
        ("controller", pods_of(&controller).0),
        ("proxy", labels.clone()),
    ] {
        let a = allowed(&policies, &labels);
        for port in DNS_PORTS {
            for proto in ["UDP", "TCP"] {
                assert!(
                    a.egress.iter().any(|(pr, po, to)| pr == proto
                        && *po == port as u64
                        && to.to_string().contains("kube-dns")),
                    "{name}: no egress to kube-dns on {proto} {port}"
                );
            }
        }
        assert!(
            a.egress.iter().any(|(pr, po, to)| pr == "UDP"
                && *po == 53
                && to.to_string().contains(cp_api::names::NODE_LOCAL_DNS_IP)),
            "{name}: no egress to node-local DNS"
        );
    }
}

#[test]
fn the_annotation_switches_every_network_policy_off_and_only_true_does() {
    let key = cp_api::keys::DISABLE_NETWORK_POLICIES_ANNOTATION;
    for (value, expected) in [
        ("true", 0),
        ("True", 0),
        (" TRUE ", 0),
        ("false", 8),
        ("yes", 8),
        ("", 8),
    ] {
        let objs = rendered(json!({ key: value }));
        let n = objs
            .iter()
            .filter(|d| d.kind == Kind::NetworkPolicy)
            .count();
        assert_eq!(n, expected, "{key}: {value:?}");
        // Nothing else changes with it.
        assert_eq!(
            objs.iter()
                .filter(|d| d.kind != Kind::NetworkPolicy)
                .count(),
            rendered(json!({}))
                .iter()
                .filter(|d| d.kind != Kind::NetworkPolicy)
                .count()
        );
    }
    assert!(
        key.starts_with(cp_api::keys::OPERATOR_ANNOTATION_PREFIX),
        "only the operator and privileged identities may set it"
    );
}

fn proxy_egress(mappings: &[std::sync::Arc<cp_api::ServiceMapping>]) -> Value {
    let c = default_cr(json!({}));
    let facts = ClusterFacts {
        cluster_domain: Some("d.example.com".into()),
        ..Default::default()
    };
    let r = resolve(&c, &facts).expect("resolves");
    desired(&c, &r, mappings)
        .into_iter()
        .find(|d| d.kind == Kind::NetworkPolicy && d.name == NAMES[7])
        .expect("the proxy's egress policy")
        .body["spec"]["egress"]
        .clone()
}

fn mapping(name: &str, address: &str) -> std::sync::Arc<cp_api::ServiceMapping> {
    let mut m = cp_api::testing::tcp_mapping(name, "sub", name);
    m.spec.internal_address = address.into();
    std::sync::Arc::new(m)
}

#[test]
fn the_proxy_may_dial_the_ports_its_service_channels_name_and_istiod() {
    let egress = proxy_egress(&[
        mapping("a", "erp.ns:3300"),
        mapping("b", "10.0.0.7:8080"),
        mapping("c", "other.ns.svc:3300"),
    ]);
    let rules = egress.as_array().expect("rules");
    assert_eq!(rules.len(), 3, "{egress}");
    assert_eq!(
        rules[1],
        json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}},
                       "podSelector": {"matchLabels": {"istio": "pilot"}}}],
               "ports": [{"protocol": "TCP", "port": 15012}]})
    );
    assert_eq!(
        rules[2],
        json!({"to": [{"namespaceSelector": {}}],
               "ports": [{"protocol": "TCP", "port": 3300}, {"protocol": "TCP", "port": 8080}]}),
        "every pod of the cluster, on the channels' ports only"
    );
    // Past the cap, every port of the cluster's pods (still no address outside the cluster).
    let many: Vec<_> = (0..=network::MAX_CHANNEL_PORTS)
        .map(|i| mapping(&format!("m{i}"), &format!("h:{}", 10000 + i)))
        .collect();
    let egress = proxy_egress(&many);
    assert_eq!(egress[2], json!({"to": [{"namespaceSelector": {}}]}));
}
