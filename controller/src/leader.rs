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
    /// Owner of the Lease (the module's CRD: uninstalling the module removes it).
    pub owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

impl LeaseConfig {
    /// Renew this often (a third of the duration, so two renewals may fail before the lease lapses).
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// How long one attempt (read + write) may take: a hung request must not outlive the renewal
    /// window.
    pub fn attempt_timeout(&self) -> Duration {
        self.duration / 3
    }

    /// Stop leading when no renewal succeeded for this long: a third of the duration before another
    /// replica may take over, so two leaders never reconcile at once.
    pub fn renew_deadline(&self) -> Duration {
        self.duration - self.duration / 3
    }
}

/// One acquisition or renewal, bounded by [`LeaseConfig::attempt_timeout`].
async fn attempt(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<Attempt, String> {
    match tokio::time::timeout(cfg.attempt_timeout(), try_acquire(api, cfg)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", cfg.attempt_timeout())),
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
                    owner_references: cfg.owner.clone().map(|o| vec![o]),
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
            if lease.metadata.owner_references.is_none() {
                lease.metadata.owner_references = cfg.owner.clone().map(|o| vec![o]);
            }
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
        match attempt(&api, cfg).await {
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

/// Renews the lease until renewal fails for longer than [`LeaseConfig::renew_deadline`]; returns then,
/// and the caller must stop reconciling (another replica may take over soon).
pub async fn keep(client: Client, cfg: LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every()).await;
        match attempt(&api, &cfg).await {
            Ok(Attempt::Acquired) => last_ok = tokio::time::Instant::now(),
            Ok(Attempt::HeldByOther(holder)) => {
                tracing::error!(%holder, "lost the lease to another replica");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the lease failed");
                if last_ok.elapsed() >= cfg.renew_deadline() {
                    return;
                }
            }
        }
    }
}

/// Gives the lease up on a graceful shutdown (holder cleared, as client-go's `ReleaseOnCancel`), so a
/// standby takes over at its next attempt instead of after the lease duration. Bounded by the attempt
/// timeout; a failure only means the standby waits for the lease to lapse.
pub async fn release(client: Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let work = async {
        let Some(mut lease) = api.get_opt(&cfg.name).await? else {
            return Ok::<bool, kube::Error>(false);
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        api.replace(&cfg.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    };
    match tokio::time::timeout(cfg.attempt_timeout(), work).await {
        Ok(Ok(true)) => tracing::info!(lease = %cfg.name, "leader lease released"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed; it lapses by itself"),
        Err(_) => tracing::warn!("releasing the lease timed out; it lapses by itself"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_stops_before_a_standby_may_take_over() {
        let cfg = LeaseConfig {
            namespace: "kyma-system".into(),
            name: "l".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
            owner: None,
        };
        assert_eq!(cfg.renew_every(), Duration::from_secs(5));
        assert_eq!(cfg.attempt_timeout(), Duration::from_secs(5));
        assert_eq!(cfg.renew_deadline(), Duration::from_secs(10));
        // The last successful renewal plus the deadline plus one hung attempt stays inside the lease.
        assert!(cfg.renew_deadline() + cfg.attempt_timeout() <= cfg.duration);
    }
}
