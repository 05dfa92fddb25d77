//! A step of the node test: neighbours that mutate the proxy's pods (the Istio sidecar injector and the
//! runtime bootstrapper, both stand-ins of [`cp_tests::neighbours`], registered as mutating webhooks),
//! and the proxy stand-in and its sidecar dialing what the real ones dial, through the module's
//! NetworkPolicies enforced by the node's policy engine.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::neighbours::{self, MIRROR, MIRROR_LABEL, Neighbours, PULL_SECRET, SIDECAR};
use cp_tests::node::Cluster;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams};

const PROXY_PODS: &str = "app=connectivity-proxy";

/// Whether `pod` carries every change of both neighbours.
fn mutated(pod: &Pod) -> Result<(), String> {
    let spec = pod.spec.clone().unwrap_or_default();
    if !spec.containers.iter().any(|c| c.name == SIDECAR) {
        return Err(format!("{:?}: no {SIDECAR}", pod.metadata.name));
    }
    let images: Vec<String> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|c| c.image.clone())
        .collect();
    if let Some(i) = images
        .iter()
        .find(|i| !i.starts_with(&format!("{MIRROR}/")))
    {
        return Err(format!("{:?}: image {i} not mirrored", pod.metadata.name));
    }
    let secrets = spec.image_pull_secrets.unwrap_or_default();
    if !secrets.iter().any(|s| s.name == PULL_SECRET) {
        return Err(format!("{:?}: no pull secret", pod.metadata.name));
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if labels.get(MIRROR_LABEL.0).map(String::as_str) != Some(MIRROR_LABEL.1) {
        return Err(format!("{:?}: no mirror label", pod.metadata.name));
    }
    Ok(())
}

/// The last `dial` outcome the proxy stand-in logged for `target` in `pod`.
fn last_dial(cluster: &Cluster, pod: &str, target: &str) -> anyhow::Result<Option<bool>> {
    Ok(cluster
        .standin_log(pod)?
        .iter()
        .find(|v| v["event"] == "dial" && v["target"] == target)
        .and_then(|v| v["reachable"].as_bool()))
}

/// The sidecar stand-in's last line in `pod`.
fn sidecar_says(cluster: &Cluster, pod: &str) -> anyhow::Result<String> {
    let log = cluster.kubectl_run(&["logs", "-n", names::KYMA_SYSTEM, pod, "-c", SIDECAR])?;
    Ok(log.lines().last().unwrap_or_default().to_string())
}

pub(crate) async fn neighbours_mutate_the_proxy_pods(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    cp_tests::cluster::ensure_namespace(&admin, "nb-probe").await?;
    // Stand-ins for istiod (15012) and a service channel's target (3300) the proxy must reach.
    let istiod = crate::node::listener_pod(
        cluster,
        names::ISTIO_NAMESPACE,
        "nb-istiod",
        serde_json::json!({"istio": "pilot"}),
        &[15012],
    )
    .await?;
    let target = crate::node::listener_pod(
        cluster,
        "nb-probe",
        "nb-channel-target",
        serde_json::json!({"app": "nb-channel-target"}),
        &[3300],
    )
    .await?;
    let mappings: Api<cp_api::ServiceMapping> = Api::all(admin.clone());
    let mut channel = cp_api::testing::tcp_mapping("nb-channel", "nb-subaccount", "nb-channel");
    channel.spec.internal_address = format!("{target}:3300");
    mappings.create(&Default::default(), &channel).await?;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until_object(
        &cms,
        names::CONFIGMAP_SERVICE_MAPPINGS,
        "the channel published",
        Duration::from_secs(60),
        |cm| {
            let data = serde_json::to_string(&cm.data).unwrap_or_default();
            if data.contains("nb-channel") {
                Ok(Some(()))
            } else {
                Err(data)
            }
        },
    )
    .await?;

    // The node serves the mirror's names from its own store, as the mirror would serve them.
    let mut tagged = 0;
    for name in cluster.image_names()? {
        let m = neighbours::mirrored(&name);
        if m != name {
            cluster.tag_image(&name, &m)?;
            tagged += 1;
        }
    }
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let pull: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": PULL_SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson":
            format!(r#"{{"auths":{{"{MIRROR}":{{"auth":"c3RhbmQtaW46c3RhbmQtaW4="}}}}}}"#)}
    }))?;
    secrets.create(&Default::default(), &pull).await?;
    let stand_ins = Neighbours::start(&cluster.netns, &istiod)?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    configs
        .create(
            &Default::default(),
            &serde_json::from_value(stand_ins.configuration())?,
        )
        .await
        .context("registering the stand-in neighbours")?;
    println!("neighbours: {tagged} images tagged under {MIRROR}; webhooks registered");

    // The proxy's pods are created again, through both neighbours.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let old: BTreeSet<String> = pods
        .list(&ListParams::default().labels(PROXY_PODS))
        .await?
        .items
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(PROXY_PODS),
    )
    .await?;
    let stss: Api<StatefulSet> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let replicas = stss
        .get("connectivity-proxy")
        .await?
        .spec
        .replicas
        .unwrap_or(1) as usize;
    let proxies: Vec<Pod> = cp_tests::wait::until(
        "the proxy's pods created again through the neighbours and ready",
        Duration::from_secs(180),
        || async {
            let ready = cp_tests::node::ready_pods(&admin, PROXY_PODS)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let new: Vec<Pod> = ready
                .into_iter()
                .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u)))
                .collect();
            if new.len() < replicas {
                return Err(format!(
                    "{} of {replicas} new pods ready\n{}",
                    new.len(),
                    cluster.pods_summary(names::KYMA_SYSTEM)
                ));
            }
            for p in &new {
                mutated(p)?;
            }
            Ok(Some(new))
        },
    )
    .await?;
    let names_of: Vec<String> = proxies
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    crate::node::wait_cr_ready(cluster, Duration::from_secs(60)).await?;

    // What the proxy dials itself (the channel, the Connectivity service) and what its sidecar dials
    // (istiod on 15012) pass the module's NetworkPolicies.
    for pod in &names_of {
        for what in ["channel nb-channel", "connectivity-service"] {
            cp_tests::wait::until(
                &format!("{pod}: the proxy stand-in reaches {what}"),
                Duration::from_secs(60),
                || {
                    let got = last_dial(cluster, pod, what).map_err(|e| format!("{e:#}"));
                    async move {
                        match got? {
                            Some(true) => Ok(Some(())),
                            other => Err(format!("last outcome: {other:?}")),
                        }
                    }
                },
            )
            .await?;
        }
        cp_tests::wait::until(
            &format!("{pod}: the sidecar stand-in reaches istiod on 15012"),
            Duration::from_secs(60),
            || {
                let said = sidecar_says(cluster, pod).map_err(|e| format!("{e:#}"));
                async move {
                    let said = said?;
                    (said == "xds 15012 reachable")
                        .then_some(Some(()))
                        .ok_or(said)
                }
            },
        )
        .await?;
        println!("neighbours: {pod} reaches its channel, the Connectivity service and istiod");
    }

    // Neither side fights the other: for a minute the controller writes nothing, the StatefulSet
    // keeps its generation, the pods stay (mutated) and the CR stays Ready. A measurement window, not
    // a synchronisation: it is checked every 3 s and fails at the first change.
    let offset = cluster.cp.audit_offset();
    let generation = stss.get("connectivity-proxy").await?.metadata.generation;
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(60) {
        let sts = stss.get("connectivity-proxy").await?;
        anyhow::ensure!(
            sts.metadata.generation == generation,
            "the StatefulSet changed generation ({:?} → {:?}) under the neighbours' mutations",
            generation,
            sts.metadata.generation
        );
        let now: Vec<Pod> = pods
            .list(&ListParams::default().labels(PROXY_PODS))
            .await?
            .items;
        let now_names: Vec<String> = now.iter().filter_map(|p| p.metadata.name.clone()).collect();
        anyhow::ensure!(
            now.len() == names_of.len() && names_of.iter().all(|n| now_names.contains(n)),
            "the proxy's pods changed: {now_names:?}, were {names_of:?}"
        );
        for p in &now {
            mutated(p).map_err(anyhow::Error::msg)?;
        }
        let cr = crs.get("connectivity-proxy").await?;
        let st = cr.status.unwrap_or_default();
        anyhow::ensure!(
            st.state == Some(State::Ready),
            "the CR left Ready: {:?} {:?}",
            st.state,
            st.description
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let writes: Vec<_> = cluster
        .cp
        .audit_writes_since(offset)?
        .into_iter()
        .filter(|w| {
            w.user == cp_tests::controller::CONTROLLER_USER
                && w.resource != "leases"
                && w.resource != "events"
        })
        .collect();
    anyhow::ensure!(
        writes.is_empty(),
        "the controller wrote while the neighbours' mutations stood: {writes:?}"
    );
    println!(
        "neighbours: 60 s with mutated pods, 0 controller writes (leases and events aside), {} webhook calls",
        stand_ins.calls.load(std::sync::atomic::Ordering::Relaxed)
    );

    // The neighbours and their objects go (the uninstall step compares the cluster with before).
    configs
        .delete(neighbours::CONFIGURATION, &DeleteParams::default())
        .await?;
    drop(stand_ins);
    mappings
        .delete("nb-channel", &DeleteParams::default())
        .await?;
    secrets
        .delete(PULL_SECRET, &DeleteParams::default())
        .await?;
    Api::<Pod>::namespaced(admin.clone(), names::ISTIO_NAMESPACE)
        .delete("nb-istiod", &DeleteParams::default().grace_period(0))
        .await?;
    Api::<Namespace>::all(admin)
        .delete("nb-probe", &DeleteParams::default())
        .await?;
    Ok(())
}
