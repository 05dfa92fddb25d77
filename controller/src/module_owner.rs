//! What the controller creates for itself at run time (its leader Lease, the webhook's CA and serving
//! certificate Secrets) is not in the bundle, so `kubectl delete -f` of the bundle would leave it behind.
//! Each carries an owner reference to the module's API, the ConnectivityProxy CRD (which is in the
//! bundle): when the module is uninstalled, the garbage collector removes them with it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::{Client, Resource};

/// The ConnectivityProxy CRD's name.
pub fn crd_name() -> String {
    format!(
        "{}.{}",
        cp_api::ConnectivityProxy::plural(&()),
        cp_api::ConnectivityProxy::group(&())
    )
}

/// The owner reference to the ConnectivityProxy CRD, or `None` when it cannot be read (then nothing is
/// owned; logged, not fatal: an owner reference to a missing object would make the garbage collector
/// delete the dependent at once).
pub async fn module_owner(client: &Client) -> Option<OwnerReference> {
    let name = crd_name();
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    // A transient error must not leave the Secrets without their owner (the next apply would drop it):
    // retry a few times, 1 s apart, before giving up.
    let mut found = api.get_opt(&name).await;
    for _ in 0..5 {
        if found.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        found = api.get_opt(&name).await;
    }
    match found {
        Ok(Some(crd)) => Some(OwnerReference {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            name,
            uid: crd.metadata.uid?,
            controller: None,
            block_owner_deletion: None,
        }),
        Ok(None) => {
            tracing::warn!(crd = %name, "the module's CRD is missing: the Lease and webhook Secrets get no owner");
            None
        }
        Err(e) => {
            tracing::warn!(crd = %name, error = %e, "reading the module's CRD: the Lease and webhook Secrets get no owner");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_crd_name() {
        assert_eq!(
            super::crd_name(),
            "connectivityproxies.connectivityproxy.sap.com"
        );
    }
}
