//! API of the Connectivity Proxy module operator: the CRD types, the names of everything it manages,
//! this release's protected defaults, the protected-field policy and the validation rules.
//!
//! The webhook and the controller both depend on this crate, so anything the webhook admits the
//! controller can reconcile.
#![forbid(unsafe_code)]

pub mod admission_config;
pub mod bundle;
pub mod cli;
pub mod config_defaults;
pub mod cp;
pub mod crds;
pub mod defaults;
#[cfg(feature = "metrics")]
pub mod exposition;
pub mod images;
pub mod keys;
pub mod kinds;
pub mod mapping;
pub mod names;
pub mod policy;
pub mod reason;
pub mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validation;
pub mod writes;
pub mod yaml11;
pub mod yaml11_types;

pub use cp::{ConnectivityProxy, ConnectivityProxySpec};
pub use mapping::{ServiceMapping, ServiceMappingSpec};
pub use status::{ModuleStatus, State};

#[cfg(test)]
mod validation_tests;

/// Drops what a watch cache never reads and what dominates a small object's memory: `managedFields`
/// (a JSON tree per field manager) and kubectl's last-applied-configuration copy. Both processes
/// apply it to the objects they cache, so 10,000 ServiceMappings cost a fraction of their full size.
pub fn slim_for_cache(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
        if a.is_empty() {
            meta.annotations = None;
        }
    }
}

#[cfg(test)]
mod slim_tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn slimming_keeps_names_labels_and_other_annotations() {
        let mut meta = ObjectMeta {
            name: Some("m".into()),
            uid: Some("u".into()),
            labels: Some([("a".to_string(), "b".to_string())].into()),
            annotations: Some(
                [
                    (
                        "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                        "{}".to_string(),
                    ),
                    ("keep".to_string(), "me".to_string()),
                ]
                .into(),
            ),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..Default::default()
        };
        super::slim_for_cache(&mut meta);
        assert_eq!(meta.managed_fields, None);
        assert_eq!(meta.name.as_deref(), Some("m"));
        assert_eq!(meta.labels.as_ref().map(|l| l.len()), Some(1));
        assert_eq!(
            meta.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
    }
}
