//! Running the `cp-controller` binary against a control plane as its own ServiceAccount, with
//! exactly the permissions of `manifests/rbac/controller.yaml`.

use std::process::Command;

use crate::cluster::{ControlPlane, Identity, ensure_namespace};

/// The controller's ServiceAccount user name.
pub const CONTROLLER_USER: &str = "system:serviceaccount:kyma-system:connectivity-proxy-controller";

/// A running controller process.
pub struct ControllerProcess {
    /// Its process name in the control plane (log file `<name>.log`).
    pub name: String,
    /// `127.0.0.1:<port>` of `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: String,
}

impl ControllerProcess {
    /// Applies the controller's RBAC, starts the binary as the controller's ServiceAccount and waits
    /// until its caches are synced. `extra_args` go to the binary.
    pub async fn start(cp: &ControlPlane, name: &str, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_waiting_for(cp, name, extra_args, "/readyz").await
    }

    /// Starts a replica that is expected to wait for the leader lease: it is up when `/healthz`
    /// answers (its caches start only once it leads).
    pub async fn start_standby(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_waiting_for(cp, name, extra_args, "/healthz").await
    }

    async fn start_waiting_for(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
        path: &'static str,
    ) -> anyhow::Result<Self> {
        let admin = cp.admin().await?;
        // The RBAC binds the controller's namespaced writes in both (as a Kyma cluster has them).
        for ns in ["kyma-system", "istio-system"] {
            ensure_namespace(&admin, ns).await?;
        }
        crate::manifest::apply_controller_rbac(&admin).await?;
        let identity = Identity::ServiceAccount {
            namespace: "kyma-system".into(),
            name: "connectivity-proxy-controller".into(),
        };
        let kubeconfig = cp
            .write_kubeconfig(&format!("{name}.kubeconfig"), &identity)
            .await?;
        let port = crate::cluster::free_port()?;
        let bin = crate::own_bin_dir().join("cp-controller");
        anyhow::ensure!(
            bin.exists(),
            "{} not found: run `cargo build --workspace --bins` first",
            bin.display()
        );
        let mut cmd = Command::new(bin);
        cmd.env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("CP_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .env("POD_NAME", name)
            .envs(crate::manifest::deployment_env(
                "controller/deployment.yaml",
            )?)
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .args(crate::ca_endpoint_args(&cp.dir)?)
            .args(extra_args);
        cp.spawn_process(name, &mut cmd)?;
        let me = Self {
            name: name.into(),
            metrics_addr: format!("127.0.0.1:{port}"),
        };
        crate::webhook::wait_answers_200(cp, name, &me.metrics_addr, path).await?;
        Ok(me)
    }

    /// The value of a metric series (first line starting with `series`), or 0.
    pub async fn metric(&self, series: &str) -> f64 {
        crate::webhook::metric(&self.metrics_addr, series).await
    }

    /// The sum of every series of metric `name` (all label sets), or 0.
    pub async fn metric_sum(&self, name: &str) -> f64 {
        let Ok((_, body)) = crate::webhook::http_get(&self.metrics_addr, "/metrics").await else {
            return 0.0;
        };
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
