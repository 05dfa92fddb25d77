//! Why the proxy's pods do not become ready, read from their status while the StatefulSet is not ready,
//! so the CR names the cause and the fix instead of only "0/1 replicas ready".

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// The proxy's pods that have not been told of the mapping shards written as `written` (their
/// [`cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION`]): the running or starting pods of its StatefulSet, not
/// those being deleted.
pub fn to_refresh<'a>(pods: &'a [Pod], written: &str) -> Vec<&'a str> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION))
                .map(String::as_str)
                != Some(written)
        })
        .filter_map(|p| p.metadata.name.as_deref())
        .filter(|n| {
            n.strip_prefix(cp_api::writes::PROXY_POD_PREFIX)
                .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

/// Sets [`cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION`] to `written` on the proxy's pods in `ns`: an
/// update of the pod, on which the kubelet syncs it and refreshes its ConfigMap volumes (the mapping
/// shards) at once instead of at its next periodic sync. Best effort: a failure is logged, and the
/// kubelet's periodic sync still brings the files within its period. Returns the pods patched.
pub async fn refresh_mapping_files(
    writer: &crate::writer::Writer,
    ns: &str,
    written: &str,
) -> usize {
    let api = kube::Api::<Pod>::namespaced(writer.client().clone(), ns);
    // From the API server's watch cache, as the diagnosis reads them: a pod a few milliseconds old
    // is as good, and a consistent list would wait for the cache to catch up.
    let params = kube::api::ListParams::default()
        .labels(&format!(
            "{}={}",
            cp_api::names::APP_LABEL,
            crate::desired::APP
        ))
        .match_any();
    let pods = match api.list(&params).await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!(error = %e, "listing the proxy's pods to refresh their mapping files");
            return 0;
        }
    };
    let patch = serde_json::json!({"metadata": {"annotations": {
        cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION: written}}});
    let mut patched = 0;
    for name in to_refresh(&pods, written) {
        let r = writer
            .write(
                &api,
                name,
                &kube::api::Patch::Merge(&patch),
                "a ServiceMapping shard changed: the kubelet refreshes the pod's mapping files",
            )
            .await;
        match r {
            Ok(_) => patched += 1,
            Err(e) => {
                tracing::warn!(pod = name, error = %e, "refreshing the proxy's mapping files")
            }
        }
    }
    patched
}

/// Waiting reasons that do not resolve by themselves.
const STUCK: [&str; 6] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "InvalidImageName",
];

/// The first pod problem found, as a message naming the pod, the container and the fix where one is
/// known; `None` when the pods are merely starting. `fd_limit` is the open-files limit the init
/// container asks for (`spec.deployment.resources.maxFileDescriptorCount`).
pub fn problem(pods: &[Pod], fd_limit: i64) -> Option<String> {
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap_or("?");
        let Some(status) = pod.status.as_ref() else {
            continue;
        };
        let init = status.init_container_statuses.iter().flatten();
        let main = status.container_statuses.iter().flatten();
        for (c, is_init) in init.map(|c| (c, true)).chain(main.map(|c| (c, false))) {
            if let Some(m) = container_problem(name, c, is_init, fd_limit) {
                return Some(m);
            }
        }
        if let Some(cond) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        {
            return Some(format!(
                "pod {name} cannot be scheduled: {}",
                cond.message.as_deref().unwrap_or("no reason given")
            ));
        }
    }
    None
}

fn container_problem(
    pod: &str,
    c: &ContainerStatus,
    is_init: bool,
    fd_limit: i64,
) -> Option<String> {
    let kind = if is_init {
        "init container"
    } else {
        "container"
    };
    let failed_exit = |s: &k8s_openapi::api::core::v1::ContainerState| {
        s.terminated
            .as_ref()
            .filter(|t| t.exit_code != 0)
            .map(|t| (t.exit_code, t.message.clone().unwrap_or_default()))
    };
    let waiting = c
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .filter(|r| STUCK.contains(r));
    let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
    let succeeded = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0);
    // A failed run: the current state (an init container that just failed) or the last one (a
    // container in back-off, or one that crashed at least twice and is not ready in between). An init
    // container that succeeded since, or a container that recovered, is not a problem.
    let last_failed = c.last_state.as_ref().and_then(failed_exit);
    let exit = c
        .state
        .as_ref()
        .and_then(failed_exit)
        .or(if succeeded { None } else { last_failed })
        .filter(|_| {
            (is_init && !running)
                || waiting.is_some()
                || (running && !c.ready && c.restart_count >= 2)
        });
    if is_init
        && c.name == "init-fd-limit"
        && let Some((code, _)) = &exit
    {
        return Some(format!(
            "pod {pod}: init container init-fd-limit failed (exit {code}): the node does not allow {fd_limit} \
             open files (spec.deployment.resources.maxFileDescriptorCount); raise the nodes' limit \
             (containerd's LimitNOFILE) or lower the field (an identity named in ConfigMap \
             kyma-system/connectivity-proxy-operator-config may)"
        ));
    }
    match (waiting, exit) {
        (
            Some(
                reason @ ("ImagePullBackOff" | "ErrImagePull" | "ErrImageNeverPull"
                | "InvalidImageName"),
            ),
            _,
        ) => Some(format!(
            "pod {pod}: {kind} {} cannot get its image {} ({reason}); check spec.deployment's image \
                 and its pull secret",
            c.name, c.image
        )),
        (reason, Some((code, message))) => Some(format!(
            "pod {pod}: {kind} {} failed (exit {code}{}){}",
            c.name,
            reason.map(|r| format!(", {r}")).unwrap_or_default(),
            if message.is_empty() {
                String::new()
            } else {
                format!(": {}", message.trim())
            }
        )),
        (Some(reason), None) => Some(format!("pod {pod}: {kind} {} is in {reason}", c.name)),
        (None, None) => None,
    }
}

/// Why the proxy's StatefulSet is not ready.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The StatefulSet controller has not seen the current spec.
    #[error("StatefulSet generation {generation} not yet observed (observed {observed})")]
    NotObserved {
        /// The current generation.
        generation: i64,
        /// The one observed.
        observed: i64,
    },
    /// Replicas are missing or not updated.
    #[error("{ready}/{want} replicas ready, {updated}/{want} updated")]
    Replicas {
        /// Ready.
        ready: i32,
        /// Wanted.
        want: i32,
        /// Updated.
        updated: i32,
    },
    /// This reconcile wrote a new spec.
    #[error("the StatefulSet's new spec is being rolled out")]
    RollingOut,
    /// No StatefulSet yet.
    #[error("StatefulSet connectivity-proxy does not exist yet")]
    Absent,
}

/// Ready when the controller observed the current spec and every replica is updated and ready.
pub fn statefulset_ready(
    sts: &k8s_openapi::api::apps::v1::StatefulSet,
) -> Result<String, NotReady> {
    let want = sts.spec.replicas.unwrap_or(1);
    let status = sts.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0);
    let generation = sts.metadata.generation.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    if observed < generation {
        return Err(NotReady::NotObserved {
            generation,
            observed,
        });
    }
    if ready < want || updated < want {
        return Err(NotReady::Replicas {
            ready,
            want,
            updated,
        });
    }
    Ok(format!("{ready}/{want} replicas ready"))
}

#[cfg(test)]
mod tests {
    use super::problem;
    const FD: i64 = cp_api::defaults::MAX_FILE_DESCRIPTORS;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    #[test]
    fn only_the_statefulsets_live_pods_not_yet_told_are_refreshed() {
        let key = cp_api::keys::MAPPINGS_WRITTEN_ANNOTATION;
        let pods: Vec<Pod> = [
            json!({"name": "connectivity-proxy-0"}),
            json!({"name": "connectivity-proxy-1", "annotations": {key: "h2"}}),
            json!({"name": "connectivity-proxy-2", "annotations": {key: "h1"}}),
            json!({"name": "connectivity-proxy-3", "deletionTimestamp": "2026-12-07T00:00:00Z"}),
            json!({"name": "connectivity-proxy-x"}),
            json!({"name": "connectivity-proxy-"}),
            json!({"name": "other-0"}),
        ]
        .into_iter()
        .map(|m| serde_json::from_value(json!({"metadata": m})).expect("pod"))
        .collect();
        assert_eq!(
            super::to_refresh(&pods, "h2"),
            ["connectivity-proxy-0", "connectivity-proxy-2"]
        );
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "connectivity-proxy-0"}, "status": status}),
        )
        .expect("pod")
    }

    #[test]
    fn starting_pods_are_not_a_problem() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "init-fd-limit", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "PodInitializing"}}}]}));
        assert_eq!(problem(&[p], FD), None);
        assert_eq!(problem(&[], FD), None);
    }

    #[test]
    fn a_failing_fd_limit_names_the_field_and_the_fix() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "init-fd-limit", "image": "busybox", "imageID": "", "ready": false, "restartCount": 2,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        let m = problem(&[p], FD).expect("a problem");
        assert!(m.contains("init-fd-limit failed (exit 1)"), "{m}");
        assert!(m.contains(&FD.to_string()), "{m}");
        assert!(
            m.contains("spec.deployment.resources.maxFileDescriptorCount"),
            "{m}"
        );
        assert!(m.contains("connectivity-proxy-operator-config"), "{m}");
    }

    #[test]
    fn image_pull_and_crash_loops_are_named() {
        let pull = pod(json!({"containerStatuses": [
            {"name": "connectivity-proxy", "image": "example.org/cp:1", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}));
        let m = problem(&[pull], FD).expect("a problem");
        assert!(
            m.contains("example.org/cp:1") && m.contains("ImagePullBackOff"),
            "{m}"
        );
        let crash = pod(json!({"containerStatuses": [
            {"name": "connectivity-proxy", "image": "cp", "imageID": "", "ready": false, "restartCount": 4,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}));
        let m = problem(&[crash], FD).expect("a problem");
        assert!(
            m.contains("exit 137") && m.contains("CrashLoopBackOff"),
            "{m}"
        );
        // A restart that is running again is not a problem.
        let recovered = pod(json!({"containerStatuses": [
            {"name": "connectivity-proxy", "image": "cp", "imageID": "", "ready": false, "restartCount": 1,
             "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137}}}]}));
        assert_eq!(problem(&[recovered], FD), None);
        // Between back-offs of a crash loop (running, not ready, restarted twice) it still is.
        let looping = pod(json!({"containerStatuses": [
            {"name": "connectivity-proxy", "image": "cp", "imageID": "", "ready": false, "restartCount": 3,
             "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 1}}}]}));
        assert!(problem(&[looping], FD).is_some_and(|m| m.contains("exit 1")));
    }

    #[test]
    fn an_init_container_that_succeeded_since_is_not_a_problem() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "init-fd-limit", "image": "busybox", "imageID": "", "ready": true, "restartCount": 1,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
            "containerStatuses": [
            {"name": "connectivity-proxy", "image": "cp", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"running": {}}}]}));
        assert_eq!(problem(&[p], FD), None);
    }

    #[test]
    fn unschedulable_pods_say_why() {
        let p = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient memory."}]}),
        );
        let m = problem(&[p], FD).expect("a problem");
        assert!(m.contains("Insufficient memory"), "{m}");
    }
}
