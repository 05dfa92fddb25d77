//! A legacy installation taken over by the module installed on a real node, with the controller's
//! container SIGKILLed five times at random moments of the takeover (through containerd, restarted by
//! the kubelet): the takeover converges and nothing of the user's is lost.
#![forbid(unsafe_code)]

use std::time::Duration;

use anyhow::Context;
use cp_api::names;
use cp_tests::legacy;
use cp_tests::node::Cluster;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

const CONTROLLER_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-controller";

/// xorshift64*, replayable from the printed seed.
fn delays(seed: u64, n: usize, max_ms: u64) -> Vec<Duration> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            Duration::from_millis(x.wrapping_mul(0x2545_f491_4f6c_dd1d) % max_ms)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_takeover_survives_five_sigkills_of_the_controller_container() -> anyhow::Result<()>
{
    let cluster = Cluster::shared()?;
    let admin = cluster.cp.admin().await?;
    cluster.prepare_kyma().await?;
    let before = legacy::legacy_cluster(&admin).await;
    cluster.install_bundle().await?;
    cluster.apply_default_cr().await?;

    let seed = std::env::var("CP_NODE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(7)
        });
    println!("CP_NODE_KILL_SEED={seed}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let pod = pods
        .list(&ListParams::default().labels(CONTROLLER_PODS))
        .await?
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .and_then(|p| p.metadata.name)
        .context("no controller pod")?;
    let mut restarts = 0;
    let mut before_done = 0;
    // The first kill early (the takeover takes a few seconds), the others anywhere in 0-2.5 s.
    let mut points = delays(seed, 5, 2500);
    points[0] /= 10;
    for (i, delay) in points.into_iter().enumerate() {
        tokio::time::sleep(delay).await; // the random kill point, not a synchronisation
        let cr: Api<cp_api::ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
        let reached: Vec<&str> = match cr.get_opt("connectivity-proxy").await? {
            Some(c) => legacy::STEPS
                .iter()
                .filter(|(_, r)| r(&c))
                .map(|(w, _)| *w)
                .collect(),
            None => vec![],
        };
        println!(
            "kill {} after {delay:?}; the takeover has reached {reached:?}",
            i + 1
        );
        if !reached.contains(&legacy::STEPS[2].0) {
            before_done += 1;
        }
        restarts = cluster
            .kill_container(names::KYMA_SYSTEM, &pod, "controller")
            .await
            .with_context(|| format!("kill {} after {delay:?}", i + 1))?;
    }
    assert!(
        restarts >= 5,
        "the kubelet restarted the controller {restarts} times"
    );
    assert!(
        before_done >= 1,
        "every kill came after the takeover was done: the test proved nothing (seed {seed})"
    );

    legacy::wait_step(&admin, legacy::STEPS[2], Duration::from_secs(120)).await;
    // The mappings are relabelled by the first install after the takeover is done (the other takeover
    // tests wait for Ready first): wait for that, not for a lucky ordering after the last kill.
    let mappings: kube::Api<cp_api::ServiceMapping> = kube::Api::all(admin.clone());
    cp_tests::wait::until(
        "every legacy mapping taken over by the first install",
        Duration::from_secs(60),
        || {
            let mappings = mappings.clone();
            let names: Vec<String> = before.keys().cloned().collect();
            async move {
                for name in names {
                    let m = mappings.get(&name).await.map_err(|e| e.to_string())?;
                    if kube::ResourceExt::labels(&m)
                        .get("kyma-project.io/module")
                        .is_none()
                    {
                        return Err(format!("{name} not yet labelled"));
                    }
                }
                Ok(Some(()))
            }
        },
    )
    .await?;
    legacy::assert_taken_over(&admin, &before, 20003).await;
    Ok(())
}
