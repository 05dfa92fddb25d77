//! The controller's command line: flags (each with its environment variable) and subcommands.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;

/// Controller of the Connectivity Proxy module operator.
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Resolve this host name the way the Connectivity CA fetch does (in-process resolver reading
    /// /etc/resolv.conf and /etc/hosts), print its addresses and exit: a diagnostic for the image,
    /// which has no shell.
    #[arg(long, value_name = "HOST")]
    pub check_dns: Option<String>,
    /// Address of the plain-HTTP server for `/metrics`, `/healthz` and `/readyz`.
    #[arg(
        long,
        env = "CP_CONTROLLER_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_addr: SocketAddr,
    /// Reconcile healthy CRs this often anyway (seconds); a steady state only reads.
    #[arg(long, env = "CP_RESYNC_SECONDS", default_value_t = 600)]
    pub resync_seconds: u64,
    /// Elect a leader on a Lease so that several replicas can run.
    #[arg(long, env = "CP_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "CP_LEASE_NAMESPACE", default_value = "kyma-system")]
    pub lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "CP_LEASE_NAME",
        default_value = "connectivity-proxy-operator"
    )]
    pub lease_name: String,
    /// Lease duration in seconds.
    #[arg(long, env = "CP_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,
    /// This replica's identity (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Issue and rotate the webhook's serving certificate and keep the CA bundle in both webhook configurations.
    #[arg(long, env = "CP_MANAGE_WEBHOOK_CERTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub manage_webhook_certs: bool,
    /// Namespace of the webhook Service and its certificate Secrets.
    #[arg(long, env = "CP_WEBHOOK_NAMESPACE", default_value = "kyma-system")]
    pub webhook_namespace: String,
    /// Name of the webhook Service (the certificate's DNS names derive from it).
    #[arg(
        long,
        env = "CP_WEBHOOK_SERVICE",
        default_value = "connectivity-proxy-operator-webhook"
    )]
    pub webhook_service: String,
    /// Extra IP addresses in the webhook certificate (comma-separated; 127.0.0.1 for a local webhook).
    #[arg(long, env = "CP_WEBHOOK_IPS", value_delimiter = ',')]
    pub webhook_ips: Vec<std::net::IpAddr>,
    /// Lifetime of the webhook CA (seconds).
    #[arg(long, env = "CP_WEBHOOK_CA_LIFETIME_SECONDS", default_value_t = 365 * 86400)]
    pub webhook_ca_lifetime_seconds: i64,
    /// Lifetime of the webhook serving certificate (seconds).
    #[arg(long, env = "CP_WEBHOOK_CERT_LIFETIME_SECONDS", default_value_t = 90 * 86400)]
    pub webhook_cert_lifetime_seconds: i64,
    /// Time a new CA bundle or certificate needs to reach the API server and every webhook replica
    /// (seconds): both learn it by watch; a broken watch re-lists within the 30 s backoff cap.
    #[arg(long, env = "CP_CERT_PROPAGATION_SECONDS", default_value_t = 60)]
    pub cert_propagation_seconds: i64,
    /// Extra trusted roots (PEM file) for the Connectivity service's CA endpoint, besides the system's
    /// (a private landscape; the tests' own endpoint). The endpoint is HTTPS-only either way. A path that
    /// does not exist means none (the bundle mounts an optional Secret); read at start.
    #[arg(long, env = "CP_CONNECTIVITY_CA_TRUST")]
    pub connectivity_ca_trust: Option<std::path::PathBuf>,
    /// Hosts the Connectivity service CA may be fetched from, comma-separated: `.domain.tld` for its
    /// subdomains (at least two labels) or an exact host. The service key's URL must name one of them.
    #[arg(
        long,
        env = "CP_CONNECTIVITY_CA_HOSTS",
        value_delimiter = ',',
        default_value = crate::egress::DEFAULT_HOSTS
    )]
    pub connectivity_ca_hosts: Vec<String>,
    /// A file with more such hosts (comma- or line-separated); absent: none (the bundle points it at the
    /// optional trust Secret's key `allowed-hosts`). Read at start.
    #[arg(long, env = "CP_CONNECTIVITY_CA_HOSTS_FILE")]
    pub connectivity_ca_hosts_file: Option<std::path::PathBuf>,
    /// Networks (CIDR) the CA fetch may connect to although they are private, loopback, link-local or
    /// otherwise special-purpose (a private landscape's endpoint), comma-separated. Default: none.
    #[arg(
        long,
        env = "CP_CONNECTIVITY_CA_ALLOWED_NETWORKS",
        value_delimiter = ','
    )]
    pub connectivity_ca_allowed_networks: Vec<String>,
    /// A file with more such networks; absent: none (the trust Secret's key `allowed-networks`).
    #[arg(long, env = "CP_CONNECTIVITY_CA_ALLOWED_NETWORKS_FILE")]
    pub connectivity_ca_allowed_networks_file: Option<std::path::PathBuf>,
    /// The cluster's pod and Service networks (CIDR), refused to the CA fetch even where they are public
    /// addresses, comma-separated. Private, loopback, link-local, CGNAT and unique-local ranges are
    /// refused anyway.
    #[arg(long, env = "CP_CLUSTER_NETWORKS", value_delimiter = ',')]
    pub cluster_networks: Vec<String>,
    /// Lifetime of the operator's own business-tunnel CA (seconds).
    #[arg(long, env = "CP_TUNNEL_CA_LIFETIME_SECONDS", default_value_t = 5 * 365 * 86400)]
    pub tunnel_ca_lifetime_seconds: i64,
    /// Lifetime of the built-in business-tunnel certificate (seconds).
    #[arg(long, env = "CP_TUNNEL_CERT_LIFETIME_SECONDS", default_value_t = 90 * 86400)]
    pub tunnel_cert_lifetime_seconds: i64,
    /// Key algorithm of the certificates the operator issues: `ecdsa-p256` (default) or `rsa-2048`.
    #[arg(long, env = "CP_KEY_ALGORITHM", default_value = "ecdsa-p256")]
    pub key_algorithm: cp_certs::KeyAlgorithm,
    /// The Connectivity Proxy image (`spec.deployment.image` default). The bundle sets it on the
    /// Deployment, where lifecycle-manager's image localization rewrites it for restricted markets.
    #[arg(long, env = "CP_PROXY_IMAGE")]
    pub proxy_image: Option<String>,
    /// The utility image of the proxy's init container (`spec.deployment.utilityImage` default); set
    /// and localized like `--proxy-image`.
    #[arg(long, env = "CP_UTILITY_IMAGE")]
    pub utility_image: Option<String>,
    /// JSON merged over this release's spec.deployment defaults (a hotfix image, or an upgrade test).
    #[arg(long, env = "CP_DEPLOYMENT_DEFAULTS_OVERRIDE")]
    pub deployment_defaults_override: Option<String>,
    /// cert-manager issuer for the tunnel certificate, `Kind/name` (used when cert-manager is installed and Gardener is not).
    #[arg(long, env = "CP_CERT_MANAGER_ISSUER")]
    pub cert_manager_issuer: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Preview the takeover of a legacy reconciler installation in the cluster of the current
    /// kubeconfig, read-only: the spec.config it would import, the backups it would write, every legacy
    /// object it would delete, adopt or keep, the ServiceMappings it would take over, and every blocker
    /// with its fix. Exits 0 when the takeover can proceed (or there is nothing to take over), 2 when
    /// it is blocked, 1 when the cluster could not be read.
    MigratePlan {
        /// Namespace of the module's CR (and of the legacy installation).
        #[arg(long, default_value = "kyma-system")]
        namespace: String,
        /// Name of the module's CR; when it does not exist yet, the module's default CR is assumed.
        #[arg(long, default_value = "connectivity-proxy")]
        name: String,
        /// `text` for people, `json` for scripts.
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        output: String,
    },
}

/// Entries of an optional list file (comma- or line-separated; `#` starts a comment); absent: none.
fn list_file(path: Option<&std::path::Path>) -> anyhow::Result<Vec<String>> {
    let Some(path) = path.filter(|p| p.exists()) else {
        return Ok(vec![]);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(|l| l.split(','))
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect())
}

/// Where the Connectivity CA may be fetched from: the flags plus the optional files.
pub fn ca_egress(args: &Args) -> anyhow::Result<crate::egress::Egress> {
    let mut hosts = args.connectivity_ca_hosts.clone();
    hosts.extend(list_file(args.connectivity_ca_hosts_file.as_deref())?);
    let mut allowed = args.connectivity_ca_allowed_networks.clone();
    allowed.extend(list_file(
        args.connectivity_ca_allowed_networks_file.as_deref(),
    )?);
    let egress = crate::egress::Egress::new(&hosts, &allowed, &args.cluster_networks).context(
        "--connectivity-ca-hosts, --connectivity-ca-allowed-networks, --cluster-networks",
    )?;
    tracing::info!(?hosts, allowed_networks = ?allowed, cluster_networks = ?args.cluster_networks, "Connectivity CA hosts");
    Ok(egress)
}
