//! The legacy takeover with the controller SIGKILLed between every two steps: the final state is the
//! same and nothing is lost.
#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../e2e/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "../legacy/mod.rs"]
mod legacy;
#[allow(dead_code)]
#[path = "../controller/support.rs"]
mod support;

use std::time::Duration;

use cp_api::ConnectivityProxy;
use cp_tests::controller::ControllerProcess;
use kube::ResourceExt;
use kube::api::Api;

#[tokio::test]
async fn migration_resumes_after_a_kill_between_every_two_steps() {
    let cp = common::control_plane();
    let admin = cp.admin().await.expect("admin");
    let before = legacy::legacy_cluster(&admin).await;
    legacy::create_default_cr(&admin).await;
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), legacy::NS);
    // Each step leaves a mark; the controller is killed as soon as the mark appears.
    type Mark = fn(&ConnectivityProxy) -> bool;
    let steps: [(&str, Mark); 3] = [
        ("migration started", |cr| {
            cr.annotations()
                .contains_key("connectivityproxy.sap.com/legacy-migration")
        }),
        ("configuration imported", |cr| {
            cr.annotations()
                .contains_key("connectivityproxy.sap.com/legacy-config-imported")
        }),
        ("migration done", |cr| {
            cr.annotations()
                .get("connectivityproxy.sap.com/legacy-migration")
                .map(String::as_str)
                == Some("done")
        }),
    ];
    for (i, (step, reached)) in steps.iter().enumerate() {
        let name = format!("controller-run-{i}");
        ControllerProcess::start(&cp, &name, &["--leader-elect=false"])
            .await
            .expect("controller");
        cp_tests::wait::until(step, Duration::from_secs(20), || {
            let api = api.clone();
            async move {
                let cr = api
                    .get("connectivity-proxy")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(reached(&cr).then_some(()))
            }
        })
        .await
        .expect("step reached");
        cp.kill_process(&name).expect("SIGKILL");
        println!("killed the controller right after: {step}");
    }
    ControllerProcess::start(&cp, "controller-final", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::finish(&admin).await;
    legacy::assert_taken_over(&admin, &before, 20003).await;
}
