//! The business-tunnel certificate: [`rotate`] (run by gather) keeps, renews or issues the operator's
//! own CA and leaf from the live Secrets and the time, generating new keys when due; [`objects`]
//! (pure, run by the plan) turns that into the objects to apply: a Gardener or cert-manager
//! `Certificate` when those issue it, else the operator's own CA and leaf Secrets.

use cp_api::names;
use cp_certs::renewal::Policy;
use cp_certs::rotation::{self, Spec};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use time::OffsetDateTime;

use super::{ca_secret_content, leaf_secret_content, state_from, text};
use crate::desired::types::{
    CertManagerCertificateSpec, GardenerCertificateSpec, IssuerRef, SecretRef, WithSpec,
};
use crate::desired::{Desired, Kind, Resolved, body, object};

/// Settings of the business-tunnel certificate.
#[derive(Clone, Debug)]
pub struct TunnelCertSettings {
    /// Lifetime of the operator's own tunnel CA.
    pub ca_lifetime: time::Duration,
    /// Lifetime of the built-in tunnel certificate.
    pub cert_lifetime: time::Duration,
    /// cert-manager issuer (`Kind/name`, e.g. `ClusterIssuer/letsencrypt`) to use when cert-manager is installed.
    pub cert_manager_issuer: Option<(String, String)>,
    /// Key algorithm of the built-in certificates.
    pub algorithm: cp_certs::KeyAlgorithm,
}

/// Which provider issues the tunnel certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Gardener's cert-management (Kyma's clusters).
    Gardener,
    /// cert-manager with the configured issuer.
    CertManager,
    /// The operator's own CA.
    BuiltIn,
}

/// Chooses the provider from the installed CRDs and the configuration.
pub fn provider(
    has_gardener: bool,
    has_cert_manager: bool,
    settings: &TunnelCertSettings,
) -> Provider {
    if has_gardener {
        Provider::Gardener
    } else if has_cert_manager && settings.cert_manager_issuer.is_some() {
        Provider::CertManager
    } else {
        Provider::BuiltIn
    }
}

/// What the tunnel certificate needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tunnel {
    /// Objects to apply (a `Certificate`, or the built-in CA and leaf Secrets).
    pub objects: Vec<Desired>,
    /// When the built-in certificate is due for renewal.
    pub renew_at: Option<OffsetDateTime>,
    /// Whether a new built-in leaf certificate was issued now.
    pub issued: bool,
    /// The current leaf certificate (PEM), for the expiry metric.
    pub leaf_pem: Option<String>,
}

/// The live Secrets the tunnel certificate is decided from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Live<'a> {
    /// The built-in tunnel CA (`connectivity-proxy-tunnel-ca` in the CR's namespace).
    pub ca: Option<&'a Secret>,
    /// The tunnel's TLS Secret (in the Istio namespace), whoever issued it.
    pub tls: Option<&'a Secret>,
}

/// Why the built-in tunnel certificate cannot be issued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// Issuing or renewing failed.
    #[error("{0}")]
    Rotation(String),
    /// The reconcile did not settle the certificate's keys before the plan.
    #[error("the built-in tunnel certificate was not prepared")]
    NotPrepared,
}

/// The leaf's DNS names: the tunnel host and its wildcard.
fn dns_names(host: &str) -> Vec<String> {
    vec![host.to_string(), format!("*.{host}")]
}

/// The built-in tunnel certificate's rotation at `now` from the `live` Secrets: the CA and leaf kept,
/// renewed or issued (new private keys are generated here, so the reconcile settles it before the plan, which stays pure);
/// an error when a certificate cannot be issued.
pub fn rotate(
    cr: &cp_api::ConnectivityProxy,
    resolved: &Resolved,
    settings: &TunnelCertSettings,
    live: Live<'_>,
    now: OffsetDateTime,
) -> Result<rotation::Rotation, IssueError> {
    let host = resolved.external_host.clone();
    let spec = Spec {
        ca_common_name: format!(
            "connectivity-proxy-tunnel-ca-{}",
            cr.namespace().unwrap_or_default()
        ),
        dns_names: dns_names(&host),
        common_name: host,
        ips: vec![],
        ca_policy: Policy::new(settings.ca_lifetime),
        leaf_policy: Policy::new(settings.cert_lifetime),
        propagation: time::Duration::ZERO,
        algorithm: settings.algorithm,
    };
    rotation::plan(now, &state_from(live.ca, live.tls), &spec)
        .map_err(|e| IssueError::Rotation(e.to_string()))
}

/// The tunnel certificate's objects; for the built-in provider from `built_in`, the [`rotate`]
/// result the reconcile settled. An error when a built-in certificate cannot be issued.
pub fn objects(
    cr: &cp_api::ConnectivityProxy,
    resolved: &Resolved,
    provider: Provider,
    settings: &TunnelCertSettings,
    live: Live<'_>,
    built_in: Option<&Result<rotation::Rotation, IssueError>>,
) -> Result<Tunnel, IssueError> {
    if !resolved.tls_auto {
        return Ok(Tunnel::default());
    }
    let host = resolved.external_host.clone();
    let dns = dns_names(&host);
    let ns = resolved.istio_namespace.as_str();
    let secret = resolved.tls_secret.as_str();
    let issued_pem = || {
        live.tls
            .and_then(|s| s.data.as_ref())
            .and_then(|d| text(d, "tls.crt"))
    };
    let certificate = |kind, body| Tunnel {
        objects: vec![object(cr, kind, Some(ns), secret, body)],
        leaf_pem: issued_pem(),
        ..Tunnel::default()
    };
    match provider {
        Provider::Gardener => Ok(certificate(
            Kind::GardenerCertificate,
            body(&WithSpec {
                spec: GardenerCertificateSpec {
                    common_name: host,
                    dns_names: dns,
                    secret_ref: SecretRef {
                        name: secret.into(),
                        namespace: ns.into(),
                    },
                },
            }),
        )),
        Provider::CertManager => {
            let (kind, name) = settings.cert_manager_issuer.clone().unwrap_or_default();
            Ok(certificate(
                Kind::CertManagerCertificate,
                body(&WithSpec {
                    spec: CertManagerCertificateSpec {
                        secret_name: secret.into(),
                        common_name: host,
                        dns_names: dns,
                        issuer_ref: IssuerRef {
                            group: "cert-manager.io",
                            kind,
                            name,
                        },
                    },
                }),
            ))
        }
        Provider::BuiltIn => match built_in {
            Some(Ok(plan)) => Ok(built_in_objects(cr, ns, secret, plan)),
            Some(Err(e)) => Err(e.clone()),
            None => Err(IssueError::NotPrepared),
        },
    }
}

/// The built-in CA Secret (in the CR's namespace) and leaf Secret of `plan`.
fn built_in_objects(
    cr: &cp_api::ConnectivityProxy,
    ns: &str,
    secret: &str,
    plan: &rotation::Rotation,
) -> Tunnel {
    let cr_ns = cr.namespace().unwrap_or_default();
    Tunnel {
        objects: vec![
            object(
                cr,
                Kind::Secret,
                Some(&cr_ns),
                names::TUNNEL_CA_SECRET,
                body(&ca_secret_content(plan)),
            ),
            object(
                cr,
                Kind::Secret,
                Some(ns),
                secret,
                body(&leaf_secret_content(plan)),
            ),
        ],
        renew_at: Some(plan.next),
        issued: plan.leaf_rotated,
        leaf_pem: plan.state.leaf.as_ref().map(|l| l.cert_pem.clone()),
    }
}
