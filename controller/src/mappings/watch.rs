//! The ServiceMapping watch: each event becomes a change of the [`MappingState`], and a batch of
//! events that changed something wakes every CR once (the echoes of the controller's own writes to the
//! mappings, labels and endpoints, wake nobody).

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use cp_api::{ConnectivityProxy, ServiceMapping};
use futures::{SinkExt, StreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::MappingState;
use crate::cache::Trigger;

/// How many events that arrived together are taken in before the CRs are woken.
const BATCH: usize = 512;

/// Keeps `state` up to date from the watch of every ServiceMapping, setting `synced` once the first
/// listing is in, and waking every CR of `proxies` through `trigger` after each batch of events that
/// changed a record. Runs until the trigger's receiver is gone.
pub async fn run(
    api: Api<ServiceMapping>,
    state: Arc<RwLock<MappingState>>,
    synced: tokio::sync::watch::Sender<bool>,
    mut trigger: Trigger,
    proxies: Store<ConnectivityProxy>,
    changes: prometheus::IntCounter,
) {
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut batches = std::pin::pin!(events.ready_chunks(BATCH));
    // The names a (re)listing delivered: those it did not deliver were deleted meanwhile.
    let mut listed: Option<HashSet<String>> = None;
    while let Some(batch) = batches.next().await {
        let (mut changed, mut wakes) = (0, false);
        {
            let mut state = state
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for event in batch {
                let change = match event {
                    Ok(watcher::Event::Apply(m)) => state.apply(&m),
                    Ok(watcher::Event::Delete(m)) => state.delete(&m.name_any()),
                    Ok(watcher::Event::Init) => {
                        listed = Some(HashSet::new());
                        continue;
                    }
                    Ok(watcher::Event::InitApply(m)) => {
                        if let Some(l) = listed.as_mut() {
                            l.insert(m.name_any());
                        }
                        state.apply(&m)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let seen = listed.take().unwrap_or_default();
                        let mut change = state.remove_unlisted(&seen);
                        synced.send_replace(true);
                        // A listing wakes every CR even when nothing changed: the first one decides.
                        change.wakes = true;
                        change
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "ServiceMapping watch");
                        continue;
                    }
                };
                changed += change.records;
                // The echo of the controller's own label or endpoint write changes a record but
                // wakes nobody.
                wakes |= change.wakes;
            }
        }
        changes.inc_by(changed as u64);
        if !wakes {
            continue;
        }
        let crs: Vec<ObjectRef<ConnectivityProxy>> = proxies
            .state()
            .iter()
            .map(|c| ObjectRef::from_obj(&**c))
            .collect();
        for cr in crs {
            if trigger.send(cr).await.is_err() {
                return;
            }
        }
    }
}
