//! The takeover previewed and blocked: `migrate-plan` on a clean cluster and on a legacy one (read-only,
//! proved with the audit log); a blocker reaches the CR's status with its fix while the legacy
//! installation stays untouched; fixed, the takeover completes.
#![forbid(unsafe_code)]

use std::time::Duration;

use cp_api::{ConnectivityProxy, State};
use cp_tests::controller::ControllerProcess;
use cp_tests::{fixtures, legacy, shared};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;

#[tokio::test]
async fn migrate_plan_previews_and_a_blocker_stops_the_takeover_until_fixed() {
    let cp = shared::control_plane();
    let admin = cp.admin().await.expect("admin");
    fixtures::install_our_crds(&admin).await;

    let (code, out) = legacy::migrate_plan(&cp, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to take over"), "{out}");

    let before = legacy::legacy_cluster(&admin).await;
    let (code, out) = legacy::migrate_plan(&cp, &[]).await;
    assert_eq!(code, 0, "ready: {out}");
    assert!(
        out.contains("subaccountId: \"3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f\""),
        "the import as YAML: {out}"
    );
    assert!(out.contains("Ready: the takeover can proceed"), "{out}");
    legacy::set_legacy_info_port(&admin, "70000").await;
    let (code, out) = legacy::migrate_plan(&cp, &[]).await;
    assert_eq!(code, 2, "blocked: {out}");
    assert!(
        out.contains("connectivity-proxy-info") && out.contains("70000"),
        "{out}"
    );
    assert!(
        out.contains("ValidatingWebhookConfiguration webhook-secret"),
        "{out}"
    );
    let (code, json) = legacy::migrate_plan(&cp, &["--output", "json"]).await;
    assert_eq!(code, 2, "{json}");
    let plan: serde_json::Value = serde_json::from_str(&json).expect("json output");
    assert_eq!(
        plan["delete"][0],
        "ValidatingWebhookConfiguration webhook-secret"
    );
    assert_eq!(
        plan["mappings"].as_array().map(Vec::len),
        Some(before.len())
    );
    assert_eq!(plan["blockers"].as_array().map(Vec::len), Some(1), "{json}");

    ControllerProcess::start(&cp, "controller", &["--leader-elect=false"])
        .await
        .expect("controller");
    legacy::create_default_cr(&admin).await;
    wait_blocked_naming(&admin, &["70000", "connectivity-proxy-info"]).await;
    // Untouched: the legacy StatefulSet and the legacy ServiceMapping validator are still there.
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), legacy::NS)
        .get("connectivity-proxy")
        .await
        .expect("sts");
    // As the fixture has it: the reconciler's disclaimer, not the operator's label.
    let labels = sts.metadata.labels.clone().unwrap_or_default();
    let annotations = sts.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("reconciler.kyma-project.io/managed-by-reconciler-disclaimer")
            && !labels.contains_key("app.kubernetes.io/managed-by"),
        "the legacy StatefulSet was touched: {labels:?} {annotations:?}"
    );
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get("webhook-secret")
        .await
        .expect("legacy webhook kept");

    legacy::set_legacy_info_port(&admin, "20003").await;
    // Another blocker: a legacy key spec.config cannot express, named with the fix; removed, the
    // takeover resumes by itself.
    legacy::edit_legacy_config(&admin, |y| format!("{y}legacyOnlyFlag: true\n")).await;
    let msg = wait_blocked_naming(&admin, &["legacyOnlyFlag"]).await;
    assert!(msg.contains("cannot express"), "{msg}");
    legacy::edit_legacy_config(&admin, |y| y.replace("legacyOnlyFlag: true\n", "")).await;
    legacy::finish(&admin).await;
    legacy::assert_taken_over(&admin, &before, 20003).await;
    let (code, out) = legacy::migrate_plan(&cp, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to take over"), "{out}");
}

/// Waits until the CR is in Warning, reason LegacyMigrationBlocked, with a message naming every needle.
async fn wait_blocked_naming(admin: &kube::Client, needles: &[&str]) -> String {
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), legacy::NS);
    cp_tests::wait::until_object(
        &crs,
        "connectivity-proxy",
        &format!("Warning LegacyMigrationBlocked naming {needles:?}"),
        Duration::from_secs(40),
        |cr| {
            let st = cr.status.unwrap_or_default();
            let blocked = st
                .conditions
                .iter()
                .any(|c| c.reason == "LegacyMigrationBlocked");
            let msg = st.description.unwrap_or_default();
            if st.state == Some(State::Warning)
                && blocked
                && needles.iter().all(|n| msg.contains(n))
            {
                Ok(Some(msg))
            } else {
                Err(format!("{:?}: {msg}", st.state))
            }
        },
    )
    .await
    .expect("blocked")
}
