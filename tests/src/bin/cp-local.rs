//! `make run`: a local control plane with the module installed (CRDs, RBAC, the webhook registered in
//! the API server, the controller), Istio's and the BTP operator's CRDs, and the default CR. Prints
//! the CR's status as it changes; Ctrl-C stops every process it started.
//!
//! `make run-cluster` (`cp-local --node`, root): the control plane plus a real node (containerd, kubelet,
//! kube-proxy) in a network namespace of its own, the module installed from the rendered bundle exactly
//! as the module manager installs it, its pods and the (stand-in) proxy run by the kubelet.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cp_api::{ConnectivityProxy, names};
use cp_tests::cluster::{ControlPlane, Options, ensure_namespace, k8s_bin_dir};
use cp_tests::controller::ControllerProcess;
use cp_tests::webhook::Webhook;
use cp_tests::{fixtures, manifest, workspace_root};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// The cluster domain `make run` pretends to have (so the tunnel host is `cp.local.kyma.dev`).
const DOMAIN: &str = "local.kyma.dev";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cp_api::cli::exit_code("cp-local", run().await)
}

async fn run() -> anyhow::Result<()> {
    let node = std::env::args().skip(1).any(|a| a == "--node");
    // `make run` passes its checkout: a cp-local built from another checkout (a shared CARGO_TARGET_DIR)
    // would read that checkout's manifests and fixtures.
    if let Some(started_in) = std::env::var_os("CP_WORKSPACE") {
        let canon = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
        let (started_in, built_from) = (canon(PathBuf::from(started_in)), canon(workspace_root()));
        anyhow::ensure!(
            started_in == built_from,
            "this cp-local was built from {} but `make run` runs in {}: CARGO_TARGET_DIR ({}) is shared \
             between checkouts; unset it (the Makefile keys the build cache by checkout) or give each \
             checkout its own",
            built_from.display(),
            started_in.display(),
            std::env::var("CARGO_TARGET_DIR").unwrap_or_default()
        );
    }
    if node {
        return run_cluster().await;
    }
    let dir = std::env::var_os("CP_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cp-operator-run"));
    println!(
        ">> starting etcd, kube-apiserver and kube-controller-manager in {}",
        dir.display()
    );
    let opts = Options {
        dir: Some(dir.clone()),
        keep_dir: true,
        ..Default::default()
    };
    let cp = tokio::task::spawn_blocking(move || ControlPlane::start(opts)).await??;
    let client = cp.admin().await?;

    let crds = workspace_root().join("manifests/crds");
    for entry in std::fs::read_dir(&crds).with_context(|| format!("reading {}", crds.display()))? {
        manifest::apply_file(&client, &entry?.path(), None).await?;
    }
    fixtures::apply(&client, &[fixtures::ISTIO_CRDS, fixtures::BTP_CRDS], None).await?;
    println!(">> installed our CRDs and the CRDs of Istio and the SAP BTP service operator");
    ensure_namespace(&client, names::KYMA_SYSTEM).await?;
    ensure_namespace(&client, names::ISTIO_NAMESPACE).await?;
    manifest::apply_json(&client, fixtures::shoot_info(Some(DOMAIN)), None).await?;

    // As in a cluster: the controller issues the webhook's certificate (here for 127.0.0.1) and writes
    // the CA bundle into the webhook configurations; the webhook serves it from the Secret.
    let controller =
        ControllerProcess::start(&cp, "cp-controller", &["--webhook-ips=127.0.0.1"]).await?;
    println!(
        ">> controller running (metrics at http://{}/metrics)",
        controller.metrics_addr
    );
    let webhook = Webhook::start_from_secret(&cp, "cp-webhook", &[]).await?;
    webhook.register(&client).await?;
    println!(
        ">> webhook serving at {} and registered in the API server",
        webhook.url
    );

    let default_cr = fixtures::default_cr_path();
    // The first attempts can meet the API server before the controller injected the CA bundle.
    let (c, cr_path) = (client.clone(), default_cr.clone());
    let what = "the default CR admitted through the webhook";
    cp_tests::wait::until(what, Duration::from_secs(60), || async {
        manifest::apply_file(&c, &cr_path, Some(names::KYMA_SYSTEM))
            .await
            .map(|_| Some(()))
            .map_err(|e| format!("{e:#}"))
    })
    .await?;
    println!(
        ">> applied the default CR the module manager creates ({})\n",
        default_cr.display()
    );

    let kubectl = k8s_bin_dir()?.join("kubectl");
    println!(
        "The local control plane is up at {server}. In another shell:\n\
         \n  export KUBECONFIG={kc}\n  alias kubectl={kubectl}\n\
         \n  kubectl get cp -A                                   # State column\n\
         \x20 kubectl get cp connectivity-proxy -n kyma-system -o yaml   # spec.deployment was injected by the webhook\n\
         \x20 kubectl get statefulset,svc,cm,gateway,virtualservice -n kyma-system\n\
         \x20 kubectl patch cp connectivity-proxy -n kyma-system --type merge -p '{{\"spec\":{{\"deployment\":{{\"replicaCount\":3}}}}}}'\n\
         \x20     # refused by the webhook: spec.deployment is protected\n\
         \x20 kubectl patch cp connectivity-proxy -n kyma-system --type merge -p '{{\"spec\":{{\"config\":{{\"servers\":{{\"proxy\":{{\"http\":{{\"port\":20010}}}}}}}}}}}}'\n\
         \x20     # allowed: ConfigMap connectivity-proxy-info follows within a second\n\
         \nLogs: {dir}/cp-webhook.log, {dir}/cp-controller.log. Press Ctrl-C to stop everything.\n",
        server = cp.server,
        kc = cp.admin_kubeconfig.display(),
        kubectl = kubectl.display(),
        dir = dir.display(),
    );

    // The stand-in BTP operator acts for every binding, as the real one does (a CR deleted and created
    // again gets its key again); its service keys point at a CA endpoint served here.
    let (ca_url, _ca_server) = cp_tests::serve_static(
        cp_certs::Ca::generate(
            "local Connectivity service CA",
            time::OffsetDateTime::now_utc(),
            time::OffsetDateTime::now_utc() + time::Duration::days(30),
            cp_certs::KeyAlgorithm::default(),
        )?
        .cert_pem,
    )
    .await?;
    let key = json!({"clientid": "cid", "clientsecret": "local-secret", "subaccount_id": "00000000-0000-4000-8000-000000000000",
        "subaccount_subdomain": "local-subdomain", "uaadomain": cp_tests::CA_ENDPOINT_UAADOMAIN,
        "connectivity_service": {"CAs_path": "/api/v1/CAs", "url": ca_url}});
    let btp = tokio::spawn(cp_tests::fakes::run_btp_operator(
        client.clone(),
        Duration::from_secs(1),
        move |ns, binding| {
            println!(
                "[make run] no SAP BTP service operator runs here: wrote the Secret of ServiceBinding {ns}/{binding} and marked it ready, as it would"
            );
            key.clone()
        },
    ));
    tokio::select! {
        r = follow(client.clone(), true) => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("\n>> stopping");
    btp.abort();
    drop(client);
    tokio::task::spawn_blocking(move || drop(cp)).await?;
    println!(">> stopped; nothing is left running");
    Ok(())
}

/// Prints each state change of every CR and, with `play_kubelet`, plays the kubelet for the StatefulSet
/// (without a node, nothing else would ever mark its pods ready).
async fn follow(client: kube::Client, play_kubelet: bool) -> anyhow::Result<()> {
    let api: Api<ConnectivityProxy> = Api::all(client.clone());
    let mut last = std::collections::HashMap::new();
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(cr) = stream.next().await {
        let cr = cr?;
        let key = format!(
            "{}/{}",
            cr.metadata.namespace.clone().unwrap_or_default(),
            cr.metadata.name.clone().unwrap_or_default()
        );
        let status = cr.status.clone().unwrap_or_default();
        let line = format!(
            "{}: {}",
            status
                .state
                .map(|s| s.to_string())
                .unwrap_or_else(|| "(no state yet)".into()),
            status.description.unwrap_or_default()
        );
        if last.get(&key) != Some(&line) {
            println!("[status] {key} {line}");
            last.insert(key.clone(), line);
        }
        let ns = cr.metadata.namespace.clone().unwrap_or_default();
        let has = |reason: &str| status.conditions.iter().any(|c| c.reason == reason);
        if play_kubelet && has("StatefulSetNotReady") {
            tokio::time::sleep(Duration::from_secs(2)).await; // let a person see Processing first
            if cp_tests::fakes::mark_statefulset_ready(&client, &ns)
                .await
                .is_ok()
            {
                println!(
                    "[make run] no kubelet runs here: marked StatefulSet {ns}/{} ready, as a kubelet would",
                    names::STATEFULSET
                );
            }
        }
    }
    Ok(())
}

/// `make run-cluster`: control plane + node, the bundle applied with kubectl, the default CR; follows the
/// CR's status until Ctrl-C.
async fn run_cluster() -> anyhow::Result<()> {
    use cp_tests::node::{Cluster, NODE_FD_LIMIT, SRE_USER};
    if let Err(why) = cp_tests::node::supported() {
        anyhow::bail!("make run-cluster: {why}; `make run` needs no root");
    }
    let dir = std::env::var_os("CP_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cp-operator-run-cluster"));
    println!(
        ">> starting the control plane and a node (containerd, kubelet, kube-proxy) in {}",
        dir.display()
    );
    let d = dir.clone();
    let cluster = tokio::task::spawn_blocking(move || Cluster::start_in(Some(d), true)).await??;
    println!(
        ">> node {} Ready; loaded the images of `make images` into its containerd",
        cp_tests::node::NODE_NAME
    );
    cluster.prepare_kyma().await?;
    println!(
        ">> kyma-system (Pod Security: restricted), istio-system, Istio's and the BTP operator's CRDs, shoot-info"
    );
    cluster.install_bundle().await?;
    println!(
        ">> kubectl apply --server-side -f manifests/connectivity-proxy-operator.yaml: webhook (2 pods) and controller Running and Ready"
    );
    cluster.apply_default_cr().await?;
    println!(">> kubectl apply --server-side -f manifests/default-cr.yaml");
    cluster.fit_fd_limit_to_node("connectivity-proxy").await?;
    println!(
        ">> this node's hard open-files limit is 20000: as {SRE_USER} (privileged in connectivity-proxy-operator-config) \
         set spec.deployment.resources.maxFileDescriptorCount to {NODE_FD_LIMIT}"
    );
    let kubectl = k8s_bin_dir()?.join("kubectl");
    println!(
        "\nThe cluster is up at {server}. In another shell:\n\
         \n  export KUBECONFIG={kc}\n  alias kubectl={kubectl}\n\
         \n  kubectl get pods -n kyma-system -o wide               # webhook x2, controller, proxy (stand-in image)\n\
         \x20 kubectl get cp -A                                    # State column\n\
         \x20 kubectl logs -n kyma-system connectivity-proxy-0      # the stand-in proxy's view of its configuration\n\
         \x20 kubectl patch cp connectivity-proxy -n kyma-system --type merge -p '{{\"spec\":{{\"deployment\":{{\"replicaCount\":3}}}}}}'\n\
         \x20     # refused by the webhook (through its Service): spec.deployment is protected\n\
         \x20 kubectl patch cp connectivity-proxy -n kyma-system --type merge -p '{{\"spec\":{{\"config\":{{\"servers\":{{\"proxy\":{{\"http\":{{\"port\":20010}}}}}}}}}}}}'\n\
         \x20     # allowed: the proxy pod rolls and listens on the new port\n\
         \nLogs: {dir}/*.log (control plane, containerd, kubelet), {dir}/pod-logs. Press Ctrl-C to stop everything.\n",
        server = cluster.cp.server,
        kc = cluster.cp.admin_kubeconfig.display(),
        kubectl = kubectl.display(),
        dir = dir.display(),
    );
    let client = cluster.cp.admin().await?;
    tokio::select! {
        r = follow(client.clone(), false) => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("\n>> stopping");
    drop(client);
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    println!(">> stopped; nothing is left running");
    Ok(())
}
