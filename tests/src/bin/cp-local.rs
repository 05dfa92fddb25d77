//! `make run`: a local control plane with the module installed and the default CR applied; stays up
//! until Ctrl-C, then stops every process it started.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use cp_tests::cluster::{ControlPlane, Options, k8s_bin_dir};
use cp_tests::{manifest, reference_dir, workspace_root};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
    };
    let cp = tokio::task::spawn_blocking(move || ControlPlane::start(opts)).await??;
    let client = cp.admin().await?;

    let crds = workspace_root().join("manifests/crds");
    for entry in std::fs::read_dir(&crds).with_context(|| format!("reading {}", crds.display()))? {
        let path = entry?.path();
        manifest::apply_file(&client, &path, None).await?;
        println!(">> applied {}", path.display());
    }
    for f in [
        "crds/istio.io.yaml",
        "crds/services.cloud.sap.com_serviceinstances.yaml",
        "crds/services.cloud.sap.com_servicebindings.yaml",
    ] {
        manifest::apply_file(&client, &reference_dir().join(f), None).await?;
        println!(">> applied {f} (Istio and the BTP operator are \"installed\")");
    }
    cp_tests::cluster::ensure_namespace(&client, cp_api::names::KYMA_SYSTEM).await?;
    let default_cr = reference_dir().join("examples/kyma-default-cr.yaml");
    manifest::apply_file(&client, &default_cr, Some(cp_api::names::KYMA_SYSTEM)).await?;
    println!(">> applied the default CR {}", default_cr.display());

    let kubectl = k8s_bin_dir()?.join("kubectl");
    let kc = cp.admin_kubeconfig.display();
    println!(
        "\nThe local control plane is up at {server}.\n\
         \n  export KUBECONFIG={kc}\n  alias kubectl={kubectl}\n\
         \nTry:\n  kubectl get cp -A\n  kubectl get cp connectivity-proxy -n kyma-system -o yaml\n  kubectl explain connectivityproxy.spec.config\n\
         \nPress Ctrl-C to stop everything.",
        server = cp.server,
        kubectl = kubectl.display(),
    );
    tokio::signal::ctrl_c().await?;
    println!("\n>> stopping");
    drop(client);
    tokio::task::spawn_blocking(move || drop(cp)).await?;
    println!(">> stopped; nothing is left running");
    Ok(())
}
