//! Moments from watch events: the bench's own watches, never polling with sleeps. A value derived
//! from a watch carries the arrival time of the event that changed it.

use std::collections::HashSet;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// The latest value derived from a watch, with the moment its event arrived. The watch stops when
/// this is dropped.
pub struct Watched<T> {
    pub rx: watch::Receiver<(Instant, T)>,
    task: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Folds the events of a watch into `state`; whenever `step` yields a value that differs from the
/// last one, publishes it with the arrival time of its event.
pub fn watch_fold<K, S, T, F>(
    api: Api<K>,
    cfg: watcher::Config,
    mut state: S,
    initial: T,
    mut step: F,
) -> Watched<T>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Send + 'static,
    T: PartialEq + Send + Sync + 'static,
    F: FnMut(&mut S, watcher::Event<K>) -> Option<T> + Send + 'static,
{
    let (tx, rx) = watch::channel((Instant::now(), initial));
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let Ok(event) = event else { continue };
            if let Some(v) = step(&mut state, event) {
                tx.send_if_modified(|cur| {
                    if cur.1 == v {
                        false
                    } else {
                        *cur = (at, v);
                        true
                    }
                });
            }
        }
    });
    Watched { rx, task }
}

/// `f` of one named object (`None` while it does not exist).
pub fn watch_one<K, T>(
    api: Api<K>,
    name: &str,
    f: impl Fn(&K) -> T + Send + 'static,
) -> Watched<Option<T>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watch_fold(api, cfg, (), None, move |_, event| match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some(Some(f(&o))),
        watcher::Event::Delete(_) => Some(None),
        _ => None,
    })
}

/// How many objects satisfy `pred` right now.
pub fn watch_count<K>(api: Api<K>, pred: impl Fn(&K) -> bool + Send + 'static) -> Watched<usize>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watch_fold(
        api,
        watcher::Config::default(),
        HashSet::<String>::new(),
        0,
        move |set, event| {
            match event {
                watcher::Event::Init => set.clear(),
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    if pred(&o) {
                        set.insert(o.name_any());
                    } else {
                        set.remove(&o.name_any());
                    }
                }
                watcher::Event::Delete(o) => {
                    set.remove(&o.name_any());
                }
                watcher::Event::InitDone => {}
            }
            Some(set.len())
        },
    )
}

/// Waits until the watched value satisfies `pred`; returns it with the arrival time of its event.
pub async fn wait_until<T: Clone + Debug>(
    w: &mut Watched<T>,
    what: &str,
    timeout: Duration,
    mut pred: impl FnMut(&T) -> bool,
) -> anyhow::Result<(Instant, T)> {
    let seen = tokio::time::timeout(timeout, w.rx.wait_for(|(_, v)| pred(v)))
        .await
        .map(|r| r.map(|seen| seen.clone()));
    match seen {
        Ok(Ok(seen)) => Ok(seen),
        Ok(Err(_)) => bail!("the watch for {what} ended"),
        Err(_) => bail!(
            "timed out after {timeout:?} waiting for {what}; last seen: {:?}",
            w.rx.borrow().1
        ),
    }
}
