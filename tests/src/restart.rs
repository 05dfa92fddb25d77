//! Checks shared by the restart tests: nothing lost, both processes still the same, the webhook's
//! watch resumed. They panic on failure: they are for tests.

use std::time::Duration;

use cp_api::ServiceMapping;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use crate::ControlPlane;
use crate::legacy::{MappingSnapshot, snapshot};

/// uid and spec of every ServiceMapping.
pub async fn mappings(admin: &Client) -> MappingSnapshot {
    snapshot(
        Api::<ServiceMapping>::all(admin.clone())
            .list(&ListParams::default())
            .await
            .expect("list mappings")
            .items,
    )
}

/// Every mapping's serviceId is in the ConfigMap the Connectivity Proxy reads.
pub async fn assert_mappings_published(admin: &Client, expected: &MappingSnapshot) {
    let what = "every ServiceMapping in the published ConfigMap";
    crate::wait::until(what, Duration::from_secs(30), || async {
        let data = crate::support::published_mappings(admin, cp_api::names::KYMA_SYSTEM).await?;
        let missing: Vec<String> = expected
            .values()
            .filter_map(|(_, spec)| spec["serviceId"].as_str())
            .filter(|id| !data.contains(&format!("\"{id}\"")))
            .map(str::to_string)
            .collect();
        if missing.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("missing {missing:?}"))
        }
    })
    .await
    .expect("published");
}

/// Waits until the webhook refuses a duplicate of mapping `name`: its cache has seen the mapping.
pub async fn wait_duplicate_refused(admin: &Client, name: &str) {
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let original = api.get(name).await.expect("mapping");
    let mut probe = ServiceMapping::new(&format!("{name}-duplicate"), original.spec.clone());
    probe.metadata.labels = None;
    crate::wait::until(
        &format!("the webhook refuses a duplicate of {name}"),
        Duration::from_secs(30),
        || async {
            let pp = PostParams {
                dry_run: true,
                ..Default::default()
            };
            match api.create(&pp, &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains("already maps") => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("duplicate refused");
}

/// The process answers `/healthz` on the address it started with and never logged an exit.
pub async fn assert_alive(cp: &ControlPlane, metrics_addr: &str, name: &str) {
    let (code, _) = crate::webhook::http_get(metrics_addr, "/healthz")
        .await
        .unwrap_or_else(|e| panic!("{name} /healthz: {e:#}\n{}", cp.log_tail(name, 30)));
    assert_eq!(code, 200, "{name} /healthz");
    let log = std::fs::read_to_string(cp.dir.join(format!("{name}.log"))).unwrap_or_default();
    assert!(
        !log.contains("exiting"),
        "{name} logged an exit:\n{}",
        cp.log_tail(name, 30)
    );
}

/// The controller answers `/healthz` and never logged an exit ([`assert_alive`]), and the webhook
/// answers `/readyz` with 200; `after` says after what (for the failure message).
pub async fn assert_both_alive(
    cp: &ControlPlane,
    controller: &crate::controller::ControllerProcess,
    webhook: &crate::webhook::Webhook,
    after: &str,
) {
    assert_alive(cp, &controller.metrics_addr, &controller.name).await;
    let (code, _) = webhook
        .metrics_get("/readyz")
        .await
        .expect("webhook /readyz");
    assert_eq!(code, 200, "webhook ready after {after}");
}

/// Starts controller `cp-controller` for a restart test: resyncing every 5 s, and leaving the webhook's
/// certificates alone (the test webhook serves its own).
pub async fn start_controller(cp: &ControlPlane) -> crate::controller::ControllerProcess {
    crate::controller::ControllerProcess::start(
        cp,
        "cp-controller",
        // A Lease longer than a restart of the API server on a loaded machine: these tests are about
        // recovering without a restart of the controller (losing the Lease exits, as a pod would).
        &[
            "--resync-seconds=5",
            "--manage-webhook-certs=false",
            "--lease-seconds=60",
        ],
    )
    .await
    .expect("controller")
}
