//! Who may change `spec.deployment`, read live: the operator's ServiceAccount and the flags, plus the
//! identities in the ConfigMap `connectivity-proxy-operator-config` (keys `privilegedUsers`,
//! `privilegedGroups`, comma-separated), watched, so a change takes effect within seconds and without a
//! restart (a removed identity loses the right as quickly as an added one gains it).
//!
//! Identities every user, every ServiceAccount or every node is part of are refused there ([`broad`]):
//! not added, with a warning log line naming each and `cp_webhook_privileged_identities_refused`
//! counting them, so one careless entry cannot hand `spec.deployment` to the whole cluster.
//! `system:masters` stays allowed: its members bypass RBAC and could rewrite the webhook anyway.

use std::sync::{Arc, RwLock};

use cp_api::policy::PrivilegedIdentities;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::admission::Policy;
use crate::metrics::Metrics;

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

    /// Recomputes the policy from the ConfigMap (`None`: deleted or absent); returns what it refused.
    pub fn update(&self, cm: Option<&ConfigMap>) -> Vec<Refused> {
        let (privileged, refused) = merged(&self.base, cm);
        let next = Arc::new(Policy { privileged });
        match self.current.write() {
            Ok(mut p) => *p = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        refused
    }
}

/// An identity of the ConfigMap that was not added, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The ConfigMap key it was listed under.
    pub key: &'static str,
    /// The user or group.
    pub identity: String,
    /// Why it is refused.
    pub why: &'static str,
}

/// Why `identity` (a user with `group == false`) is too broad to be privileged, if it is: it names
/// every user, every unauthenticated request, every ServiceAccount (of the cluster or of a namespace),
/// every node or every bootstrap token.
pub fn broad(identity: &str, group: bool) -> Option<&'static str> {
    if !group {
        return (identity == "system:anonymous")
            .then_some("every unauthenticated request is made as system:anonymous");
    }
    match identity {
        "system:authenticated" => Some("every authenticated user is in system:authenticated"),
        "system:unauthenticated" => {
            Some("every unauthenticated request is in system:unauthenticated")
        }
        "system:serviceaccounts" => Some("every ServiceAccount is in system:serviceaccounts"),
        "system:nodes" => Some("every node's kubelet is in system:nodes"),
        g if g.starts_with("system:serviceaccounts:") => Some(
            "every ServiceAccount of that namespace is in it, including ones any editor there can create",
        ),
        g if g == "system:bootstrappers" || g.starts_with("system:bootstrappers:") => {
            Some("every bootstrap token is in system:bootstrappers")
        }
        _ => None,
    }
}

/// The fixed identities plus the ConfigMap's (comma-separated, blanks ignored, no duplicates), and
/// the ConfigMap's identities refused as too broad ([`broad`]).
pub fn merged(
    base: &PrivilegedIdentities,
    cm: Option<&ConfigMap>,
) -> (PrivilegedIdentities, Vec<Refused>) {
    let data = cm.and_then(|c| c.data.as_ref());
    let mut refused = Vec::new();
    let mut list = |key: &'static str, fixed: &[String], group: bool| {
        let mut out: Vec<String> = fixed.to_vec();
        for v in data
            .and_then(|d| d.get(key))
            .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()))
            .into_iter()
            .flatten()
        {
            if let Some(why) = broad(v, group) {
                if !refused.iter().any(|r: &Refused| r.identity == v) {
                    refused.push(Refused {
                        key,
                        identity: v.to_string(),
                        why,
                    });
                }
            } else if !out.iter().any(|o| o == v) {
                out.push(v.to_string());
            }
        }
        out
    };
    let users = list(USERS_KEY, &base.users, false);
    let groups = list(GROUPS_KEY, &base.groups, true);
    (PrivilegedIdentities { users, groups }, refused)
}

/// Watches ConfigMap `namespace/name` and keeps `live` current; returns the store (for readiness).
pub fn watch(
    client: Client,
    namespace: &str,
    name: &str,
    live: Arc<LivePolicy>,
    metrics: Arc<Metrics>,
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
    let (namespace, name) = (namespace.to_string(), name.to_string());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut reported: Option<Vec<Refused>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    let cm = reader.state().into_iter().next();
                    let before = live.current().privileged.describe();
                    let refused = live.update(cm.as_deref());
                    let after = live.current().privileged.describe();
                    if before != after {
                        tracing::info!(who = %after, "identities that may change spec.deployment changed");
                    }
                    // Every watch event re-reads the ConfigMap: warn when what is refused changes.
                    if reported.as_ref() != Some(&refused) {
                        report_refused(&metrics, namespace.as_str(), name.as_str(), &refused);
                        reported = Some(refused);
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

/// Sets the refused-identities gauge and logs each refused identity.
fn report_refused(metrics: &Metrics, namespace: &str, name: &str, refused: &[Refused]) {
    metrics
        .privileged_refused
        .set(i64::try_from(refused.len()).unwrap_or(i64::MAX));
    for r in refused {
        tracing::warn!(
            configmap = %format!("{namespace}/{name}"),
            key = r.key,
            identity = %r.identity,
            why = r.why,
            "identity refused as privileged: it is too broad; name a narrower group or the users themselves"
        );
    }
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

    #[test]
    fn broad_groups_and_anonymous_in_the_configmap_are_refused_and_named() {
        let base = PrivilegedIdentities {
            users: vec!["op".into()],
            groups: vec!["system:masters".into()],
        };
        let live = LivePolicy::new(base);
        let refused = live.update(Some(&cm(
            "carol, system:anonymous",
            "sre, system:authenticated, system:unauthenticated, system:serviceaccounts, \
             system:serviceaccounts:team-a, system:nodes, system:masters",
        )));
        let p = live.current();
        assert_eq!(p.privileged.users, vec!["op", "carol"]);
        assert_eq!(p.privileged.groups, vec!["system:masters", "sre"]);
        // Every authenticated user is in system:authenticated: still refused.
        assert!(
            !p.privileged
                .allows("alice", &["system:authenticated".into()])
        );
        assert!(!p.privileged.allows(
            "system:serviceaccount:team-a:default",
            &[
                "system:serviceaccounts".into(),
                "system:serviceaccounts:team-a".into()
            ]
        ));
        let named: Vec<&str> = refused.iter().map(|r| r.identity.as_str()).collect();
        assert_eq!(
            named,
            vec![
                "system:anonymous",
                "system:authenticated",
                "system:unauthenticated",
                "system:serviceaccounts",
                "system:serviceaccounts:team-a",
                "system:nodes",
            ]
        );
        assert!(refused.iter().all(|r| !r.why.is_empty()));
    }
}
