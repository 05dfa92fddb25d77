//! Watch-backed caches of ServiceMappings and ConnectivityProxies: admission reads them, never LISTs.
//!
//! Only what a rule reads is kept: the mappings' uniqueness index, and of each ConnectivityProxy in
//! `kyma-system` its name and whether it runs in shared tenant mode. A CR in another namespace is
//! admitted (with a warning) but never watched, kept or used: another namespace's editor can neither
//! fill the webhook's memory nor change the ServiceMapping rules.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use cp_api::{ConnectivityProxy, ServiceMapping, names};
use futures::StreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::admission::ClusterView;
use crate::index::{IndexWriter, SharedIndex};

/// Reflector stores with a readiness flag.
#[derive(Clone)]
pub struct Caches {
    mappings: SharedIndex,
    shared_tenant: SharedTenants,
    synced: Arc<AtomicBool>,
}

/// The names of the ConnectivityProxies in `kyma-system` that run in shared tenant mode.
#[derive(Clone, Debug, Default)]
pub struct SharedTenants(Arc<RwLock<BTreeSet<String>>>);

impl SharedTenants {
    /// Records one watch event; returns true when the initial listing is complete.
    pub fn apply(
        &self,
        event: &watcher::Event<ConnectivityProxy>,
        init: &mut BTreeSet<String>,
    ) -> bool {
        let shared = |p: &ConnectivityProxy| p.spec.tenant_mode() == "shared";
        let mut set = match self.0.write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        match event {
            watcher::Event::Apply(p) if shared(p) => {
                set.insert(p.name_any());
            }
            watcher::Event::Apply(p) | watcher::Event::Delete(p) => {
                set.remove(&p.name_any());
            }
            watcher::Event::Init => init.clear(),
            watcher::Event::InitApply(p) if shared(p) => {
                init.insert(p.name_any());
            }
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                *set = std::mem::take(init);
                return true;
            }
        }
        false
    }

    /// Whether any of them runs in shared tenant mode.
    pub fn any(&self) -> bool {
        match self.0.read() {
            Ok(s) => !s.is_empty(),
            Err(poisoned) => !poisoned.into_inner().is_empty(),
        }
    }
}

impl Caches {
    /// Starts the reflectors on the current runtime; `extra` (the privileged-identities ConfigMap) must
    /// also have its first listing before the caches count as ready.
    pub fn start(
        client: Client,
        extra: Option<Store<k8s_openapi::api::core::v1::ConfigMap>>,
    ) -> Self {
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
        let shared_tenant = SharedTenants::default();
        let (p_listed, mut proxies_listed) = tokio::sync::watch::channel(false);
        let tenants = shared_tenant.clone();
        let mut init = BTreeSet::new();
        let p_stream = watcher(
            Api::<ConnectivityProxy>::namespaced(client, names::KYMA_SYSTEM),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(move |event| {
            if let Ok(e) = &event
                && tenants.apply(e, &mut init)
            {
                p_listed.send_replace(true);
            }
            event.map(|_| ())
        });
        tokio::spawn(drain(m_stream.boxed(), "ServiceMapping"));
        tokio::spawn(drain(p_stream.boxed(), "ConnectivityProxy"));
        let synced = Arc::new(AtomicBool::new(false));
        let s = synced.clone();
        tokio::spawn(async move {
            let _ = proxies_listed.wait_for(|listed| *listed).await;
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
            shared_tenant,
            synced,
        }
    }

    /// Whether both caches have their initial list.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// The facts admission needs, from the caches.
    pub fn facts(&self) -> ClusterView {
        ClusterView {
            service_mappings: self.mappings.clone(),
            shared_tenant: self.shared_tenant.any(),
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
