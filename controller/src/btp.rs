//! The Connectivity service key: from a BTP ServiceBinding (auto-provision), from `secretData`, or
//! from a named Secret; and the subaccount id and subdomain it carries.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cp_api::{ConnectivityProxy, names};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::Error;
use crate::desired::{Desired, Kind, object};

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

impl ServiceKey {
    /// Parses a key; fields that are absent stay `None`.
    pub fn parse(content: Vec<u8>) -> Self {
        let v: Value = serde_json::from_slice(&content).unwrap_or(Value::Null);
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
        Self {
            subaccount_id: field("subaccount_id"),
            subaccount_subdomain: field("subaccount_subdomain"),
            content,
        }
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
        crate::desired::secret("Opaque", None, data),
    )
}

fn binding_ready(binding: &DynamicObject) -> Result<(), String> {
    let conditions = binding.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c["type"] == "Ready");
    match ready {
        Some(c) if c["status"] == "True" => Ok(()),
        Some(c) => Err(format!(
            "ServiceBinding {} is not ready: {} {}",
            binding.name_any(),
            c["reason"].as_str().unwrap_or(""),
            c["message"].as_str().unwrap_or("")
        )),
        None => Err(format!(
            "ServiceBinding {} has no Ready condition yet; the SAP BTP service operator is provisioning it",
            binding.name_any()
        )),
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
        return Ok(Outcome {
            objects,
            key: Some(ServiceKey::parse(content)),
            waiting: None,
        });
    }
    // A Secret the user manages: read for the subaccount values, never written.
    let content = secret.and_then(|s| s.data.as_ref()).and_then(|d| {
        d.get(&key_name)
            .or_else(|| d.get(names::SECRET_SERVICE_KEY_KEY))
            .map(|b| b.0.clone())
    });
    Ok(Outcome {
        objects: vec![],
        key: content.map(ServiceKey::parse),
        waiting: None,
    })
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
            json!({"spec": {
                "serviceOfferingName": "connectivity", "servicePlanName": "connectivity_proxy",
                "externalName": instance,
            }}),
        ),
        object(
            cr,
            Kind::ServiceBinding,
            Some(ns),
            &binding_name,
            json!({"spec": {
                "serviceInstanceName": instance, "secretName": binding_secret, "secretKey": key_name,
                "externalName": binding_name,
            }}),
        ),
    ];
    let waiting = match binding.map(binding_ready) {
        None => Some(format!("ServiceBinding {binding_name} is being created")),
        Some(Err(msg)) => Some(msg),
        Some(Ok(())) => None,
    };
    let content = secret
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(key_name).map(|b| b.0.clone()));
    let (key, waiting) = match (waiting, content) {
        (Some(w), _) => (None, Some(w)),
        (None, None) => (
            None,
            Some(format!(
                "Secret {binding_secret} of ServiceBinding {binding_name} has no key {key_name} yet"
            )),
        ),
        (None, Some(content)) => {
            objects.push(key_secret(cr, ns, names::SECRET_SERVICE_KEY, &content));
            (Some(ServiceKey::parse(content)), None)
        }
    };
    Outcome {
        objects,
        key,
        waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subaccount_fields() {
        let k = ServiceKey::parse(
            br#"{"subaccount_id":"sub-1","subaccount_subdomain":"dom","clientid":"x"}"#.to_vec(),
        );
        assert_eq!(k.subaccount_id.as_deref(), Some("sub-1"));
        assert_eq!(k.subaccount_subdomain.as_deref(), Some("dom"));
        assert_eq!(ServiceKey::parse(b"not json".to_vec()).subaccount_id, None);
    }
}
