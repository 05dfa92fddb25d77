//! Start-up of the operator's two pods on the node: from the bundle's apply until each Deployment's
//! first pod is Ready and the Deployment is Available, the default CR until it is Ready, and deleted
//! pods until their replacements are Ready.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::node::{Cluster, ready_pods};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::harness::report::met_bold;
use crate::harness::stats::whole_ms;

const WEBHOOK_DEPLOYMENT: &str = "connectivity-proxy-operator-webhook";
const CONTROLLER_DEPLOYMENT: &str = "connectivity-proxy-operator-controller";
pub const WEBHOOK_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-webhook";
pub const CONTROLLER_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-controller";

/// Goals, stated before measuring.
const GOAL_WEBHOOK_READY_MS: u64 = 5_000;
const GOAL_CONTROLLER_READY_MS: u64 = 5_000;
const GOAL_CR_READY_MS: u64 = 30_000;

/// Times from the bundle's apply, ms.
#[derive(Clone, Debug, Default)]
pub struct StartUp {
    /// The first webhook pod Ready.
    pub webhook_pod_ready_ms: u64,
    /// The webhook Deployment Available with all its replicas.
    pub webhook_available_ms: u64,
    /// The controller pod Ready.
    pub controller_pod_ready_ms: u64,
    /// The controller Deployment Available.
    pub controller_available_ms: u64,
    /// Webhook replicas.
    pub webhook_replicas: i32,
    /// From the default CR's apply until it is Ready (includes the node's fd-limit fix, see render).
    pub cr_ready_ms: Option<u64>,
}

/// Applies the bundle as the module manager does and times each Deployment's first Ready pod and its
/// availability (polled every 100 ms).
pub async fn install_timed(cluster: &Cluster, admin: &Client) -> anyhow::Result<StartUp> {
    let bundle = cp_tests::workspace_root().join("manifests/connectivity-proxy-operator.yaml");
    let t0 = Instant::now();
    cluster
        .kubectl_run(&[
            "apply",
            "--server-side",
            "--field-manager=module-manager",
            "-f",
            &bundle.display().to_string(),
        ])
        .context("applying the bundle")?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let mut times: [[Option<u64>; 2]; 2] = [[None; 2]; 2];
    let mut webhook_replicas = 0;
    let deadline = t0 + Duration::from_secs(180);
    loop {
        for (i, (deployment, selector)) in [
            (WEBHOOK_DEPLOYMENT, WEBHOOK_PODS),
            (CONTROLLER_DEPLOYMENT, CONTROLLER_PODS),
        ]
        .into_iter()
        .enumerate()
        {
            if times[i][0].is_none() && !ready_pods(admin, selector).await?.is_empty() {
                times[i][0] = Some(whole_ms(t0.elapsed()));
            }
            if times[i][1].is_none()
                && let Some(d) = deployments.get_opt(deployment).await?
            {
                let want = d.spec.replicas.unwrap_or(1);
                if i == 0 {
                    webhook_replicas = want;
                }
                let generation = d.metadata.generation.unwrap_or(0);
                let st = d.status.unwrap_or_default();
                if st.observed_generation.unwrap_or(0) >= generation
                    && st.available_replicas.unwrap_or(0) >= want
                    && st.updated_replicas.unwrap_or(0) >= want
                {
                    times[i][1] = Some(whole_ms(t0.elapsed()));
                }
            }
        }
        if let [[Some(a), Some(b)], [Some(c), Some(d)]] = times {
            return Ok(StartUp {
                webhook_pod_ready_ms: a,
                webhook_available_ms: b,
                controller_pod_ready_ms: c,
                controller_available_ms: d,
                webhook_replicas,
                cr_ready_ms: None,
            });
        }
        if Instant::now() > deadline {
            bail!(
                "the operator's Deployments not available within 180 s ({times:?}):\n{}",
                cluster.pods_summary(names::KYMA_SYSTEM)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the default CR is Ready at its current generation.
pub async fn wait_cr_ready(admin: &Client, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until("the default CR Ready", timeout, || {
        let api = api.clone();
        async move {
            let c = api
                .get(names::DEFAULT_CR_NAME)
                .await
                .map_err(|e| e.to_string())?;
            let st = c.status.clone().unwrap_or_default();
            let current = st.observed_generation == c.metadata.generation;
            if st.state == Some(State::Ready) && current {
                Ok(Some(()))
            } else {
                Err(format!(
                    "{:?} (generation current: {current}) {:?}",
                    st.state, st.description
                ))
            }
        }
    })
    .await
}

/// The names of the pods `selector` selects.
pub async fn pod_names(admin: &Client, selector: &str) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing pods {selector}"))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// Waits until new pods replaced the deleted ones: the first new webhook pod Ready and the Deployment
/// at `replicas` new Ready pods, the new controller pod Ready. Returns (webhook, controller) ms from
/// `t0` to their first new Ready pod.
pub async fn wait_replacements(
    admin: &Client,
    old: &BTreeSet<String>,
    t0: Instant,
    replicas: i32,
) -> anyhow::Result<(u64, u64)> {
    let deadline = t0 + Duration::from_secs(180);
    let (mut webhook, mut controller, mut all_webhooks) = (None, None, false);
    loop {
        let new = |pods: Vec<Pod>| {
            pods.into_iter()
                .filter(|p| !old.contains(&p.name_any()))
                .count()
        };
        let w = new(ready_pods(admin, WEBHOOK_PODS).await?);
        let c = new(ready_pods(admin, CONTROLLER_PODS).await?);
        if webhook.is_none() && w > 0 {
            webhook = Some(whole_ms(t0.elapsed()));
        }
        if controller.is_none() && c > 0 {
            controller = Some(whole_ms(t0.elapsed()));
        }
        all_webhooks = all_webhooks || w >= usize::try_from(replicas).unwrap_or(1);
        if let (Some(w), Some(c), true) = (webhook, controller, all_webhooks) {
            return Ok((w, c));
        }
        if Instant::now() > deadline {
            bail!(
                "the replacement pods not Ready within 180 s (webhook {webhook:?}, controller {controller:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The start-up table; `mappings` were present when the pods were replaced, their replacements Ready
/// `restart_webhook_ms` and `restart_controller_ms` after the delete.
pub fn render(
    st: &StartUp,
    mappings: usize,
    restart_webhook_ms: u64,
    restart_controller_ms: u64,
) -> String {
    let mut s = String::from("### Start → Ready\n\n");
    s.push_str(
        "From `kubectl apply --server-side` of the bundle (images already on the node), polled every \
         100 ms. The webhook's readiness waits for its serving certificate, which the controller issues.\n\n",
    );
    s.push_str("| What | Measured | Goal | Verdict |\n|---|---:|---:|---|\n");
    let mut row = |what: &str, ms: u64, goal: Option<u64>| {
        s.push_str(&match goal {
            Some(goal) => format!(
                "| {what} | {ms} ms | < {goal} ms | {} |\n",
                met_bold(ms < goal)
            ),
            None => format!("| {what} | {ms} ms | | |\n"),
        });
    };
    row(
        "webhook: first pod Ready",
        st.webhook_pod_ready_ms,
        Some(GOAL_WEBHOOK_READY_MS),
    );
    row(
        &format!(
            "webhook: Deployment Available ({} replicas)",
            st.webhook_replicas
        ),
        st.webhook_available_ms,
        None,
    );
    row(
        "controller: pod Ready",
        st.controller_pod_ready_ms,
        Some(GOAL_CONTROLLER_READY_MS),
    );
    row(
        "controller: Deployment Available",
        st.controller_available_ms,
        None,
    );
    if let Some(cr) = st.cr_ready_ms {
        row(
            "default CR Ready (from its apply)",
            cr,
            Some(GOAL_CR_READY_MS),
        );
    }
    row(
        &format!(
            "after deleting the pods, {mappings} mappings present: first new webhook pod Ready"
        ),
        restart_webhook_ms,
        None,
    );
    row(
        "after deleting the pods: new controller pod Ready",
        restart_controller_ms,
        None,
    );
    s.push('\n');
    s.push_str(
        "The default CR's time includes this node's peculiarity: its hard open-files limit is below the \
         proxy's default, so the proxy's init container fails until a privileged user lowers \
         `maxFileDescriptorCount` (`Cluster::fit_fd_limit_to_node`, done at once after the apply, once the \
         controller has recorded its defaults), and the proxy pod restarts.\n\n",
    );
    s
}
