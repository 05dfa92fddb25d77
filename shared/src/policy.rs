//! The protected-field policy: `spec.deployment` belongs to the operator.

use serde_json::Value;

/// JSON path prefix of the protected section.
pub const PROTECTED_ROOT: &str = "spec.deployment";

/// Field paths (dotted, `spec.deployment...`) whose value differs between `old` and `new`.
/// Both arguments are the `spec.deployment` values (or `Null` when absent). Paths are sorted and
/// name the deepest differing field, so a message can list exactly what was changed.
pub fn changed_paths(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff(PROTECTED_ROOT, old, new, &mut out);
    out.sort();
    out
}

fn diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let av = a.get(k).unwrap_or(&Value::Null);
                let bv = b.get(k).unwrap_or(&Value::Null);
                diff(&format!("{path}.{k}"), av, bv, out);
            }
        }
        _ => out.push(path.to_string()),
    }
}

/// Who may change protected fields: the operator's ServiceAccount and configured identities.
#[derive(Clone, Debug, Default)]
pub struct PrivilegedIdentities {
    /// Usernames, e.g. `system:serviceaccount:kyma-system:connectivity-proxy-controller`.
    pub users: Vec<String>,
    /// Groups, e.g. `system:masters`.
    pub groups: Vec<String>,
}

impl PrivilegedIdentities {
    /// Whether `user` (with `groups`) may change protected fields.
    pub fn allows(&self, user: &str, groups: &[String]) -> bool {
        self.users.iter().any(|u| u == user) || groups.iter().any(|g| self.groups.contains(g))
    }

    /// A human-readable list for denial messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.users.iter().map(|u| format!("user {u}")).collect();
        parts.extend(self.groups.iter().map(|g| format!("group {g}")));
        if parts.is_empty() {
            "nobody".into()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_every_changed_leaf() {
        let old = json!({"replicaCount": 1, "image": {"tag": "1", "registry": "r"}});
        let new = json!({"replicaCount": 2, "image": {"tag": "2", "registry": "r"}, "nodeSelector": {"a": "b"}});
        assert_eq!(
            changed_paths(&old, &new),
            vec![
                "spec.deployment.image.tag",
                "spec.deployment.nodeSelector",
                "spec.deployment.replicaCount"
            ]
        );
        assert!(changed_paths(&old, &old).is_empty());
    }

    #[test]
    fn privileged_by_user_or_group() {
        let p = PrivilegedIdentities {
            users: vec!["op".into()],
            groups: vec!["admins".into()],
        };
        assert!(p.allows("op", &[]));
        assert!(p.allows("x", &["admins".into()]));
        assert!(!p.allows("x", &["devs".into()]));
    }
}
