//! Operator upgrades: `spec.deployment` moves to this release's defaults; user fields stay.

use cp_api::{ConnectivityProxy, defaults};
use kube::ResourceExt;
use serde_json::{Value, json};

/// This release's `spec.deployment` defaults, optionally with an override merged over them
/// (`--deployment-defaults-override`, for hotfix images and upgrade tests).
pub fn release_defaults(override_json: Option<&Value>) -> Value {
    let mut d = defaults::deployment_defaults_json();
    if let Some(o) = override_json {
        merge(&mut d, o);
    }
    d
}

fn merge(target: &mut Value, over: &Value) {
    match (target, over) {
        (Value::Object(t), Value::Object(o)) => {
            for (k, v) in o {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (t, o) => *t = o.clone(),
    }
}

/// A merge patch keeps keys it does not mention: at every depth, a key of `current` the new defaults
/// do not have is set to null, so nothing of the old defaults (a pinned `image.digest`, a
/// `pullSecret`) outlives the upgrade.
fn clear_missing(current: &Value, new: &mut Value) {
    if let (Value::Object(cur), Value::Object(new)) = (current, new) {
        for (k, v) in cur {
            match new.get_mut(k) {
                Some(n) => clear_missing(v, n),
                None => {
                    new.insert(k.clone(), Value::Null);
                }
            }
        }
    }
}

/// Identifies a set of defaults: the release and a hash of the values.
pub fn defaults_id(defaults: &Value) -> String {
    format!(
        "{}-{}",
        defaults::RELEASE,
        crate::desired::hash_str(&defaults.to_string())
    )
}

/// The merge patch moving `spec.deployment` to `release` defaults, unless the CR already holds them.
pub fn release_patch(cr: &ConnectivityProxy, release: &Value) -> Option<Value> {
    let id = defaults_id(release);
    if cr
        .annotations()
        .get(cp_api::keys::DEFAULTS_RELEASE_ANNOTATION)
        == Some(&id)
    {
        return None;
    }
    let current = serde_json::to_value(&cr.spec.deployment).unwrap_or(Value::Null);
    let mut deployment = release.clone();
    clear_missing(&current, &mut deployment);
    Some(json!({
        "metadata": {"annotations": {cp_api::keys::DEFAULTS_RELEASE_ANNOTATION: id}},
        "spec": {"deployment": deployment},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_clears_nested_values_the_new_defaults_do_not_have() {
        let current = json!({"image": {"registry": "r", "tag": "1", "digest": "sha256:old", "pullSecret": "s"},
            "nodeSelector": {"a": "b"}, "replicaCount": 1});
        let mut new = json!({"image": {"registry": "r", "tag": "2"}, "replicaCount": 1});
        clear_missing(&current, &mut new);
        assert_eq!(
            new,
            json!({"image": {"registry": "r", "tag": "2", "digest": null, "pullSecret": null},
                "nodeSelector": null, "replicaCount": 1})
        );
    }
}
