//! Running the `cp-webhook` binary against a control plane and registering it in the API server.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use cp_api::admission_config::{self, Endpoint};
use cp_certs::{Ca, KeyAlgorithm, LeafSpec};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ControlPlane;
use crate::manifest::HARNESS_MANAGER;

/// A running webhook process.
pub struct Webhook {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// `127.0.0.1:<port>` of the plain-HTTP metrics server.
    pub metrics_addr: String,
    /// The CA that signed its serving certificate (`None` when the controller issues it).
    pub ca: Option<Ca>,
    /// Certificate file the webhook watches.
    pub cert_file: std::path::PathBuf,
    /// Key file the webhook watches.
    pub key_file: std::path::PathBuf,
}

/// Issues a serving certificate for 127.0.0.1 from `ca`, valid from now for `lifetime`.
pub fn serving_cert(ca: &Ca, lifetime: time::Duration) -> anyhow::Result<cp_certs::Leaf> {
    let now = OffsetDateTime::now_utc() - time::Duration::seconds(30);
    Ok(ca.issue(&LeafSpec::server(
        "cp-webhook",
        &["localhost"],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        now,
        lifetime,
    ))?)
}

impl Webhook {
    /// Starts the webhook binary in the control plane's process group, waits until it is ready,
    /// and registers both webhook configurations pointing at it. `extra_args` go to the binary.
    pub async fn start(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Webhook> {
        Self::start_with(cp, name, extra_args, true, &[]).await
    }

    /// Like [`Webhook::start`], with the binary run by `wrapper` (e.g. `taskset -c 1`: the bench pins
    /// the server under test to its own core from the start, so its runtime sizes itself to it).
    pub async fn start_wrapped(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
        wrapper: &[&str],
    ) -> anyhow::Result<Webhook> {
        Self::start_with(cp, name, extra_args, true, wrapper).await
    }

    /// Like [`Webhook::start`], but the webhook serves the certificate the controller issues into
    /// Secret `kyma-system/connectivity-proxy-webhook-cert` (watched, swapped without a restart).
    pub async fn start_from_secret(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<Webhook> {
        Self::start_with(cp, name, extra_args, false, &[]).await
    }

    async fn start_with(
        cp: &ControlPlane,
        name: &str,
        extra_args: &[&str],
        own_cert: bool,
        wrapper: &[&str],
    ) -> anyhow::Result<Webhook> {
        let cert_file = cp.dir.join(format!("{name}.crt"));
        let key_file = cp.dir.join(format!("{name}.key"));
        let ca = if own_cert {
            let now = OffsetDateTime::now_utc() - time::Duration::minutes(1);
            let ca = Ca::generate(
                "cp-webhook-test-ca",
                now,
                now + time::Duration::days(30),
                KeyAlgorithm::default(),
            )?;
            let leaf = serving_cert(&ca, time::Duration::days(30))?;
            std::fs::write(&cert_file, &leaf.cert_pem)?;
            std::fs::write(&key_file, &leaf.key_pem)?;
            Some(ca)
        } else {
            None
        };
        let port = crate::cluster::free_port()?;
        let metrics_port = crate::cluster::free_port()?;
        // Run as the webhook's own ServiceAccount with exactly the manifest's permissions.
        let admin = cp.admin().await?;
        crate::cluster::ensure_namespace(&admin, "kyma-system").await?;
        let rbac = crate::workspace_root().join("manifests/rbac/webhook.yaml");
        crate::manifest::apply_file(&admin, &rbac, None).await?;
        let identity = crate::cluster::Identity::ServiceAccount {
            namespace: "kyma-system".into(),
            name: "connectivity-proxy-webhook".into(),
        };
        let kubeconfig = cp
            .write_kubeconfig(&format!("{name}.kubeconfig"), &identity)
            .await?;
        let bin = crate::own_bin_dir().join("cp-webhook");
        anyhow::ensure!(
            bin.exists(),
            "{} not found: run `cargo build --workspace --bins` first",
            bin.display()
        );
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("CP_WEBHOOK_LOG").unwrap_or_else(|_| "info".into()),
            )
            // As the Deployment sets them (the allocator settings).
            .envs(crate::manifest::deployment_env("webhook/deployment.yaml")?)
            .arg(format!("--addr=127.0.0.1:{port}"))
            .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
            .args(extra_args);
        if own_cert {
            cmd.arg(format!("--tls-cert-file={}", cert_file.display()))
                .arg(format!("--tls-key-file={}", key_file.display()))
                .arg("--tls-reload-interval=200ms");
        }
        cp.spawn_process(name, &mut cmd)?;
        let wh = Webhook {
            url: format!("https://127.0.0.1:{port}"),
            metrics_addr: format!("127.0.0.1:{metrics_port}"),
            ca,
            cert_file,
            key_file,
        };
        wait_answers_200(cp, name, &wh.metrics_addr, "/readyz").await?;
        Ok(wh)
    }

    /// Registers (or re-points) both webhook configurations at this webhook.
    pub async fn register(&self, client: &Client) -> anyhow::Result<()> {
        let endpoint = Endpoint::Url(self.url.clone());
        let ca = self.ca.as_ref().map(|c| c.cert_pem.as_bytes());
        let pp = PatchParams::apply(HARNESS_MANAGER).force();
        let m = admission_config::mutating(&endpoint, ca);
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(
                cp_api::names::MUTATING_WEBHOOK_CONFIG,
                &pp,
                &Patch::Apply(&m),
            )
            .await
            .context("registering the mutating webhook")?;
        let v = admission_config::validating(&endpoint, ca);
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .patch(
                cp_api::names::VALIDATING_WEBHOOK_CONFIG,
                &pp,
                &Patch::Apply(&v),
            )
            .await
            .context("registering the validating webhook")?;
        Ok(())
    }

    /// Rewrites the client configuration of a (Mutating|Validating)WebhookConfiguration object so the
    /// API server calls this local webhook instead of the in-cluster Service (tests never send traffic
    /// to a ClusterIP).
    pub fn point_at_me(&self, obj: &mut kube::api::DynamicObject) {
        use base64::Engine;
        let ca = self
            .ca
            .as_ref()
            .map(|c| base64::engine::general_purpose::STANDARD.encode(c.cert_pem.as_bytes()));
        if let Some(hooks) = obj.data.get_mut("webhooks").and_then(|w| w.as_array_mut()) {
            for hook in hooks {
                let path = hook
                    .pointer("/clientConfig/service/path")
                    .and_then(|p| p.as_str())
                    .unwrap_or("/")
                    .to_string();
                hook["clientConfig"] =
                    serde_json::json!({"url": format!("{}{path}", self.url), "caBundle": ca});
            }
        }
    }

    /// A client whose base URL is the webhook itself (for direct, malformed requests).
    pub fn direct_client(&self) -> anyhow::Result<Client> {
        let mut cfg = Config::new(self.url.parse()?);
        let ca = self
            .ca
            .as_ref()
            .context("this webhook's CA is the controller's")?;
        cfg.root_cert = Some(vec![pem_to_der(&ca.cert_pem)?]);
        Ok(Client::try_from(cfg)?)
    }

    /// A client whose base URL is the webhook itself, presenting the client certificate
    /// `cert_pem`/`key_pem` (as the API server does when its admission configuration gives it one).
    pub async fn direct_client_with_cert(
        &self,
        cert_pem: &str,
        key_pem: &str,
    ) -> anyhow::Result<Client> {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let ca = self
            .ca
            .as_ref()
            .context("this webhook's CA is the controller's")?;
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: webhook\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
             users:\n- name: caller\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
             contexts:\n- name: webhook\n  context:\n    cluster: webhook\n    user: caller\ncurrent-context: webhook\n",
            self.url,
            b64(&ca.cert_pem),
            b64(cert_pem),
            b64(key_pem)
        );
        crate::cluster::client_from_kubeconfig(&yaml).await
    }

    /// `GET` on the metrics port; returns the status code and body.
    pub async fn metrics_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(&self.metrics_addr, path).await
    }
}

/// The DER of the first PEM block of `pem`.
pub fn pem_to_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

/// The value of a metric series (first line starting with `series`) on the `/metrics` of
/// `metrics_addr`, or 0.
pub async fn metric(metrics_addr: &str, series: &str) -> f64 {
    let Ok((_, body)) = http_get(metrics_addr, "/metrics").await else {
        return 0.0;
    };
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A minimal HTTP/1.0 GET over loopback.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Waits (30 s) until process `name` of `cp` answers `path` on `addr` with 200; fails with its log.
pub(crate) async fn wait_answers_200(
    cp: &crate::ControlPlane,
    name: &str,
    addr: &str,
    path: &str,
) -> anyhow::Result<()> {
    let what = format!("{name} {path}");
    crate::wait::until(&what, Duration::from_secs(30), || async {
        match http_get(addr, path).await {
            Ok((200, _)) => Ok(Some(())),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| e.context(format!("{name} log:\n{}", cp.log_tail(name, 20))))
}

/// Waits until a dry-run create of the default CR ([`crate::fixtures::default_cr`]) through `api`
/// comes back defaulted by the webhook, i.e. the API server calls the webhook and trusts its
/// certificate; fails after 30 s with `what`.
pub async fn admitted(
    api: &kube::api::Api<kube::api::DynamicObject>,
    what: &str,
) -> anyhow::Result<()> {
    use kube::api::{DynamicObject, PostParams};
    let obj: DynamicObject = serde_json::from_value(crate::fixtures::default_cr("probe"))?;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    crate::wait::until(what, std::time::Duration::from_secs(30), || async {
        let created = api.create(&pp, &obj).await.map_err(|e| e.to_string())?;
        Ok(created.data["spec"].get("deployment").map(|_| ()))
    })
    .await
}

/// Waits until the API server calls the webhook for ConnectivityProxies ([`admitted`], probed as
/// `client` in namespace `webhook-probe`).
pub async fn admission_active(client: &kube::Client) -> anyhow::Result<()> {
    let ns = "webhook-probe";
    crate::cluster::ensure_namespace(client, ns).await?;
    let api = kube::api::Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<cp_api::ConnectivityProxy>(&()),
    );
    admitted(&api, "the API server to call the webhook").await
}
