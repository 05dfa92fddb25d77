//! One allowed and one denied case per validation rule.

use serde_json::json;

use crate::ConnectivityProxySpec;
use crate::mapping::ServiceMappingSpec;
use crate::validation::{ClusterFacts, Stored, parse_host_port, validate_mapping};

fn base() -> serde_json::Value {
    crate::testing::default_spec_json()
}

fn spec(v: serde_json::Value) -> ConnectivityProxySpec {
    serde_json::from_value(v).expect("test spec")
}

fn fields(
    s: &ConnectivityProxySpec,
    old: Option<&ConnectivityProxySpec>,
    facts: &ClusterFacts,
) -> Vec<String> {
    s.validate(old.map(Stored::from).as_ref(), facts)
        .into_iter()
        .map(|e| e.field)
        .collect()
}

fn no_facts() -> ClusterFacts {
    ClusterFacts::default()
}

#[test]
fn default_cr_is_valid() {
    assert!(fields(&spec(base()), None, &no_facts()).is_empty());
}

#[test]
fn dedicated_needs_subaccount_id() {
    let mut v = base();
    v["config"]
        .as_object_mut()
        .map(|c| c.remove("subaccountId"));
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        ["spec.config.subaccountId"]
    );
    v["config"]["tenantMode"] = json!("shared");
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

#[test]
fn subdomain_needed_when_a_proxy_has_no_authorization() {
    let mut v = base();
    v["config"]
        .as_object_mut()
        .map(|c| c.remove("subaccountSubdomain"));
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        ["spec.config.subaccountSubdomain"]
    );
    let on = json!({"enableProxyAuthorization": true});
    v["config"]["servers"]["proxy"] = json!({"http": on, "rfcAndLdap": on, "socks5": on,
        "authorization": {"oauth": {"allowedClientId": "client"}}});
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

#[test]
fn allowed_client_id_needed_when_authorization_is_on() {
    let mut v = base();
    v["config"]["servers"]["proxy"] = json!({"socks5": {"enableProxyAuthorization": true}});
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        ["spec.config.servers.proxy.authorization.oauth.allowedClientId"]
    );
    v["config"]["servers"]["proxy"]["authorization"] = json!({"oauth": {"allowedClientId": "c"}});
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

#[test]
fn multi_region_rules() {
    let mut v = base();
    v["config"]["multiRegionMode"] = json!({"enabled": true});
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        [
            "spec.config.multiRegionMode.configMapName",
            "spec.config.serviceChannels.enabled",
            "spec.config.tenantMode"
        ]
    );
    v["config"]["multiRegionMode"]["configMapName"] = json!("regions");
    v["config"]["serviceChannels"] = json!({"enabled": false});
    v["config"]["tenantMode"] = json!("shared");
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

#[test]
fn istio_needs_tls_secret() {
    let mut v = base();
    v["ingress"] = json!({"className": "istio"});
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        ["spec.ingress.tls.secretName"]
    );
    v["ingress"] = json!({"className": "istio", "tls": {"secretName": "tls"}});
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

#[test]
fn nginx_is_refused_and_nginx_only_fields_are_named() {
    let mut v = base();
    v["ingress"] = json!({"className": "nginx"});
    assert_eq!(
        fields(&spec(v), None, &no_facts()),
        ["spec.ingress.className"]
    );
    let mut v = base();
    assert!(crate::validation::ignored_fields(&spec(v.clone())).is_empty());
    v["ingress"]["annotations"] = json!({"nginx.ingress.kubernetes.io/x": "y"});
    v["ingress"]["timeouts"] = json!({"proxy": {"send": 30}});
    let ignored = crate::validation::ignored_fields(&spec(v));
    assert_eq!(ignored.len(), 2, "{ignored:?}");
    assert!(ignored[0].starts_with("spec.ingress.annotations"));
    assert!(ignored[1].starts_with("spec.ingress.timeouts.proxy.send"));
}

#[test]
fn secret_name_frozen_while_secret_data_set() {
    let mut old = base();
    old["secretConfig"]["integration"]["connectivityService"] =
        json!({"secretName": "a", "secretData": "YWJj"});
    let mut new = old.clone();
    new["secretConfig"]["integration"]["connectivityService"]["secretName"] = json!("b");
    let old = spec(old);
    assert_eq!(
        fields(&spec(new.clone()), Some(&old), &no_facts()),
        ["spec.secretConfig.integration.connectivityService.secretName"]
    );
    let mut plain_old = base();
    plain_old["secretConfig"]["integration"]["connectivityService"] = json!({"secretName": "a"});
    new["secretConfig"]["integration"]["connectivityService"] = json!({"secretName": "b"});
    assert!(fields(&spec(new), Some(&spec(plain_old)), &no_facts()).is_empty());
}

#[test]
fn service_channels_stay_while_mappings_exist() {
    let mut v = base();
    v["config"]["serviceChannels"] = json!({"enabled": false});
    let facts = ClusterFacts {
        service_mapping_count: 1,
        service_mappings: vec!["m1".into()],
    };
    let old = spec(base());
    let errs = spec(v.clone()).validate(Some(&Stored::from(&old)), &facts);
    assert_eq!(errs.len(), 1);
    assert!(errs[0].message.contains("m1"), "{}", errs[0].message);
    assert!(fields(&spec(v), Some(&old), &no_facts()).is_empty());
}

#[test]
fn external_host_length_is_limited() {
    let mut v = base();
    v["config"]["servers"]["businessDataTunnel"]["externalHost"] =
        json!(format!("{}.example.com", "a".repeat(60)));
    assert_eq!(
        fields(&spec(v.clone()), None, &no_facts()),
        ["spec.config.servers.businessDataTunnel.externalHost"]
    );
    v["config"]["servers"]["businessDataTunnel"]["externalHost"] = json!("cp.example.com");
    assert!(fields(&spec(v), None, &no_facts()).is_empty());
}

fn mapping(v: serde_json::Value) -> ServiceMappingSpec {
    serde_json::from_value(v).expect("mapping")
}

#[test]
fn mapping_rules() {
    let ok = mapping(
        json!({"type": "RFC", "serviceId": "s4", "internalAddress": "erp.ns:3300", "subaccountId": "a"}),
    );
    assert!(validate_mapping(&ok, true).is_empty());
    let no_sub =
        mapping(json!({"type": "TCP", "serviceId": "s4", "internalAddress": "erp.ns:3300"}));
    assert!(validate_mapping(&no_sub, false).is_empty());
    assert_eq!(
        validate_mapping(&no_sub, true)[0].field,
        "spec.subaccountId"
    );
    for bad in ["erp", "erp:0", "erp:70000", ":80", "erp:x", "[zz]:80"] {
        assert!(parse_host_port(bad).is_err(), "{bad} accepted");
    }
    assert_eq!(parse_host_port("[::1]:80"), Ok(("[::1]", 80)));
    let empty = mapping(json!({"type": "TCP", "serviceId": " ", "internalAddress": "a:1"}));
    assert_eq!(validate_mapping(&empty, false)[0].field, "spec.serviceId");
    assert!(
        serde_json::from_value::<ServiceMappingSpec>(
            json!({"type": "HTTP", "serviceId": "s", "internalAddress": "a:1"})
        )
        .is_err()
    );
}

#[test]
fn unknown_fields_names_every_dropped_field_with_its_path() {
    use serde_json::json;
    let sent = json!({"a": {"b": 1, "x": 2, "n": null}, "l": [{"c": 1, "y": 3}], "z": true});
    let known = json!({"a": {"b": 1}, "l": [{"c": 1}]});
    let mut got = crate::validation::unknown_fields(&sent, &known, "spec");
    got.sort();
    assert_eq!(got, vec!["spec.a.x", "spec.l[0].y", "spec.z"]);
    assert_eq!(
        crate::validation::unknown_fields(&sent, &known, ""),
        vec!["a.x", "l[0].y", "z"]
    );
    assert!(crate::validation::unknown_fields(&known, &known, "spec").is_empty());
}

#[test]
fn user_chosen_secret_names_stay_in_the_namespace_and_off_the_operators_secrets() {
    let facts = no_facts();
    let with = |tls: &str, key: &str| {
        let mut v = base();
        v["ingress"]["tls"]["secretName"] = json!(tls);
        v["secretConfig"]["integration"]["connectivityService"]["secretName"] = json!(key);
        fields(&spec(v), None, &facts)
    };
    assert!(with("my-tls", "my-key").is_empty());
    assert!(with("auto-provision", "Auto-Provision").is_empty());
    assert_eq!(
        with("other-ns/my-tls", "my-key"),
        vec!["spec.ingress.tls.secretName"]
    );
    assert_eq!(
        with("my-tls", "connectivity-proxy-webhook-cert"),
        vec!["spec.secretConfig.integration.connectivityService.secretName"]
    );
    assert_eq!(
        with("connectivity-proxy-tunnel-ca", "Bad_Name"),
        vec![
            "spec.ingress.tls.secretName",
            "spec.secretConfig.integration.connectivityService.secretName"
        ]
    );
}

#[test]
fn the_audit_log_secret_name_gets_the_same_check_as_the_other_secret_names() {
    let facts = no_facts();
    let with_auditlog = |name: &str| {
        let mut v = base();
        v["secretConfig"]["integration"]["auditlogService"] = json!({"secretName": name});
        fields(&spec(v), None, &facts)
    };
    assert!(with_auditlog("my-auditlog-key").is_empty());
    for bad in [
        "connectivity-proxy-webhook-ca",
        "connectivity-proxy-webhook-cert",
        "connectivity-proxy-tunnel-ca",
        "other-ns/key",
        "Bad_Name",
    ] {
        assert_eq!(
            with_auditlog(bad),
            vec!["spec.secretConfig.integration.auditlogService.secretName"],
            "{bad}"
        );
    }
}
