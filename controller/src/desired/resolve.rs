//! Turning `auto-provision` values into concrete ones from cluster facts.

use cp_api::reason::Reason;
use cp_api::validation::{ClusterFacts as RuleFacts, FieldError, MAX_HOST_LEN, join};
use cp_api::{ConnectivityProxy, State, names};
use kube::ResourceExt;

/// What the controller knows about the cluster when it resolves a CR.
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    /// `data.domain` of ConfigMap `kube-system/shoot-info`.
    pub cluster_domain: Option<String>,
    /// How many ServiceMappings exist.
    pub service_mapping_count: usize,
    /// Some of their names (for a message; never the whole list).
    pub service_mappings: Vec<String>,
    /// Subaccount id from the BTP service binding, when auto-provisioned.
    pub binding_subaccount_id: Option<String>,
    /// Subaccount subdomain from the BTP service binding, when auto-provisioned.
    pub binding_subaccount_subdomain: Option<String>,
}

/// The CR's values with every `auto-provision` replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Public host of the business data tunnel.
    pub external_host: String,
    /// TLS secret of the tunnel (in `istio_namespace`).
    pub tls_secret: String,
    /// Whether the operator issues the TLS secret.
    pub tls_auto: bool,
    /// Namespace of the Istio ingress gateway.
    pub istio_namespace: String,
    /// Secret with the Connectivity service key, mounted into the proxy.
    pub service_key_secret: String,
    /// Whether the service key comes from a BTP binding.
    pub service_key_auto: bool,
    /// Subaccount id, if known.
    pub subaccount_id: Option<String>,
    /// Subaccount subdomain, if known.
    pub subaccount_subdomain: Option<String>,
    /// Hash of the Secrets the proxy depends on (service key, tunnel TLS), once known: in the pod
    /// template, so a rotated key or certificate restarts the proxy.
    pub secrets_hash: Option<String>,
    /// The audit log Secret the CR names (`spec.secretConfig.integration.auditlogService.secretName`),
    /// projected into the proxy only while its owner lets the proxy use it (the plan clears it
    /// otherwise: [`crate::btp::usable_by_proxy`]).
    pub auditlog_secret: Option<String>,
}

/// Why a CR cannot be applied as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigProblem {
    /// `externalHost` is auto-provisioned but the cluster domain is unknown.
    ExternalHostUnresolved,
    /// The tunnel host is longer than a certificate common name may be.
    ExternalHostTooLong {
        /// The host.
        host: String,
    },
    /// A cross-field rule is broken (the webhook refuses this, but a CR may predate the rule).
    Invalid(Vec<FieldError>),
}

impl ConfigProblem {
    /// Condition reason.
    pub fn reason(&self) -> Reason {
        match self {
            ConfigProblem::ExternalHostUnresolved => Reason::ExternalHostUnresolved,
            ConfigProblem::ExternalHostTooLong { .. } => Reason::ExternalHostTooLong,
            ConfigProblem::Invalid(_) => Reason::InvalidConfiguration,
        }
    }

    /// The module state it leads to.
    pub fn state(&self) -> State {
        match self {
            ConfigProblem::ExternalHostTooLong { .. } => State::Error,
            _ => State::Warning,
        }
    }

    /// What is wrong and what to do.
    pub fn message(&self) -> String {
        match self {
            ConfigProblem::ExternalHostUnresolved => format!(
                "spec.config.servers.businessDataTunnel.externalHost is auto-provision but ConfigMap {}/{} has no data.domain; \
                 set externalHost to the tunnel's public host",
                names::SHOOT_INFO_NAMESPACE,
                names::SHOOT_INFO
            ),
            ConfigProblem::ExternalHostTooLong { host } => format!(
                "tunnel host {host:?} has {} characters, more than the {MAX_HOST_LEN} a certificate common name allows; \
                 set spec.config.servers.businessDataTunnel.externalHost to a shorter host",
                host.len()
            ),
            ConfigProblem::Invalid(errors) => format!("invalid configuration: {}", join(errors)),
        }
    }
}

/// Resolves every `auto-provision` value of `cr` from `facts`.
pub fn resolve(cr: &ConnectivityProxy, facts: &ClusterFacts) -> Result<Resolved, ConfigProblem> {
    let spec = &cr.spec;
    let errors = spec.validate(
        None,
        &RuleFacts {
            service_mapping_count: facts.service_mapping_count,
            service_mappings: facts.service_mappings.clone(),
        },
    );
    if !errors.is_empty() {
        return Err(ConfigProblem::Invalid(errors));
    }
    let cr_name = cr.name_any();
    let cr_ns = cr.namespace().unwrap_or_default();
    let host = &spec.config.servers.business_data_tunnel.external_host;
    let external_host = if names::is_auto_provision(Some(host)) {
        let domain = facts
            .cluster_domain
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .ok_or(ConfigProblem::ExternalHostUnresolved)?;
        format!("cp.{}", domain.trim_end_matches('.'))
    } else {
        host.trim().to_string()
    };
    if external_host.len() > MAX_HOST_LEN {
        return Err(ConfigProblem::ExternalHostTooLong {
            host: external_host,
        });
    }
    let tls_name = spec
        .ingress
        .as_ref()
        .and_then(|i| i.tls.as_ref())
        .map(|t| t.secret_name.clone());
    let tls_auto = names::is_auto_provision(tls_name.as_deref());
    let tls_secret = if tls_auto {
        names::tls_secret_name(&cr_name, &cr_ns)
    } else {
        tls_name.unwrap_or_default()
    };
    let istio_namespace = spec.istio_namespace().to_string();
    let (key_name, _) = spec.connectivity_secret();
    let service_key_auto = names::is_auto_provision(Some(&key_name));
    let service_key_secret = if service_key_auto {
        names::SECRET_SERVICE_KEY.to_string()
    } else {
        key_name
    };
    let pick = |value: &Option<String>, from_binding: &Option<String>| match value {
        Some(v) if names::is_auto_provision(Some(v)) => from_binding.clone(),
        other => other.clone(),
    };
    Ok(Resolved {
        external_host,
        tls_secret,
        tls_auto,
        istio_namespace,
        service_key_secret,
        service_key_auto,
        subaccount_id: pick(&spec.config.subaccount_id, &facts.binding_subaccount_id),
        subaccount_subdomain: pick(
            &spec.config.subaccount_subdomain,
            &facts.binding_subaccount_subdomain,
        ),
        secrets_hash: None,
        auditlog_secret: spec
            .auditlog_secret()
            .filter(|a| !a.is_empty())
            .map(String::from),
    })
}
