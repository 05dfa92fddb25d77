//! The legacy takeover with the controller SIGKILLed between every two steps: the final state is the
//! same and nothing is lost.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_tests::controller::ControllerProcess;
use cp_tests::legacy;

#[tokio::test]
async fn migration_resumes_after_a_kill_between_every_two_steps() {
    let (cp, admin, before) = legacy::legacy_control_plane().await;
    legacy::create_default_cr(&admin).await;
    // Each step leaves a mark; the controller is killed as soon as the mark appears.
    for (i, step) in legacy::STEPS.into_iter().enumerate() {
        let name = format!("controller-run-{i}");
        ControllerProcess::start(&cp, &name, &["--leader-elect=false"])
            .await
            .expect("controller");
        legacy::wait_step(&admin, step, Duration::from_secs(20)).await;
        cp.kill_process(&name).expect("SIGKILL");
        println!("killed the controller right after: {}", step.0);
    }
    ControllerProcess::start(&cp, "controller-final", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::finish(&admin).await;
    legacy::assert_taken_over(&admin, &before, 20003).await;
}
