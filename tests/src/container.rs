//! Running the operator's images (from `make images`) with podman against a local control plane,
//! configured as the Deployments in `manifests/` configure them: the same args (listen addresses moved
//! to free loopback ports, since the container shares the host's network), env, user, read-only root
//! filesystem, dropped capabilities and no privilege escalation.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::ControlPlane;

/// Label on every container the harness starts, so leftovers of a killed run can be found and removed.
pub const LABEL: &str = "cp-operator.test=1";

/// podman refuses its default rlimits in this sandbox (measured); these work and raise nothing.
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// The local name `make images` gives an image: `localhost/cp-<name>:<workspace version>`.
pub fn image(name: &str) -> String {
    format!("localhost/cp-{name}:{}", cp_api::defaults::RELEASE)
}

/// podman's global options: runc, since Debian's crun refuses this machine's hybrid cgroup layout
/// ("cgroups in hybrid mode not supported"); runc 1.1 runs the images as they are.
pub const PODMAN_GLOBAL: [&str; 1] = ["--runtime=runc"];

/// Runs podman to completion.
pub fn podman(args: &[&str]) -> anyhow::Result<Output> {
    Command::new("podman")
        .args(PODMAN_GLOBAL)
        .args(args)
        .output()
        .context("running podman (apt-get install -y podman; `make images` installs it as root)")
}

/// Fails with the fix when an image is missing.
pub fn require_image(image: &str) -> anyhow::Result<()> {
    let out = podman(&["image", "exists", image])?;
    if !out.status.success() {
        bail!("image {image} not found: run `make images` (make test does it first)");
    }
    Ok(())
}

/// Removes every container a previous run left behind.
pub fn remove_leftovers() -> anyhow::Result<()> {
    let out = podman(&["ps", "-aq", "--filter", &format!("label={LABEL}")])?;
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        podman(&["rm", "-f", "-t", "0", id])?;
    }
    Ok(())
}

/// What a Deployment's container says about how to run it.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// `args`.
    pub args: Vec<String>,
    /// `env` entries with a literal `value` or a `fieldRef` to the pod name (given the container's name).
    pub env: Vec<(String, String)>,
    /// `runAsUser`:`runAsGroup` (container or pod security context).
    pub user: Option<String>,
    /// `readOnlyRootFilesystem`.
    pub read_only: bool,
    /// `capabilities.drop` contains `ALL`.
    pub drop_all_caps: bool,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privileges: bool,
    /// `containerPort`s by name.
    pub ports: Vec<(String, i64)>,
}

impl ContainerSpec {
    /// Reads the first Deployment in `manifest` (a path under the workspace) and its container `name`.
    pub fn from_deployment(manifest: &str, container: &str) -> anyhow::Result<Self> {
        let path = crate::workspace_root().join(manifest);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {manifest}"))?;
        let deployment = crate::manifest::parse_documents(&text)?
            .into_iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .find(|d| d["kind"] == "Deployment")
            .with_context(|| format!("no Deployment in {manifest}"))?;
        let pod = &deployment["spec"]["template"]["spec"];
        let c = pod["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == container)
            .with_context(|| format!("no container {container} in {manifest}"))?;
        let strs = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        };
        let sc = &c["securityContext"];
        let psc = &pod["securityContext"];
        let pick = |k: &str| sc.get(k).or_else(|| psc.get(k)).and_then(Value::as_i64);
        let user = pick("runAsUser").map(|u| format!("{u}:{}", pick("runAsGroup").unwrap_or(u)));
        let env = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e["name"].as_str()?.to_string();
                if let Some(v) = e["value"].as_str() {
                    return Some((name, v.to_string()));
                }
                (e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name")
                    .then(|| (name, format!("{container}-pod")))
            })
            .collect();
        Ok(Self {
            args: strs(&c["args"]),
            env,
            user,
            read_only: sc["readOnlyRootFilesystem"] == true,
            drop_all_caps: strs(&sc["capabilities"]["drop"]).iter().any(|d| d == "ALL"),
            no_new_privileges: sc["allowPrivilegeEscalation"] == false,
            ports: c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    Some((
                        p["name"].as_str()?.to_string(),
                        p["containerPort"].as_i64()?,
                    ))
                })
                .collect(),
        })
    }

    /// Replaces the value of `--flag=...` in the args (the flag must be there).
    pub fn set_arg(&mut self, flag: &str, value: &str) -> anyhow::Result<()> {
        let prefix = format!("{flag}=");
        let arg = self
            .args
            .iter_mut()
            .find(|a| a.starts_with(&prefix))
            .with_context(|| format!("the Deployment has no {flag}"))?;
        *arg = format!("{prefix}{value}");
        Ok(())
    }

    /// The `podman run` options this spec asks for.
    pub fn run_options(&self) -> Vec<String> {
        let mut o: Vec<String> = ULIMITS.iter().map(|s| s.to_string()).collect();
        if let Some(u) = &self.user {
            o.push(format!("--user={u}"));
        }
        if self.read_only {
            o.push("--read-only".into());
        }
        if self.drop_all_caps {
            o.push("--cap-drop=ALL".into());
        }
        if self.no_new_privileges {
            o.push("--security-opt=no-new-privileges".into());
        }
        for (k, v) in &self.env {
            o.push(format!("--env={k}={v}"));
        }
        o
    }
}

/// A running container; removed (SIGKILL) when dropped.
pub struct Container {
    /// Its podman name, also the process name in the control plane (log `<name>.log`).
    pub name: String,
}

impl Container {
    /// Starts `image` as `name` on the host network with `spec`, the kubeconfig mounted read-only as
    /// `KUBECONFIG`, and `extra_args` after the spec's args. `podman run` stays in the foreground as a
    /// process of the control plane's group, so its output lands in `<name>.log`.
    pub fn start(
        cp: &ControlPlane,
        name: &str,
        image: &str,
        spec: &ContainerSpec,
        kubeconfig: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        require_image(image)?;
        let _ = podman(&["rm", "-f", "-t", "0", name]);
        // The container runs as the Deployment's non-root user: hand it its own copy of the kubeconfig.
        let own = cp.dir.join(format!("{name}.container.kubeconfig"));
        std::fs::copy(kubeconfig, &own)
            .with_context(|| format!("copying {}", kubeconfig.display()))?;
        if let Some((uid, gid)) = spec.user.as_deref().and_then(|u| u.split_once(':')) {
            std::os::unix::fs::chown(&own, uid.parse().ok(), gid.parse().ok())
                .with_context(|| format!("chown {uid}:{gid} {}", own.display()))?;
        }
        // The stand-in Connectivity CA endpoint's root, trusted by the controller (ignored by the webhook).
        let trust = cp.dir.join("ca-endpoint-root.pem");
        std::fs::write(&trust, &crate::ca_endpoint_tls()?.root_pem)
            .with_context(|| format!("writing {}", trust.display()))?;
        // And the trust Secret's host list and allowed networks: the endpoint is on loopback.
        let hosts = cp.dir.join("ca-endpoint-allowed-hosts");
        std::fs::write(&hosts, crate::CA_ENDPOINT_HOSTS)?;
        let networks = cp.dir.join("ca-endpoint-allowed-networks");
        std::fs::write(&networks, crate::CA_ENDPOINT_NETWORKS)?;
        let mut cmd = Command::new("podman");
        cmd.args(PODMAN_GLOBAL)
            .args([
                "run",
                "--rm",
                "--name",
                name,
                "--label",
                LABEL,
                "--network=host",
            ])
            .args(spec.run_options())
            .arg(format!(
                "--volume={}:/var/run/cp/kubeconfig:ro",
                own.display()
            ))
            .arg("--env=KUBECONFIG=/var/run/cp/kubeconfig")
            // Where the bundle's controller Deployment mounts its optional trust Secret (and points
            // `--connectivity-ca-trust` at).
            .arg(format!(
                "--volume={}:/etc/cp-operator/ca-trust/ca.crt:ro",
                trust.display()
            ))
            .arg(format!(
                "--volume={}:/etc/cp-operator/ca-trust/allowed-hosts:ro",
                hosts.display()
            ))
            .arg(format!(
                "--volume={}:/etc/cp-operator/ca-trust/allowed-networks:ro",
                networks.display()
            ))
            .arg(image)
            .args(&spec.args)
            .args(extra_args);
        cp.spawn_process(name, &mut cmd)?;
        Ok(Self { name: name.into() })
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}
