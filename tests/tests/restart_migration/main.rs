//! A legacy takeover with the API server SIGKILLed and restarted as soon as the migration starts, and
//! etcd as soon as the configuration is imported: the controller and the webhook recover by
//! themselves, the takeover completes, and nothing is lost.
#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../e2e/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "../legacy/mod.rs"]
mod legacy;
#[allow(dead_code)]
#[path = "../restart/mod.rs"]
mod restart_support;
#[allow(dead_code)]
#[path = "../controller/support.rs"]
mod support;

use std::time::Duration;

use cp_tests::controller::ControllerProcess;

#[tokio::test]
async fn api_server_and_etcd_restarts_during_a_legacy_migration_lose_nothing() {
    let cp = common::control_plane();
    let admin = cp.admin().await.expect("admin");
    let before = legacy::legacy_cluster(&admin).await;
    let webhook = common::webhook().await;
    let controller = ControllerProcess::start(
        &cp,
        "cp-controller",
        &[
            "--resync-seconds=5",
            // The test webhook serves its own certificate.
            "--manage-webhook-certs=false",
        ],
    )
    .await
    .expect("controller");
    legacy::create_default_cr(&admin).await;

    for (component, step) in [
        ("kube-apiserver", legacy::STEPS[0]),
        ("etcd", legacy::STEPS[1]),
    ] {
        legacy::wait_step(&admin, step, Duration::from_secs(60)).await;
        let away = cp.restart(component).await.expect("restart");
        println!(
            "{component} SIGKILLed right after: {}; API server ready again after {away:?}",
            step.0
        );
    }
    legacy::finish(&admin).await;
    legacy::assert_taken_over(&admin, &before, 20003).await;
    restart_support::assert_mappings_published(&admin, &before).await;
    restart_support::assert_alive(&cp, &controller.metrics_addr, "cp-controller").await;
    let (code, _) = webhook
        .metrics_get("/readyz")
        .await
        .expect("webhook /readyz");
    assert_eq!(code, 200, "webhook ready after the restarts");
    let any = before.keys().next().expect("a legacy mapping").clone();
    restart_support::wait_duplicate_refused(&admin, &any).await;
}
