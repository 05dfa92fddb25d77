//! Ownership that a label cannot forge, on the real API server: an earlier release's labelled objects
//! are adopted once (while the ownership key is new), then only objects with the controller's HMAC
//! proof are written, pruned or deleted with the CR; a labelled object without it is left alone and
//! named in a Warning, and one under a rendered name stops the install with its name.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::keys::{ADOPTING_ANNOTATION, OWNERSHIP_PROOF_ANNOTATION};
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::controller::ControllerProcess;
use cp_tests::shared::control_plane;
use cp_tests::support::{self, NS};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const CR: &str = "connectivity-proxy";

/// The operator's labels for the CR, as anyone who may label a ConfigMap in kyma-system can set them.
fn owner_labels() -> serde_json::Value {
    json!({
        names::LABEL_MANAGED_BY: names::MANAGED_BY_VALUE,
        names::LABEL_MODULE: names::MODULE_VALUE,
        names::LABEL_OWNER_NAME: CR,
        names::LABEL_OWNER_NAMESPACE: NS,
    })
}

fn proof_of(cm: &ConfigMap) -> Option<String> {
    cm.annotations().get(OWNERSHIP_PROOF_ANNOTATION).cloned()
}

/// Waits for a Warning Event with `reason` whose note names `what`.
async fn warning_naming(admin: &kube::Client, reason: &str, what: &str) -> String {
    cp_tests::wait::warning_event(
        admin,
        NS,
        &format!("a Warning {reason} naming {what}"),
        Duration::from_secs(30),
        |e| {
            e.reason.as_deref() == Some(reason)
                && e.note.as_deref().is_some_and(|n| n.contains(what))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test]
async fn only_objects_with_the_ownership_proof_are_written_pruned_or_deleted() {
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    support::prepare_cluster(&admin, "owner.kyma.example.com").await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);

    // An earlier release's object: its labels, no proof (there was no key), created before the key.
    let earlier: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": names::CONFIGMAP_INFO, "labels": owner_labels()},
        "data": {"written-by": "an earlier release"}}))
    .expect("configmap");
    cms.create(&PostParams::default(), &earlier)
        .await
        .expect("an earlier release's ConfigMap");

    let _controller = ControllerProcess::start(&cp, "cp-controller", &["--resync-seconds=3"])
        .await
        .expect("controller");
    let key = cp_tests::wait::until(
        "the ownership key Secret",
        Duration::from_secs(20),
        || async {
            secrets
                .get_opt(names::OWNERSHIP_KEY_SECRET)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .expect("key");
    assert_eq!(
        key.annotations()
            .get(ADOPTING_ANNOTATION)
            .map(String::as_str),
        Some("true"),
        "a new key opens the adoption window"
    );
    support::create_default_cr(&admin, NS, CR).await;
    support::make_ready(&admin, NS, CR).await;

    // Adopted: rewritten with the operator's content and a proof; the window closes once Ready.
    let info = cms.get(names::CONFIGMAP_INFO).await.expect("info");
    assert!(
        proof_of(&info).is_some_and(|p| p.starts_with("v1.")),
        "adopted and stamped: {:?}",
        info.annotations()
    );
    // (Server-side apply keeps a key another field manager set; the operator's keys are applied.)
    let data = info.data.unwrap_or_default();
    assert!(
        data.keys().any(|k| k != "written-by"),
        "the operator's content was applied over the earlier release's: {data:?}"
    );
    cp_tests::wait::until(
        "the adoption window closed",
        Duration::from_secs(20),
        || async {
            let key = cp_tests::wait::get(&secrets, names::OWNERSHIP_KEY_SECRET).await?;
            Ok((!key.annotations().contains_key(ADOPTING_ANNOTATION)).then_some(()))
        },
    )
    .await
    .expect("window closed");
    let key_data = secrets
        .get(names::OWNERSHIP_KEY_SECRET)
        .await
        .expect("key")
        .data;

    // A user's ConfigMap wearing the labels, even with a proof copied from the operator's object: it
    // is not pruned (nothing renders it) and it is named in a Warning.
    let copied = proof_of(&cms.get(names::CONFIGMAP_CONFIG).await.expect("config"));
    let user: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "user-config", "labels": owner_labels(),
            "annotations": {OWNERSHIP_PROOF_ANNOTATION: copied}},
        "data": {"mine": "precious"}}))
    .expect("configmap");
    cms.create(&PostParams::default(), &user)
        .await
        .expect("user ConfigMap");
    let note = warning_naming(
        &admin,
        "UnprovenObjectLeftAlone",
        "ConfigMap kyma-system/user-config",
    )
    .await;
    assert!(note.contains(OWNERSHIP_PROOF_ANNOTATION), "{note}");

    // The object under a rendered name loses its proof and gets someone else's data: the operator
    // does not write over it, stops the install and names it.
    // (Its owner reference goes too: the garbage collector deletes what an owner reference names,
    // whoever set it; the question here is what the controller itself deletes.)
    let forged = json!({"metadata": {"annotations": {OWNERSHIP_PROOF_ANNOTATION: null},
            "ownerReferences": null},
        "data": {"forged": "by a labeller"}});
    cms.patch(
        names::CONFIGMAP_INFO,
        &PatchParams::default(),
        &Patch::Merge(&forged),
    )
    .await
    .expect("forge");
    let cr = support::wait_state(
        &admin,
        NS,
        CR,
        State::Warning,
        Some("ObjectNotOwned"),
        Duration::from_secs(20),
    )
    .await;
    let msg = cr.status.and_then(|s| s.description).unwrap_or_default();
    assert!(
        msg.contains("ConfigMap kyma-system/connectivity-proxy-info")
            && msg.contains("ownership proof"),
        "{msg}"
    );
    let info = cms.get(names::CONFIGMAP_INFO).await.expect("info");
    assert_eq!(
        info.data
            .unwrap_or_default()
            .get("forged")
            .map(String::as_str),
        Some("by a labeller"),
        "never written over"
    );

    // Deleting the CR removes what the operator created, and nothing it cannot prove it created.
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    crs.delete(CR, &DeleteParams::default())
        .await
        .expect("delete CR");
    cp_tests::wait::gone(&crs, CR, Duration::from_secs(30))
        .await
        .expect("the CR gone");
    cp_tests::wait::gone(&cms, names::CONFIGMAP_CONFIG, Duration::from_secs(20))
        .await
        .expect("the operator's own ConfigMap deleted with the CR");
    let user = cms
        .get("user-config")
        .await
        .expect("the user's ConfigMap is kept");
    assert_eq!(
        user.data
            .unwrap_or_default()
            .get("mine")
            .map(String::as_str),
        Some("precious")
    );
    let info = cms
        .get(names::CONFIGMAP_INFO)
        .await
        .expect("the forged ConfigMap is kept");
    assert!(info.data.unwrap_or_default().contains_key("forged"));
    // The key outlives the CR (a new CR's objects are proven with it) and never changed.
    assert_eq!(
        secrets
            .get(names::OWNERSHIP_KEY_SECRET)
            .await
            .expect("key kept")
            .data,
        key_data
    );
}
