//! What reaches the store behind the webhook's back (duplicate ServiceMappings), and a service key that
//! cannot be used: the controller stays deterministic and says so.

use std::time::Duration;

use cp_api::{ConnectivityProxy, ServiceMapping, State};
use cp_tests::fixtures::{secret, service_mapping};
use cp_tests::support::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The mapping names ConfigMap `connectivity-proxy-service-mappings` publishes.
async fn published(admin: &Client) -> Result<Vec<String>, String> {
    let json = published_mappings(admin, NS).await?;
    let entries: Vec<Value> = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    Ok(entries
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect())
}

/// Waits until the mappings ConfigMap publishes exactly `names` (sorted).
async fn wait_published(admin: &Client, names: &[&str], what: &str) {
    let want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    cp_tests::wait::until(what, Duration::from_secs(20), || async {
        let got = published(admin).await?;
        if got == want {
            Ok(Some(()))
        } else {
            Err(format!("published {got:?}"))
        }
    })
    .await
    .expect(what);
}

/// Waits for a Warning Event about the cluster-scoped ServiceMapping `name` whose note contains `text`.
async fn wait_mapping_warning(admin: &Client, name: &str, text: &str) -> String {
    // Events about cluster-scoped objects live in namespace default.
    cp_tests::wait::warning_event(
        admin,
        "default",
        &format!("a Warning Event on ServiceMapping {name} naming {text}"),
        Duration::from_secs(20),
        |e| {
            e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ServiceMapping")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.note.as_deref().is_some_and(|n| n.contains(text))
        },
    )
    .await
    .expect("Warning Event on the losing mapping")
}

fn dup(name: &str, subaccount: &str, service: &str, address: &str) -> ServiceMapping {
    service_mapping(
        name,
        json!({"type": "TCP", "subaccountId": subaccount, "serviceId": service,
            "internalAddress": address}),
    )
}

#[tokio::test]
async fn duplicate_service_mappings_publish_only_the_oldest_and_warn_on_the_others() {
    let admin = &scenario_ready().await.admin;
    // No webhook is registered in this binary: duplicates reach the store as they would with two
    // webhook replicas admitting concurrently, or with the webhook down.
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let pp = PostParams::default();
    // The oldest sorts last by name: the age decides, not the name.
    let oldest = api
        .create(&pp, &dup("dup-z-oldest", "sub-1", "erp", "old.apps:80"))
        .await
        .expect("first mapping");
    wait_published(admin, &["dup-z-oldest"], "the first mapping published").await;
    cp_tests::wait::a_second_past(&oldest.metadata).await;
    api.create(&pp, &dup("dup-a-newer", "sub-1", "erp", "new.apps:80"))
        .await
        .expect("a duplicate");
    // Differs only by case and surrounding whitespace: the same key.
    api.create(&pp, &dup("dup-m-case", " SUB-1", "ERP ", "case.apps:80"))
        .await
        .expect("a duplicate up to case and whitespace");
    api.create(&pp, &dup("other", "sub-1", "crm", "crm.apps:80"))
        .await
        .expect("an unrelated mapping");
    wait_published(
        admin,
        &["dup-z-oldest", "other"],
        "only the oldest of the duplicates published",
    )
    .await;
    for loser in ["dup-a-newer", "dup-m-case"] {
        let note = wait_mapping_warning(admin, loser, "dup-z-oldest").await;
        assert!(note.contains("not published"), "{note}");
    }
    let cr = wait_state(
        admin,
        NS,
        "connectivity-proxy",
        State::Warning,
        Some("DuplicateServiceMappings"),
        Duration::from_secs(20),
    )
    .await;
    let d = cr.status.and_then(|s| s.description).unwrap_or_default();
    for name in ["dup-a-newer", "dup-m-case", "dup-z-oldest"] {
        assert!(d.contains(name), "{name} in {d}");
    }
    let loser = api.get("dup-a-newer").await.expect("loser");
    assert_eq!(
        loser.status.and_then(|s| s.endpoint),
        None,
        "a mapping that is not published advertises no endpoint"
    );
    assert_eq!(loser.spec.internal_address, "new.apps:80", "spec untouched");
    // The winner gone, the oldest of the rest is published: still exactly one of the key.
    api.delete("dup-z-oldest", &DeleteParams::default())
        .await
        .expect("delete the winner");
    let what = "one of the remaining duplicates published";
    cp_tests::wait::until(what, Duration::from_secs(20), || async move {
        let got = published(admin).await?;
        let dups = got.iter().filter(|n| n.starts_with("dup-")).count();
        if dups == 1 && got.contains(&"other".to_string()) {
            Ok(Some(()))
        } else {
            Err(format!("published {got:?}"))
        }
    })
    .await
    .expect("one duplicate published");
    for name in ["dup-a-newer", "dup-m-case"] {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    play_until_ready(admin, NS, "connectivity-proxy").await;
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}

/// Points the CR's service key at the user's Secret `name`.
async fn use_secret(admin: &Client, name: &str) {
    let edit = json!({"spec": {"secretConfig": {"integration": {"connectivityService":
        {"secretName": name}}}}});
    Api::<ConnectivityProxy>::namespaced(admin.clone(), NS)
        .patch(
            "connectivity-proxy",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await
        .expect("edit secretName");
}

/// Waits until the CR is Warning `ServiceKeyInvalid` with a description holding every one of `text`.
async fn wait_key_warning(admin: &Client, text: &[&str]) {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    cp_tests::wait::until(
        &format!("Warning ServiceKeyInvalid naming {text:?}"),
        Duration::from_secs(20),
        || async {
            let st = cp_tests::wait::get(&api, "connectivity-proxy")
                .await?
                .status
                .unwrap_or_default();
            let d = st.description.clone().unwrap_or_default();
            let reason = st
                .conditions
                .iter()
                .any(|c| c.reason == "ServiceKeyInvalid");
            if st.state == Some(State::Warning) && reason && text.iter().all(|t| d.contains(t)) {
                Ok(Some(()))
            } else {
                Err(format!("{:?}: {d}", st.state))
            }
        },
    )
    .await
    .expect("ServiceKeyInvalid");
}

#[tokio::test]
async fn a_user_secret_without_a_usable_service_key_is_not_ready() {
    let env = scenario_ready().await;
    let admin = &env.admin;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    // A working key (its CA URL is the test's endpoint): the one the BTP operator stand-in wrote.
    let good_key = secrets
        .get(&cp_api::names::binding_secret_name(
            "connectivity-proxy",
            NS,
        ))
        .await
        .expect("binding Secret")
        .data
        .and_then(|d| d.get("service_key").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .expect("service_key");
    let _ = secrets.delete("users-key", &DeleteParams::default()).await;
    // A Secret that does not exist (yet).
    use_secret(admin, "users-key").await;
    let not_usable = [
        "kyma-system/users-key",
        "is not usable by the proxy",
        cp_api::keys::USABLE_BY_PROXY_LABEL,
    ];
    wait_key_warning(admin, &not_usable).await;
    let crs = Api::<ConnectivityProxy>::namespaced(admin.clone(), NS);
    let cr_description = || async { description(&crs.get(CR).await.expect("cr")) };
    let absent = cr_description().await;
    // The Secret exists but its owner has not let the proxy use it: the status says exactly what it
    // said while it was absent (a CR editor learns neither its existence nor its keys), and the proxy
    // does not mount it.
    let secret = secret("users-key", json!({"credentials": "{\"clientid\": \"x\"}"}));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create");
    // Another Kyma module's Secret is never usable, opted in or not.
    // A merge patch of the user's Secret; panics with `what` if it is refused.
    let edit_key = |patch: Value, what: &'static str| {
        let secrets = &secrets;
        async move {
            let patch = Patch::Merge(&patch);
            let edited = secrets
                .patch("users-key", &PatchParams::default(), &patch)
                .await;
            edited.expect(what);
        }
    };
    let label =
        |labels: Value| edit_key(json!({"metadata": {"labels": labels}}), "label users-key");
    let reconciles = || {
        env.controller
            .metric("cp_controller_reconcile_total{result=\"success\"}")
    };
    let before = reconciles().await;
    label(json!({cp_api::keys::USABLE_BY_PROXY_LABEL: "true", "kyma-project.io/module": "btp-operator"}))
        .await;
    // Two reconciles after the label's write (the Secret's watch wakes one, the resync another) have
    // seen it.
    let what = "two reconciles after the label";
    cp_tests::wait::until(what, Duration::from_secs(20), || async {
        let now = reconciles().await;
        if now >= before + 2.0 {
            Ok(Some(()))
        } else {
            Err(format!("{now} reconciles"))
        }
    })
    .await
    .expect("reconciled");
    let sts_api: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), NS);
    assert_eq!(
        cr_description().await,
        absent,
        "the same words for a Secret that exists"
    );
    let mounts = serde_json::to_string(&sts_api.get("connectivity-proxy").await.expect("sts").spec)
        .expect("json");
    assert!(
        !mounts.contains("users-key"),
        "an unusable Secret is never mounted"
    );
    label(json!({"kyma-project.io/module": null})).await;
    wait_key_warning(admin, &["kyma-system/users-key", "service_key", "no key"]).await;
    // A service_key that is not a service key's JSON.
    edit_key(
        json!({"stringData": {"service_key": "clientid=x"}}),
        "bad key",
    )
    .await;
    wait_key_warning(admin, &["kyma-system/users-key", "service_key", "JSON"]).await;
    assert!(
        !cr_description().await.contains("clientid=x"),
        "the key's content is never quoted"
    );
    // Fixed: Ready again.
    edit_key(json!({"stringData": {"service_key": good_key}}), "good key").await;
    play_until_ready(admin, NS, CR).await;
    let cr = crs.get(CR).await.expect("cr");
    assert_eq!(cr.status.and_then(|s| s.state), Some(State::Ready));
    let _ = secrets.delete("users-key", &DeleteParams::default()).await;
}
