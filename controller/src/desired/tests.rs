use std::sync::Arc;

use cp_api::ConnectivityProxy;
use serde_json::json;

use super::*;
use cp_api::reason::Reason;

fn cr(spec: serde_json::Value) -> ConnectivityProxy {
    serde_json::from_value(json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ConnectivityProxy",
        "metadata": {"name": "connectivity-proxy", "namespace": "kyma-system", "uid": "u-1"},
        "spec": spec
    }))
    .expect("cr")
}

fn default_spec() -> serde_json::Value {
    cp_api::testing::default_spec_json()
}

fn facts(domain: &str) -> ClusterFacts {
    ClusterFacts {
        cluster_domain: Some(domain.into()),
        ..Default::default()
    }
}

fn find<'a>(objs: &'a [Desired], kind: Kind, name: &str) -> &'a serde_json::Value {
    &objs
        .iter()
        .find(|d| d.kind == kind && d.name == name)
        .unwrap_or_else(|| panic!("{kind:?} {name} missing"))
        .body
}

#[test]
fn default_cr_resolves_host_and_secrets() {
    let c = cr(default_spec());
    let r = resolve(&c, &facts("abc.kyma.example.com")).expect("resolves");
    assert_eq!(r.external_host, "cp.abc.kyma.example.com");
    assert_eq!(r.tls_secret, "cp-tls-connectivity-proxy-kyma-system");
    assert_eq!(r.istio_namespace, "istio-system");
    assert!(r.service_key_auto && r.tls_auto);
    assert_eq!(
        r.subaccount_id, None,
        "auto-provisioned subaccount waits for the binding"
    );
}

#[test]
fn host_errors_are_clear() {
    let c = cr(default_spec());
    assert_eq!(
        resolve(&c, &ClusterFacts::default()),
        Err(ConfigProblem::ExternalHostUnresolved)
    );
    let long = format!("{}.example.com", "x".repeat(60));
    let err = resolve(&c, &facts(&long)).expect_err("too long");
    assert_eq!(err.reason(), Reason::ExternalHostTooLong);
    assert_eq!(err.state(), cp_api::State::Error);
    assert!(err.message().contains("64"), "{}", err.message());
}

#[test]
fn every_object_is_labelled_and_owned() {
    let c = cr(default_spec());
    let r = resolve(&c, &facts("d.example.com")).expect("resolves");
    let objs = desired(&c, &r, &[]);
    let kinds: Vec<Kind> = objs.iter().map(|d| d.kind).collect();
    // Secrets, certificates and BTP objects come from their own steps (certificates.rs, btp.rs).
    for k in [
        Kind::PriorityClass,
        Kind::ConfigMap,
        Kind::Service,
        Kind::StatefulSet,
        Kind::Gateway,
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::PeerAuthentication,
    ] {
        assert!(kinds.contains(&k), "{k:?} missing");
    }
    for d in &objs {
        let labels = &d.body["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/managed-by"], "connectivity-proxy-operator",
            "{}",
            d.name
        );
        assert_eq!(labels["kyma-project.io/module"], "connectivity-proxy");
        if d.namespace.as_deref() == Some("kyma-system") {
            assert_eq!(d.body["metadata"]["ownerReferences"][0]["uid"], "u-1");
        }
    }
    let gw = find(&objs, Kind::Gateway, "connectivity-proxy-tunnel");
    assert_eq!(gw["spec"]["servers"][0]["hosts"][0], "cp.d.example.com");
    assert_eq!(gw["spec"]["servers"][0]["tls"]["mode"], "MUTUAL");
    assert_eq!(
        gw["spec"]["servers"][0]["tls"]["minProtocolVersion"],
        "TLSV1_2"
    );
    assert_eq!(
        gw["spec"]["servers"][0]["tls"]["credentialName"],
        "cp-tls-connectivity-proxy-kyma-system"
    );
    let sts = find(&objs, Kind::StatefulSet, "connectivity-proxy");
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["image"],
        "docker.io/sapse/connectivity-proxy:2.11.0"
    );
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    let info = find(&objs, Kind::ConfigMap, "connectivity-proxy-info");
    assert_eq!(info["data"]["onpremise_proxy_http_port"], "20003");
    assert_eq!(info["data"]["onpremise_socks5_proxy_port"], "20004");
    assert_eq!(
        info["data"]["onpremise_proxy_host"],
        "connectivity-proxy.kyma-system.svc.cluster.local"
    );
    let cfg =
        find(&objs, Kind::ConfigMap, "connectivity-proxy")["data"]["connectivity-proxy-config.yml"]
            .as_str()
            .unwrap_or("")
            .to_string();
    assert!(cfg.contains("externalHost: cp.d.example.com"), "{cfg}");
    assert!(
        !cfg.to_lowercase().contains("auto-provision"),
        "auto-provision leaked into the config: {cfg}"
    );
}

#[test]
fn disabled_proxy_has_no_port_and_changed_port_propagates() {
    let mut spec = default_spec();
    spec["config"]["servers"]["proxy"] =
        json!({"socks5": {"enabled": false}, "http": {"port": 21000}});
    let c = cr(spec);
    let r = resolve(&c, &facts("d.example.com")).expect("resolves");
    let objs = desired(&c, &r, &[]);
    let svc = find(&objs, Kind::Service, "connectivity-proxy");
    let ports: Vec<i64> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert_eq!(ports, vec![21000, 20001]);
    assert_eq!(
        find(&objs, Kind::ConfigMap, "connectivity-proxy-info")["data"]["onpremise_proxy_http_port"],
        "21000"
    );
}

#[test]
fn service_mappings_json_is_deterministic() {
    let m = |name: &str| -> Arc<cp_api::ServiceMapping> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                "metadata": {"name": name},
                "spec": {"type": "TCP", "serviceId": name, "internalAddress": "a:1"}
            }))
            .expect("mapping"),
        )
    };
    let a = service_mappings_json(&[m("b"), m("a")]);
    let b = service_mappings_json(&[m("a"), m("b")]);
    assert_eq!(a, b);
    assert!(a.starts_with(r#"[{"internalAddress":"a:1""#), "{a}");
}

#[test]
fn service_mappings_json_leaves_out_unset_fields_and_fits_10000_mappings_in_a_config_map() {
    let mapping = |name: String, extra: Value| -> Arc<cp_api::ServiceMapping> {
        let mut spec = json!({"type": "TCP", "serviceId": name, "internalAddress": "erp.ns:3300"});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                "metadata": {"name": name}, "spec": spec
            }))
            .expect("mapping"),
        )
    };
    let full = service_mappings_json(&[mapping(
        "full".into(),
        json!({"subaccountId": "sub", "tenantId": "t", "locationIds": ["loc"]}),
    )]);
    let v: Value = serde_json::from_str(&full).expect("json");
    assert_eq!(v[0]["subaccountId"], "sub");
    assert_eq!(v[0]["tenantId"], "t");
    assert_eq!(v[0]["locationIds"], json!(["loc"]));
    let bare = service_mappings_json(&[mapping("bare".into(), json!({"locationIds": []}))]);
    assert!(
        !bare.contains("null") && !bare.contains("locationIds"),
        "{bare}"
    );
    let many: Vec<_> = (0..10_000)
        .map(|i| mapping(format!("mapping-{i:05}"), json!({})))
        .collect();
    let size = service_mappings_json(&many).len();
    assert!(size < 1_000_000, "10,000 mappings take {size} bytes");
}

#[test]
fn gateway_port_and_mapping_endpoints_agree_for_any_external_port() {
    let mapping: cp_api::ServiceMapping = serde_json::from_value(json!({
        "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {"name": "m"},
        "spec": {"type": "RFC", "serviceId": "erp", "internalAddress": "erp.ns:3300"}
    }))
    .expect("mapping");
    for port in [None, Some(443), Some(8443)] {
        let mut spec = default_spec();
        if let Some(p) = port {
            spec["config"]["servers"]["businessDataTunnel"]["externalPort"] = json!(p);
        }
        let c = cr(spec);
        let r = resolve(&c, &facts("d.example.com")).expect("resolves");
        let objs = desired(&c, &r, &[]);
        let served = find(&objs, Kind::Gateway, cp_api::names::GATEWAY)["spec"]["servers"][0]["port"]
            ["number"]
            .as_i64()
            .expect("gateway port");
        let advertised =
            crate::mappings::endpoint(&mapping, &r, cp_api::validation::external_port(&c.spec));
        assert_eq!(served, i64::from(port.unwrap_or(443)));
        assert!(
            advertised.ends_with(&format!(":{served}/erp")),
            "{advertised} vs Gateway port {served}"
        );
    }
}

#[test]
fn hash_is_stable() {
    assert_eq!(hash_str("abc"), hash_str("abc"));
    assert_ne!(hash_str("abc"), hash_str("abd"));
    assert_eq!(hash_str(""), "cbf29ce484222325");
}

/// The Secrets projected into the proxy pod.
fn projected_secrets(objs: &[Desired]) -> Vec<String> {
    let sts = find(objs, Kind::StatefulSet, cp_api::names::STATEFULSET);
    sts["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["projected"]["sources"].as_array())
        .flatten()
        .filter_map(|s| s["secret"]["name"].as_str().map(String::from))
        .collect()
}

#[test]
fn the_renderer_never_projects_an_operator_owned_secret_into_the_proxy() {
    let mut spec = default_spec();
    spec["secretConfig"]["integration"]["auditlogService"] =
        json!({"secretName": "my-auditlog-key"});
    let c = cr(spec.clone());
    let r = resolve(&c, &facts("d.example.com")).expect("resolves");
    assert!(projected_secrets(&desired(&c, &r, &[])).contains(&"my-auditlog-key".to_string()));
    for owned in cp_api::validation::OPERATOR_SECRETS {
        spec["secretConfig"]["integration"]["auditlogService"] = json!({"secretName": owned});
        let c = cr(spec.clone());
        // A CR admitted before the rule is refused as a whole...
        let err = resolve(&c, &facts("d.example.com")).expect_err(owned);
        assert!(
            err.message()
                .contains("spec.secretConfig.integration.auditlogService.secretName"),
            "{}",
            err.message()
        );
        // ...and the renderer, handed one anyway, leaves the Secret out.
        let objs = desired(&c, &r, &[]);
        assert!(
            !projected_secrets(&objs).iter().any(|s| s == owned),
            "{owned} projected: {:?}",
            projected_secrets(&objs)
        );
        let mut r = r.clone();
        r.service_key_secret = owned.to_string();
        let objs = desired(&c, &r, &[]);
        assert!(
            !projected_secrets(&objs).iter().any(|s| s == owned),
            "{owned} projected as the service key"
        );
    }
}
