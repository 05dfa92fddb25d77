//! A cluster with a real node: the control plane of [`crate::cluster`] plus containerd 2 (runc, the CNI
//! bridge), kubelet and kube-proxy, all inside one network namespace of the run's own
//! ([`crate::netns`]). The node runs the operator's pods from the rendered bundle and the images of
//! `make images`; nothing marks anything ready.
//!
//! What the machine lacks is played, and named as a stand-in: DNS (a responder for one zone on the node's
//! address, which pods use as their nameserver), the Connectivity service's CA endpoint (HTTPS on the node's
//! address, `ca.node.test`), the SAP BTP service operator ([`crate::fakes::run_btp_operator`]), the proxy
//! image (`tests/standin-proxy`), the pod sandbox image (busybox `sleep`).
//!
//! The node's processes live in a PID and mount namespace of their own: when the control plane's
//! watchdog kills the node's root process, the kernel ends every container and shim with it, and their
//! mounts go with the namespace. The kubelet's cgroups live under a root named after the run, which the
//! watchdog removes.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::cluster::{ControlPlane, Identity, Options};
use crate::netns::{NODE_IP, Netns};

/// The node's name.
pub const NODE_NAME: &str = "cp-node";
/// The zone the stand-in DNS answers (with the node's address).
pub const DNS_ZONE: &str = "node.test";
/// The stand-in Connectivity CA endpoint's host.
pub const CA_ENDPOINT_HOST: &str = "ca.node.test";
/// The `uaadomain` of the stand-in service keys: its domain minus the first label is [`DNS_ZONE`].
pub const NODE_UAADOMAIN: &str = "authentication.node.test";
/// The pods' addresses (the CNI bridge's range).
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The Secret holding extra roots the controller trusts for the Connectivity CA endpoint (the bundle mounts
/// it, optional): the stand-in endpoint's root, as a private landscape would add its own.
pub const CA_TRUST_SECRET: &str = "connectivity-proxy-operator-ca-trust";

/// A running control plane and node.
pub struct Cluster {
    /// The control plane (its processes include the node's root process).
    pub cp: ControlPlane,
    /// The network namespace everything runs in.
    pub netns: Arc<Netns>,
    /// containerd's socket (reachable from the host: it is a file).
    pub containerd_socket: PathBuf,
    /// The `ctr` binary.
    pub ctr: PathBuf,
    /// The stand-in Connectivity CA endpoint's base URL.
    pub ca_endpoint: String,
    /// Restores the kernel settings and removes the cgroups once the processes are gone (dropped last).
    _leftovers: NodeLeftovers,
}

/// Host-wide settings the kubelet changes (not per network namespace): saved before it starts, restored
/// after the node stopped.
const KUBELET_SYSCTLS: [&str; 6] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// What the node leaves outside its namespaces: the kubelet's cgroups (under a root named after the
/// run) and the host-wide kernel settings it writes. Dropping it (after the node's processes are gone)
/// restores the settings and removes the cgroups; the watchdog does the same when the process dies
/// without dropping it.
struct NodeLeftovers {
    run_id: String,
    sysctls: Vec<(String, String)>,
}

/// The kernel settings as they were before the first node of this boot started, kept until the last node
/// is gone: a run that starts while an earlier one's cleanup is still pending must not take that node's
/// settings for the machine's.
const SAVED_SYSCTLS: &str = "/run/cp-operator-node-sysctls";

impl NodeLeftovers {
    fn new(run_id: &str) -> anyhow::Result<Self> {
        let saved = fs::read_to_string(SAVED_SYSCTLS).unwrap_or_default();
        let mut sysctls: Vec<(String, String)> = saved
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| KUBELET_SYSCTLS.contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if sysctls.is_empty() {
            sysctls = KUBELET_SYSCTLS
                .iter()
                .filter_map(|k| {
                    fs::read_to_string(format!("/proc/sys/{k}"))
                        .ok()
                        .map(|v| (k.to_string(), v.trim().to_string()))
                })
                .collect();
            let text: String = sysctls.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            fs::write(SAVED_SYSCTLS, text).with_context(|| format!("writing {SAVED_SYSCTLS}"))?;
        }
        for c in fs::read_dir("/sys/fs/cgroup")?.flatten() {
            if c.path().is_dir() {
                let _ = fs::create_dir_all(c.path().join(run_id));
            }
        }
        Ok(Self {
            run_id: run_id.to_string(),
            sysctls,
        })
    }

    /// The same cleanup as a shell snippet, for the watchdog.
    fn script(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.sysctls {
            s.push_str(&format!("echo '{v}' > /proc/sys/{k} 2>/dev/null\n"));
        }
        // The last node gone (its network namespace is deleted first): forget the saved settings.
        s.push_str(&format!(
            "ip netns list 2>/dev/null | grep -v '^{id}\\b' | grep -q '^cp-node-' || rm -f {SAVED_SYSCTLS}\n",
            id = self.run_id
        ));
        s.push_str(&format!(
            "for c in /sys/fs/cgroup/*/{id}; do [ -d \"$c\" ] || continue; \
             for i in 1 2 3 4 5 6 7 8 9 10; do find \"$c\" -depth -type d -exec rmdir {{}} + 2>/dev/null; \
             [ -d \"$c\" ] || break; sleep 0.5; done; done",
            id = self.run_id
        ));
        s
    }
}

impl Drop for NodeLeftovers {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args(["-c", &self.script()])
            .stderr(Stdio::null())
            .status();
    }
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The directory holding kube-router (`hack/npc-bins.sh` builds it on first use).
pub fn npc_bin_dir() -> anyhow::Result<PathBuf> {
    crate::script_bin_dir("CP_NPC_BIN_DIR", "hack/npc-bins.sh").map_err(anyhow::Error::msg)
}

/// The directory holding containerd, its shim and ctr (`hack/node-bins.sh` builds them on first use).
pub fn node_bin_dir() -> anyhow::Result<PathBuf> {
    crate::script_bin_dir("CP_NODE_BIN_DIR", "hack/node-bins.sh").map_err(anyhow::Error::msg)
}

/// Whether this machine can run the node: root (network namespaces, mounts, cgroups).
pub fn supported() -> Result<(), String> {
    let uid = run(Command::new("id").arg("-u"), "id -u").map_err(|e| format!("{e:#}"))?;
    if uid != "0" {
        return Err("the node needs root (network namespaces, mounts, cgroups)".into());
    }
    Ok(())
}

impl Cluster {
    /// The cluster shared by every test of this test group ([`crate::group`]), started on first use and
    /// stopped when the next group starts.
    pub fn shared() -> anyhow::Result<Arc<Cluster>> {
        static SHARED: crate::group::SyncSlot<Cluster> = crate::group::SyncSlot::new();
        SHARED
            .get_or_start(
                || {
                    std::thread::spawn(|| {
                        Cluster::start_in(None, std::env::var_os("CP_KEEP_DIR").is_some())
                    })
                    .join()
                    .map_err(|_| "cluster start panicked".to_string())
                    .and_then(|r| r.map_err(|e| format!("{e:#}")))
                },
                |c| c.cp.stop(),
            )
            .map_err(anyhow::Error::msg)
    }

    /// Starts the control plane and the node, loads the images of `make images` into containerd, and
    /// waits until the node is Ready.
    /// In `dir` (a temporary directory when `None`), kept after the stop with `keep_dir`.
    pub fn start_in(dir: Option<PathBuf>, keep_dir: bool) -> anyhow::Result<Cluster> {
        supported().map_err(anyhow::Error::msg)?;
        let node_bins = node_bin_dir()?;
        let k8s_bins = crate::cluster::k8s_bin_dir()?;
        remove_stale_runs();
        let run_id = format!("cp-node-{}", std::process::id());
        // Declared first, dropped last: after the control plane and the node are stopped.
        let leftovers = NodeLeftovers::new(&run_id)?;
        let netns = Arc::new(Netns::create(&run_id)?);
        let cgroup_root = format!("/{run_id}");
        let cleanup = leftovers.script();
        let cp = ControlPlane::start(Options {
            dir,
            keep_dir,
            netns: Some(netns.clone()),
            cleanup: Some(cleanup),
            ..Default::default()
        })?;
        let dir = cp.dir.clone();
        let d = |f: &str| dir.join(f).display().to_string();

        // Stand-in DNS and CA endpoint on the node's address.
        let node_ip: Ipv4Addr = NODE_IP.parse()?;
        let dns = netns.bind_udp(SocketAddr::from((node_ip, 53)))?;
        crate::netns::serve_dns(dns, DNS_ZONE, node_ip);
        let local_dns: Ipv4Addr = crate::netns::NODE_LOCAL_DNS_IP.parse()?;
        let dns = netns.bind_udp(SocketAddr::from((local_dns, 53)))?;
        crate::netns::serve_dns(dns, DNS_ZONE, node_ip);
        let ca_listener = netns.bind_tcp(SocketAddr::from((node_ip, 443)))?;
        let ca_endpoint = format!("https://{CA_ENDPOINT_HOST}");
        start_background(cp.kubeconfig_yaml(&Identity::Admin, None)?, ca_listener)?;

        // Configuration of containerd, CNI, kubelet, kube-proxy.
        for sub in ["containerd", "cni", "kubelet", "pod-logs"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let socket = dir.join("containerd/containerd.sock");
        fs::write(
            dir.join("containerd.toml"),
            containerd_config(&dir, &socket),
        )?;
        fs::write(dir.join("cni/10-cp-node.conflist"), CNI_CONFIG)?;
        fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {}\n", crate::netns::NODE_LOCAL_DNS_IP),
        )?;
        fs::write(
            dir.join("kubelet.yaml"),
            kubelet_config(&dir, &socket, &cgroup_root, kubelet_minor(&k8s_bins)?),
        )?;
        fs::write(dir.join("kube-proxy.yaml"), kube_proxy_config(&dir))?;
        let kubelet_id = Identity::User {
            name: format!("system:node:{NODE_NAME}"),
            groups: vec!["system:nodes".into()],
        };
        let proxy_id = Identity::User {
            name: "system:kube-proxy".into(),
            groups: vec![],
        };
        fs::write(
            dir.join("kubelet.kubeconfig"),
            cp.kubeconfig_yaml_for(&cp.internal_server, &kubelet_id, None)?,
        )?;
        fs::write(
            dir.join("kube-proxy.kubeconfig"),
            cp.kubeconfig_yaml_for(&cp.internal_server, &proxy_id, None)?,
        )?;
        let script = format!(
            r#"set -u
export PATH={node_bins}:/usr/sbin:/usr/bin:/sbin:/bin
containerd --config {containerd_toml} >>{dir}/containerd.log 2>&1 &
for i in $(seq 1 300); do [ -S {socket} ] && break; sleep 0.1; done
[ -S {socket} ] || {{ echo "containerd did not open its socket within 30 s"; exit 1; }}
kubelet --config={dir}/kubelet.yaml --kubeconfig={dir}/kubelet.kubeconfig --root-dir={dir}/kubelet \
  --hostname-override={NODE_NAME} --node-ip={NODE_IP} --v=1 >>{dir}/kubelet.log 2>&1 &
kube-proxy --config={dir}/kube-proxy.yaml --v=1 >>{dir}/kube-proxy.log 2>&1 &
wait -n
echo "a node process exited; see containerd.log, kubelet.log, kube-proxy.log"
exit 1
"#,
            node_bins = node_bins.display(),
            containerd_toml = d("containerd.toml"),
            dir = dir.display(),
            socket = socket.display(),
        );
        let script = script.replace(
            "kubelet --config",
            &format!("{} --config", k8s_bins.join("kubelet").display()),
        );
        let script = script.replace(
            "kube-proxy --config",
            &format!("{} --config", k8s_bins.join("kube-proxy").display()),
        );
        fs::write(dir.join("node.sh"), script)?;
        cp.spawn_process(
            "node",
            // nsenter, not `ip netns exec`: that one remounts /sys, which hides the cgroup mounts the
            // kubelet needs.
            Command::new("nsenter").args([
                &format!("--net=/var/run/netns/{}", netns.name),
                "--",
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "private",
                "bash",
                &d("node.sh"),
            ]),
        )?;
        let cluster = Cluster {
            cp,
            netns,
            containerd_socket: socket,
            ctr: node_bins.join("ctr"),
            ca_endpoint,
            _leftovers: leftovers,
        };
        cluster.wait_containerd(Duration::from_secs(30))?;
        cluster.load_images()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(cluster.wait_node_ready(Duration::from_secs(120)))?;
        cluster.start_network_policy_engine()?;
        Ok(cluster)
    }

    /// Starts the NetworkPolicy engine: kube-router's policy controller alone (no routing, no service
    /// proxy) in the node's namespace, enforcing every NetworkPolicy with iptables and ipset as a
    /// policy-enforcing CNI would (Gardener's Calico does the same job). Returns once its chains are in
    /// place. Traffic from the node itself (kubelet probes, the API server here) always passes, as on
    /// Gardener.
    fn start_network_policy_engine(&self) -> anyhow::Result<()> {
        let bin = npc_bin_dir()?.join("kube-router");
        let ns = &self.netns.name;
        run(
            Command::new("ip").args([
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.bridge.bridge-nf-call-iptables=1",
            ]),
            "enabling bridge netfilter in the node's namespace",
        )?;
        let kubeconfig = self.cp.dir.join("admin-internal.kubeconfig");
        self.cp.spawn_process(
            "kube-router",
            Command::new("ip")
                .args(["netns", "exec", ns, "env"])
                .arg(format!("NODE_NAME={NODE_NAME}"))
                .arg("PATH=/usr/sbin:/usr/bin:/sbin:/bin")
                .arg(&bin)
                .args([
                    "--run-firewall=true",
                    "--run-router=false",
                    "--run-service-proxy=false",
                    &format!("--kubeconfig={}", kubeconfig.display()),
                    &format!("--hostname-override={NODE_NAME}"),
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--health-port=0",
                    "--metrics-port=0",
                    "--v=1",
                ]),
        )?;
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let rules = run(
                Command::new("ip").args(["netns", "exec", ns, "iptables-save", "-t", "filter"]),
                "iptables-save in the node's namespace",
            )?;
            if rules.contains("KUBE-ROUTER-FORWARD") {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "kube-router set up no chains within 90 s: {}",
                    self.cp.log_tail("kube-router", 20)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The iptables filter rules the NetworkPolicy engine keeps in the node's namespace.
    pub fn policy_rules(&self) -> anyhow::Result<String> {
        run(
            Command::new("ip").args([
                "netns",
                "exec",
                &self.netns.name,
                "iptables-save",
                "-t",
                "filter",
            ]),
            "iptables-save in the node's namespace",
        )
    }

    fn ctr(&self) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io"]);
        c
    }

    fn wait_containerd(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self
                .ctr()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "containerd did not answer within {timeout:?}; containerd.log:\n{}\nnode.log:\n{}",
                    self.cp.log_tail("containerd", 30),
                    self.cp.log_tail("node", 30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Loads the images `make images` built (operator, stand-in proxy, busybox, pause) into containerd,
    /// under every name they carry, the way a registry would serve them.
    pub fn load_images(&self) -> anyhow::Result<()> {
        let names = run(
            Command::new("podman").args([
                "--runtime=runc",
                "images",
                "--format",
                "{{range .Names}}{{.}}\n{{end}}",
                "--filter",
                "label=org.opencontainers.image.title",
            ]),
            "podman images",
        )?;
        let wanted = crate::node::images_to_load(&names);
        if wanted.len() < 5 {
            bail!(
                "expected the images of `make images` (webhook, controller, stand-in proxy, busybox, pause); podman has: {names}"
            );
        }
        let tar = self.cp.dir.join("images.tar");
        let mut save = Command::new("podman");
        save.args([
            "--runtime=runc",
            "save",
            "-m",
            "--format",
            "docker-archive",
            "-o",
        ])
        .arg(&tar)
        .args(&wanted);
        run(&mut save, "podman save")?;
        run(
            self.ctr().args(["images", "import"]).arg(&tar),
            "ctr images import",
        )?;
        let _ = fs::remove_file(&tar);
        Ok(())
    }

    /// Gives the image `source` (loaded by [`Cluster::load_images`]) the further name `target` in
    /// containerd, as a registry serving it under that name would (a localized registry, a new tag).
    pub fn tag_image(&self, source: &str, target: &str) -> anyhow::Result<()> {
        run(
            self.ctr()
                .args(["images", "tag", "--force", source, target]),
            "ctr images tag",
        )?;
        Ok(())
    }

    /// Every image name containerd holds for the pods (`ctr images ls -q`).
    pub fn image_names(&self) -> anyhow::Result<Vec<String>> {
        let out = run(self.ctr().args(["images", "ls", "-q"]), "ctr images ls")?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("sha256:"))
            .map(String::from)
            .collect())
    }

    /// Waits until the node reports Ready.
    pub async fn wait_node_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.cp.admin().await?);
        crate::wait::until("the node Ready", timeout, || async {
            let Some(n) = nodes.get_opt(NODE_NAME).await.map_err(|e| e.to_string())? else {
                return Err(format!(
                    "node not registered; kubelet.log:\n{}",
                    self.cp.log_tail("kubelet", 15)
                ));
            };
            let ready = n
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Ready");
            match ready {
                Some(c) if c.status == "True" => Ok(Some(())),
                other => Err(format!(
                    "node Ready condition {other:?}; kubelet.log:\n{}",
                    self.cp.log_tail("kubelet", 15)
                )),
            }
        })
        .await
    }
}

/// Pods matching `selector` in kyma-system that are Running and Ready (by their probes), not being
/// deleted, sorted by name.
pub async fn ready_pods(
    client: &kube::Client,
    selector: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(client.clone(), cp_api::names::KYMA_SYSTEM);
    let mut ready: Vec<_> = pods
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing pods {selector}"))?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let st = p.status.clone().unwrap_or_default();
            st.phase.as_deref() == Some("Running")
                && st
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .collect();
    ready.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(ready)
}

/// The cluster domain the node cluster's shoot-info names (the tunnel host is `cp.<domain>`).
pub const CLUSTER_DOMAIN: &str = "node.test";

/// The open-files limit the proxy's init container asks for on this node (see
/// [`Cluster::fit_fd_limit_to_node`]).
pub const NODE_FD_LIMIT: i64 = 16384;

/// The identity the node cluster names in the operator's ConfigMap as privileged (a platform SRE).
pub const SRE_USER: &str = "cp-node-sre";

impl Cluster {
    /// `kubectl` as the cluster admin.
    pub fn kubectl(&self) -> anyhow::Result<Command> {
        let mut c = Command::new(crate::cluster::k8s_bin_dir()?.join("kubectl"));
        c.arg("--kubeconfig").arg(&self.cp.admin_kubeconfig);
        Ok(c)
    }

    /// Runs `kubectl` with `args`; fails with its stderr.
    pub fn kubectl_run(&self, args: &[&str]) -> anyhow::Result<String> {
        run(
            self.kubectl()?.args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// The JSON lines the proxy stand-in logged in pod `pod` of kyma-system, newest first (its other
    /// lines left out).
    pub fn standin_log(&self, pod: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let log = self.kubectl_run(&[
            "logs",
            "-n",
            cp_api::names::KYMA_SYSTEM,
            pod,
            "-c",
            "connectivity-proxy",
        ])?;
        Ok(log
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }

    /// What a Kyma cluster has before the module arrives: the namespaces (kyma-system enforcing the
    /// `restricted` Pod Security level), Istio's and the SAP BTP service operator's CRDs, the Gardener
    /// shoot-info; and the stand-in CA endpoint's root in the optional trust Secret the bundle mounts.
    pub async fn prepare_kyma(&self) -> anyhow::Result<()> {
        use cp_api::names;
        let client = self.cp.admin().await?;
        let ns = |name: &str, labels: serde_json::Value| {
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels}})
        };
        for obj in [
            ns(
                names::KYMA_SYSTEM,
                serde_json::json!({"pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest"}),
            ),
            ns(names::ISTIO_NAMESPACE, serde_json::json!({})),
            crate::fixtures::shoot_info(Some(CLUSTER_DOMAIN)),
            serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": CA_TRUST_SECRET, "namespace": names::KYMA_SYSTEM},
                "stringData": {"ca.crt": crate::ca_endpoint_tls()?.root_pem,
                    // The stand-in endpoint's zone and the node's (private) address it answers on.
                    "allowed-hosts": format!(".{DNS_ZONE}"),
                    "allowed-networks": format!("{NODE_IP}/32")}}),
        ] {
            crate::manifest::apply_json(&client, obj, None).await?;
        }
        // What the controller manager adds to every namespace, so that a snapshot taken now is complete.
        for ns in [names::KYMA_SYSTEM, names::ISTIO_NAMESPACE] {
            let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(client.clone(), ns);
            let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(client.clone(), ns);
            crate::wait::until(
                &format!("ServiceAccount default and ConfigMap kube-root-ca.crt in {ns}"),
                Duration::from_secs(30),
                || async {
                    let sa = sas.get_opt("default").await.map_err(|e| e.to_string())?;
                    let cm = crate::wait::get_opt(&cms, "kube-root-ca.crt").await?;
                    Ok((sa.is_some() && cm.is_some()).then_some(()))
                },
            )
            .await?;
        }
        crate::fixtures::apply(
            &client,
            &[crate::fixtures::ISTIO_CRDS, crate::fixtures::BTP_CRDS],
            None,
        )
        .await
    }

    /// Installs the module the way the module manager does: `kubectl apply --server-side` of the rendered
    /// bundle; then waits until the webhook (2 pods) and the controller are available by their probes.
    pub async fn install_bundle(&self) -> anyhow::Result<()> {
        let bundle = crate::workspace_root().join("manifests/connectivity-proxy-operator.yaml");
        self.kubectl_run(&[
            "apply",
            "--server-side",
            "--field-manager=module-manager",
            "-f",
            &bundle.display().to_string(),
        ])?;
        self.wait_deployment_available(
            cp_api::names::KYMA_SYSTEM,
            "connectivity-proxy-operator-webhook",
            2,
        )
        .await?;
        self.wait_deployment_available(
            cp_api::names::KYMA_SYSTEM,
            "connectivity-proxy-operator-controller",
            1,
        )
        .await
    }

    /// Applies `manifests/default-cr.yaml` with kubectl, as the module manager does, retrying while the
    /// webhook's CA bundle is not injected yet.
    pub async fn apply_default_cr(&self) -> anyhow::Result<()> {
        let cr = crate::workspace_root().join("manifests/default-cr.yaml");
        crate::wait::until(
            "the default CR admitted through the webhook Service",
            Duration::from_secs(60),
            || async {
                self.kubectl_run(&[
                    "apply",
                    "--server-side",
                    "--field-manager=module-manager",
                    "-f",
                    &cr.display().to_string(),
                ])
                .map(|_| Some(()))
                .map_err(|e| format!("{e:#}"))
            },
        )
        .await
    }

    /// This node's hard open-files limit is 20000 (a machine fact: nothing here may raise it), below the
    /// proxy's default 64000, so the init container `ulimit -n 64000` fails exactly as it would on such
    /// a node. The platform SRE, named privileged in the operator's ConfigMap, lowers
    /// `spec.deployment.resources.maxFileDescriptorCount` to [`NODE_FD_LIMIT`] (a protected field only
    /// such an identity may change).
    pub async fn fit_fd_limit_to_node(&self, cr: &str) -> anyhow::Result<()> {
        use cp_api::names;
        let client = self.cp.admin().await?;
        let cm = crate::fixtures::operator_config(serde_json::json!({"privilegedUsers": SRE_USER}));
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), names::KYMA_SYSTEM);
        // The bundle ships no such ConfigMap (lifecycle-manager would reset it): the SRE creates it.
        cms.patch(
            crate::fixtures::OPERATOR_CONFIG,
            &kube::api::PatchParams::apply(SRE_USER),
            &kube::api::Patch::Apply(&cm),
        )
        .await
        .context("naming the SRE privileged")?;
        let sre = self
            .cp
            .client(&Identity::User {
                name: SRE_USER.into(),
                groups: vec!["system:masters".into()],
            })
            .await?;
        let api: Api<cp_api::ConnectivityProxy> = Api::namespaced(sre, names::KYMA_SYSTEM);
        // The controller's first reconcile of a new CR writes this release's `spec.deployment` defaults
        // (and records them in an annotation): an SRE edit that lands before it is replaced by 64000.
        // That race made `make run-cluster` end in the fd-limit Warning on one run and Ready on the
        // next; the SRE edits once the release's defaults are recorded, as a person reading the CR would.
        let what = "the controller recorded this release's spec.deployment defaults";
        let key = cp_api::keys::DEFAULTS_RELEASE_ANNOTATION;
        crate::wait::until_annotated(&api, cr, key, what, Duration::from_secs(60)).await?;
        let patch = serde_json::json!({"spec": {"deployment": {"resources": {"maxFileDescriptorCount": NODE_FD_LIMIT}}}});
        // The webhook learns the privileged user by watch: retry until it has.
        crate::wait::until(
            "the SRE's change of maxFileDescriptorCount admitted",
            Duration::from_secs(30),
            || async {
                api.patch(
                    cr,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .map(|_| Some(()))
                .map_err(|e| e.to_string())
            },
        )
        .await
    }

    /// The SRE removes the privileged-identities ConfigMap it created (it is not the module's: removing
    /// the module leaves it).
    pub async fn remove_sre_config(&self) -> anyhow::Result<()> {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.cp.admin().await?, cp_api::names::KYMA_SYSTEM);
        match cms
            .delete(
                crate::fixtures::OPERATOR_CONFIG,
                &kube::api::DeleteParams::default(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e).context("removing the SRE's ConfigMap"),
        }
    }

    /// Waits until a Deployment has `replicas` available (ready by their probes) replicas of its
    /// current generation.
    pub async fn wait_deployment_available(
        &self,
        ns: &str,
        name: &str,
        replicas: i32,
    ) -> anyhow::Result<()> {
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.cp.admin().await?, ns);
        crate::wait::until(
            &format!("Deployment {ns}/{name} with {replicas} available"),
            Duration::from_secs(180),
            || async {
                let d = api.get(name).await.map_err(|e| e.to_string())?;
                let generation = d.metadata.generation.unwrap_or(0);
                let st = d.status.unwrap_or_default();
                if st.observed_generation.unwrap_or(0) >= generation
                    && st.available_replicas.unwrap_or(0) >= replicas
                    && st.updated_replicas.unwrap_or(0) >= replicas
                {
                    Ok(Some(()))
                } else {
                    Err(format!("status {st:?}; pods:\n{}", self.pods_summary(ns)))
                }
            },
        )
        .await
    }

    /// SIGKILLs the running container `container` of pod `ns/pod` through containerd (as a crash or the
    /// OOM killer would) and waits until the kubelet has restarted it. Returns the restart count after.
    pub async fn kill_container(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
    ) -> anyhow::Result<i32> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.cp.admin().await?, ns);
        let status = |p: &k8s_openapi::api::core::v1::Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == container).cloned())
        };
        let before = pods.get(pod).await?;
        let st = status(&before).with_context(|| format!("{pod} has no container {container}"))?;
        anyhow::ensure!(
            st.state.as_ref().is_some_and(|s| s.running.is_some()),
            "{pod}/{container} is not running: {:?}",
            st.state
        );
        let id = st
            .container_id
            .as_deref()
            .and_then(|id| id.strip_prefix("containerd://"))
            .with_context(|| format!("{pod}/{container}: no containerd id"))?
            .to_string();
        run(
            self.ctr()
                .args(["tasks", "kill", "--signal", "SIGKILL", &id]),
            "ctr tasks kill",
        )?;
        crate::wait::until(
            &format!("{pod}/{container} restarted after SIGKILL"),
            Duration::from_secs(60),
            || async {
                let p = pods.get(pod).await.map_err(|e| e.to_string())?;
                let st = status(&p).ok_or("no status")?;
                let running = st.state.as_ref().is_some_and(|s| s.running.is_some());
                Ok((running
                    && st.restart_count > 0
                    && st
                        .container_id
                        .as_deref()
                        .is_some_and(|c| !c.ends_with(&id)))
                .then_some(st.restart_count))
            },
        )
        .await
    }

    /// `kubectl get pods -o wide` of a namespace, for failure messages.
    pub fn pods_summary(&self, ns: &str) -> String {
        self.kubectl_run(&["get", "pods", "-n", ns, "-o", "wide"])
            .unwrap_or_else(|e| format!("{e:#}"))
    }
}

/// Removes the network namespaces and cgroups of earlier runs whose process is gone (a run killed so hard
/// that its watchdog died too).
fn remove_stale_runs() {
    let gone = |name: &str| {
        name.strip_prefix("cp-node-")
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    for ns in fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = ns.file_name().to_string_lossy().to_string();
        if gone(&name) {
            let _ = Command::new("ip").args(["netns", "delete", &name]).status();
        }
    }
    for hierarchy in fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for c in fs::read_dir(hierarchy.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if gone(&c.file_name().to_string_lossy()) {
                let _ = Command::new("find")
                    .arg(c.path())
                    .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", "+"])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// The names to load: the operator's images at the workspace version and the node's stand-ins, under all
/// their names (a local `localhost/...` one and the one the manifests reference).
pub fn images_to_load(podman_names: &str) -> Vec<String> {
    let version = env!("CARGO_PKG_VERSION");
    let mut out: Vec<String> = podman_names
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .filter(|n| {
            n.ends_with(&format!(":{version}"))
                || *n == "localhost/cp-node-pause:3.10"
                || n.contains("connectivity-proxy:")
                || n.contains("/busybox:")
        })
        .map(String::from)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A thread with its own runtime for what the cluster serves for as long as the process lives: the
/// stand-in CA endpoint and the stand-in BTP operator.
fn start_background(
    admin_kubeconfig: String,
    ca_listener: std::net::TcpListener,
) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let connectivity_ca = crate::test_ca("stand-in Connectivity service CA", now, 2)?;
    let acceptor = crate::ca_endpoint_acceptor()?;
    ca_listener.set_nonblocking(true)?;
    crate::serve_on_thread(
        "cp-node-stand-ins",
        ca_listener,
        move |listener| async move {
            let _ca = crate::serve_static_on(listener, acceptor, connectivity_ca.cert_pem);
            let Ok(admin) = crate::cluster::client_from_kubeconfig(&admin_kubeconfig).await else {
                return;
            };
            crate::fakes::run_btp_operator(admin, Duration::from_secs(1), |_ns, _binding| {
                standin_service_key()
            })
            .await;
        },
    )?;
    Ok(())
}

/// The service key the stand-in BTP operator hands out on the node cluster.
pub fn standin_service_key() -> serde_json::Value {
    serde_json::json!({
        "clientid": "stand-in-client", "clientsecret": "stand-in-secret",
        "subaccount_id": "5a1e5b1c-0000-4000-8000-000000000001", "subaccount_subdomain": "stand-in",
        "uaadomain": NODE_UAADOMAIN,
        "connectivity_service": {"CAs_path": "/api/v1/CAs", "url": format!("https://{CA_ENDPOINT_HOST}")}
    })
}

const CNI_CONFIG: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "cp-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
"#;

fn containerd_config(dir: &Path, socket: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{d}/containerd/ttrpc.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'localhost/cp-node-pause:3.10'

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # No process here may lower its OOM score below its parent's (no CAP_SYS_RESOURCE, like the rlimits):
  # containerd keeps the pods' scores at or above its own instead of failing every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{d}/cni'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = 'runc'
      SystemdCgroup = false
"#,
        socket = socket.display()
    )
}

/// The kubelet's minor version (`kubelet --version`: `Kubernetes v1.N.P`).
fn kubelet_minor(k8s_bins: &Path) -> anyhow::Result<u32> {
    let out = std::process::Command::new(k8s_bins.join("kubelet"))
        .arg("--version")
        .output()
        .context("kubelet --version")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("v1."))
        .and_then(|rest| rest.split('.').next())
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("no version in kubelet --version: {text:?}"))
}

fn kubelet_config(dir: &Path, socket: &Path, cgroup_root: &str, minor: u32) -> String {
    let d = dir.display();
    // Before 1.35 the restart cap below is behind an alpha gate (KEP-4603); from 1.35 it is on.
    let gates = if minor < 35 {
        "featureGates: {KubeletCrashLoopBackOffMax: true}\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{socket}
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
failSwapOn: false
resolvConf: {d}/resolv.conf
podLogsDir: {d}/pod-logs
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 60
rotateCertificates: false
protectKernelDefaults: false
makeIPTablesUtilChains: true
# A crashed container restarts within 5 s instead of backing off to 5 minutes: tests kill containers
# on purpose, repeatedly.
crashLoopBackOff:
  maxContainerRestartPeriod: 5s
{gates}"#,
        socket = socket.display()
    )
}

fn kube_proxy_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {d}/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: {POD_CIDR}
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#
    )
}
