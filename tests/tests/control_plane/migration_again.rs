//! Shared tenant mode keeps the user's service key; a rollback to a changed legacy installation and a
//! second takeover import the legacy ConfigMap as it is then, with the first takeover's backups kept.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::ConnectivityProxy;
use cp_tests::controller::ControllerProcess;
use cp_tests::legacy;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const CR: &str = "connectivity-proxy";

async fn config_of(admin: &kube::Client) -> serde_json::Value {
    let cr = Api::<ConnectivityProxy>::namespaced(admin.clone(), legacy::NS)
        .get(CR)
        .await
        .expect("CR");
    serde_json::to_value(&cr.spec).expect("json")
}

#[tokio::test]
async fn shared_tenant_key_is_kept_and_a_second_takeover_imports_the_current_legacy_config() {
    let (cp, admin, before) = legacy::legacy_control_plane().await;
    legacy::edit_legacy_config(&admin, |y| {
        y.replace("tenantMode: dedicated", "tenantMode: shared")
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), legacy::NS);
    // The user's key names the Connectivity CA endpoint: served on loopback here.
    let now = time::OffsetDateTime::now_utc();
    let ca = cp_certs::Ca::generate(
        "Connectivity CA",
        now,
        now + time::Duration::days(1),
        Default::default(),
    )
    .expect("CA");
    let (url, _server) = cp_tests::serve_static(ca.cert_pem)
        .await
        .expect("CA endpoint");
    let key = json!({"clientid": "legacy-client", "clientsecret": "legacy-secret-value",
        "subaccount_id": "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f", "subaccount_subdomain": "legacy-subdomain",
        "uaadomain": cp_tests::CA_ENDPOINT_UAADOMAIN,
        "connectivity_service": {"CAs_path": "/api/v1/CAs", "url": url}});
    secrets
        .patch(
            "connectivity-proxy-service-key",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"service_key": key.to_string()}})),
        )
        .await
        .expect("the user's key");
    let key_before = secrets
        .get("connectivity-proxy-service-key")
        .await
        .expect("legacy key")
        .data;

    ControllerProcess::start(&cp, "controller-1", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::create_default_cr(&admin).await;
    legacy::wait_step(&admin, legacy::STEPS[2], Duration::from_secs(30)).await;
    cp_tests::fakes::play_until_ready(&admin, legacy::NS, CR, None, Duration::from_secs(60))
        .await
        .expect("Ready");
    let spec = config_of(&admin).await;
    assert_eq!(spec["config"]["tenantMode"], "shared");
    assert_eq!(
        spec["secretConfig"]["integration"]["connectivityService"]["secretName"],
        "connectivity-proxy-service-key",
        "the CR uses the user's key"
    );
    let key = secrets
        .get("connectivity-proxy-service-key")
        .await
        .expect("the user's key is kept");
    assert_eq!(key.data, key_before, "the user's key is unchanged");
    assert!(
        !key.labels().contains_key("app.kubernetes.io/managed-by"),
        "not taken by the operator"
    );
    let backup_secrets: Api<Secret> =
        Api::namespaced(admin.clone(), cp_api::keys::BACKUP_NAMESPACE);
    let backed_up = backup_secrets
        .list(&ListParams::default())
        .await
        .expect("backups")
        .items;
    assert!(
        backed_up.iter().any(|s| s
            .name_any()
            .starts_with("connectivity-proxy-service-key-backup-")
            && s.data == key_before),
        "the key is backed up"
    );
    for (name, (uid, _)) in &before {
        let m = Api::<cp_api::ServiceMapping>::all(admin.clone())
            .get(name)
            .await
            .expect("mapping");
        assert_eq!(m.uid().as_deref(), Some(uid.as_str()));
    }

    // Roll back to the legacy installation, as disabling the module and the reconciler would: the CR
    // and the operator's objects go, the reconciler renders its chart again with changed values.
    cp.kill_process("controller-1")
        .expect("stop the controller");
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), legacy::NS);
    crs.patch(
        CR,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("finalizer");
    crs.delete(CR, &DeleteParams::default())
        .await
        .expect("delete CR");
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), legacy::NS);
    // The operator's objects carry an owner reference to the CR: the garbage collector may have
    // removed them already.
    let gone_or_deleted = |r: Result<_, kube::Error>| match r {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("delete: {e}"),
    };
    for name in ["connectivity-proxy", "connectivity-proxy-info"] {
        gone_or_deleted(cms.delete(name, &DeleteParams::default()).await.map(|_| ()));
    }
    gone_or_deleted(
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(admin.clone(), legacy::NS)
            .delete("connectivity-proxy", &DeleteParams::default())
            .await
            .map(|_| ()),
    );
    cp_tests::wait::gone(&cms, "connectivity-proxy", Duration::from_secs(20))
        .await
        .expect("the operator's ConfigMap gone");
    cp_tests::fixtures::apply(
        &admin,
        &cp_tests::fixtures::LEGACY_INSTALL,
        Some(legacy::NS),
    )
    .await
    .expect("legacy again");
    legacy::edit_legacy_config(&admin, |y| {
        y.replace("tenantMode: dedicated", "tenantMode: shared")
            .replace(
                "socks5:\n      enableProxyAuthorization: false",
                "socks5:\n      enableProxyAuthorization: true",
            )
            .replace(
                "  proxy:\n",
                "  proxy:\n    authorization:\n      oauth:\n        allowedClientId: legacy-client\n",
            )
    })
    .await;
    let cm = cms.get("connectivity-proxy").await.expect("legacy config");
    let yml = cp_tests::support::proxy_config_yml(cm);
    assert!(
        yml.contains("enableProxyAuthorization: true"),
        "the edit took: {yml}"
    );

    ControllerProcess::start(&cp, "controller-2", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::create_default_cr(&admin).await;
    legacy::wait_step(&admin, legacy::STEPS[2], Duration::from_secs(30)).await;
    let spec = config_of(&admin).await;
    assert_eq!(spec["config"]["tenantMode"], "shared");
    assert_eq!(
        spec["config"]["servers"]["proxy"]["socks5"]["enableProxyAuthorization"], true,
        "the current legacy value, not the first takeover's backup"
    );
    let backups: Api<ConfigMap> = Api::namespaced(admin.clone(), cp_api::keys::BACKUP_NAMESPACE);
    let configs: Vec<String> = backups
        .list(&ListParams::default())
        .await
        .expect("backups")
        .items
        .iter()
        .map(|c| c.name_any())
        .filter(|n| n.starts_with("connectivity-proxy-backup-"))
        .collect();
    assert_eq!(
        configs.len(),
        2,
        "both takeovers' config backups are kept: {configs:?}"
    );
    legacy::assert_nothing_legacy_left(&admin, true).await;
}
