//! The webhook's command line: flags (each with its environment variable) and what they mean once
//! checked (limits, privileged identities, where the serving certificate comes from).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use cp_api::policy::PrivilegedIdentities;

use crate::limits::Limits;
use crate::tls::CertSource;

/// Admission webhook of the Connectivity Proxy module operator.
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// Address of the TLS admission server.
    #[arg(long, env = "CP_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub addr: SocketAddr,
    /// Address of the plain-HTTP metrics server (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "CP_WEBHOOK_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// After SIGTERM, keep accepting requests this long with readiness false (so the endpoint leaves
    /// the Service first), then finish the open requests and exit.
    #[arg(long, env = "CP_WEBHOOK_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Serving certificate chain (PEM). Re-read when it changes.
    #[arg(long, env = "CP_WEBHOOK_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving private key (PEM).
    #[arg(long, env = "CP_WEBHOOK_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) of the client certificate the API server presents to webhooks (its
    /// `--admission-control-config-file`). Set: only callers with a certificate of this CA complete
    /// the TLS handshake. Unset (Gardener and most managed clusters configure none): anyone on the
    /// pod network may call, and answers name nothing beyond the request's own content.
    #[arg(long, env = "CP_WEBHOOK_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// How often to look for a changed certificate file.
    #[arg(long, env = "CP_WEBHOOK_TLS_RELOAD_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// Serve the certificate of this `kubernetes.io/tls` Secret (`namespace/name`), watched; used when no files are given.
    #[arg(
        long,
        env = "CP_WEBHOOK_TLS_SECRET",
        default_value = "kyma-system/connectivity-proxy-webhook-cert"
    )]
    pub tls_secret: String,
    /// The operator's ServiceAccount (`namespace/name`): the identity that may change `spec.deployment`.
    #[arg(
        long,
        env = "CP_OPERATOR_SERVICE_ACCOUNT",
        default_value = "kyma-system/connectivity-proxy-controller"
    )]
    pub operator_service_account: String,
    /// The Connectivity Proxy image injected as `spec.deployment.image` (the bundle sets it; lifecycle-manager's
    /// image localization rewrites it for restricted markets).
    #[arg(long, env = "CP_PROXY_IMAGE")]
    pub proxy_image: Option<String>,
    /// The utility image injected as `spec.deployment.utilityImage`; set and localized like `--proxy-image`.
    #[arg(long, env = "CP_UTILITY_IMAGE")]
    pub utility_image: Option<String>,
    /// More users that may change `spec.deployment` (comma-separated).
    #[arg(long, env = "CP_PRIVILEGED_USERS", value_delimiter = ',')]
    pub privileged_users: Vec<String>,
    /// Groups that may change `spec.deployment` (comma-separated).
    #[arg(long, env = "CP_PRIVILEGED_GROUPS", value_delimiter = ',')]
    pub privileged_groups: Vec<String>,
    /// ConfigMap (`namespace/name`) with more privileged identities (`privilegedUsers`,
    /// `privilegedGroups`), watched: changes apply within seconds. Empty: none.
    #[arg(
        long,
        env = "CP_PRIVILEGED_CONFIG",
        default_value = "kyma-system/connectivity-proxy-operator-config"
    )]
    pub privileged_config: String,
    /// Open connections to the admission port at most; one beyond it is closed at once.
    #[arg(long, env = "CP_WEBHOOK_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Open connections from one IP address at most (below --max-connections, so a few sources
    /// cannot take every connection and the API server's address still gets in).
    #[arg(
        long,
        env = "CP_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = Limits::default().max_connections_per_source
    )]
    pub max_connections_per_source: usize,
}

impl Args {
    /// The connection limits of the admission port (`--max-connections*` checked against each other).
    pub fn limits(&self) -> anyhow::Result<Limits> {
        anyhow::ensure!(
            self.max_connections_per_source >= 1
                && self.max_connections_per_source <= self.max_connections,
            "--max-connections-per-source ({}) must be between 1 and --max-connections ({})",
            self.max_connections_per_source,
            self.max_connections
        );
        Ok(Limits {
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            ..Limits::default()
        })
    }

    /// The fixed privileged identities: the operator's ServiceAccount, then `--privileged-users` and
    /// `--privileged-groups` (blanks dropped).
    pub fn privileged(&self) -> anyhow::Result<PrivilegedIdentities> {
        let (sa_ns, sa_name) =
            namespaced(&self.operator_service_account, "--operator-service-account")?;
        let mut users = vec![format!("system:serviceaccount:{sa_ns}:{sa_name}")];
        users.extend(given(&self.privileged_users));
        Ok(PrivilegedIdentities {
            users,
            groups: given(&self.privileged_groups).collect(),
        })
    }

    /// `--privileged-config` split (`None`: empty, no ConfigMap is watched).
    pub fn privileged_config(&self) -> anyhow::Result<Option<(&str, &str)>> {
        match self.privileged_config.split_once('/') {
            Some(ns_name) => Ok(Some(ns_name)),
            None if self.privileged_config.is_empty() => Ok(None),
            None => anyhow::bail!("--privileged-config must be namespace/name or empty"),
        }
    }

    /// Where the serving certificate comes from: both files when given, else `--tls-secret`.
    pub fn cert_source(&self) -> anyhow::Result<CertSource> {
        Ok(match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
                interval: self.tls_reload_interval,
            },
            _ => {
                let (ns, name) = namespaced(&self.tls_secret, "--tls-secret")?;
                CertSource::Secret {
                    namespace: ns.into(),
                    name: name.into(),
                }
            }
        })
    }
}

/// The identities of a comma-separated flag, blanks dropped.
fn given(list: &[String]) -> impl Iterator<Item = String> + '_ {
    list.iter().filter(|s| !s.is_empty()).cloned()
}

/// `value` of `flag` as `(namespace, name)`.
fn namespaced<'a>(value: &'a str, flag: &str) -> anyhow::Result<(&'a str, &'a str)> {
    value
        .split_once('/')
        .with_context(|| format!("{flag} must be namespace/name"))
}

/// A duration like `2s`, `500ms` or `1m` (a bare number: seconds).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| DurationError::NotADuration(s.into()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(DurationError::Unit(s.into())),
    }
}

/// Why a flag's value is not a duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No leading number.
    #[error("{0:?} is not a duration like 2s or 500ms")]
    NotADuration(String),
    /// A unit other than ms, s or m.
    #[error("{0:?}: unit must be ms, s or m")]
    Unit(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn args(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("cp-webhook").chain(flags.iter().copied()))
            .expect("flags")
    }

    #[test]
    fn the_flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn durations_take_ms_s_m_or_a_bare_number_of_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn privileged_identities_start_with_the_operator_and_drop_blanks() {
        let p = args(&["--privileged-users", "a,,b", "--privileged-groups", ",g"])
            .privileged()
            .expect("privileged");
        assert_eq!(
            p.users,
            [
                "system:serviceaccount:kyma-system:connectivity-proxy-controller",
                "a",
                "b"
            ]
        );
        assert_eq!(p.groups, ["g"]);
        let e = args(&["--operator-service-account", "x"])
            .privileged()
            .expect_err("no namespace");
        assert_eq!(
            e.to_string(),
            "--operator-service-account must be namespace/name"
        );
    }

    #[test]
    fn the_privileged_config_is_namespace_name_or_empty() {
        assert_eq!(
            args(&[]).privileged_config().expect("default"),
            Some(("kyma-system", "connectivity-proxy-operator-config"))
        );
        assert_eq!(
            args(&["--privileged-config", ""])
                .privileged_config()
                .expect("empty"),
            None
        );
        assert!(
            args(&["--privileged-config", "x"])
                .privileged_config()
                .is_err()
        );
    }

    #[test]
    fn files_given_win_over_the_secret() {
        let files = args(&["--tls-cert-file", "c", "--tls-key-file", "k"]);
        assert!(matches!(
            files.cert_source().expect("files"),
            CertSource::Files { interval, .. } if interval == Duration::from_secs(2)
        ));
        assert!(matches!(
            args(&[]).cert_source().expect("secret"),
            CertSource::Secret { namespace, name }
                if namespace == "kyma-system" && name == "connectivity-proxy-webhook-cert"
        ));
        let e = args(&["--tls-secret", "x"])
            .cert_source()
            .expect_err("no namespace");
        assert_eq!(e.to_string(), "--tls-secret must be namespace/name");
    }
}
