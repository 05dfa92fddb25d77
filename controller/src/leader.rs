//! Leader election on a `coordination.k8s.io/v1` Lease, so that several replicas can run and only
//! one reconciles. Every duration derives from the lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Lease settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease is valid without renewal; others take over after it.
    pub duration: Duration,
}

impl LeaseConfig {
    /// Renew this often (a third of the duration, so two renewals may fail before the lease lapses).
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }
}

enum Attempt {
    Acquired,
    HeldByOther(String),
}

async fn try_acquire(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<Attempt, kube::Error> {
    let now = Timestamp::now();
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(i32::MAX);
    match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
            Ok(Attempt::Acquired)
        }
        Some(mut lease) => {
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let renewed = spec
                .renew_time
                .map(|t| t.0)
                .unwrap_or(Timestamp::UNIX_EPOCH);
            let valid_for =
                SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(secs)));
            let expired = renewed + valid_for < now;
            if holder != cfg.identity && !holder.is_empty() && !expired {
                return Ok(Attempt::HeldByOther(holder));
            }
            let transitions =
                spec.lease_transitions.unwrap_or(0) + i32::from(holder != cfg.identity);
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: if holder == cfg.identity {
                    spec.acquire_time
                } else {
                    Some(MicroTime(now))
                },
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(transitions),
                ..spec
            });
            // `replace` carries the resourceVersion read above: a concurrent writer makes it fail.
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await?;
            Ok(Attempt::Acquired)
        }
    }
}

/// Blocks until this replica holds the lease.
pub async fn acquire(client: &Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    loop {
        match try_acquire(&api, cfg).await {
            Ok(Attempt::Acquired) => {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                return;
            }
            Ok(Attempt::HeldByOther(holder)) => {
                tracing::debug!(%holder, "lease held by another replica")
            }
            Err(e) => tracing::debug!(error = %e, "lease acquisition attempt failed"),
        }
        tokio::time::sleep(cfg.renew_every()).await;
    }
}

/// Renews the lease until renewal fails for longer than the lease duration; returns then, and the
/// caller must stop reconciling (another replica may already lead).
pub async fn keep(client: Client, cfg: LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every()).await;
        match try_acquire(&api, &cfg).await {
            Ok(Attempt::Acquired) => last_ok = tokio::time::Instant::now(),
            Ok(Attempt::HeldByOther(holder)) => {
                tracing::error!(%holder, "lost the lease to another replica");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the lease failed");
                if last_ok.elapsed() >= cfg.duration {
                    return;
                }
            }
        }
    }
}
