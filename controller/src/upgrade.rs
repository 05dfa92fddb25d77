//! Operator upgrades: `spec.deployment` moves to this release's defaults where it still holds the
//! previous release's; a field someone changed stays (and the status names it).

use cp_api::{ConnectivityProxy, defaults};
use kube::ResourceExt;
use serde_json::Value;

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

/// What an upgrade makes of `spec.deployment`.
#[derive(Debug, PartialEq)]
pub struct Upgraded {
    /// The new `spec.deployment`.
    pub deployment: Value,
    /// The fields (`spec.deployment.…`) that keep a value someone set instead of the new default.
    pub kept: Vec<String>,
}

/// Field by field: a field that still holds the old release's default (or was never set) moves to the
/// new release's default (and goes when the new release has none); a field someone changed stays.
/// An absent field counts as never set.
/// Objects are compared key by key, everything else (lists too) as one value.
pub fn upgrade(current: &Value, old: &Value, new: &Value) -> Upgraded {
    let mut kept = Vec::new();
    let deployment = walk(
        present(current),
        present(old),
        present(new),
        "spec.deployment",
        &mut kept,
    )
    .unwrap_or_else(|| Value::Object(Default::default()));
    Upgraded { deployment, kept }
}

fn object(v: Option<&Value>) -> Option<&serde_json::Map<String, Value>> {
    v.and_then(Value::as_object)
}

fn present(v: &Value) -> Option<&Value> {
    (!v.is_null()).then_some(v)
}

fn walk(
    cur: Option<&Value>,
    old: Option<&Value>,
    new: Option<&Value>,
    path: &str,
    kept: &mut Vec<String>,
) -> Option<Value> {
    let all_objects = [cur, old, new]
        .iter()
        .all(|v| v.is_none() || object(*v).is_some());
    if all_objects && (object(cur).is_some() || object(new).is_some()) {
        let empty = serde_json::Map::new();
        let (c, o, n) = (
            object(cur).unwrap_or(&empty),
            object(old).unwrap_or(&empty),
            object(new).unwrap_or(&empty),
        );
        let keys: std::collections::BTreeSet<&String> =
            c.keys().chain(o.keys()).chain(n.keys()).collect();
        let mut out = serde_json::Map::new();
        for k in keys {
            if let Some(v) = walk(
                c.get(k).and_then(present),
                o.get(k).and_then(present),
                n.get(k).and_then(present),
                &format!("{path}.{k}"),
                kept,
            ) {
                out.insert(k.clone(), v);
            }
        }
        return (!out.is_empty() || cur.is_some() || new.is_some()).then_some(Value::Object(out));
    }
    // Never set (the webhook refills a removed field, so absent is never a choice) or untouched.
    if cur.is_none() || cur == old {
        new.cloned()
    } else {
        if cur != new {
            kept.push(path.to_string());
        }
        cur.cloned()
    }
}

/// The release defaults recorded on the CR (the values annotation), if any and readable.
fn recorded_defaults(cr: &ConnectivityProxy) -> Option<Value> {
    cr.annotations()
        .get(cp_api::keys::DEFAULTS_VALUES_ANNOTATION)
        .and_then(|s| serde_json::from_str(s).ok())
}

/// The defaults `spec.deployment` was last moved to: the values recorded on the CR; for a CR stamped
/// only with a release id (no values), the CR's own `spec.deployment` when its hash is that id's
/// (nothing changed since); otherwise this build's compiled defaults (a CR the webhook defaulted, or
/// one changed since an id-only stamp: a field that differs from them is kept).
fn previous_defaults(cr: &ConnectivityProxy, current: &Value) -> Value {
    if let Some(v) = recorded_defaults(cr) {
        return v;
    }
    let unchanged_since_stamp = cr
        .annotations()
        .get(cp_api::keys::DEFAULTS_RELEASE_ANNOTATION)
        .and_then(|id| id.rsplit_once('-'))
        .is_some_and(|(_, hash)| hash == crate::desired::hash_str(&current.to_string()));
    if unchanged_since_stamp {
        current.clone()
    } else {
        defaults::deployment_defaults_json()
    }
}

/// The `spec.deployment` fields holding a value other than the defaults recorded on the CR (the ones
/// an upgrade keeps), for the status.
pub fn kept_fields(cr: &ConnectivityProxy) -> Vec<String> {
    let Some(recorded) = recorded_defaults(cr) else {
        return Vec::new();
    };
    let current = serde_json::to_value(&cr.spec.deployment).unwrap_or(Value::Null);
    upgrade(&current, &recorded, &recorded).kept
}

/// The merge patch moving `spec.deployment` to `release` defaults field by field ([`upgrade`]) and
/// recording them, unless the CR already records them.
pub fn release_patch(cr: &ConnectivityProxy, release: &Value) -> Option<Value> {
    let id = defaults_id(release);
    let annotations = cr.annotations();
    if annotations.get(cp_api::keys::DEFAULTS_RELEASE_ANNOTATION) == Some(&id)
        && annotations.contains_key(cp_api::keys::DEFAULTS_VALUES_ANNOTATION)
    {
        return None;
    }
    let current = serde_json::to_value(&cr.spec.deployment).unwrap_or(Value::Null);
    let old = previous_defaults(cr, &current);
    let mut deployment = upgrade(&current, &old, release).deployment;
    clear_missing(&current, &mut deployment);
    let spec = serde_json::Map::from_iter([("deployment".to_string(), deployment)]);
    let patch = crate::writer::MergePatch::default()
        .annotation(cp_api::keys::DEFAULTS_RELEASE_ANNOTATION, Some(&id))
        .annotation(
            cp_api::keys::DEFAULTS_VALUES_ANNOTATION,
            Some(&release.to_string()),
        )
        .spec(Value::Object(spec));
    Some(crate::desired::body(&patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn untouched_defaults_move_and_a_field_someone_changed_stays() {
        let old = json!({"image": {"registry": "r", "tag": "1"}, "replicaCount": 1,
            "resources": {"maxFileDescriptorCount": 64000, "limits": {"cpu": "1"}}});
        let new = json!({"image": {"registry": "r", "tag": "2"}, "replicaCount": 1,
            "resources": {"maxFileDescriptorCount": 64000, "limits": {"cpu": "2"}}});
        // Untouched: all of it moves.
        assert_eq!(
            upgrade(&old, &old, &new),
            Upgraded {
                deployment: new.clone(),
                kept: vec![]
            }
        );
        // An SRE lowered the open files and pinned the CPU limit: both stay, the image moves.
        let mut sre = old.clone();
        sre["resources"]["maxFileDescriptorCount"] = json!(20000);
        sre["resources"]["limits"]["cpu"] = json!("1500m");
        let up = upgrade(&sre, &old, &new);
        assert_eq!(up.deployment["image"]["tag"], "2");
        assert_eq!(up.deployment["resources"]["maxFileDescriptorCount"], 20000);
        assert_eq!(up.deployment["resources"]["limits"]["cpu"], "1500m");
        assert_eq!(
            up.kept,
            vec![
                "spec.deployment.resources.limits.cpu",
                "spec.deployment.resources.maxFileDescriptorCount"
            ]
        );
        // A value someone set to what the new release defaults to is no conflict.
        let mut same = old.clone();
        same["image"]["tag"] = json!("2");
        assert_eq!(upgrade(&same, &old, &new).kept, Vec::<String>::new());
    }

    #[test]
    fn a_field_the_new_release_removes_goes_unless_someone_set_it() {
        let old = json!({"image": {"registry": "r", "tag": "1", "digest": "sha256:old"}, "priorityClassName": "p"});
        let new = json!({"image": {"registry": "r", "tag": "2"}});
        let up = upgrade(&old, &old, &new);
        assert_eq!(up.deployment, new);
        // A user-added key (no default ever) and a changed one the new release drops both stay.
        let mut cur = old.clone();
        cur["nodeSelector"] = json!({"pool": "edge"});
        cur["priorityClassName"] = json!("mine");
        let up = upgrade(&cur, &old, &new);
        assert_eq!(up.deployment["nodeSelector"], json!({"pool": "edge"}));
        assert_eq!(up.deployment["priorityClassName"], "mine");
        assert!(up.deployment["image"].get("digest").is_none());
        assert_eq!(
            up.kept,
            vec![
                "spec.deployment.nodeSelector.pool",
                "spec.deployment.priorityClassName"
            ]
        );
        // The merge patch clears what goes.
        let mut patch = up.deployment.clone();
        clear_missing(&cur, &mut patch);
        assert_eq!(patch["image"]["digest"], Value::Null);
    }

    fn cr_with(deployment: Value, annotations: Value) -> ConnectivityProxy {
        let mut cr = cp_api::testing::default_cr();
        cr.metadata.annotations = serde_json::from_value(annotations).expect("annotations");
        cr.spec.deployment = serde_json::from_value(deployment).expect("deployment");
        cr
    }

    #[test]
    fn the_patch_records_the_values_and_the_status_names_what_was_kept() {
        let compiled = defaults::deployment_defaults_json();
        let mut new = compiled.clone();
        new["image"]["tag"] = json!("9.9.9");
        // A CR the webhook defaulted, a privileged identity then lowered the open files.
        let mut d = compiled.clone();
        d["resources"]["maxFileDescriptorCount"] = json!(20000);
        let cr = cr_with(d.clone(), json!({}));
        let patch = release_patch(&cr, &new).expect("a patch");
        assert_eq!(patch["spec"]["deployment"]["image"]["tag"], "9.9.9");
        assert_eq!(
            patch["spec"]["deployment"]["resources"]["maxFileDescriptorCount"],
            20000
        );
        let recorded = patch["metadata"]["annotations"][cp_api::keys::DEFAULTS_VALUES_ANNOTATION]
            .as_str()
            .expect("values recorded");
        assert_eq!(serde_json::from_str::<Value>(recorded).expect("json"), new);
        // Applied: no second patch, and the status names the kept field.
        let mut after = patch["spec"]["deployment"].clone();
        after["resources"]["maxFileDescriptorCount"] = json!(20000);
        let stamped = cr_with(after, patch["metadata"]["annotations"].clone());
        assert_eq!(release_patch(&stamped, &new), None);
        assert_eq!(
            kept_fields(&stamped),
            vec!["spec.deployment.resources.maxFileDescriptorCount"]
        );
    }

    #[test]
    fn an_id_only_stamp_of_an_earlier_release_moves_what_is_unchanged_since() {
        let mut old = defaults::deployment_defaults_json();
        old["image"]["tag"] = json!("0.0.1");
        let id = format!("0.0.1-{}", crate::desired::hash_str(&old.to_string()));
        let cr = cr_with(
            old.clone(),
            json!({cp_api::keys::DEFAULTS_RELEASE_ANNOTATION: id}),
        );
        let new = defaults::deployment_defaults_json();
        let patch = release_patch(&cr, &new).expect("a patch");
        assert_eq!(
            patch["spec"]["deployment"]["image"]["tag"],
            new["image"]["tag"]
        );
    }

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
