//! Watch-backed caches of ServiceMappings and ConnectivityProxies: admission reads them, never LISTs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cp_api::{ConnectivityProxy, ServiceMapping};
use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::admission::Facts;
use crate::index::{IndexWriter, SharedIndex};

/// Reflector stores with a readiness flag.
#[derive(Clone)]
pub struct Caches {
    mappings: SharedIndex,
    proxies: Store<ConnectivityProxy>,
    synced: Arc<AtomicBool>,
}

impl Caches {
    /// Starts the reflectors on the current runtime; `extra` (the privileged-identities ConfigMap) must
    /// also have its first listing before the caches count as ready.
    pub fn start(
        client: Client,
        extra: Option<Store<k8s_openapi::api::core::v1::ConfigMap>>,
    ) -> Self {
        let (proxies, pw) = reflector::store::<ConnectivityProxy>();
        // Mappings are kept only as the uniqueness index the watch updates (no list to copy per request).
        let mappings = SharedIndex::default();
        let (listed, mut mappings_listed) = tokio::sync::watch::channel(false);
        let mut writer = IndexWriter::new(mappings.clone());
        let m_stream = watcher(
            Api::<ServiceMapping>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(move |event| {
            if let Ok(e) = &event
                && writer.apply(e)
            {
                listed.send_replace(true);
            }
            event.map(|_| ())
        });
        let p_stream = reflector::reflector(
            pw,
            watcher(
                Api::<ConnectivityProxy>::all(client),
                watcher::Config::default(),
            )
            .modify(|p| cp_api::slim_for_cache(&mut p.metadata)),
        )
        .default_backoff()
        .touched_objects();
        tokio::spawn(drain(m_stream.boxed(), "ServiceMapping"));
        tokio::spawn(drain(p_stream.boxed(), "ConnectivityProxy"));
        let synced = Arc::new(AtomicBool::new(false));
        let (p, s) = (proxies.clone(), synced.clone());
        tokio::spawn(async move {
            let _ = p.wait_until_ready().await;
            // The first complete mapping listing swapped into the index.
            let _ = mappings_listed.wait_for(|listed| *listed).await;
            if let Some(e) = extra {
                let _ = e.wait_until_ready().await;
            }
            s.store(true, Ordering::SeqCst);
            tracing::info!("caches synced");
        });
        Self {
            mappings,
            proxies,
            synced,
        }
    }

    /// Whether both caches have their initial list.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// The facts admission needs, from the caches.
    pub fn facts(&self) -> Facts {
        Facts {
            service_mappings: self.mappings.clone(),
            shared_tenant: self
                .proxies
                .state()
                .iter()
                .any(|p| p.spec.tenant_mode() == "shared"),
        }
    }
}

async fn drain<S, T, E>(mut stream: S, kind: &'static str)
where
    S: futures::Stream<Item = Result<T, E>> + Unpin,
    E: std::fmt::Display,
{
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            tracing::warn!(kind, error = %e, "watch error; retrying with backoff");
        }
    }
}
