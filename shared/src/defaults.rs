//! This release's `spec.deployment` defaults, used by the webhook (injection) and the controller
//! (upgrade to the new release's defaults).

use std::collections::BTreeMap;

use crate::cp::{CpuMemory, Deployment, Image, Resources, RestartWatcher};

/// `spec.config` and `spec.ingress` defaults ([`crate::config_defaults`], a leaf module the CRD types
/// read too).
pub use crate::config_defaults as config;

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

/// This release's proxy image as one reference (what the Deployments' [`PROXY_IMAGE_ENV`] carries).
///
/// [`PROXY_IMAGE_ENV`]: crate::images::PROXY_IMAGE_ENV
pub fn release_proxy_image() -> String {
    format!("{PROXY_REGISTRY}/{PROXY_REPOSITORY}:{PROXY_TAG}")
}

/// This release's utility image as one reference (the Deployments' [`UTILITY_IMAGE_ENV`]).
///
/// [`UTILITY_IMAGE_ENV`]: crate::images::UTILITY_IMAGE_ENV
pub fn release_utility_image() -> String {
    format!("{UTILITY_REGISTRY}/{UTILITY_REPOSITORY}:{UTILITY_TAG}")
}

/// The images the process was started with (a localized bundle's env values), set once at start by
/// [`use_images`]; the release's own when unset.
static IMAGES: std::sync::OnceLock<(Image, Image)> = std::sync::OnceLock::new();

/// The defaults were read before [`use_images`] could set the images.
#[derive(Debug, thiserror::Error)]
#[error("the image defaults are already in use; set the images once, before the first request")]
pub struct ImagesAlreadySet;

/// Makes `proxy` and `utility` this process's image defaults (the webhook and the controller call it
/// at start with their env values). Fails if the defaults were already read or set.
pub fn use_images(
    proxy: &crate::images::ImageRef,
    utility: &crate::images::ImageRef,
) -> Result<(), ImagesAlreadySet> {
    IMAGES
        .set((
            proxy.to_image("IfNotPresent"),
            utility.to_image("IfNotPresent"),
        ))
        .map_err(|_| ImagesAlreadySet)
}

/// A start-up image setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// The value is not an image reference.
    #[error("{var}: {source}")]
    Invalid {
        /// The env var (or flag) it came from.
        var: &'static str,
        /// Why.
        source: crate::images::ImageRefError,
    },
    /// The defaults were read before.
    #[error(transparent)]
    AlreadySet(#[from] ImagesAlreadySet),
}

/// Makes the images of `--proxy-image`/[`PROXY_IMAGE_ENV`] and `--utility-image`/[`UTILITY_IMAGE_ENV`]
/// this process's `spec.deployment` image defaults (the release's own where one is not given). Both
/// operator programs call it first thing.
pub fn configure(proxy: Option<&str>, utility: Option<&str>) -> Result<(), ConfigureError> {
    if proxy.is_none() && utility.is_none() {
        return Ok(());
    }
    let parse = |var: &'static str, value: Option<&str>, release: String| {
        crate::images::ImageRef::parse(value.unwrap_or(&release))
            .map_err(|source| ConfigureError::Invalid { var, source })
    };
    let proxy = parse(crate::images::PROXY_IMAGE_ENV, proxy, release_proxy_image())?;
    let utility = parse(
        crate::images::UTILITY_IMAGE_ENV,
        utility,
        release_utility_image(),
    )?;
    use_images(&proxy, &utility)?;
    Ok(())
}

fn images() -> &'static (Image, Image) {
    IMAGES.get_or_init(|| {
        let image = |registry: &str, repository: &str, tag: &str| Image {
            digest: None,
            pull_policy: Some("IfNotPresent".into()),
            pull_secret: None,
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.into(),
        };
        (
            image(PROXY_REGISTRY, PROXY_REPOSITORY, PROXY_TAG),
            image(UTILITY_REGISTRY, UTILITY_REPOSITORY, UTILITY_TAG),
        )
    })
}

/// The complete `spec.deployment` of this release (with the images the process was started with).
pub fn deployment_defaults() -> Deployment {
    let (proxy, utility) = images();
    Deployment {
        image: Some(proxy.clone()),
        utility_image: Some(utility.clone()),
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

/// The module's default CR's spec (`manifests/default-cr.yaml`): every value the operator can derive is
/// `auto-provision`. What `migrate-plan` assumes when the CR does not exist yet.
pub fn kyma_default_spec() -> serde_json::Value {
    use crate::names::AUTO_PROVISION;
    serde_json::json!({
        "config": {
            "servers": {"businessDataTunnel": {"externalHost": AUTO_PROVISION}},
            "subaccountId": AUTO_PROVISION,
            "subaccountSubdomain": AUTO_PROVISION
        },
        "ingress": {"tls": {"secretName": AUTO_PROVISION}},
        "secretConfig": {"integration": {"connectivityService": {"secretName": AUTO_PROVISION}}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every default of `spec.config` in the generated CRD is [`config::spec_config`]'s: the schema,
    /// the renderer and the legacy import read one source.
    #[test]
    fn the_crds_config_defaults_are_the_defaults_module() {
        fn leaves(v: &serde_json::Value, path: String, out: &mut Vec<(String, serde_json::Value)>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        leaves(v, format!("{path}/{k}"), out);
                    }
                }
                v => out.push((path, v.clone())),
            }
        }
        fn walk(schema: &serde_json::Value, path: &str, checked: &mut usize) {
            let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
                return;
            };
            for (name, prop) in props {
                let here = format!("{path}/{name}");
                if let Some(default) = prop.get("default") {
                    let mut found = vec![];
                    leaves(default, here.clone(), &mut found);
                    for (leaf, value) in found {
                        let ours = config::spec_config().pointer(&leaf).cloned();
                        assert_eq!(
                            ours.as_ref(),
                            Some(&value),
                            "the CRD defaults spec.config{leaf} to {value}; defaults::config::spec_config() has {ours:?}"
                        );
                        *checked += 1;
                    }
                }
                walk(prop, &here, checked);
            }
        }
        let crd = serde_json::to_value(crate::crds::all().remove(0)).expect("CRD as JSON");
        let config = crd
            .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/config")
            .expect("spec.config in the CRD");
        let mut checked = 0;
        walk(config, "", &mut checked);
        assert!(checked > 20, "only {checked} defaults checked");
    }

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
