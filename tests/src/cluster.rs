//! Starting and stopping the control plane, and clients acting as different identities.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use cp_certs::{Ca, KeyAlgorithm, LeafSpec};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use time::OffsetDateTime;

fn encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Audit every write (metadata only) so tests can count who wrote what.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
  verbs: [\"create\", \"update\", \"patch\", \"delete\", \"deletecollection\"]
- level: None
";

/// Audit every request (metadata only): for benchmarks that count reads too.
const AUDIT_POLICY_ALL: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
";

/// One request recorded in the audit log.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditWrite {
    /// create, update, patch, delete, ...
    pub verb: String,
    /// Who wrote.
    pub user: String,
    /// Resource (plural), subresource appended as `resource/sub`.
    pub resource: String,
    /// Namespace, if any.
    pub namespace: String,
    /// Object name, if any.
    pub name: String,
    /// Response code.
    pub code: i64,
}

/// Who a client acts as.
#[derive(Clone, Debug)]
pub enum Identity {
    /// `system:masters`.
    Admin,
    /// A user with groups, authenticated by a client certificate.
    User {
        /// The user name.
        name: String,
        /// The groups it is in.
        groups: Vec<String>,
    },
    /// A ServiceAccount, authenticated by a bound token.
    ServiceAccount {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// A running etcd + kube-apiserver + kube-controller-manager.
pub struct ControlPlane {
    /// Working directory: certificates, kubeconfigs, etcd data, logs.
    pub dir: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Serving CA of the API server (PEM).
    pub ca_pem: String,
    client_ca: Ca,
    /// Path of the admin kubeconfig.
    pub admin_kubeconfig: PathBuf,
    group_leader: u32,
    children: Mutex<Vec<(String, Child)>>,
    /// Program and arguments of etcd, kube-apiserver and kube-controller-manager, to start them again.
    components: Mutex<Vec<(String, PathBuf, Vec<String>)>>,
    keep_dir: bool,
    /// The network namespace every component runs in (the cluster with a real node), if any.
    netns: Option<Arc<crate::netns::Netns>>,
    /// The API server's address as seen from inside the network namespace (the same as `server`
    /// without one).
    pub internal_server: String,
}

/// Options of [`ControlPlane::start`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Working directory to use (created); a temporary one otherwise.
    pub dir: Option<PathBuf>,
    /// Keep the working directory after stopping.
    pub keep_dir: bool,
    /// Audit reads as well as writes (see [`ControlPlane::audit_requests_since`]).
    pub audit_reads: bool,
    /// Run every component inside this network namespace, the API server advertising
    /// [`crate::netns::NODE_IP`] and routing to webhooks through Service endpoints, with a scheduler and
    /// the controller manager's usual controllers, for a real node to join (see [`crate::node`]). The host
    /// reaches the API server through a loopback forwarder (`server`).
    pub netns: Option<Arc<crate::netns::Netns>>,
    /// A shell snippet the watchdog runs after it has stopped the processes (e.g. removing the node's
    /// cgroups).
    pub cleanup: Option<String>,
}

/// A free loopback TCP port.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((LOCALHOST, 0))?.local_addr()?.port())
}

/// `N` distinct free loopback TCP ports.
pub fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0u16; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

/// The directory holding kube-apiserver, kube-controller-manager, etcd and kubectl: `CP_K8S_BIN_DIR`, or
/// whatever `hack/k8s-bins.sh` prints (it builds them into the cache on first use).
pub fn k8s_bin_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| crate::script_bin_dir("CP_K8S_BIN_DIR", "hack/k8s-bins.sh"))
        .clone()
        .map_err(anyhow::Error::msg)
}

impl ControlPlane {
    /// The control plane shared by every test of this test group ([`crate::group`]), started on first
    /// use and stopped when the next group starts (the watchdog stops what is left when the test binary
    /// exits).
    pub fn shared() -> anyhow::Result<Arc<ControlPlane>> {
        static SHARED: crate::group::SyncSlot<ControlPlane> = crate::group::SyncSlot::new();
        SHARED
            .get_or_start(
                || {
                    // Start on a plain thread: callers are usually inside a tokio runtime.
                    std::thread::spawn(|| {
                        let keep_dir = std::env::var_os("CP_KEEP_DIR").is_some();
                        ControlPlane::start(Options {
                            keep_dir,
                            ..Default::default()
                        })
                    })
                    .join()
                    .map_err(|_| "control plane start panicked".to_string())
                    .and_then(|r| r.map_err(|e| format!("{e:#}")))
                },
                ControlPlane::stop,
            )
            .map_err(anyhow::Error::msg)
    }

    /// Starts a control plane and waits until the API server is ready.
    pub fn start(opts: Options) -> anyhow::Result<ControlPlane> {
        let bins = k8s_bin_dir()?;
        let dir = match opts.dir {
            Some(d) => d,
            None => std::env::temp_dir().join(format!(
                "cp-control-plane-{}-{}",
                std::process::id(),
                OffsetDateTime::now_utc().unix_timestamp_nanos() % 1_000_000_000
            )),
        };
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let now = OffsetDateTime::now_utc() - time::Duration::minutes(5);
        let year = time::Duration::days(365);

        let serving_ca = Ca::generate(
            "cp-test-serving-ca",
            now,
            now + year,
            KeyAlgorithm::default(),
        )?;
        let serving = serving_ca.issue(&LeafSpec::server(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            &[
                LOCALHOST,
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1)),
            ],
            now,
            year,
        ))?;
        let client_ca = Ca::generate(
            "cp-test-client-ca",
            now,
            now + year,
            KeyAlgorithm::default(),
        )?;
        // The API server authenticates itself to webhooks with a client certificate of its own CA
        // (its --admission-control-config-file), as a platform may configure it; a webhook started
        // with --client-ca-file=<admission_client_ca_file()> then accepts only the API server.
        let admission_ca = Ca::generate(
            "cp-test-admission-client-ca",
            now,
            now + year,
            KeyAlgorithm::default(),
        )?;
        let admission_client = admission_ca.issue(&LeafSpec::client(
            "kube-apiserver-admission-client",
            &[],
            now,
            year,
        ))?;
        write(&dir, "admission-client-ca.crt", &admission_ca.cert_pem)?;
        write(&dir, "admission-client.crt", &admission_client.cert_pem)?;
        write(&dir, "admission-client.key", &admission_client.key_pem)?;
        write(
            &dir,
            "admission-client.kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
                dir.join("admission-client.crt").display(),
                dir.join("admission-client.key").display()
            ),
        )?;
        let webhook_admission = format!(
            "  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            dir.join("admission-client.kubeconfig").display()
        );
        write(
            &dir,
            "admission-config.yaml",
            &format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
                 - name: ValidatingAdmissionWebhook\n{webhook_admission}\
                 - name: MutatingAdmissionWebhook\n{webhook_admission}"
            ),
        )?;
        let sa_key = rcgen::KeyPair::generate()?;
        write(&dir, "serving-ca.crt", &serving_ca.cert_pem)?;
        write(&dir, "apiserver.crt", &serving.cert_pem)?;
        write(&dir, "apiserver.key", &serving.key_pem)?;
        write(&dir, "client-ca.crt", &client_ca.cert_pem)?;
        write(&dir, "sa.key", &sa_key.serialize_pem())?;
        write(&dir, "sa.pub", &sa_key.public_key_pem())?;
        write(
            &dir,
            "audit-policy.yaml",
            if opts.audit_reads {
                AUDIT_POLICY_ALL
            } else {
                AUDIT_POLICY
            },
        )?;

        // The network namespace first: the other cleanup may wait for cgroups to empty.
        let mut cleanup = opts
            .netns
            .as_ref()
            .map(|ns| format!("ip netns delete {} 2>/dev/null\n", ns.name))
            .unwrap_or_default();
        cleanup.push_str(opts.cleanup.as_deref().unwrap_or_default());
        let group_leader =
            start_watchdog(&dir, (!opts.keep_dir).then_some(dir.as_path()), &cleanup)?;
        let mut cp = ControlPlane {
            server: String::new(),
            ca_pem: serving_ca.cert_pem.clone(),
            client_ca,
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            dir: dir.clone(),
            group_leader,
            children: Mutex::new(Vec::new()),
            components: Mutex::new(Vec::new()),
            keep_dir: opts.keep_dir,
            netns: opts.netns.clone(),
            internal_server: String::new(),
        };
        let node_ip = crate::netns::NODE_IP;

        // All at once, each listener held until the last is chosen: distinct ports. (Inside a network
        // namespace the host cannot see which ports its components took, so one at a time could repeat.)
        let [etcd_port, peer_port, api_port, kcm_port, scheduler_port] = free_ports()?;
        // In the node's network namespace (a port space of its own) the API server takes 6443, the port
        // pods reach it on in a kubeadm cluster: NetworkPolicies judge the port after the `kubernetes`
        // Service's translation, and the module's egress policy allows 443 and 6443.
        let api_port = if opts.netns.is_some() {
            API_PORT_IN_NETNS
        } else {
            api_port
        };
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        cp.spawn_component(
            "etcd",
            bins.join("etcd"),
            vec![
                "--name=default".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;

        cp.internal_server = format!("https://127.0.0.1:{api_port}");
        cp.server = match &opts.netns {
            Some(ns) => format!(
                "https://127.0.0.1:{}",
                ns.forward((LOCALHOST, api_port).into())?
            ),
            None => cp.internal_server.clone(),
        };
        let d = |f: &str| dir.join(f).display().to_string();
        let mut api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", d("apiserver-certs")),
            format!("--tls-cert-file={}", d("apiserver.crt")),
            format!("--tls-private-key-file={}", d("apiserver.key")),
            format!("--client-ca-file={}", d("client-ca.crt")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            format!(
                "--admission-control-config-file={}",
                d("admission-config.yaml")
            ),
            format!("--audit-policy-file={}", d("audit-policy.yaml")),
            format!("--audit-log-path={}", d("audit.log")),
            "--audit-log-format=json".into(),
            "--v=1".into(),
        ];
        if opts.netns.is_some() {
            // Pods reach this address through the `kubernetes` Service; the API server calls webhooks
            // at their Service's endpoints (pod IPs), as it does in a cluster without a proxy on the
            // control-plane hosts.
            api_args.extend([
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={node_ip}"),
                "--enable-aggregator-routing=true".into(),
                "--authorization-mode=Node,RBAC".into(),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]);
        } else {
            api_args.extend([
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                "--authorization-mode=RBAC".into(),
                "--endpoint-reconciler-type=none".into(),
            ]);
        }
        cp.spawn_component("kube-apiserver", bins.join("kube-apiserver"), api_args)?;

        let admin = cp.kubeconfig_yaml(&Identity::Admin, None)?;
        write(&dir, "admin.kubeconfig", &admin)?;
        let internal_admin = cp.kubeconfig_yaml_for(&cp.internal_server, &Identity::Admin, None)?;
        write(&dir, "admin-internal.kubeconfig", &internal_admin)?;
        cp.wait_ready(Duration::from_secs(90))?;

        let controllers = if opts.netns.is_some() {
            // Every default controller, as in a cluster (Deployments, StatefulSets, endpoints, PDBs, ...).
            "*"
        } else {
            "garbage-collector-controller,namespace-controller,serviceaccount-controller,clusterrole-aggregation-controller"
        };
        // What the controller manager and the scheduler share: the API server as seen from where they
        // run, an admin identity, loopback serving, no leader election.
        let component_args = |port: u16| {
            let kc = d("admin-internal.kubeconfig");
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ]
        };
        let mut kcm_args = component_args(kcm_port);
        kcm_args.extend([
            format!("--service-account-private-key-file={}", d("sa.key")),
            format!("--root-ca-file={}", d("serving-ca.crt")),
            format!("--cert-dir={}", d("kcm-certs")),
            format!("--controllers={controllers}"),
        ]);
        cp.spawn_component(
            "kube-controller-manager",
            bins.join("kube-controller-manager"),
            kcm_args,
        )?;
        if opts.netns.is_some() {
            cp.spawn_component(
                "kube-scheduler",
                bins.join("kube-scheduler"),
                component_args(scheduler_port),
            )?;
        }
        Ok(cp)
    }

    /// Starts a control-plane component and remembers how, so that [`ControlPlane::restart`] can start
    /// it again.
    fn spawn_component(
        &self,
        name: &str,
        program: PathBuf,
        args: Vec<String>,
    ) -> anyhow::Result<()> {
        self.spawn(name, &mut self.component_command(&program, &args))?;
        self.components
            .lock()
            .map_err(|_| anyhow::anyhow!("components lock poisoned"))?
            .push((name.to_string(), program, args));
        Ok(())
    }

    /// SIGKILLs a control-plane component (`etcd`, `kube-apiserver`, `kube-controller-manager`),
    /// starts it again with the same arguments and data, and waits until the API server is ready
    /// again (which, for etcd, means the API server reaches its storage again). Returns how long the
    /// component was away.
    pub async fn restart(&self, name: &str) -> anyhow::Result<Duration> {
        let (program, args) = {
            let components = self
                .components
                .lock()
                .map_err(|_| anyhow::anyhow!("components lock poisoned"))?;
            let (_, program, args) = components
                .iter()
                .find(|(n, _, _)| n == name)
                .with_context(|| format!("{name} is not a control-plane component"))?;
            (program.clone(), args.clone())
        };
        let started = std::time::Instant::now();
        self.kill_process(name)?;
        self.spawn(name, &mut self.component_command(&program, &args))?;
        self.wait_ready_async(Duration::from_secs(90))
            .await
            .map_err(|e| {
                e.context(format!(
                    "after restarting {name}; its log tail:\n{}",
                    self.log_tail(name, 30)
                ))
            })?;
        Ok(started.elapsed())
    }

    /// The command that runs `program` as a component: inside the network namespace when there is one.
    fn component_command(&self, program: &Path, args: &[String]) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", &ns.name])
                    .arg(program)
                    .args(args);
                cmd
            }
            None => {
                let mut cmd = Command::new(program);
                cmd.args(args);
                cmd
            }
        }
    }

    fn spawn(&self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        // Append: a restarted process continues its log.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(self.group_leader as i32)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        self.children
            .lock()
            .map_err(|_| anyhow::anyhow!("children lock poisoned"))?
            .push((name.to_string(), child));
        Ok(())
    }

    /// Starts another process in the control plane's process group (stopped with it). Output goes
    /// to `<dir>/<name>.log`.
    pub fn spawn_process(&self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        self.spawn(name, cmd)
    }

    /// Removes a process started with [`ControlPlane::spawn_process`] from the ones stopped with the
    /// control plane, handing it to the caller.
    fn take_process(&self, name: &str) -> anyhow::Result<Child> {
        let mut children = self
            .children
            .lock()
            .map_err(|_| anyhow::anyhow!("children lock poisoned"))?;
        let idx = children
            .iter()
            .position(|(n, _)| n == name)
            .with_context(|| format!("no process named {name}"))?;
        Ok(children.remove(idx).1)
    }

    /// SIGKILLs a process started with [`ControlPlane::spawn_process`] and waits for it to die.
    pub fn kill_process(&self, name: &str) -> anyhow::Result<()> {
        let mut child = self.take_process(name)?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// SIGTERMs a process started with [`ControlPlane::spawn_process`] (a graceful shutdown, as the
    /// kubelet does) and waits up to `timeout` for it to exit; returns its exit status. SIGKILLs it if it
    /// outlives the timeout and fails then.
    pub fn terminate_process(
        &self,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.take_process(name)?;
        let pid = child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("kill -TERM")?;
        // Wait for the exit itself (a thread blocked in wait), not by polling.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(timeout) {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                let _ = rx.recv();
                anyhow::bail!("{name} did not exit within {timeout:?} of SIGTERM")
            }
        }
    }

    /// The process id of a process started by the control plane, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children
            .lock()
            .ok()?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.id())
    }

    /// For a failed step of a test: a panic with the error and the last `lines` lines of process
    /// `name`'s log (`result.unwrap_or_else(cp.panic_with_log("cp-controller", 40))`).
    pub fn panic_with_log<T>(&self, name: &str, lines: usize) -> impl FnOnce(anyhow::Error) -> T {
        move |e| panic!("{e:#}\n{name} log:\n{}", self.log_tail(name, lines))
    }

    /// The tail of a process log, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn check_alive(&self) -> anyhow::Result<()> {
        let mut children = self
            .children
            .lock()
            .map_err(|_| anyhow::anyhow!("children lock poisoned"))?;
        for (name, child) in children.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} exited ({status}); log tail:\n{}",
                    self.log_tail(name, 30)
                );
            }
        }
        Ok(())
    }

    fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(self.wait_ready_async(timeout))
    }

    async fn wait_ready_async(&self, timeout: Duration) -> anyhow::Result<()> {
        let client = self.client(&Identity::Admin).await?;
        crate::wait::until("kube-apiserver /readyz", timeout, || async {
            self.check_alive().map_err(|e| format!("{e:#}"))?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => Ok(Some(())),
                Ok(body) => Err(body),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|e| {
            e.context(format!(
                "kube-apiserver log tail:\n{}",
                self.log_tail("kube-apiserver", 30)
            ))
        })
    }

    /// A kubeconfig for `identity` (a ServiceAccount needs its token).
    pub fn kubeconfig_yaml(
        &self,
        identity: &Identity,
        token: Option<&str>,
    ) -> anyhow::Result<String> {
        self.kubeconfig_yaml_for(&self.server, identity, token)
    }

    /// A kubeconfig for `identity` at `server` (e.g. [`ControlPlane::internal_server`]).
    pub fn kubeconfig_yaml_for(
        &self,
        server: &str,
        identity: &Identity,
        token: Option<&str>,
    ) -> anyhow::Result<String> {
        let user = match identity {
            Identity::Admin => self.cert_user("admin", &["system:masters"])?,
            Identity::User { name, groups } => {
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                self.cert_user(name, &groups)?
            }
            Identity::ServiceAccount { .. } => {
                let token = token.context("a ServiceAccount kubeconfig needs a token")?;
                format!("    token: {token}\n")
            }
        };
        Ok(format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
             users:\n- name: user\n  user:\n{user}contexts:\n- name: local\n  context:\n    cluster: local\n    user: user\n\
             current-context: local\n",
            server,
            encode(self.ca_pem.as_bytes())
        ))
    }

    fn cert_user(&self, name: &str, groups: &[&str]) -> anyhow::Result<String> {
        // rcgen's distinguished name keeps one value per attribute: a second O would silently replace
        // the first, and the user would not be in the group the test names.
        anyhow::ensure!(
            groups.len() <= 1,
            "{name}: a test client certificate carries at most one group, got {groups:?}"
        );
        let now = OffsetDateTime::now_utc() - time::Duration::minutes(5);
        let leaf = self.client_ca.issue(&LeafSpec::client(
            name,
            groups,
            now,
            time::Duration::days(30),
        ))?;
        Ok(format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            encode(leaf.cert_pem.as_bytes()),
            encode(leaf.key_pem.as_bytes())
        ))
    }

    /// A client acting as `identity`.
    pub async fn client(&self, identity: &Identity) -> anyhow::Result<Client> {
        let token = match identity {
            Identity::ServiceAccount { namespace, name } => {
                Some(self.sa_token(namespace, name).await?)
            }
            _ => None,
        };
        let yaml = self.kubeconfig_yaml(identity, token.as_deref())?;
        client_from_kubeconfig(&yaml).await
    }

    /// The CA (PEM file) of the client certificate the API server presents to webhooks: a webhook
    /// given it as `--client-ca-file` answers only the API server.
    pub fn admission_client_ca_file(&self) -> PathBuf {
        self.dir.join("admission-client-ca.crt")
    }

    /// The admin client.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.client(&Identity::Admin).await
    }

    /// Writes a kubeconfig for `identity` into the working directory and returns its path.
    pub async fn write_kubeconfig(
        &self,
        file: &str,
        identity: &Identity,
    ) -> anyhow::Result<PathBuf> {
        let token = match identity {
            Identity::ServiceAccount { namespace, name } => {
                Some(self.sa_token(namespace, name).await?)
            }
            _ => None,
        };
        let yaml = self.kubeconfig_yaml(identity, token.as_deref())?;
        write(&self.dir, file, &yaml)?;
        Ok(self.dir.join(file))
    }

    /// Creates the ServiceAccount if needed and returns a one-day bound token for it.
    pub async fn sa_token(&self, namespace: &str, name: &str) -> anyhow::Result<String> {
        let admin = client_from_kubeconfig(&self.kubeconfig_yaml(&Identity::Admin, None)?).await?;
        ensure_namespace(&admin, namespace).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(admin, namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec!["https://kubernetes.default.svc".into()]),
                expiration_seconds: Some(86400),
                ..Default::default()
            }),
            ..Default::default()
        };
        let tr = sas
            .create_token_request(name, &PostParams::default(), &req)
            .await?;
        tr.status
            .and_then(|s| s.token)
            .context("TokenRequest without a token")
    }

    /// Size of the audit log now: pass it to [`ControlPlane::audit_writes_since`].
    pub fn audit_offset(&self) -> u64 {
        fs::metadata(self.dir.join("audit.log"))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Writes recorded in the audit log after `offset` (completed requests only).
    pub fn audit_writes_since(&self, offset: u64) -> anyhow::Result<Vec<AuditWrite>> {
        const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
        Ok(self
            .audit_requests_since(offset)?
            .into_iter()
            .filter(|w| WRITES.contains(&w.verb.as_str()))
            .collect())
    }

    /// Every request recorded in the audit log after `offset` (completed requests only; reads only
    /// with [`Options::audit_reads`]).
    pub fn audit_requests_since(&self, offset: u64) -> anyhow::Result<Vec<AuditWrite>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = fs::File::open(self.dir.join("audit.log"))?;
        f.seek(SeekFrom::Start(offset))?;
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let mut out = Vec::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["stage"] != "ResponseComplete" {
                continue;
            }
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(|x| x.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            let sub = s("/objectRef/subresource");
            let resource = if sub.is_empty() {
                s("/objectRef/resource")
            } else {
                format!("{}/{sub}", s("/objectRef/resource"))
            };
            out.push(AuditWrite {
                verb: s("/verb"),
                user: s("/user/username"),
                resource,
                namespace: s("/objectRef/namespace"),
                name: s("/objectRef/name"),
                code: v
                    .pointer("/responseStatus/code")
                    .and_then(|c| c.as_i64())
                    .unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Creates a fresh namespace named after `prefix`.
    pub async fn namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let suffix = OffsetDateTime::now_utc().unix_timestamp_nanos() % 1_000_000;
        let name = format!("{prefix}-{suffix}");
        ensure_namespace(&self.admin().await?, &name).await?;
        Ok(name)
    }

    /// Stops every process of the control plane: TERM, a grace period, then KILL for the whole
    /// group (which also ends the watchdog).
    pub fn stop(&self) {
        signal_group(self.group_leader, "TERM");
        if let Ok(mut children) = self.children.lock() {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            for (_, child) in children.iter_mut() {
                while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            signal_group(self.group_leader, "KILL");
            for (_, child) in children.iter_mut() {
                let _ = child.wait();
            }
            children.clear();
        } else {
            signal_group(self.group_leader, "KILL");
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if !self.keep_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The API server's port inside the node's network namespace.
pub const API_PORT_IN_NETNS: u16 = 6443;

/// A client from kubeconfig YAML.
pub async fn client_from_kubeconfig(yaml: &str) -> anyhow::Result<Client> {
    let kc = Kubeconfig::from_yaml(yaml)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Creates a namespace unless it exists.
pub async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn write(dir: &Path, file: &str, content: &str) -> anyhow::Result<()> {
    fs::write(dir.join(file), content).with_context(|| format!("writing {file}"))
}

/// Starts the watchdog: a shell that leads a new process group, waits for this process to exit,
/// then terminates the whole group (TERM, then KILL) and removes `remove_dir` if given.
pub(crate) fn start_watchdog(
    dir: &Path,
    remove_dir: Option<&Path>,
    cleanup: &str,
) -> anyhow::Result<u32> {
    let script = r#"trap '' TERM
while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
others() { ps -eo pid=,pgid= | awk -v g=$$ '$2 == g && $1 != g {print $1}'; }
kill -TERM -- -$$ 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do
  [ -z "$(others)" ] && break
  sleep 0.2
done
for p in $(others); do kill -KILL "$p" 2>/dev/null; done
eval "$3"
[ -n "$2" ] && rm -rf -- "$2"
exit 0"#;
    let remove = remove_dir
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let child = Command::new("bash")
        .args([
            "-c",
            script,
            "cp-watchdog",
            &std::process::id().to_string(),
            &remove,
            cleanup,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.join("watchdog.log"))?)
        .process_group(0)
        .spawn()
        .context("starting the watchdog")?;
    Ok(child.id())
}

/// Sends a signal to a process group.
pub fn signal_group(leader: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{leader}")])
        .stderr(Stdio::null())
        .status();
}
