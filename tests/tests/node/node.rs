//! The module on a real node: the rendered bundle installed the way the module manager installs it
//! (`kubectl apply --server-side`), the operator's pods run by kubelet + containerd from the images of
//! `make images`, the proxy's StatefulSet run from the stand-in proxy image, the API server calling the
//! webhook through its Service. Nothing in the harness marks anything ready.
//!
//! One cluster, one test: the steps build on each other (install, edit, disrupt, uninstall) and each
//! failure names its step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ConnectivityProxy, State, names};
use cp_tests::node::Cluster;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

const CR: &str = "connectivity-proxy";
const WEBHOOK_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-webhook";
const CONTROLLER_PODS: &str = "app.kubernetes.io/name=connectivity-proxy-operator-controller";

pub(crate) async fn wait_cr_ready(
    cluster: &Cluster,
    timeout: Duration,
) -> anyhow::Result<ConnectivityProxy> {
    let api: Api<ConnectivityProxy> =
        Api::namespaced(cluster.cp.admin().await?, names::KYMA_SYSTEM);
    cp_tests::wait::until(&format!("CR {CR} Ready"), timeout, || async {
        let c = api.get(CR).await.map_err(|e| e.to_string())?;
        let st = c.status.clone().unwrap_or_default();
        let current = st.observed_generation == c.metadata.generation;
        if st.state == Some(State::Ready) && current {
            return Ok(Some(c));
        }
        let reasons: Vec<String> = st
            .conditions
            .iter()
            .map(|c| format!("{}: {}", c.reason, c.message))
            .collect();
        Err(format!(
            "{:?} (observed generation current: {current}) {:?} {reasons:?}\n{}",
            st.state,
            st.description,
            cluster.pods_summary(names::KYMA_SYSTEM)
        ))
    })
    .await
}

/// Pods matching `selector` in kyma-system that are Running and Ready (by their probes).
async fn ready_pods(cluster: &Cluster, selector: &str) -> anyhow::Result<Vec<Pod>> {
    cp_tests::node::ready_pods(&cluster.cp.admin().await?, selector).await
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// The last configuration the stand-in proxy logged it read (as the proxy reads it: YAML 1.1).
fn standin_config(cluster: &Cluster, pod: &str) -> anyhow::Result<serde_json::Value> {
    let log = cluster.standin_log(pod)?;
    log.iter()
        .find(|v| v.get("config").is_some())
        .map(|v| v["config"].clone())
        .with_context(|| format!("no configuration line in the stand-in's log: {log:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_on_a_real_node() -> anyhow::Result<()> {
    let cluster = Cluster::shared()?;
    cluster
        .prepare_kyma()
        .await
        .context("step: prepare the cluster")?;
    let before = inventory(&cluster)?;
    install(&cluster).await.context("step: install")?;
    webhook_through_its_service(&cluster)
        .await
        .context("step: the webhook through its Service")?;
    prometheus_scrapes_the_operator(&cluster)
        .await
        .context("step: Prometheus scrapes the operator's pods")?;
    network_policies_are_enforced(&cluster)
        .await
        .context("step: the NetworkPolicies enforced")?;
    crate::neighbours::neighbours_mutate_the_proxy_pods(&cluster)
        .await
        .context("step: neighbours mutate the proxy's pods; the proxy and its sidecar dial")?;
    edit_reaches_the_proxy(&cluster, 20010)
        .await
        .context("step: an edit reaches the proxy")?;
    a_new_mapping_reaches_the_proxy_at_once(&cluster)
        .await
        .context("step: a new ServiceMapping reaches the proxy's files at once")?;
    controller_pod_replaced(&cluster)
        .await
        .context("step: the controller pod replaced")?;
    webhook_pod_deleted_under_load(&cluster)
        .await
        .context("step: a webhook pod deleted under load")?;
    uninstall(&cluster, &before)
        .await
        .context("step: uninstall")?;
    Ok(())
}

/// Every object in the cluster (`kind/namespace/name`) but Events and the node's own heartbeat and
/// registration objects.
pub(crate) fn inventory(cluster: &Cluster) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let kinds: Vec<String> = cluster
        .kubectl_run(&["api-resources", "--verbs=list,delete", "-o", "name"])?
        .lines()
        .filter(|k| !k.starts_with("events") && !k.is_empty())
        .map(String::from)
        .collect();
    let out = cluster.kubectl_run(&[
        "get",
        &kinds.join(","),
        "-A",
        "-o",
        r#"jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}{"\n"}{end}"#,
    ])?;
    Ok(out
        .lines()
        .filter(|l| !l.is_empty())
        .filter(|l| !l.starts_with("Lease/kube-node-lease/") && !l.starts_with("Node/"))
        .map(String::from)
        .collect())
}

/// The module manager's install, then the default CR Ready with every pod Running and Ready by its
/// probes, under Pod Security `restricted`.
async fn install(cluster: &Cluster) -> anyhow::Result<()> {
    cluster.install_bundle().await?;
    cluster.apply_default_cr().await?;
    // The default 64000 open files exceed this node's hard limit (20000): the proxy's init container
    // must fail as it would on such a node, and the CR must not be Ready.
    let admin = cluster.cp.admin().await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let what = "the proxy's init container failing at ulimit -n 64000";
    let failed_init = cp_tests::wait::until(what, Duration::from_secs(120), || async {
        let Some(p) = cp_tests::wait::get_opt(&pods, "connectivity-proxy-0").await? else {
            return Err("no proxy pod yet".into());
        };
        let st = p.status.unwrap_or_default();
        let init = st.init_container_statuses.unwrap_or_default();
        let failed = init.iter().find(|c| {
            c.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code != 0)
                || c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code != 0)
        });
        Ok(failed.map(|c| c.name.clone()))
    })
    .await?;
    assert_eq!(failed_init, "init-fd-limit");
    // The CR says so, naming the field and the fix.
    let cr: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let what = "the CR in Warning ProxyPodFailing";
    let warning = cp_tests::wait::until(what, Duration::from_secs(60), || async {
        let st = cp_tests::wait::get(&cr, CR)
            .await?
            .status
            .unwrap_or_default();
        let failing = st
            .conditions
            .iter()
            .find(|c| c.reason == "ProxyPodFailing")
            .cloned();
        match (st.state, failing) {
            (Some(State::Warning), Some(c)) => Ok(Some(c.message)),
            (state, _) => Err(format!("{state:?} {:?}", st.description)),
        }
    })
    .await?;
    assert!(
        warning.contains("init-fd-limit")
            && warning.contains("spec.deployment.resources.maxFileDescriptorCount")
            && warning.contains("64000"),
        "{warning}"
    );

    cluster.fit_fd_limit_to_node(CR).await?;
    wait_cr_ready(cluster, Duration::from_secs(180)).await?;

    let webhooks = ready_pods(cluster, WEBHOOK_PODS).await?;
    let controllers = ready_pods(cluster, CONTROLLER_PODS).await?;
    let proxies = ready_pods(cluster, "app=connectivity-proxy").await?;
    assert_eq!(
        webhooks.len(),
        2,
        "{}",
        cluster.pods_summary(names::KYMA_SYSTEM)
    );
    assert_eq!(
        controllers.len(),
        1,
        "{}",
        cluster.pods_summary(names::KYMA_SYSTEM)
    );
    assert_eq!(
        proxies.len(),
        1,
        "{}",
        cluster.pods_summary(names::KYMA_SYSTEM)
    );

    // Pod Security admission enforces `restricted` on kyma-system and admitted all of them; a pod
    // that breaks it is refused there (so the enforcement is on, not just labelled).
    let ns: Api<Namespace> = Api::all(admin.clone());
    let labels = ns
        .get(names::KYMA_SYSTEM)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );
    let root_pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "psa-probe"},
        "spec": {"containers": [{"name": "c", "image": "localhost/cp-node-busybox:0.1.0"}]}
    }))?;
    let refused = pods
        .create(
            &kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            },
            &root_pod,
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("restricted")),
        "a pod violating restricted was not refused: {refused:?}"
    );

    // The proxy read its configuration and the service key the stand-in BTP operator issued, as the
    // values of the CR.
    let config = standin_config(cluster, &pod_name(&proxies[0]))?;
    assert_eq!(
        config["servers"]["businessDataTunnel"]["externalHost"],
        format!("cp.{}", cp_tests::node::CLUSTER_DOMAIN)
    );
    assert_eq!(
        config["subaccountId"],
        cp_tests::node::standin_service_key()["subaccount_id"]
    );
    Ok(())
}

/// A user's edit of a protected field goes API server → webhook Service → a webhook pod, and is
/// refused with the webhook's message.
async fn webhook_through_its_service(cluster: &Cluster) -> anyhow::Result<()> {
    let out = cluster
        .kubectl()?
        .args([
            "patch",
            "cp",
            CR,
            "-n",
            names::KYMA_SYSTEM,
            "--type",
            "merge",
            "--as",
            "jane@example.com",
            "--as-group",
            "system:masters",
            "-p",
            r#"{"spec":{"deployment":{"replicaCount":3}}}"#,
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "a protected edit was admitted");
    anyhow::ensure!(
        stderr.contains("spec.deployment") && stderr.contains("denied the request"),
        "not the webhook's refusal: {stderr}"
    );
    Ok(())
}

/// A real Prometheus (built from its Go module) in the node's network namespace scrapes every operator
/// pod at the address and port the bundle declares, and every query of the in-cluster Grafana dashboard
/// returns series from what it scraped.
async fn prometheus_scrapes_the_operator(cluster: &Cluster) -> anyhow::Result<()> {
    let mut targets = Vec::new();
    for (job, selector, replicas) in [
        ("webhook", WEBHOOK_PODS, 2),
        ("controller", CONTROLLER_PODS, 1),
    ] {
        let pods = ready_pods(cluster, selector).await?;
        anyhow::ensure!(pods.len() == replicas, "{job}: {} pods ready", pods.len());
        let addrs: Vec<String> = pods
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .map(|ip| format!("'{ip}:8080'"))
            .collect();
        targets.push(format!(
            "- job_name: {job}\n  static_configs:\n  - targets: [{}]\n",
            addrs.join(", ")
        ));
    }
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}",
        targets.concat()
    );
    let dir = std::env::temp_dir().join(format!("cp-prometheus-node-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut prom = cp_tests::prometheus::Prometheus::start(&dir, &config, Some(&cluster.netns))?;
    prom.wait_ready(Duration::from_secs(30)).await?;
    let prom = Arc::new(prom);
    cp_tests::wait::until(
        "every operator pod scraped successfully",
        Duration::from_secs(30),
        || async {
            let t = prom.targets().await.map_err(|e| e.to_string())?;
            if t.len() == 3 && t.iter().all(|(_, health, _)| health == "up") {
                Ok(Some(()))
            } else {
                Err(format!("{t:?}"))
            }
        },
    )
    .await?;
    // Two scrapes of every target at least, so rates over the dashboards' windows have two samples.
    let queries =
        cp_tests::prometheus::dashboard_queries("manifests/monitoring/grafana-dashboard.yaml")?;
    anyhow::ensure!(queries.len() >= 10, "{} dashboard queries", queries.len());
    for (title, expr) in queries {
        let prom = prom.clone();
        let what = format!("panel {title:?}: {expr} returns series");
        cp_tests::wait::until(&what, Duration::from_secs(20), || async {
            let series = prom.query(&expr, None).await.map_err(|e| e.to_string())?;
            if series.is_empty() {
                Err("no series".to_string())
            } else {
                Ok(Some(series.len()))
            }
        })
        .await?;
    }
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A busybox pod in `ns` with `labels`, to open connections from (restricted Pod Security: kyma-system
/// enforces it). Returned once the policy engine has its rules for it: the engine applies rules after
/// each pod event, and a connection made before would be judged without them.
async fn probe_pod(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    labels: serde_json::Value,
) -> anyhow::Result<(String, String)> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "probe",
                "image": "localhost/cp-node-busybox:0.1.0",
                "command": ["sleep", "3600"],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))?;
    let pods: Api<Pod> = Api::namespaced(cluster.cp.admin().await?, ns);
    pods.create(&Default::default(), &pod).await?;
    let what = "the probe pod running";
    cp_tests::wait::until_object(&pods, name, what, Duration::from_secs(60), |p| {
        match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let mark = format!("POD name:{name} namespace: {ns}");
    cp_tests::wait::until(
        "the policy engine's rules for the probe",
        Duration::from_secs(30),
        || {
            let rules = cluster.policy_rules().map_err(|e| format!("{e:#}"));
            let mark = mark.clone();
            async move { Ok(rules?.contains(&mark).then_some(())) }
        },
    )
    .await?;
    Ok((ns.to_string(), name.to_string()))
}

/// A pod that accepts TCP connections on `ports` (busybox `nc`, one container per port); its IP once
/// every listener runs.
pub(crate) async fn listener_pod(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    labels: serde_json::Value,
    ports: &[i32],
) -> anyhow::Result<String> {
    let containers: Vec<serde_json::Value> = ports
        .iter()
        .map(|port| {
            serde_json::json!({"name": format!("tcp-{port}"), "image": "localhost/cp-node-busybox:0.1.0",
                "command": ["nc", "-ll", "-p", port.to_string(), "-e", "true"]})
        })
        .collect();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
                 "containers": containers}
    }))?;
    let pods: Api<Pod> = Api::namespaced(cluster.cp.admin().await?, ns);
    pods.create(&Default::default(), &pod).await?;
    let what = "every listener running";
    cp_tests::wait::until_object(&pods, name, what, Duration::from_secs(60), |p| {
        let st = p.status.clone().unwrap_or_default();
        let running = st
            .container_statuses
            .unwrap_or_default()
            .iter()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .count();
        match (running == ports.len(), st.pod_ip) {
            (true, Some(ip)) => Ok(Some(ip)),
            other => Err(format!("{running} running, {other:?}")),
        }
    })
    .await
}

/// Whether the probe pod opens a TCP connection to `ip:port` (busybox `nc ... -e true`: exit 0 once
/// connected, 1 when refused or rejected).
fn connects(
    cluster: &Cluster,
    probe: &(String, String),
    ip: &str,
    port: i32,
) -> anyhow::Result<bool> {
    let out = cluster
        .kubectl()?
        .args([
            "exec",
            "-n",
            &probe.0,
            &probe.1,
            "--",
            "nc",
            "-w",
            "3",
            ip,
            &port.to_string(),
            "-e",
            "true",
        ])
        .output()?;
    if !out.status.success() {
        println!(
            "  {} → {ip}:{port}: {}",
            probe.1,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.status.success())
}

/// The module's NetworkPolicies, enforced by the node's policy engine (kube-router, iptables and
/// ipset): the flows the module needs pass and others are dropped, from pods in and outside
/// kyma-system; the switch-off annotation opens them. DNS (to node-local DNS) and the Connectivity CA
/// fetch (443) already passed: the CR became Ready through them; the API server → webhook and the
/// operator → API server (6443 behind the `kubernetes` Service) pass on every write of these tests.
async fn network_policies_are_enforced(cluster: &Cluster) -> anyhow::Result<()> {
    let rules = cluster.policy_rules()?;
    anyhow::ensure!(
        rules.contains("KUBE-POD-FW-"),
        "no pod firewall chain: the engine enforces nothing\n{rules}"
    );
    let ip = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default()
    };
    let controller = ip(&ready_pods(cluster, CONTROLLER_PODS).await?[0]);
    let webhook = ip(&ready_pods(cluster, WEBHOOK_PODS).await?[0]);
    let proxy_pod = ready_pods(cluster, "app=connectivity-proxy").await?[0].clone();
    let proxy = ip(&proxy_pod);
    let http_port = proxy_pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.ports.as_ref())
        .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some("http-proxy")))
        .map(|p| p.container_port)
        .context("the proxy's HTTP port")?;
    let admin = cluster.cp.admin().await?;
    cp_tests::cluster::ensure_namespace(&admin, "np-probe").await?;
    // A stand-in for Gardener's CoreDNS pods (kube-system, `k8s-app: kube-dns`): TCP listeners on 53,
    // 8053 (CoreDNS's port there) and 9053 (a port the module's DNS policy does not open).
    let dns_ip = listener_pod(
        cluster,
        "kube-system",
        "np-kube-dns",
        serde_json::json!({"k8s-app": "kube-dns"}),
        &[53, 8053, 9053],
    )
    .await?;
    // A service channel's target (3300, which a ServiceMapping names, and 3301, which none does); a
    // stand-in for istiod (`istio: pilot` in the Istio namespace: 15012, which sidecars dial, and 15010);
    // a pod shaped like the Istio module's ingress gateway (`istio: ingressgateway`) under that module's
    // own egress policy, which lets it reach only pods labelled `from-ingressgateway`
    // (kyma-project/istio, docs/contributor/adr/0015-networkpolicies-istio-kyma-system.md).
    let target = listener_pod(
        cluster,
        "np-probe",
        "np-channel-target",
        serde_json::json!({"app": "np-channel-target"}),
        &[3300, 3301],
    )
    .await?;
    let istiod = listener_pod(
        cluster,
        names::ISTIO_NAMESPACE,
        "np-istiod",
        serde_json::json!({"istio": "pilot"}),
        &[15012, 15010],
    )
    .await?;
    let gateway_policy: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kyma-project.io--istio-ingressgateway-egress",
                         "labels": {"kyma-project.io/module": "istio"}},
            "spec": {"podSelector": {"matchLabels": {"istio": "ingressgateway"}},
                     "policyTypes": ["Egress"],
                     "egress": [{"to": [{"podSelector": {"matchLabels":
                         {"networking.kyma-project.io/from-ingressgateway": "allowed"}},
                         "namespaceSelector": {}}]}]}
        }))?;
    let istio_policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(admin.clone(), names::ISTIO_NAMESPACE);
    istio_policies
        .create(&Default::default(), &gateway_policy)
        .await
        .context("the Istio module's gateway egress policy")?;
    let gateway = probe_pod(
        cluster,
        names::ISTIO_NAMESPACE,
        "np-ingressgateway",
        serde_json::json!({"istio": "ingressgateway"}),
    )
    .await?;
    let mappings: Api<cp_api::ServiceMapping> = Api::all(admin.clone());
    let mut channel = cp_api::testing::tcp_mapping("np-channel", "np-subaccount", "np-channel");
    channel.spec.internal_address = format!("{target}:3300");
    mappings.create(&Default::default(), &channel).await?;
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until_object(
        &policies,
        names::NETWORK_POLICIES[7],
        "the proxy's egress opens the channel's port",
        Duration::from_secs(60),
        |np| {
            let body = serde_json::to_string(&np.spec).unwrap_or_default();
            if body.contains("3300") {
                Ok(Some(()))
            } else {
                Err(body)
            }
        },
    )
    .await?;
    let scraper = probe_pod(
        cluster,
        "np-probe",
        "np-scraper",
        serde_json::json!({"networking.kyma-project.io/metrics-scraping": "allowed"}),
    )
    .await?;
    let anyone = probe_pod(
        cluster,
        "np-probe",
        "np-anyone",
        serde_json::json!({"app": "np-probe"}),
    )
    .await?;
    // Shaped like the proxy's pods (its policies select it): what the proxy may reach.
    let proxy_like = probe_pod(
        cluster,
        names::KYMA_SYSTEM,
        "np-proxy-like",
        serde_json::json!({"app": "connectivity-proxy", "kyma-project.io/module": "connectivity-proxy"}),
    )
    .await?;
    let cases = [
        (
            "a scraper → controller metrics",
            &scraper,
            controller.as_str(),
            8080,
            true,
        ),
        (
            "a scraper → webhook metrics",
            &scraper,
            webhook.as_str(),
            8080,
            true,
        ),
        (
            "anyone → webhook admission port",
            &anyone,
            webhook.as_str(),
            9443,
            true,
        ),
        (
            "anyone → the proxy's HTTP port",
            &anyone,
            proxy.as_str(),
            http_port,
            true,
        ),
        (
            "anyone → the proxy's tunnel port",
            &anyone,
            proxy.as_str(),
            names::TUNNEL_PORT,
            true,
        ),
        (
            "a pod that is no scraper → controller metrics",
            &anyone,
            controller.as_str(),
            8080,
            false,
        ),
        (
            "a pod that is no scraper → webhook metrics",
            &anyone,
            webhook.as_str(),
            8080,
            false,
        ),
        (
            "a proxy-shaped pod → the CA endpoint (443)",
            &proxy_like,
            cp_tests::netns::NODE_IP,
            443,
            true,
        ),
        (
            "a proxy-shaped pod → the API server (6443: the proxy has no business there)",
            &proxy_like,
            cp_tests::netns::NODE_IP,
            i32::from(cp_tests::cluster::API_PORT_IN_NETNS),
            false,
        ),
        (
            "a proxy-shaped pod → controller metrics (egress)",
            &proxy_like,
            controller.as_str(),
            8080,
            false,
        ),
        (
            "a proxy-shaped pod → kube-dns on 53",
            &proxy_like,
            dns_ip.as_str(),
            53,
            true,
        ),
        (
            "a proxy-shaped pod → kube-dns on 8053 (Gardener's CoreDNS)",
            &proxy_like,
            dns_ip.as_str(),
            8053,
            true,
        ),
        (
            "a proxy-shaped pod → kube-dns on another port",
            &proxy_like,
            dns_ip.as_str(),
            9053,
            false,
        ),
        (
            "a proxy-shaped pod → a service channel's target (3300, mapped)",
            &proxy_like,
            target.as_str(),
            3300,
            true,
        ),
        (
            "a proxy-shaped pod → the same pod on a port no mapping names",
            &proxy_like,
            target.as_str(),
            3301,
            false,
        ),
        (
            "a proxy-shaped pod (its sidecar) → istiod on 15012",
            &proxy_like,
            istiod.as_str(),
            15012,
            true,
        ),
        (
            "a proxy-shaped pod → istiod on 15010 (plain-text xDS)",
            &proxy_like,
            istiod.as_str(),
            15010,
            false,
        ),
        (
            "the ingress gateway under the Istio module's policy → the proxy's tunnel port",
            &gateway,
            proxy.as_str(),
            names::TUNNEL_PORT,
            true,
        ),
        (
            "the ingress gateway under the Istio module's policy → an unlabelled pod",
            &gateway,
            dns_ip.as_str(),
            9053,
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, from, ip, port, expected) in &cases {
        let got = connects(cluster, from, ip, *port)?;
        println!(
            "network policy: {what} ({ip}:{port}): {}",
            if got { "passes" } else { "dropped" }
        );
        if got != *expected {
            wrong.push(format!(
                "{what}: {}",
                if got { "passes" } else { "dropped" }
            ));
        }
    }
    anyhow::ensure!(wrong.is_empty(), "flows not as the policies say: {wrong:?}");

    // Switched off by a privileged identity: the dropped flow passes; back on: dropped again.
    let sre = cluster
        .cp
        .client(&cp_tests::cluster::Identity::User {
            name: cp_tests::node::SRE_USER.into(),
            groups: vec!["system:masters".into()],
        })
        .await?;
    let crs: Api<ConnectivityProxy> = Api::namespaced(sre, names::KYMA_SYSTEM);
    let key = cp_api::keys::DISABLE_NETWORK_POLICIES_ANNOTATION;
    for (value, expected) in [
        (serde_json::json!("true"), true),
        (serde_json::Value::Null, false),
    ] {
        crs.patch(
            CR,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .context("the switch-off annotation")?;
        cp_tests::wait::until(
            "the unlabelled pod's scrape follows the switch",
            Duration::from_secs(60),
            || {
                let got =
                    connects(cluster, &anyone, &controller, 8080).map_err(|e| format!("{e:#}"));
                async move {
                    let got = got?;
                    (got == expected)
                        .then_some(())
                        .map(Some)
                        .ok_or(format!("connects: {got}"))
                }
            },
        )
        .await?;
    }
    // The probes, their namespace, the stand-ins, the Istio module's policy and the mapping go (the
    // uninstall step compares the cluster with its state before).
    Api::<Pod>::namespaced(admin.clone(), names::KYMA_SYSTEM)
        .delete("np-proxy-like", &DeleteParams::default().grace_period(0))
        .await?;
    Api::<Pod>::namespaced(admin.clone(), "kube-system")
        .delete("np-kube-dns", &DeleteParams::default().grace_period(0))
        .await?;
    let istio_pods: Api<Pod> = Api::namespaced(admin.clone(), names::ISTIO_NAMESPACE);
    for pod in ["np-istiod", "np-ingressgateway"] {
        istio_pods
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await?;
    }
    istio_policies
        .delete(
            "kyma-project.io--istio-ingressgateway-egress",
            &DeleteParams::default(),
        )
        .await?;
    mappings
        .delete("np-channel", &DeleteParams::default())
        .await?;
    let namespaces: Api<Namespace> = Api::all(admin);
    namespaces
        .delete("np-probe", &DeleteParams::default())
        .await?;
    Ok(())
}

/// A CR edit reaches the running proxy: the controller renders it, the pods roll, the stand-in reads the
/// new port and listens on it (Ready again).
async fn edit_reaches_the_proxy(cluster: &Cluster, port: i64) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    let cr: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cr.patch(
        CR,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": port}}}}}})),
    )
    .await?;
    wait_cr_ready(cluster, Duration::from_secs(180)).await?;
    let sts: Api<StatefulSet> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until(
        &format!("the proxy pod listening on {port}"),
        Duration::from_secs(180),
        || async {
            let s = cp_tests::wait::get(&sts, names::STATEFULSET).await?;
            let st = s.status.unwrap_or_default();
            if st.update_revision != st.current_revision || st.ready_replicas.unwrap_or(0) < 1 {
                return Err(format!("rolling: {st:?}"));
            }
            let p = cp_tests::wait::get(&pods, "connectivity-proxy-0").await?;
            let config = standin_config(cluster, &pod_name(&p)).map_err(|e| format!("{e:#}"))?;
            Ok((config["servers"]["proxy"]["http"]["port"] == port).then_some(()))
        },
    )
    .await
}

/// The service channels the proxy stand-in last said it read from its mapping files, in `pod`.
fn standin_channels(cluster: &Cluster, pod: &str) -> anyhow::Result<Option<u64>> {
    Ok(cluster
        .standin_log(pod)?
        .iter()
        .find(|v| v["event"] == "mappings")
        .and_then(|v| v["channels"].as_u64()))
}

/// A ServiceMapping created while the proxy runs is in its files within seconds, not at the kubelet's
/// next periodic sync of the pod (a minute by default, on this node too): the controller sets the
/// mappings annotation on the proxy's pods after writing the shard, and the kubelet refreshes their
/// ConfigMap volumes on that update. The deadline (10 s) is well inside the kubelet's period, so
/// without the annotation this step fails about five times in six.
async fn a_new_mapping_reaches_the_proxy_at_once(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let proxies = ready_pods(cluster, "app=connectivity-proxy").await?;
    let mut before = Vec::new();
    for p in &proxies {
        let name = pod_name(p);
        let channels = standin_channels(cluster, &name)?
            .with_context(|| format!("{name}: the stand-in logged no mappings line"))?;
        before.push((name, channels));
    }
    let mappings: Api<cp_api::ServiceMapping> = Api::all(admin.clone());
    let channel =
        cp_api::testing::tcp_mapping("files-channel", "files-subaccount", "files-channel");
    let created = Instant::now();
    mappings.create(&Default::default(), &channel).await?;
    for (pod, channels) in &before {
        cp_tests::wait::until(
            &format!("{pod}: the proxy stand-in reads the new mapping from its files"),
            Duration::from_secs(10),
            || {
                let got = standin_channels(cluster, pod).map_err(|e| format!("{e:#}"));
                async move {
                    let got = got?;
                    (got == Some(channels + 1))
                        .then_some(Some(()))
                        .ok_or(format!("{got:?} channels, {channels} before"))
                }
            },
        )
        .await?;
        let p = pods.get(pod).await?;
        anyhow::ensure!(
            p.metadata
                .annotations
                .unwrap_or_default()
                .contains_key(cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION),
            "{pod}: no {} annotation",
            cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION
        );
    }
    println!(
        "node: a new mapping in the proxy's files {} ms after its create ({} pods)",
        created.elapsed().as_millis(),
        before.len()
    );
    mappings
        .delete("files-channel", &DeleteParams::default())
        .await?;
    Ok(())
}

/// Deleting the controller's pod: the Deployment's new pod takes the Lease and applies the next edit.
async fn controller_pod_replaced(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    let old = ready_pods(cluster, CONTROLLER_PODS).await?;
    let old_name = pod_name(old.first().context("no controller pod")?);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    pods.delete(&old_name, &DeleteParams::default()).await?;
    let what = "a new controller pod Ready";
    let new_name = cp_tests::wait::until(what, Duration::from_secs(120), || async {
        let ready = ready_pods(cluster, CONTROLLER_PODS)
            .await
            .map_err(|e| e.to_string())?;
        Ok(ready.iter().map(pod_name).find(|n| *n != old_name))
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let what = "the new pod holding the Lease";
    cp_tests::wait::until(what, Duration::from_secs(60), || async {
        let list = cp_tests::wait::list(&leases).await?;
        let holders: Vec<String> = list
            .items
            .iter()
            .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
            .collect();
        Ok(holders
            .iter()
            .any(|h| h.contains(&new_name))
            .then_some(())
            .or_else(|| {
                tracing::info!(?holders, "not yet");
                None
            }))
    })
    .await?;
    edit_reaches_the_proxy(cluster, 20011).await
}

/// One webhook pod deleted while admissions run, from before the delete until after the pod is gone and
/// out of the Service's endpoints (at least 200 in all): none fails (two replicas, a PDB, readiness off
/// before the server stops).
async fn webhook_pod_deleted_under_load(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    let webhooks = ready_pods(cluster, WEBHOOK_PODS).await?;
    anyhow::ensure!(
        webhooks.len() == 2,
        "{}",
        cluster.pods_summary(names::KYMA_SYSTEM)
    );
    let victim = pod_name(&webhooks[0]);
    let victim_ip = webhooks[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("webhook pod without an IP")?;
    let cr: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ok, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut workers = Vec::new();
    for w in 0..4i64 {
        let (cr, failures, ok, stop) = (cr.clone(), failures.clone(), ok.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0i64;
            while !stop.load(Ordering::SeqCst) {
                // A server-side dry run goes through both webhooks and stores nothing.
                let patch = serde_json::json!({"spec": {"config": {"servers": {"proxy": {"socks5": {"port": 20100 + w * 1000 + i % 1000}}}}}});
                let params = PatchParams { dry_run: true, ..Default::default() };
                match cr.patch(CR, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        if let Ok(mut f) = failures.lock() {
                            f.push(e.to_string());
                        }
                    }
                }
                i += 1;
            }
        }));
    }
    let at_least = |n: usize, what: &'static str| {
        let ok = ok.clone();
        async move {
            cp_tests::wait::until(what, Duration::from_secs(120), || {
                let ok = ok.clone();
                async move { Ok((ok.load(Ordering::SeqCst) >= n).then_some(())) }
            })
            .await
        }
    };
    at_least(50, "50 admissions before the delete").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    pods.delete(&victim, &DeleteParams::default()).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cp_tests::wait::until(
        "the deleted pod gone and out of the webhook Service's endpoints",
        Duration::from_secs(120),
        || {
            let (pods, slices, victim, victim_ip) = (
                pods.clone(),
                slices.clone(),
                victim.clone(),
                victim_ip.clone(),
            );
            async move {
                let gone = cp_tests::wait::get_opt(&pods, &victim).await?.is_none();
                let listed =
                    slices
                        .list(&ListParams::default().labels(
                            "kubernetes.io/service-name=connectivity-proxy-operator-webhook",
                        ))
                        .await
                        .map_err(|e| e.to_string())?
                        .items
                        .iter()
                        .flat_map(|s| s.endpoints.iter().flatten())
                        .any(|e| e.addresses.contains(&victim_ip));
                Ok((gone && !listed).then_some(()))
            }
        },
    )
    .await?;
    let after = ok.load(Ordering::SeqCst);
    at_least(
        (after + 50).max(200),
        "50 admissions after the pod is gone, 200 in all",
    )
    .await?;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await?;
    }
    let failures = failures.lock().map(|f| f.clone()).unwrap_or_default();
    let total = ok.load(Ordering::SeqCst) + failures.len();
    assert!(
        failures.is_empty(),
        "{} of {total} admissions failed: {failures:?}",
        failures.len()
    );
    println!("{total} admissions while webhook pod {victim} was deleted: none failed");
    cluster
        .wait_deployment_available(names::KYMA_SYSTEM, "connectivity-proxy-operator-webhook", 2)
        .await
}

/// The CR deleted, then `kubectl delete -f` of the bundle: nothing of ours is left, nothing of the
/// cluster's is gone.
async fn uninstall(
    cluster: &Cluster,
    before: &std::collections::BTreeSet<String>,
) -> anyhow::Result<()> {
    let admin = cluster.cp.admin().await?;
    let cr: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    cr.delete(CR, &DeleteParams::default()).await?;
    cp_tests::wait::until("the CR gone", Duration::from_secs(120), || async {
        Ok(cp_tests::wait::get_opt(&cr, CR)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let bundle = cp_tests::workspace_root().join("manifests/connectivity-proxy-operator.yaml");
    cluster.kubectl_run(&["delete", "--wait=true", "-f", &bundle.display().to_string()])?;
    cluster.remove_sre_config().await?;
    wait_inventory_as_before(cluster, before).await
}

/// Waits until the cluster's inventory is `before` again: nothing left behind, nothing gone.
pub(crate) async fn wait_inventory_as_before(
    cluster: &Cluster,
    before: &std::collections::BTreeSet<String>,
) -> anyhow::Result<()> {
    let what = "the cluster as before the install";
    cp_tests::wait::until(what, Duration::from_secs(120), || async {
        let now = inventory(cluster).map_err(|e| format!("{e:#}"))?;
        let left: Vec<&String> = now.difference(before).collect();
        let gone: Vec<&String> = before.difference(&now).collect();
        if left.is_empty() && gone.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("left behind: {left:?}; gone: {gone:?}"))
        }
    })
    .await
}
