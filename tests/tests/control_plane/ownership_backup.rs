//! A forged migration backup: an object under the takeover's backup name that the controller cannot
//! prove it wrote (its labels, no HMAC over its data) is neither restored from nor overwritten; the
//! takeover waits with the object named, and goes on once it is removed.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::keys::{
    BACKUP_NAMESPACE, BACKUP_OF_ANNOTATION, IMPORTED_ANNOTATION, MIGRATION_ANNOTATION,
    OWNERSHIP_PROOF_ANNOTATION, TAKEOVER_ID_ANNOTATION, backup_name,
};
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::controller::ControllerProcess;
use cp_tests::support::CR;
use cp_tests::{fixtures, legacy};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const ID: &str = "forged1";

#[tokio::test]
async fn a_forged_backup_is_never_restored_from_nor_overwritten() {
    let (cp, admin, before) = legacy::legacy_control_plane().await;
    let _controller = ControllerProcess::start(&cp, "cp-controller", &["--leader-elect=false"])
        .await
        .expect("controller");
    // The key exists before the forgery: nothing created after it is adopted without a proof.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::present(
        &secrets,
        names::OWNERSHIP_KEY_SECRET,
        Duration::from_secs(20),
    )
    .await
    .expect("the ownership key Secret");
    // Objects of the key's own second count as older than the key (timestamps have whole seconds):
    // the forgery comes later.
    let key = secrets.get(names::OWNERSHIP_KEY_SECRET).await.expect("key");
    cp_tests::wait::a_second_past(&key.metadata).await;

    // Someone who may write ConfigMaps in kyma-system plants this takeover's backup, labelled.
    let name = backup_name(names::CONFIGMAP_CONFIG, ID);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), BACKUP_NAMESPACE);
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": names::managed_labels(),
            "annotations": {BACKUP_OF_ANNOTATION: "kyma-system/connectivity-proxy",
                TAKEOVER_ID_ANNOTATION: ID}},
        "data": {names::CONFIGMAP_CONFIG_KEY: "servers: {proxy: {http: {port: 31337}}}"}}))
    .expect("configmap");
    cms.create(&PostParams::default(), &forged)
        .await
        .expect("forged backup");
    // A takeover that has started (as after a crash right after its first step) with that id.
    let mut cr = fixtures::default_connectivity_proxy("connectivity-proxy");
    cr.metadata.annotations = Some(
        [
            (MIGRATION_ANNOTATION.to_string(), "in-progress".to_string()),
            (TAKEOVER_ID_ANNOTATION.to_string(), ID.to_string()),
        ]
        .into(),
    );
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), legacy::NS);
    crs.create(&PostParams::default(), &cr).await.expect("CR");

    let what = "the takeover waits, naming the forged backup";
    let cr = cp_tests::wait::until_object(&crs, CR, what, Duration::from_secs(30), |cr| {
        let st = cr.status.clone().unwrap_or_default();
        if st.state == Some(State::Warning)
            && st.conditions.iter().any(|c| c.reason == "ObjectNotOwned")
        {
            Ok(Some(cr))
        } else {
            Err(format!("{:?}: {:?}", st.state, st.description))
        }
    })
    .await
    .unwrap_or_else(cp.panic_with_log("cp-controller", 40));
    let msg = cr
        .status
        .clone()
        .and_then(|s| s.description)
        .unwrap_or_default();
    assert!(
        msg.contains(&format!("ConfigMap kyma-system/{name}")),
        "{msg}"
    );
    assert!(
        !cr.annotations().contains_key(IMPORTED_ANNOTATION),
        "nothing imported while the backup name is taken"
    );
    assert_ne!(
        serde_json::to_value(&cr.spec).expect("json")["config"]["servers"]["proxy"]["http"]["port"],
        31337,
        "the forged data never reaches the CR"
    );
    let kept = cms.get(&name).await.expect("forged backup");
    assert_eq!(kept.data, forged.data, "never overwritten");

    // Once it is removed, the takeover writes its own backup (with a proof) and completes.
    cms.delete(&name, &DeleteParams::default())
        .await
        .expect("remove the forged backup");
    // (The takeover looks again within its 30 s recheck: the backup is not watched.)
    legacy::wait_step(&admin, legacy::STEPS[2], Duration::from_secs(60)).await;
    cp_tests::support::make_ready(&admin, legacy::NS, "connectivity-proxy").await;
    legacy::assert_taken_over(&admin, &before, 20003).await;
    let own = cms.get(&name).await.expect("the operator's backup");
    assert!(
        own.annotations().contains_key(OWNERSHIP_PROOF_ANNOTATION),
        "{:?}",
        own.annotations()
    );
}
