//! The ServiceMappings' budget through the real API server: once the mappings' entries fill what the 16
//! ConfigMaps `connectivity-proxy-service-mappings[-1…-15]` can hold together, a new mapping is refused
//! at admission, saying why. A group of its own: it fills the cluster with mappings no other test expects.

use std::time::Duration;

use cp_tests::shared::{control_plane, webhook};
use futures::{StreamExt, stream};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// A mapping whose entry takes about 14 KiB (16 long location ids): several hundred fill the budget.
fn big_mapping(name: &str) -> cp_api::ServiceMapping {
    let locations: Vec<String> = (0..16)
        .map(|j| format!("{name}-location-{j:02}-{}", "x".repeat(880)))
        .collect();
    cp_tests::fixtures::service_mapping(
        name,
        serde_json::json!({"type": "TCP", "subaccountId": "budget-sub", "serviceId": name,
            "internalAddress": "backend.default:443", "locationIds": locations}),
    )
}

#[tokio::test]
async fn a_mapping_beyond_the_configmap_budget_is_refused_at_admission() {
    webhook().await;
    let admin = control_plane().admin().await.expect("admin");
    let api: Api<cp_api::ServiceMapping> = Api::all(admin);
    let one = cp_api::mapping::entry_bytes("budget-0000", &big_mapping("budget-0000").spec);
    let fill = cp_api::mapping::MAPPINGS_TOTAL_BUDGET_BYTES / one;
    assert!(
        (600..1200).contains(&fill),
        "{fill} mappings of {one} bytes"
    );
    let created: Vec<Result<(), String>> = stream::iter(0..fill)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("budget-{i:04}");
                api.create(&PostParams::default(), &big_mapping(&name))
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{name}: {e}"))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let failed: Vec<&String> = created.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} refused below the budget: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );

    // The webhook counts the mappings from its watch: once it has seen them all, one more is refused.
    let over = big_mapping("budget-over");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let what = "one more mapping refused for the budget";
    let message = cp_tests::wait::until(what, Duration::from_secs(30), || async {
        match api.create(&dry, &over).await {
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(Some(e.message)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .expect("refused");
    // The limit and the fix, but not how many mappings exist (a caller without the API server in
    // between learns nothing about the cluster's mappings from it).
    assert!(
        message.contains("ServiceMapping budget-over is refused")
            && !message.contains(&format!("{fill} ServiceMappings"))
            && message.contains("13056 KiB")
            && message.contains("16 ConfigMaps connectivity-proxy-service-mappings")
            && message.contains("delete"),
        "{message}"
    );
    // A small edit of an existing mapping that does not grow it stays possible; deleting one makes room.
    api.delete("budget-0000", &DeleteParams::default())
        .await
        .expect("delete one");
    let what = "room again after a delete";
    cp_tests::wait::until(what, Duration::from_secs(30), || async {
        api.create(&dry, &over)
            .await
            .map(|_| Some(()))
            .map_err(|e| e.to_string())
    })
    .await
    .expect("admitted after a delete");
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("clean up");
}
