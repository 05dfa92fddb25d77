//! The API server, then etcd, SIGKILLed and restarted right after a CR edit, while the controller
//! reconciles it: the controller (leader election on, default 15 s lease) and the webhook recover by
//! themselves, without a restart of their own; the edit lands; no ServiceMapping and no user field is
//! lost.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::{ConnectivityProxy, ServiceMapping};
use cp_tests::support::{self, NS};
use cp_tests::{fixtures, restart, shared};
use kube::api::Api;
use serde_json::json;

const MAPPINGS: usize = 20;

#[tokio::test]
async fn api_server_and_etcd_restarts_during_reconcile_lose_nothing() {
    let cp = shared::control_plane();
    let admin = cp.admin().await.expect("admin");
    fixtures::install_our_crds(&admin).await;
    for ns in [NS, "istio-system"] {
        cp_tests::cluster::ensure_namespace(&admin, ns)
            .await
            .expect("namespace");
    }
    support::install_istio(&admin).await;
    support::install_btp(&admin).await;
    support::set_domain(&admin, Some(support::DOMAIN)).await;
    let webhook = shared::webhook().await;
    let controller = restart::start_controller(&cp).await;

    support::create_default_cr(&admin, NS, "connectivity-proxy").await;
    for i in 0..MAPPINGS {
        support::create_mapping(&admin, &format!("restart-{i}")).await;
    }
    support::make_ready(&admin, NS, "connectivity-proxy").await;
    let mappings_before = restart::mappings(&admin).await;
    assert_eq!(mappings_before.len(), MAPPINGS);

    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    for (round, component, port) in [(0, "kube-apiserver", 20551), (1, "etcd", 20552)] {
        let spec_before = crs.get("connectivity-proxy").await.expect("CR").spec;
        support::set_http_port(&admin, NS, "connectivity-proxy", port).await;
        let away = cp.restart(component).await.expect("restart");
        println!(
            "{component} SIGKILLed right after the edit; the API server was ready again after {away:?}"
        );

        support::wait_info_port(
            &admin,
            NS,
            "connectivity-proxy",
            port,
            &format!("the edit after the {component} restart reaches the ConfigMap"),
            Duration::from_secs(60),
        )
        .await;
        support::play_until_ready(&admin, NS, "connectivity-proxy").await;

        // No user field lost: the spec is the old one plus the edit.
        let mut expected = serde_json::to_value(&spec_before).expect("json");
        expected["config"]["servers"]["proxy"]["http"]["port"] = json!(port);
        let spec_after = crs.get("connectivity-proxy").await.expect("CR").spec;
        assert_eq!(
            serde_json::to_value(&spec_after).expect("json"),
            expected,
            "the CR spec after the {component} restart"
        );
        // No ServiceMapping lost or replaced.
        assert_eq!(
            restart::mappings(&admin).await,
            mappings_before,
            "ServiceMappings (uid and spec) after the {component} restart"
        );
        restart::assert_mappings_published(&admin, &mappings_before).await;

        // The webhook's watch resumed: a mapping created now is known to it (its duplicate is refused).
        let fresh = format!("after-restart-{round}");
        support::create_mapping(&admin, &fresh).await;
        restart::wait_duplicate_refused(&admin, &fresh).await;
        Api::<ServiceMapping>::all(admin.clone())
            .delete(&fresh, &Default::default())
            .await
            .expect("delete the probe mapping");

        // Neither process restarted: both still answer on the addresses they started with.
        let after = format!("the {component} restart");
        restart::assert_both_alive(&cp, &controller, webhook, &after).await;
    }
}
