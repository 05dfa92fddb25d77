//! This release's `spec.deployment` defaults, used by the webhook (injection) and the controller
//! (upgrade to the new release's defaults).

use std::collections::BTreeMap;

use crate::cp::{CpuMemory, Deployment, Image, Resources, RestartWatcher};

/// Version of the operator release these defaults belong to.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// Connectivity Proxy image of this release.
pub const PROXY_REGISTRY: &str = "docker.io";
pub const PROXY_REPOSITORY: &str = "sapse/connectivity-proxy";
pub const PROXY_TAG: &str = "2.11.0";
/// Utility image (file-descriptor check init container).
pub const UTILITY_REGISTRY: &str = "europe-docker.pkg.dev";
pub const UTILITY_REPOSITORY: &str = "kyma-project/prod/external/library/busybox";
pub const UTILITY_TAG: &str = "1.37.0";

/// Open file descriptors the proxy gets (`spec.deployment.resources.maxFileDescriptorCount`) unless
/// the CR says otherwise; the init container checks that the node allows it.
pub const MAX_FILE_DESCRIPTORS: i64 = 64000;

/// The complete `spec.deployment` of this release.
pub fn deployment_defaults() -> Deployment {
    Deployment {
        image: Some(Image {
            digest: None,
            pull_policy: Some("IfNotPresent".into()),
            pull_secret: None,
            registry: PROXY_REGISTRY.into(),
            repository: PROXY_REPOSITORY.into(),
            tag: PROXY_TAG.into(),
        }),
        utility_image: Some(Image {
            digest: None,
            pull_policy: Some("IfNotPresent".into()),
            pull_secret: None,
            registry: UTILITY_REGISTRY.into(),
            repository: UTILITY_REPOSITORY.into(),
            tag: UTILITY_TAG.into(),
        }),
        replica_count: Some(1),
        resources: Some(Resources {
            max_file_descriptor_count: Some(MAX_FILE_DESCRIPTORS),
            limits: Some(CpuMemory {
                cpu: "1000m".into(),
                memory: "1024M".into(),
            }),
            requests: Some(CpuMemory {
                cpu: "100m".into(),
                memory: "256M".into(),
            }),
        }),
        restart_watcher: Some(RestartWatcher { enabled: true }),
        node_selector: Some(BTreeMap::new()),
    }
}

/// `spec.deployment` defaults as JSON, built once: the webhook reads them on every request.
pub fn deployment_defaults_value() -> &'static serde_json::Value {
    static DEFAULTS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    // Serialising plain structs of strings and integers cannot fail.
    DEFAULTS.get_or_init(|| {
        serde_json::to_value(deployment_defaults()).unwrap_or(serde_json::Value::Null)
    })
}

/// `spec.deployment` defaults as an owned JSON value, the form the webhook patches in.
pub fn deployment_defaults_json() -> serde_json::Value {
    deployment_defaults_value().clone()
}

/// Fills every field of `current` that is missing with this release's default; returns whether
/// anything changed. Existing values are kept.
pub fn fill_missing(current: &mut serde_json::Value, defaults: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (current, defaults) {
        (Value::Object(cur), Value::Object(def)) => {
            let mut changed = false;
            for (k, dv) in def {
                match cur.get_mut(k) {
                    None | Some(Value::Null) => {
                        cur.insert(k.clone(), dv.clone());
                        changed = true;
                    }
                    Some(cv) => changed |= fill_missing(cv, dv),
                }
            }
            changed
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_complete() {
        let d = deployment_defaults_json();
        for p in [
            "/image/tag",
            "/image/registry",
            "/utilityImage/repository",
            "/replicaCount",
            "/resources/limits/cpu",
            "/resources/maxFileDescriptorCount",
            "/restartWatcher/enabled",
        ] {
            assert!(d.pointer(p).is_some(), "missing default {p}");
        }
    }

    #[test]
    fn fill_missing_keeps_existing_values() {
        let mut cur = json!({"replicaCount": 3, "image": {"tag": "custom"}});
        assert!(fill_missing(&mut cur, &deployment_defaults_json()));
        assert_eq!(cur["replicaCount"], 3);
        assert_eq!(cur["image"]["tag"], "custom");
        assert_eq!(cur["image"]["registry"], PROXY_REGISTRY);
        let mut again = cur.clone();
        assert!(!fill_missing(&mut again, &deployment_defaults_json()));
    }
}
