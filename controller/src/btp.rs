//! The Connectivity service key: from a BTP ServiceBinding (auto-provision), from `secretData`, or
//! from a named Secret; and the subaccount id and subdomain it carries.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cp_api::{ConnectivityProxy, names};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::Error;
use crate::desired::types::{ServiceBindingSpec, ServiceInstanceSpec, WithSpec};
use crate::desired::{Desired, Kind, body, object};

/// The service key and what the controller learned from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceKey {
    /// The key's bytes (JSON), to be mounted into the proxy.
    pub content: Vec<u8>,
    /// `subaccount_id` in the key.
    pub subaccount_id: Option<String>,
    /// `subaccount_subdomain` in the key.
    pub subaccount_subdomain: Option<String>,
}

/// What is wrong with a service key's content (never quoting it: it is a credential).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyProblem {
    /// Not JSON.
    #[error("is not JSON ({0})")]
    NotJson(String),
    /// JSON, but no object.
    #[error("is JSON but not a JSON object")]
    NotAnObject,
}

/// Why the key in the user's Secret cannot be used; each message names the Secret and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretProblem {
    /// Absent, not opted in, or another module's (one message: a CR editor learns nothing about it).
    #[error(
        "Secret {ns}/{name}, named in spec.secretConfig.integration.connectivityService.secretName, is not usable by the proxy: it must exist, belong to no other Kyma module, carry the label {label}=true (its owner's consent: kubectl label secret {name} -n {ns} {label}=true) and hold the Connectivity service key under key {keys}; or set secretName to auto-provision",
        label = cp_api::keys::USABLE_BY_PROXY_LABEL
    )]
    NotUsable {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
        /// The keys looked for.
        keys: String,
    },
    /// No key under the expected names.
    #[error(
        "Secret {ns}/{name}, named in spec.secretConfig.integration.connectivityService.secretName, has no key {keys}; add the Connectivity service key under key {keys} (another key name goes into spec.config.integration.connectivityService.serviceCredentialsKey)"
    )]
    NoKey {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
        /// The keys looked for.
        keys: String,
    },
    /// The key's content is not a service key.
    #[error("{}", unusable(&format!("key {found_under} of Secret {ns}/{name}"), problem))]
    Unusable {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
        /// The key it was found under.
        found_under: String,
        /// What is wrong.
        problem: KeyProblem,
    },
}

/// Why a ServiceBinding has no key yet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingWait {
    /// Its Ready condition is not True.
    #[error("ServiceBinding {name} is not ready: {reason} {message}")]
    NotReady {
        /// The binding.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// No Ready condition yet.
    #[error(
        "ServiceBinding {0} has no Ready condition yet; the SAP BTP service operator is provisioning it"
    )]
    Provisioning(String),
}

impl ServiceKey {
    /// Parses a key, which must be a JSON object (a Connectivity service key); fields that are absent
    /// stay `None`. The error says what is wrong without quoting the content (it is a credential).
    pub fn parse(content: Vec<u8>) -> Result<Self, KeyProblem> {
        let v: Value =
            serde_json::from_slice(&content).map_err(|e| KeyProblem::NotJson(e.to_string()))?;
        if !v.is_object() {
            return Err(KeyProblem::NotAnObject);
        }
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
        Ok(Self {
            subaccount_id: field("subaccount_id"),
            subaccount_subdomain: field("subaccount_subdomain"),
            content,
        })
    }
}

/// What the service-key step concluded.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Objects to apply (ServiceInstance, ServiceBinding, the service-key Secret).
    pub objects: Vec<Desired>,
    /// The key, once known.
    pub key: Option<ServiceKey>,
    /// Why the key is not available yet (the state stays Processing).
    pub waiting: Option<String>,
    /// Why the key the CR points at cannot be used: the user must act (the state is Warning).
    pub invalid: Option<String>,
}

/// How a service key that does not parse is fixed, by where it comes from.
const KEY_FIX: &str = "put the Connectivity service key there as the JSON object SAP BTP issues \
     (a service key or binding of the connectivity service, plan connectivity_proxy)";

fn unusable(where_: &str, problem: &KeyProblem) -> String {
    format!("{where_} does not hold a usable service key: it {problem}; {KEY_FIX}")
}

fn credentials_key(cr: &ConnectivityProxy) -> String {
    cr.spec
        .config
        .integration
        .as_ref()
        .and_then(|i| i.connectivity_service.as_ref())
        .and_then(|c| c.service_credentials_key.clone())
        .unwrap_or_else(|| names::SECRET_SERVICE_KEY_KEY.to_string())
}

/// The Secret the proxy mounts, holding the key under `service_key` (and the configured credentials key).
fn key_secret(cr: &ConnectivityProxy, ns: &str, name: &str, content: &[u8]) -> Desired {
    let data = std::collections::BTreeMap::from([
        (names::SECRET_SERVICE_KEY_KEY.to_string(), content.to_vec()),
        (credentials_key(cr), content.to_vec()),
    ]);
    object(
        cr,
        Kind::Secret,
        Some(ns),
        name,
        body(&crate::desired::secret("Opaque", None, data)),
    )
}

fn binding_ready(binding: &DynamicObject) -> Result<(), BindingWait> {
    let conditions = binding.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c["type"] == "Ready");
    match ready {
        Some(c) if c["status"] == "True" => Ok(()),
        Some(c) => Err(BindingWait::NotReady {
            name: binding.name_any(),
            reason: c["reason"].as_str().unwrap_or("").into(),
            message: c["message"].as_str().unwrap_or("").into(),
        }),
        None => Err(BindingWait::Provisioning(binding.name_any())),
    }
}

/// Where the service key is read from: the BTP operator's Secret of the binding (auto-provision) or
/// the user's Secret, in the CR's namespace; `None` when the CR carries the key itself (`secretData`).
pub fn key_source(cr: &ConnectivityProxy) -> Option<String> {
    let (secret_name, secret_data) = cr.spec.connectivity_secret();
    if names::is_auto_provision(Some(&secret_name)) {
        return Some(names::binding_secret_name(
            &cr.name_any(),
            &cr.namespace().unwrap_or_default(),
        ));
    }
    secret_data.is_none().then_some(secret_name)
}

/// Works out the service key for `cr` from the live ServiceBinding and the Secret named by
/// [`key_source`] (pure).
pub fn service_key(
    cr: &ConnectivityProxy,
    binding: Option<&DynamicObject>,
    secret: Option<&Secret>,
) -> Result<Outcome, Error> {
    let ns = cr.namespace().unwrap_or_default();
    let (secret_name, secret_data) = cr.spec.connectivity_secret();
    let key_name = credentials_key(cr);
    if names::is_auto_provision(Some(&secret_name)) {
        return Ok(from_binding(cr, &ns, &key_name, binding, secret));
    }
    if let Some(data) = secret_data {
        // Validated by the CRD's base64 pattern; a key that still does not decode is reported.
        let content = STANDARD.decode(data.trim()).map_err(|e| {
            Error::Invalid(format!(
                "spec.secretConfig.integration.connectivityService.secretData is not base64: {e}"
            ))
        })?;
        let objects = vec![key_secret(cr, &ns, &secret_name, &content)];
        return Ok(match ServiceKey::parse(content) {
            Ok(key) => Outcome {
                objects,
                key: Some(key),
                ..Outcome::default()
            },
            Err(problem) => Outcome {
                objects,
                invalid: Some(unusable(
                    "spec.secretConfig.integration.connectivityService.secretData",
                    &problem,
                )),
                ..Outcome::default()
            },
        });
    }
    // A Secret the user manages: read for the key and the subaccount values, never written.
    Ok(
        match from_user_secret(cr, &ns, &secret_name, &key_name, secret) {
            Ok(key) => Outcome {
                key: Some(key),
                ..Outcome::default()
            },
            Err(problem) => Outcome {
                invalid: Some(problem.to_string()),
                ..Outcome::default()
            },
        },
    )
}

/// The key in the user's Secret `ns/name`, under `key_name` (the configured credentials key) or
/// `service_key`; the error names the Secret, the key and the fix.
fn from_user_secret(
    cr: &ConnectivityProxy,
    ns: &str,
    name: &str,
    key_name: &str,
    secret: Option<&Secret>,
) -> Result<ServiceKey, SecretProblem> {
    let std = names::SECRET_SERVICE_KEY_KEY;
    let keys = if key_name == std {
        std.to_string()
    } else {
        format!("{key_name} (or {std})")
    };
    let Some(secret) = secret.filter(|s| usable_by_proxy(s, cr)) else {
        // Absent, not opted in, or another module's: one message, so the status tells a CR editor
        // who may not read Secrets neither whether the Secret exists nor what it holds.
        return Err(SecretProblem::NotUsable {
            ns: ns.into(),
            name: name.into(),
            keys,
        });
    };
    let data = secret.data.as_ref();
    let found = data
        .and_then(|d| d.get(key_name).map(|b| (key_name, b)))
        .or_else(|| data.and_then(|d| d.get(std).map(|b| (std, b))));
    let Some((found_under, content)) = found else {
        return Err(SecretProblem::NoKey {
            ns: ns.into(),
            name: name.into(),
            keys,
        });
    };
    ServiceKey::parse(content.0.clone()).map_err(|problem| SecretProblem::Unusable {
        ns: ns.into(),
        name: name.into(),
        found_under: found_under.into(),
        problem,
    })
}

/// Whether the proxy may mount the user's Secret: its owner opted in with
/// [`cp_api::keys::USABLE_BY_PROXY_LABEL`] (or it is the legacy installation's own service key, which
/// the takeover that the CR records kept), and it belongs to no other Kyma module.
pub fn usable_by_proxy(secret: &Secret, cr: &ConnectivityProxy) -> bool {
    let labels = secret.labels();
    let label = |k: &str| labels.get(k).map(String::as_str);
    let other_module = label(names::LABEL_MODULE).is_some_and(|m| m != names::MODULE_VALUE);
    let opted_in = label(cp_api::keys::USABLE_BY_PROXY_LABEL) == Some("true");
    let legacy_key = secret.name_any() == names::SECRET_SERVICE_KEY
        && cr
            .annotations()
            .contains_key(cp_api::keys::TAKEOVER_ID_ANNOTATION);
    !other_module && (opted_in || legacy_key)
}

fn from_binding(
    cr: &ConnectivityProxy,
    ns: &str,
    key_name: &str,
    binding: Option<&DynamicObject>,
    secret: Option<&Secret>,
) -> Outcome {
    let cr_name = cr.name_any();
    let instance = names::service_instance_name(&cr_name, ns);
    let binding_name = names::service_binding_name(&cr_name, ns);
    let binding_secret = names::binding_secret_name(&cr_name, ns);
    let mut objects = vec![
        object(
            cr,
            Kind::ServiceInstance,
            Some(ns),
            &instance,
            body(&WithSpec {
                spec: ServiceInstanceSpec {
                    service_offering_name: "connectivity",
                    service_plan_name: "connectivity_proxy",
                    external_name: instance.clone(),
                },
            }),
        ),
        object(
            cr,
            Kind::ServiceBinding,
            Some(ns),
            &binding_name,
            body(&WithSpec {
                spec: ServiceBindingSpec {
                    service_instance_name: instance.clone(),
                    secret_name: binding_secret.clone(),
                    secret_key: key_name.into(),
                    external_name: binding_name.clone(),
                },
            }),
        ),
    ];
    let waiting = match binding.map(binding_ready) {
        None => Some(format!("ServiceBinding {binding_name} is being created")),
        Some(Err(wait)) => Some(wait.to_string()),
        Some(Ok(())) => None,
    };
    let content = secret
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(key_name).map(|b| b.0.clone()));
    let (key, waiting, invalid) = match (waiting, content) {
        (Some(w), _) => (None, Some(w), None),
        (None, None) => (
            None,
            Some(format!(
                "Secret {binding_secret} of ServiceBinding {binding_name} has no key {key_name} yet"
            )),
            None,
        ),
        (None, Some(content)) => {
            objects.push(key_secret(cr, ns, names::SECRET_SERVICE_KEY, &content));
            match ServiceKey::parse(content) {
                Ok(key) => (Some(key), None, None),
                Err(problem) => {
                    let at = format!(
                        "key {key_name} of Secret {ns}/{binding_secret} (written by the SAP BTP \
                         service operator for ServiceBinding {binding_name})"
                    );
                    (None, None, Some(unusable(&at, &problem)))
                }
            }
        }
    };
    Outcome {
        objects,
        key,
        waiting,
        invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subaccount_fields() {
        let k = ServiceKey::parse(
            br#"{"subaccount_id":"sub-1","subaccount_subdomain":"dom","clientid":"x"}"#.to_vec(),
        )
        .expect("a key");
        assert_eq!(k.subaccount_id.as_deref(), Some("sub-1"));
        assert_eq!(k.subaccount_subdomain.as_deref(), Some("dom"));
        assert_eq!(
            ServiceKey::parse(br#"{"clientid":"x"}"#.to_vec()).map(|k| k.subaccount_id),
            Ok(None)
        );
        for bad in [&b"not json"[..], b"\"clientid\"", b"[1]", b""] {
            let err = ServiceKey::parse(bad.to_vec())
                .expect_err("not a key")
                .to_string();
            assert!(err.contains("JSON"), "{err}");
        }
    }
}
