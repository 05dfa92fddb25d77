//! Who may change `spec.deployment`, read live: the operator's ServiceAccount and the flags, plus the
//! identities in the ConfigMap `connectivity-proxy-operator-config` (keys `privilegedUsers`,
//! `privilegedGroups`, comma-separated), watched, so a change takes effect within seconds and without a
//! restart (a removed identity loses the right as quickly as an added one gains it).

use std::sync::{Arc, RwLock};

use cp_api::policy::PrivilegedIdentities;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::admission::Policy;

/// The ConfigMap keys.
pub const USERS_KEY: &str = "privilegedUsers";
/// The ConfigMap keys.
pub const GROUPS_KEY: &str = "privilegedGroups";

/// The policy in force: fixed identities plus the watched ConfigMap's.
pub struct LivePolicy {
    base: PrivilegedIdentities,
    current: RwLock<Arc<Policy>>,
}

impl LivePolicy {
    /// A policy of the fixed identities only (until a ConfigMap is seen).
    pub fn new(base: PrivilegedIdentities) -> Self {
        let current = RwLock::new(Arc::new(Policy {
            privileged: base.clone(),
        }));
        Self { base, current }
    }

    /// The policy for one request.
    pub fn current(&self) -> Arc<Policy> {
        match self.current.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Recomputes the policy from the ConfigMap (`None`: deleted or absent); returns the new policy.
    pub fn update(&self, cm: Option<&ConfigMap>) -> Arc<Policy> {
        let next = Arc::new(Policy {
            privileged: merged(&self.base, cm),
        });
        match self.current.write() {
            Ok(mut p) => *p = next.clone(),
            Err(poisoned) => *poisoned.into_inner() = next.clone(),
        }
        next
    }
}

/// The fixed identities plus the ConfigMap's (comma-separated, blanks ignored, no duplicates).
pub fn merged(base: &PrivilegedIdentities, cm: Option<&ConfigMap>) -> PrivilegedIdentities {
    let data = cm.and_then(|c| c.data.as_ref());
    let list = |key: &str, fixed: &[String]| {
        let mut out: Vec<String> = fixed.to_vec();
        for v in data
            .and_then(|d| d.get(key))
            .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()))
            .into_iter()
            .flatten()
        {
            if !out.iter().any(|o| o == v) {
                out.push(v.to_string());
            }
        }
        out
    };
    PrivilegedIdentities {
        users: list(USERS_KEY, &base.users),
        groups: list(GROUPS_KEY, &base.groups),
    }
}

/// Watches ConfigMap `namespace/name` and keeps `live` current; returns the store (for readiness).
pub fn watch(
    client: Client,
    namespace: &str,
    name: &str,
    live: Arc<LivePolicy>,
) -> Store<ConfigMap> {
    let (store, writer) = reflector::store::<ConfigMap>();
    let stream = reflector::reflector(
        writer,
        watcher(
            Api::<ConfigMap>::namespaced(client, namespace),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        ),
    )
    .default_backoff();
    let reader = store.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    let cm = reader.state().into_iter().next();
                    let before = live.current().privileged.describe();
                    let after = live.update(cm.as_deref()).privileged.describe();
                    if before != after {
                        tracing::info!(who = %after, "identities that may change spec.deployment changed");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching the privileged identities ConfigMap")
                }
            }
        }
    });
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(users: &str, groups: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "c"},
            "data": {USERS_KEY: users, GROUPS_KEY: groups}}))
        .expect("cm")
    }

    #[test]
    fn the_configmap_adds_to_the_fixed_identities_and_removing_it_revokes() {
        let base = PrivilegedIdentities {
            users: vec!["system:serviceaccount:kyma-system:connectivity-proxy-controller".into()],
            groups: vec![],
        };
        let live = LivePolicy::new(base.clone());
        let carol = |p: &Policy| p.privileged.allows("carol", &[]);
        assert!(!carol(&live.current()));
        live.update(Some(&cm(" carol, ,dave,carol", "sre")));
        let p = live.current();
        assert!(carol(&p) && p.privileged.allows("x", &["sre".into()]));
        assert_eq!(p.privileged.users.len(), 3, "{:?}", p.privileged.users);
        live.update(Some(&cm("", "")));
        assert!(!carol(&live.current()));
        live.update(None);
        assert_eq!(live.current().privileged.users, base.users);
    }
}
