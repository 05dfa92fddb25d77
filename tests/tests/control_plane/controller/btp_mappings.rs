//! The BTP dependency and ServiceMappings at scale.

use std::time::Duration;

use cp_api::ServiceMapping;
use cp_tests::fixtures::service_mapping;
use cp_tests::support::*;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

#[tokio::test]
async fn missing_btp_operator_is_a_warning_while_the_key_is_auto_provisioned() {
    let admin = &scenario().await.admin;
    let d =
        default_cr_without_crds(admin, &cp_api::names::BTP_CRDS, "BTPOperatorCRDsMissing").await;
    assert!(d.contains("serviceinstances.services.cloud.sap.com"), "{d}");
    install_btp(admin).await;
    make_ready(admin, NS, CR).await;
}

fn mapping(i: usize) -> ServiceMapping {
    service_mapping(
        &format!("scale-{i:04}"),
        json!({
            "type": if i.is_multiple_of(2) { "RFC" } else { "TCP" },
            "serviceId": format!("service-{i}"),
            "subaccountId": "sub",
            "internalAddress": format!("backend-{i}.apps:{}", 1000 + i),
            "locationIds": ["loc-a"],
        }),
    )
}

#[tokio::test]
async fn a_thousand_service_mappings_are_aggregated_and_get_endpoints() {
    let admin = &scenario_ready().await.admin;
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    futures::stream::iter(0..1000)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &mapping(i))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("1000 mappings created");
    // Waits until the mappings ConfigMap holds `want` entries.
    let published = |want: usize, what: &'static str, secs: u64| {
        cp_tests::wait::until(what, Duration::from_secs(secs), move || async move {
            let json = published_mappings(admin, NS).await?;
            let n = serde_json::from_str::<Vec<Value>>(&json).map_or(0, |v| v.len());
            if n == want {
                Ok(Some(()))
            } else {
                Err(format!("{n} mappings"))
            }
        })
    };
    published(1000, "the ConfigMap holds 1000 mappings", 60)
        .await
        .expect("aggregated");
    let what = "every mapping has its endpoint and the takeover label";
    cp_tests::wait::until(what, Duration::from_secs(90), || async {
        let list = cp_tests::wait::list(&api).await?;
        let missing = list
            .items
            .iter()
            .filter(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| s.endpoint.as_deref())
                    .is_none()
                    || m.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kyma-project.io/module"))
                        .is_none()
            })
            .count();
        if missing == 0 {
            Ok(Some(list))
        } else {
            Err(format!("{missing} mappings without endpoint or label"))
        }
    })
    .await
    .map(|list| {
        let m = list
            .items
            .iter()
            .find(|m| m.metadata.name.as_deref() == Some("scale-0002"))
            .expect("scale-0002");
        assert_eq!(
            m.status
                .as_ref()
                .and_then(|s| s.endpoint.clone())
                .unwrap_or_default(),
            format!("rfc://cp.{DOMAIN}:443/service-2")
        );
        assert_eq!(
            m.spec.internal_address, "backend-2.apps:1002",
            "spec untouched"
        );
    })
    .expect("endpoints");
    for i in 0..10 {
        api.delete(&format!("scale-{i:04}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    published(990, "the ConfigMap reflects the deletions", 30)
        .await
        .expect("990");
    // Clean up quickly for the next test (deletion would otherwise be blocked by them).
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}

/// A mapping whose entry takes about 14 KiB (16 long location ids): 70 of them outgrow one ConfigMap.
fn big_mapping(i: usize) -> ServiceMapping {
    let name = format!("big-{i:03}");
    let locations: Vec<String> = (0..16)
        .map(|j| format!("{name}-location-{j:02}-{}", "x".repeat(860)))
        .collect();
    service_mapping(
        &name,
        json!({"type": "TCP", "serviceId": name, "subaccountId": "sub",
            "internalAddress": format!("backend-{i}.apps:443"), "locationIds": locations}),
    )
}

/// The names in mapping shard ConfigMap `index`, or `None` while it does not exist.
async fn shard_names(admin: &kube::Client, index: usize) -> Result<Option<Vec<String>>, String> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), NS);
    let name = cp_api::names::MAPPING_SHARD_CONFIGMAPS[index];
    let Some(cm) = cms
        .get_opt(name)
        .await
        .map_err(|e| format!("{name}: {e}"))?
    else {
        return Ok(None);
    };
    let text = cm
        .data
        .unwrap_or_default()
        .remove(cp_api::names::MAPPING_SHARD_KEYS[index])
        .ok_or(format!(
            "{name} has no key {}",
            cp_api::names::MAPPING_SHARD_KEYS[index]
        ))?;
    let list: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(
        list.iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_string())
            .collect(),
    ))
}

#[tokio::test]
async fn mappings_past_one_configmap_are_split_across_shards_and_merge_back() {
    let admin = &scenario_ready().await.admin;
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(admin.clone(), NS);
    let generation = |s: k8s_openapi::api::apps::v1::StatefulSet| s.metadata.generation;
    let before = generation(
        sts.get(cp_api::names::STATEFULSET)
            .await
            .expect("the StatefulSet"),
    );
    futures::stream::iter(0..70)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &big_mapping(i))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("70 mappings created");
    let what = "the 70 mappings split across two ConfigMaps";
    let (first, second) = cp_tests::wait::until(what, Duration::from_secs(60), || async {
        let (Some(a), Some(b)) = (shard_names(admin, 0).await?, shard_names(admin, 1).await?)
        else {
            return Err("one shard so far".into());
        };
        if a.len() + b.len() == 70 {
            Ok(Some((a, b)))
        } else {
            Err(format!("{} + {} entries", a.len(), b.len()))
        }
    })
    .await
    .expect("split");
    // Each mapping in exactly one shard, the one its name hashes to; neither is near the object limit.
    for (index, names) in [(0, &first), (1, &second)] {
        assert!(!names.is_empty(), "shard {index} is empty");
        for n in names.iter() {
            assert_eq!(
                cp_api::mapping::shard_of(n, 2),
                index,
                "{n} in shard {index}"
            );
        }
    }
    let mut all: Vec<String> = first.iter().chain(&second).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 70);
    for i in 2..16 {
        assert_eq!(
            shard_names(admin, i).await.expect("read"),
            None,
            "no shard {i}"
        );
    }
    // The shards are files of one projected volume: the pod template did not change.
    let after = generation(sts.get(cp_api::names::STATEFULSET).await.expect("sts"));
    assert_eq!(before, after, "the StatefulSet was not rolled for a shard");

    // Thinned out: back to the one ConfigMap, the shard pruned.
    for i in 10..70 {
        api.delete(&format!("big-{i:03}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    let what = "the 10 left in the first ConfigMap, the second gone";
    let left = cp_tests::wait::until(what, Duration::from_secs(60), || async {
        match (shard_names(admin, 0).await?, shard_names(admin, 1).await?) {
            (Some(a), None) if a.len() == 10 => Ok(Some(a)),
            (a, b) => Err(format!(
                "{:?} / {:?} entries",
                a.map(|a| a.len()),
                b.map(|b| b.len())
            )),
        }
    })
    .await
    .expect("merged back");
    let mut want: Vec<String> = (0..10).map(|i| format!("big-{i:03}")).collect();
    want.sort();
    assert_eq!(left, want);
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}
