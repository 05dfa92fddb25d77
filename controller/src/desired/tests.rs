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
    // NetworkPolicies, Secrets, certificates and BTP objects come from their own steps
    // (network.rs, certificates.rs, btp.rs).
    let own_steps = [
        Kind::NetworkPolicy,
        Kind::Secret,
        Kind::GardenerCertificate,
        Kind::CertManagerCertificate,
        Kind::ServiceInstance,
        Kind::ServiceBinding,
    ];
    for k in Kind::ALL.into_iter().filter(|k| !own_steps.contains(k)) {
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
        let advertised = crate::mappings::endpoint(
            &crate::mappings::Mapping::of(&mapping),
            &r,
            cp_api::validation::external_port(&c.spec),
        );
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
        let mut handed = r.clone();
        handed.auditlog_secret = Some(owned.to_string());
        let objs = desired(&c, &handed, &[]);
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

/// The golden snapshots under `src/desired/golden/`: every desired object of a set of representative
/// CRs (workload, ConfigMaps, Services, Istio, the tunnel certificate of each provider, the BTP
/// objects, the webhook Secrets), each as `serde_json::to_string_pretty` of its body. They pin the
/// applied JSON byte for byte: object hashes go into pod-template annotations and server-side apply's
/// field ownership depends on the exact fields. `GOLDEN_UPDATE=1` rewrites them.
mod golden {
    use super::*;
    use crate::certificates::tunnel::{self, Live, Provider};
    use crate::certificates::{TunnelCertSettings, ca_secret_content, leaf_secret_content};
    use cp_api::testing;
    use cp_certs::rotation::{Rotation, State};
    use cp_certs::{Ca, Leaf};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    const DOMAIN: &str = "c-1.kyma.example.org";
    const KEY: &str = r#"{"subaccount_id":"sub-1","subaccount_subdomain":"dom","clientid":"x"}"#;

    fn render(objs: &[Desired]) -> String {
        objs.iter()
            .map(|d| {
                let body = serde_json::to_string_pretty(&d.body).expect("a body renders");
                format!(
                    "--- {:?} {}/{}\n{body}\n",
                    d.kind,
                    d.namespace.as_deref().unwrap_or("-"),
                    d.name
                )
            })
            .collect()
    }

    fn check(case: &str, objs: &[Desired]) {
        let path = format!(
            "{}/src/desired/golden/{case}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        let got = render(objs);
        if std::env::var_os("GOLDEN_UPDATE").is_some() {
            std::fs::write(&path, &got).expect("golden written");
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or_else(|| got.lines().count().min(want.lines().count()));
            panic!(
                "{case}: the desired objects differ from {path} from line {}:\n got: {:?}\nwant: {:?}",
                line + 1,
                got.lines().nth(line),
                want.lines().nth(line)
            );
        }
    }

    fn mappings() -> Vec<Arc<cp_api::ServiceMapping>> {
        vec![
            Arc::new(testing::tcp_mapping("erp", "sub-1", "erp")),
            Arc::new(testing::service_mapping(
                "ldap",
                json!({"type": "RFC", "serviceId": "ldap", "internalAddress": "ldap.ns:389",
                       "tenantId": "t-1", "locationIds": ["loc-1", "loc-2"]}),
            )),
        ]
    }

    /// Everything `desired` renders for `cr`, with `tweak` applied to the resolved values.
    fn all(
        cr: &ConnectivityProxy,
        mappings: &[Arc<cp_api::ServiceMapping>],
        tweak: impl FnOnce(&mut Resolved),
    ) -> Vec<Desired> {
        let mut r = resolve(cr, &facts(DOMAIN)).expect("resolves");
        tweak(&mut r);
        desired(cr, &r, mappings)
    }

    #[test]
    fn default_cr() {
        check("default", &all(&testing::default_cr(), &[], |_| {}));
    }

    #[test]
    fn istio_options_custom_tls_secret_and_mappings() {
        let cr = testing::cr(testing::default_spec_with(json!({
            "config": {"servers": {
                "businessDataTunnel": {"externalHost": "tunnel.example.org", "externalPort": 8443},
                "proxy": {"http": {"port": 21000}, "socks5": {"enabled": false}}}},
            "ingress": {
                "tls": {"secretName": "my-tunnel-tls"},
                "istio": {"namespace": "my-istio",
                    "gateway": {"selector": {"istio": "my-gateway", "tier": "edge"}},
                    "tls": {"ciphers": ["ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-AES128-GCM-SHA256"]}},
                "timeouts": {"proxy": {"connect": 5, "read": 300, "send": 60}}}
        })));
        check(
            "istio",
            &all(&cr, &mappings(), |r| {
                r.secrets_hash = Some("0123abcd".into())
            }),
        );
    }

    #[test]
    fn every_optional_config_field() {
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD.encode(KEY);
        let cr = testing::cr(testing::default_spec_with(json!({
            "config": {
                "highAvailabilityMode": "path",
                "tenantMode": "shared",
                "subaccountId": "sub-explicit",
                "subaccountSubdomain": "dom-explicit",
                "multiRegionMode": {"enabled": true, "configMapName": "regions"},
                "serviceChannels": {"enabled": false},
                "integration": {
                    "auditlog": {"mode": "service", "serviceCredentialsKey": "audit-key"},
                    "connectivityService": {"serviceCredentialsKey": "cs-key"}},
                "servers": {
                    "businessDataTunnel": {"externalHost": "cp.example.org", "externalPort": 443},
                    "proxy": {
                        "authorization": {"oauth": {"allowedClientId": "client-1"}},
                        "http": {"allowRemoteConnections": true, "enableProxyAuthorization": true,
                                 "enabled": true, "port": 20003},
                        "rfcAndLdap": {"allowRemoteConnections": false, "enableProxyAuthorization": false,
                                       "enabled": true, "port": 20001},
                        "socks5": {"allowRemoteConnections": true, "enableProxyAuthorization": true,
                                   "enabled": true, "port": 20004}}}},
            "deployment": {
                "image": {"registry": "reg.example.org", "repository": "cp", "tag": "9.9.9",
                          "digest": "sha256:abc", "pullPolicy": "Always", "pullSecret": "pull-a"},
                "utilityImage": {"registry": "reg.example.org", "repository": "util", "tag": "1",
                                 "pullSecret": "pull-b"},
                "replicaCount": 3,
                "resources": {"maxFileDescriptorCount": 65536,
                              "limits": {"cpu": "2", "memory": "2Gi"},
                              "requests": {"cpu": "500m", "memory": "1Gi"}},
                "restartWatcher": {"enabled": true},
                "nodeSelector": {"pool": "proxy"}},
            "secretConfig": {"integration": {
                "auditlogService": {"secretName": "my-auditlog-key"},
                "connectivityService": {"secretName": "my-key", "secretData": key}}}
        })));
        let mut objs = all(&cr, &mappings(), |r| r.secrets_hash = Some("feed".into()));
        let key = crate::btp::service_key(&cr, None, None).expect("secretData decodes");
        objs.extend(key.objects);
        check("full_config", &objs);
    }

    #[test]
    fn restart_watcher_off() {
        let cr = testing::cr(testing::default_spec_with(json!({
            "deployment": {"restartWatcher": {"enabled": false}}
        })));
        check(
            "restart_watcher_off",
            &all(&cr, &[], |r| r.secrets_hash = Some("beef".into())),
        );
    }

    fn tunnel_settings(issuer: Option<(&str, &str)>) -> TunnelCertSettings {
        TunnelCertSettings {
            ca_lifetime: time::Duration::days(365),
            cert_lifetime: time::Duration::days(90),
            cert_manager_issuer: issuer.map(|(k, n)| (k.into(), n.into())),
            algorithm: cp_certs::KeyAlgorithm::EcdsaP256,
        }
    }

    /// A rotation plan with fixed (not parseable) PEMs and times.
    fn fixed_plan() -> Rotation {
        let t = time::OffsetDateTime::from_unix_timestamp(1_714_564_800).expect("a time");
        Rotation {
            state: State {
                ca: Some(Ca {
                    cert_pem: "CA-CERT".into(),
                    key_pem: "CA-KEY".into(),
                }),
                previous_ca_pem: Some("OLD-CA".into()),
                ca_created_at: Some(t),
                leaf_switched_at: Some(t),
                leaf: Some(Leaf {
                    cert_pem: "LEAF-CERT".into(),
                    key_pem: "LEAF-KEY".into(),
                }),
            },
            bundle: "OLD-CA\nCA-CERT".into(),
            next: t,
            ca_rotated: false,
            leaf_rotated: true,
        }
    }

    #[test]
    fn tunnel_certificate_of_each_provider_and_btp_objects() {
        let mut objs = Vec::new();
        for cr in [
            testing::default_cr(),
            testing::named_cr("team-a", "proxy", testing::default_spec_json()),
        ] {
            let r = resolve(&cr, &facts(DOMAIN)).expect("resolves");
            for (provider, issuer) in [
                (Provider::Gardener, None),
                (
                    Provider::CertManager,
                    Some(("ClusterIssuer", "letsencrypt")),
                ),
            ] {
                let t = tunnel::objects(
                    &cr,
                    &r,
                    provider,
                    &tunnel_settings(issuer),
                    Live::default(),
                    None,
                )
                .expect("a certificate");
                objs.extend(t.objects);
            }
            let plan = Ok(fixed_plan());
            let t = tunnel::objects(
                &cr,
                &r,
                Provider::BuiltIn,
                &tunnel_settings(None),
                Live::default(),
                Some(&plan),
            )
            .expect("built-in objects");
            objs.extend(t.objects);
            let binding: kube::api::DynamicObject = serde_json::from_value(json!({
                "apiVersion": "services.cloud.sap.com/v1", "kind": "ServiceBinding",
                "metadata": {"name": "b", "namespace": "kyma-system"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .expect("binding");
            let encoded = {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(KEY)
            };
            let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
                "metadata": {"name": "b"},
                "data": {cp_api::names::SECRET_SERVICE_KEY_KEY: encoded}
            }))
            .expect("secret");
            let key = crate::btp::service_key(&cr, Some(&binding), Some(&secret)).expect("key");
            objs.extend(key.objects);
        }
        check("certificates_and_btp", &objs);
    }

    #[test]
    fn webhook_secrets() {
        let owner = OwnerReference {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            name: "connectivityproxies.connectivityproxy.sap.com".into(),
            uid: "crd-uid".into(),
            ..OwnerReference::default()
        };
        let plan = fixed_plan();
        let objs: Vec<Desired> = [
            (
                cp_api::names::WEBHOOK_CA_SECRET,
                Some(&owner),
                ca_secret_content(&plan),
            ),
            (
                cp_api::names::WEBHOOK_CERT_SECRET,
                None,
                leaf_secret_content(&plan),
            ),
        ]
        .into_iter()
        .map(|(name, owner, content)| Desired {
            kind: Kind::Secret,
            namespace: Some("kyma-system".into()),
            name: name.into(),
            body: crate::certificates::secret_body("kyma-system", name, owner, content),
        })
        .collect();
        check("webhook_secrets", &objs);
    }
}
