//! The control plane runs, our CRDs and the stand-in third-party CRDs apply, and CRs round-trip losslessly.

use cp_api::ConnectivityProxy;
use cp_tests::fixtures::{self, dynamic_crs, install_our_crds, manifest_path};
use cp_tests::manifest;
use cp_tests::shared::{alice_client, control_plane, webhook};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

/// Every leaf of `expected` must be present with the same value in `actual`; returns the paths
/// that are missing or differ.
fn missing_leaves(expected: &Value, actual: &Value, path: &str) -> Vec<String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .flat_map(|(k, v)| {
                missing_leaves(v, a.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"))
            })
            .collect(),
        (e, a) if e == a => vec![],
        _ => vec![format!("{path}: expected {expected}, got {actual}")],
    }
}

#[tokio::test]
async fn every_fixture_crd_applies_and_is_served() {
    let cp = control_plane();
    let client = cp.admin().await.expect("admin client");
    for f in [
        cp_tests::fixtures::ISTIO_CRDS,
        cp_tests::fixtures::BTP_CRDS,
        cp_tests::fixtures::GARDENER_CERT_CRD,
        cp_tests::fixtures::CERT_MANAGER_CRD,
    ] {
        let applied = manifest::apply_file(&client, &fixtures::path(f), None)
            .await
            .unwrap_or_else(|e| panic!("{f}: {e:#}"));
        assert!(!applied.is_empty(), "{f} holds no objects");
    }
    // Each kind the operator writes is served at the version it uses.
    for kind in cp_api::kinds::Kind::ALL {
        let ar = kind.api_resource();
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        api.list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{} {} is not served: {e}", ar.api_version, ar.kind));
    }
}

#[tokio::test]
async fn kyma_default_cr_round_trips() {
    let cp = control_plane();
    let client = cp.admin().await.expect("admin client");
    install_our_crds(&client).await;
    let ns = cp.namespace("roundtrip-default").await.expect("namespace");
    let yaml = std::fs::read_to_string(cp_tests::fixtures::default_cr_path()).expect("default CR");
    let mut obj = manifest::parse_documents(&yaml).expect("parse").remove(0);
    obj.metadata.namespace = Some(ns.clone());
    let sent = serde_json::to_value(&obj).expect("json");
    let stored = manifest::apply_object(&client, obj, Some(&ns))
        .await
        .expect("default CR applies");
    let stored = serde_json::to_value(&stored).expect("json");
    assert_eq!(
        missing_leaves(&sent["spec"], &stored["spec"], "spec"),
        Vec::<String>::new()
    );
    // Schema defaults: the documented HTTP port, not the old CRD's slip.
    assert_eq!(
        stored["spec"]["config"]["servers"]["proxy"]["http"]["port"],
        20003
    );
    assert_eq!(stored["spec"]["config"]["tenantMode"], "dedicated");
    assert_eq!(stored["spec"]["config"]["highAvailabilityMode"], "off");
    // The typed view reads it back.
    let typed: ConnectivityProxy = serde_json::from_value(stored).expect("typed");
    // Other tests of this binary register the webhook at any moment: deployment is either absent or
    // exactly this release's defaults (injected), never anything else.
    let deployment = serde_json::to_value(&typed.spec.deployment).expect("json");
    assert!(
        deployment.is_null() || deployment == cp_api::defaults::deployment_defaults_json(),
        "unexpected spec.deployment: {deployment}"
    );
}

/// A CR with every field of the existing module's CRD set.
pub fn full_cr(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ConnectivityProxy",
        "metadata": {"name": name},
        "spec": {
            "config": {
                "highAvailabilityMode": "path",
                "integration": {
                    "auditlog": {"mode": "service", "serviceCredentialsKey": "audit_key"},
                    "connectivityService": {"serviceCredentialsKey": "conn_key"}
                },
                "multiRegionMode": {"enabled": false, "configMapName": "regions"},
                "servers": {
                    "businessDataTunnel": {"externalHost": "cp.example.com", "externalPort": 8443},
                    "proxy": {
                        "authorization": {"oauth": {"allowedClientId": "client-1"}},
                        "http": {"allowRemoteConnections": true, "enableProxyAuthorization": true, "enabled": true, "port": 21003},
                        "rfcAndLdap": {"allowRemoteConnections": false, "enableProxyAuthorization": true, "enabled": false, "port": 21001},
                        "socks5": {"allowRemoteConnections": true, "enableProxyAuthorization": true, "enabled": true, "port": 21004}
                    }
                },
                "serviceChannels": {"enabled": true},
                "subaccountId": "0000-1111",
                "subaccountSubdomain": "sub",
                "tenantMode": "dedicated"
            },
            "deployment": {
                "image": {"digest": "sha256:abc", "pullPolicy": "Always", "pullSecret": "pull", "registry": "r.example.com", "repository": "cp", "tag": "9.9.9"},
                "utilityImage": {"digest": "sha256:def", "pullPolicy": "Never", "pullSecret": "pull2", "registry": "r.example.com", "repository": "util", "tag": "1"},
                "replicaCount": 3,
                "resources": {"maxFileDescriptorCount": 1000, "limits": {"cpu": "2", "memory": "2G"}, "requests": {"cpu": "1", "memory": "1G"}},
                "restartWatcher": {"enabled": false},
                "nodeSelector": {"pool": "cp"}
            },
            "ingress": {
                "annotations": {"a": "b"},
                "className": "istio",
                "istio": {"gateway": {"selector": {"istio": "gw"}}, "namespace": "istio-ingress", "tls": {"ciphers": ["ECDHE-ECDSA-AES128-GCM-SHA256"]}},
                "timeouts": {"proxy": {"connect": 5, "read": 6, "send": 7}},
                "tls": {"secretName": "tls"}
            },
            "secretConfig": {
                "integration": {
                    "auditlogService": {"secretData": "YWJj", "secretName": "audit"},
                    "connectivityService": {"secretData": "ZGVm", "secretName": "conn"}
                }
            }
        }
    })
}

#[tokio::test]
async fn cr_with_every_field_round_trips() {
    let cp = control_plane();
    let client = cp.admin().await.expect("admin client");
    install_our_crds(&client).await;
    let ns = cp.namespace("roundtrip-full").await.expect("namespace");
    let sent = full_cr("full");
    let obj: DynamicObject = serde_json::from_value(sent.clone()).expect("object");
    let api = dynamic_crs(&client, &ns);
    let stored = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("create full CR");
    let stored = serde_json::to_value(&stored).expect("json");
    assert_eq!(
        missing_leaves(&sent["spec"], &stored["spec"], "spec"),
        Vec::<String>::new()
    );
    // Typed round trip: nothing is lost through our Rust types either.
    let typed: ConnectivityProxy = serde_json::from_value(stored.clone()).expect("typed");
    let again = serde_json::to_value(&typed).expect("json");
    assert_eq!(
        missing_leaves(&stored["spec"], &again["spec"], "spec"),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn committed_manifests_equal_generated() {
    let dir = cp_tests::workspace_root().join("manifests");
    for (rel, content) in cp_api::bundle::generated(&dir).expect("render") {
        let path = dir.join(&rel);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == content,
            "{} differs from what `make manifests` generates; run it and commit",
            path.display()
        );
    }
}

#[tokio::test]
async fn rendered_bundle_applies_with_server_side_apply() {
    let cp = control_plane();
    let client = cp.admin().await.expect("admin client");
    // Both exist in a Kyma cluster (the Istio module creates istio-system); the controller's
    // namespaced rights are bound in them.
    for ns in ["kyma-system", "istio-system"] {
        cp_tests::cluster::ensure_namespace(&client, ns)
            .await
            .expect("namespace");
    }
    let wh = webhook().await;
    let bundle = std::fs::read_to_string(manifest_path(cp_api::bundle::BUNDLE)).expect("bundle");
    let mut applied = Vec::new();
    for mut obj in manifest::parse_documents(&bundle).expect("parse bundle") {
        if obj
            .types
            .as_ref()
            .is_some_and(|t| t.kind.ends_with("WebhookConfiguration"))
        {
            wh.point_at_me(&mut obj);
        }
        let is_crd = obj
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "CustomResourceDefinition");
        let o = manifest::apply_object(&client, obj, None)
            .await
            .expect("bundle object applies");
        if is_crd {
            manifest::wait_crd_established(&client, &o.metadata.name.clone().unwrap_or_default())
                .await
                .expect("established");
        }
        applied.push(o);
    }
    let kinds: std::collections::BTreeSet<String> = applied
        .iter()
        .filter_map(|o| o.types.as_ref().map(|t| t.kind.clone()))
        .collect();
    for k in [
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ClusterRole",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(k), "bundle has no {k}: {kinds:?}");
    }
    // The default CR is then admitted through the webhook.
    let ns = cp.namespace("bundle-default-cr").await.expect("namespace");
    let alice = alice_client(&[]).await;
    let yaml = std::fs::read_to_string(manifest_path("default-cr.yaml")).expect("default CR");
    let mut cr = manifest::parse_documents(&yaml).expect("parse").remove(0);
    cr.metadata.namespace = Some(ns.clone());
    let api = dynamic_crs(&alice, &ns);
    let stored = api
        .create(&PostParams::default(), &cr)
        .await
        .expect("default CR admitted");
    assert_eq!(
        stored.data["spec"]["deployment"],
        cp_api::defaults::deployment_defaults_json()
    );
}
