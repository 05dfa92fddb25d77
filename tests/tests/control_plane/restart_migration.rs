//! A legacy takeover with the API server SIGKILLed and restarted as soon as the migration starts, and
//! etcd as soon as the configuration is imported: the controller and the webhook recover by
//! themselves, the takeover completes, and nothing is lost.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_tests::{legacy, restart, shared};

#[tokio::test]
async fn api_server_and_etcd_restarts_during_a_legacy_migration_lose_nothing() {
    let (cp, admin, before) = legacy::legacy_control_plane().await;
    let webhook = shared::webhook().await;
    let controller = restart::start_controller(&cp).await;
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
    restart::assert_mappings_published(&admin, &before).await;
    restart::assert_both_alive(&cp, &controller, webhook, "the restarts").await;
    let any = before.keys().next().expect("a legacy mapping").clone();
    restart::wait_duplicate_refused(&admin, &any).await;
}
