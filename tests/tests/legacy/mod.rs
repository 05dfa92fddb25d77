//! A legacy reconciler installation (the reference fixtures plus the other objects the reconciler
//! left), and the checks that a takeover lost nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use cp_api::{ConnectivityProxy, ServiceMapping};
use cp_tests::cluster::ensure_namespace;
use cp_tests::manifest;
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::common::{fixture, install_our_crds};

pub const NS: &str = "kyma-system";
pub const DOMAIN: &str = "legacy.kyma.example.com";

/// uid and spec of each pre-existing mapping.
pub type MappingSnapshot = BTreeMap<String, (String, serde_json::Value)>;

/// Installs the CRDs and a legacy installation; returns the mappings as they were.
pub async fn legacy_cluster(admin: &Client) -> MappingSnapshot {
    install_our_crds(admin).await;
    cp_tests::fixtures::apply(
        admin,
        &[cp_tests::fixtures::ISTIO_CRDS, cp_tests::fixtures::BTP_CRDS],
        None,
    )
    .await
    .expect("CRDs");
    for ns in [NS, "istio-system"] {
        ensure_namespace(admin, ns).await.expect("namespace");
    }
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shoot-info", "namespace": "kube-system"}, "data": {"domain": DOMAIN}});
    manifest::apply_object(admin, serde_json::from_value(cm).expect("cm"), None)
        .await
        .expect("shoot-info");
    cp_tests::fixtures::apply(admin, &cp_tests::fixtures::LEGACY_INSTALL, Some(NS))
        .await
        .expect("legacy fixture");
    let extras = cp_tests::fakes::legacy_extras_yaml(NS);
    manifest::apply_yaml(admin, &extras, Some(NS))
        .await
        .expect("legacy extras");
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let mut snapshot = BTreeMap::new();
    for i in 0..5 {
        let m = ServiceMapping {
            metadata: ObjectMeta {
                name: Some(format!("legacy-mapping-{i}")),
                labels: Some([("owner".to_string(), "team-erp".to_string())].into_iter().collect()),
                ..Default::default()
            },
            spec: serde_json::from_value(json!({"type": "RFC", "serviceId": format!("erp-{i}"), "subaccountId": "00000000-0000-0000-0000-000000000000",
                "internalAddress": format!("erp-{i}.erp:3300"), "locationIds": ["loc1"]}))
            .expect("spec"),
            status: None,
        };
        let created = api
            .create(&PostParams::default(), &m)
            .await
            .expect("legacy mapping");
        snapshot.insert(
            created.name_any(),
            (
                created.uid().unwrap_or_default(),
                serde_json::to_value(&created.spec).expect("json"),
            ),
        );
    }
    snapshot
}

/// Everything the takeover must have achieved.
pub async fn assert_taken_over(admin: &Client, before: &MappingSnapshot, http_port: i64) {
    let cr: ConnectivityProxy = Api::namespaced(admin.clone(), NS)
        .get("connectivity-proxy")
        .await
        .expect("CR");
    let cfg = serde_json::to_value(&cr.spec.config).expect("json");
    assert_eq!(
        cfg["servers"]["businessDataTunnel"]["externalHost"], "cp.legacy.kyma.example.com",
        "legacy host imported"
    );
    assert_eq!(cfg["subaccountId"], "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f");
    assert_eq!(cfg["subaccountSubdomain"], "legacy-subdomain");
    assert_eq!(cfg["servers"]["proxy"]["http"]["port"], http_port);
    assert_eq!(cfg["servers"]["proxy"]["rfcAndLdap"]["port"], 20001);
    assert_eq!(cfg["servers"]["proxy"]["socks5"]["port"], 20004);
    assert_eq!(cfg["servers"]["proxy"]["socks5"]["enabled"], true);
    let ann = cr.annotations();
    assert_eq!(
        ann.get("connectivityproxy.sap.com/legacy-migration")
            .map(String::as_str),
        Some("done")
    );
    assert!(
        ann.contains_key("connectivityproxy.sap.com/legacy-config-imported"),
        "the import is recorded"
    );

    let backups: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "connectivity-proxy-backup");
    let b = backups
        .get("connectivity-proxy")
        .await
        .expect("backup of the config");
    let original =
        std::fs::read_to_string(fixture(cp_tests::fixtures::LEGACY_CONFIG)).expect("fixture");
    let original: serde_json::Value = serde_yaml::from_str(&original).expect("yaml");
    assert_eq!(
        b.data
            .unwrap_or_default()
            .get("connectivity-proxy-config.yml")
            .map(String::as_str),
        original["data"]["connectivity-proxy-config.yml"].as_str(),
        "the backup holds the legacy config byte for byte"
    );
    backups
        .get("connectivity-proxy-info")
        .await
        .expect("backup of the info");

    let mappings: Api<ServiceMapping> = Api::all(admin.clone());
    for (name, (uid, spec)) in before {
        let m = mappings.get(name).await.expect("mapping survives");
        assert_eq!(
            m.uid().as_deref(),
            Some(uid.as_str()),
            "{name} was recreated"
        );
        assert_eq!(
            &serde_json::to_value(&m.spec).expect("json"),
            spec,
            "{name} spec changed"
        );
        assert_eq!(
            m.labels().get("kyma-project.io/module").map(String::as_str),
            Some("connectivity-proxy"),
            "{name} taken over"
        );
        assert_eq!(
            m.labels().get("owner").map(String::as_str),
            Some("team-erp"),
            "{name} user label kept"
        );
    }
    for (ar, name) in [
        (
            ("networking.istio.io", "v1", "Gateway", "gateways"),
            "kyma-gateway-cc",
        ),
        (
            (
                "networking.istio.io",
                "v1",
                "VirtualService",
                "virtualservices",
            ),
            "cc-proxy",
        ),
        (
            ("apps", "v1", "Deployment", "deployments"),
            "connectivity-proxy-sm-operator",
        ),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            NS,
            &kube::api::ApiResource {
                group: ar.0.into(),
                version: ar.1.into(),
                api_version: format!("{}/{}", ar.0, ar.1),
                kind: ar.2.into(),
                plural: ar.3.into(),
            },
        );
        assert!(
            api.get_opt(name).await.expect("get").is_none(),
            "legacy {} {name} still there",
            ar.2
        );
    }
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), NS);
    let sts = sts.get("connectivity-proxy").await.expect("StatefulSet");
    assert_eq!(
        sts.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("connectivity-proxy-operator")
    );
    let cm: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), NS);
    let yml = cm
        .get("connectivity-proxy")
        .await
        .expect("config")
        .data
        .unwrap_or_default()
        .get("connectivity-proxy-config.yml")
        .cloned()
        .unwrap_or_default();
    assert!(
        yml.contains("externalHost: cp.legacy.kyma.example.com"),
        "{yml}"
    );
}

/// Creates the module's default CR.
pub async fn create_default_cr(admin: &Client) {
    let cr: ConnectivityProxy =
        serde_json::from_value(crate::common::default_cr("connectivity-proxy")).expect("cr");
    Api::<ConnectivityProxy>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &cr)
        .await
        .expect("create CR");
}

/// A step of the migration, told by the mark it leaves on the CR.
pub type Step = (&'static str, fn(&ConnectivityProxy) -> bool);

/// The migration's steps in order.
pub const STEPS: [Step; 3] = [
    ("migration started", |cr| {
        cr.annotations()
            .contains_key(cp_controller::migration::MIGRATION_ANNOTATION)
    }),
    ("configuration imported", |cr| {
        cr.annotations()
            .contains_key(cp_controller::migration::IMPORTED_ANNOTATION)
    }),
    ("migration done", |cr| {
        cr.annotations()
            .get(cp_controller::migration::MIGRATION_ANNOTATION)
            .map(String::as_str)
            == Some("done")
    }),
];

/// Waits until the CR carries the mark of `step`; while it does not, shows the CR's status.
pub async fn wait_step(admin: &Client, (what, reached): Step, within: Duration) {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    cp_tests::wait::until(what, within, || {
        let api = api.clone();
        async move {
            let cr = api
                .get("connectivity-proxy")
                .await
                .map_err(|e| e.to_string())?;
            if reached(&cr) {
                Ok(Some(()))
            } else {
                Err(format!("{:?}", cr.status.and_then(|s| s.description)))
            }
        }
    })
    .await
    .expect(what);
}

/// Waits for the migration to finish, then plays the BTP operator and the kubelet until Ready.
pub async fn finish(admin: &Client) {
    wait_step(admin, STEPS[2], Duration::from_secs(30)).await;
    crate::support::make_ready(admin, NS, "connectivity-proxy").await;
}
