//! Upgrade from the legacy reconciler installation, then an upgrade of the operator itself.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::ConnectivityProxy;
use cp_tests::controller::ControllerProcess;
use cp_tests::support::CR;
use cp_tests::{legacy, support};
use kube::api::Api;

#[tokio::test]
async fn legacy_install_is_taken_over_then_the_operator_is_upgraded() {
    let (cp, admin, before) = legacy::legacy_control_plane().await;
    ControllerProcess::start(&cp, "controller-v1", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::create_default_cr(&admin).await;
    legacy::finish(&admin).await;
    legacy::assert_taken_over(&admin, &before, 20003).await;

    // A user edits spec.config; then the operator is upgraded (restarted with newer defaults).
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), legacy::NS);
    support::set_http_port(&admin, legacy::NS, "connectivity-proxy", 20777).await;
    // An SRE lowers the open-files limit once v1 has recorded its defaults (before, v1's first
    // reconcile would still be the one writing spec.deployment).
    let (key, what) = (
        cp_api::keys::DEFAULTS_VALUES_ANNOTATION,
        "v1's defaults recorded on the CR",
    );
    cp_tests::wait::until_annotated(&api, CR, key, what, Duration::from_secs(20))
        .await
        .expect("v1 stamped");
    api.patch(
        "connectivity-proxy",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!(
            {"spec": {"deployment": {"resources": {"maxFileDescriptorCount": 20000}}}}
        )),
    )
    .await
    .expect("the SRE's change");
    cp.kill_process("controller-v1").expect("stop v1");
    ControllerProcess::start(
        &cp,
        "controller-v2",
        &[
            "--leader-elect=false",
            r#"--deployment-defaults-override={"image":{"tag":"2.99.0"},"replicaCount":2}"#,
        ],
    )
    .await
    .expect("controller v2");
    let what = "spec.deployment moves to the new release's defaults";
    let cr = cp_tests::wait::until_object(&api, CR, what, Duration::from_secs(20), |cr| {
        let d = serde_json::to_value(&cr.spec.deployment).map_err(|e| e.to_string())?;
        if d["image"]["tag"] == "2.99.0" && d["replicaCount"] == 2 {
            Ok(Some(cr))
        } else {
            Err(d.to_string())
        }
    })
    .await
    .expect("upgraded");
    assert_eq!(
        serde_json::to_value(&cr.spec.config).expect("json")["servers"]["proxy"]["http"]["port"],
        20777,
        "the user's edit survives the upgrade"
    );
    // The untouched defaults moved (above); the SRE's field stayed, and the status says so.
    assert_eq!(
        serde_json::to_value(&cr.spec.deployment).expect("json")["resources"]["maxFileDescriptorCount"],
        20000,
        "the SRE's change survives the upgrade"
    );
    cp_tests::support::wait_kept_deployment_fields(
        &api,
        "connectivity-proxy",
        &["spec.deployment.resources.maxFileDescriptorCount"],
    )
    .await
    .expect("kept field in the status");
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(admin.clone(), legacy::NS);
    let what = "the StatefulSet runs the new image";
    cp_tests::wait::until_object(&sts, CR, what, Duration::from_secs(20), |s| {
        let image = s
            .spec
            .template
            .spec
            .and_then(|p| p.containers.first().and_then(|c| c.image.clone()))
            .unwrap_or_default();
        if image.ends_with(":2.99.0") {
            Ok(Some(()))
        } else {
            Err(image)
        }
    })
    .await
    .expect("new image");
    legacy::assert_taken_over(&admin, &before, 20777).await;
}
