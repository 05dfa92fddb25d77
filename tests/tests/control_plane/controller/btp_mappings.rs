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
