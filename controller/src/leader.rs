//! Leader election on a `coordination.k8s.io/v1` Lease, so that several replicas can run and only
//! one reconciles. Every duration derives from the lease duration.
//!
//! Whether another holder's lease has lapsed is judged as client-go does: by this replica's own
//! monotonic clock since the lease record last changed ([`Observer`]), never by comparing the
//! holder's `renewTime` with the local wall clock, so clock skew between nodes (or a `renewTime` written
//! by hand) neither cuts a live holder's lease short nor keeps a dead holder's lease for ever.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
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

/// What identifies one version of a lease record: any write by its holder changes at least the
/// `resourceVersion` (and a renewal the `renewTime`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `spec.holderIdentity` (empty: released).
    pub holder: String,
    /// `spec.renewTime`, as written (never compared with a clock).
    pub renew_time: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: Option<i32>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
}

impl Record {
    /// The record of a stored Lease.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.unwrap_or_default(),
            renew_time: spec.renew_time.map(|t| t.0.to_string()),
            transitions: spec.lease_transitions,
            resource_version: lease.metadata.resource_version.clone(),
            duration_seconds: spec.lease_duration_seconds,
        }
    }
}

/// What a candidate concludes about a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Free (no holder), held by this replica, or unchanged for a whole lease duration: take it.
    Take,
    /// Another holder's record changed less than a lease duration ago: it may still be renewing. Look
    /// again after `remaining` at the latest.
    Held {
        /// The holder.
        holder: String,
        /// Until the lease lapses if the record stays as it is.
        remaining: Duration,
    },
}

/// The lease record a replica last saw and when (its monotonic clock) it saw it change.
#[derive(Clone, Debug, Default)]
pub struct Observer {
    last: Option<(Record, Instant)>,
}

impl Observer {
    /// Notes `record`, seen at `now`, and judges it for `identity`. `default_duration` applies when the
    /// record has no (positive) `leaseDurationSeconds`.
    pub fn judge(
        &mut self,
        record: Record,
        now: Instant,
        identity: &str,
        default_duration: Duration,
    ) -> Verdict {
        let since = match &self.last {
            Some((seen, at)) if *seen == record => *at,
            _ => now,
        };
        self.last = Some((record.clone(), since));
        if record.holder.is_empty() || record.holder == identity {
            return Verdict::Take;
        }
        let duration = record
            .duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(default_duration, Duration::from_secs);
        let unchanged = now.saturating_duration_since(since);
        if unchanged >= duration {
            Verdict::Take
        } else {
            Verdict::Held {
                holder: record.holder,
                remaining: duration - unchanged,
            }
        }
    }
}

/// One acquisition or renewal, bounded by [`LeaseConfig::attempt_timeout`].
async fn attempt(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observer: &mut Observer,
) -> Result<Attempt, LeaseError> {
    match tokio::time::timeout(cfg.attempt_timeout(), try_acquire(api, cfg, observer)).await {
        Ok(r) => r.map_err(LeaseError::Api),
        Err(_) => Err(LeaseError::Timeout(cfg.attempt_timeout())),
    }
}

/// Why one acquisition or renewal failed.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    /// The API refused or failed.
    #[error("{0}")]
    Api(kube::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

enum Attempt {
    Acquired,
    HeldByOther { holder: String, remaining: Duration },
}

async fn try_acquire(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observer: &mut Observer,
) -> Result<Attempt, kube::Error> {
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
            if let Verdict::Held { holder, remaining } = observer.judge(
                Record::of(&lease),
                Instant::now(),
                &cfg.identity,
                cfg.duration,
            ) {
                return Ok(Attempt::HeldByOther { holder, remaining });
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
    let mut observer = Observer::default();
    loop {
        let mut wait = cfg.renew_every();
        match attempt(&api, cfg, &mut observer).await {
            Ok(Attempt::Acquired) => {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                return;
            }
            Ok(Attempt::HeldByOther { holder, remaining }) => {
                tracing::debug!(%holder, ?remaining, "lease held by another replica");
                // Look again the moment it would lapse, not up to a renewal interval later.
                wait = wait.min(remaining + Duration::from_millis(10));
            }
            Err(e) => tracing::debug!(error = %e, "lease acquisition attempt failed"),
        }
        tokio::time::sleep(wait).await;
    }
}

/// Renews the lease until renewal fails for longer than [`LeaseConfig::renew_deadline`]; returns then,
/// and the caller must stop reconciling (another replica may take over soon).
pub async fn keep(client: Client, cfg: LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_ok = tokio::time::Instant::now();
    let mut observer = Observer::default();
    loop {
        tokio::time::sleep(cfg.renew_every()).await;
        match attempt(&api, &cfg, &mut observer).await {
            Ok(Attempt::Acquired) => last_ok = tokio::time::Instant::now(),
            Ok(Attempt::HeldByOther { holder, .. }) => {
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

    fn record(holder: &str, renew: &str, rv: &str) -> Record {
        Record {
            holder: holder.into(),
            renew_time: Some(renew.into()),
            transitions: Some(0),
            resource_version: Some(rv.into()),
            duration_seconds: Some(15),
        }
    }

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn a_record_unchanged_for_a_lease_duration_of_the_own_clock_may_be_taken() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        // renewTime far in the future (the holder's clock is ahead): it does not matter.
        let stuck = record("other", "2100-01-01T00:00:00Z", "7");
        assert!(matches!(
            o.judge(stuck.clone(), t0, "me", LEASE),
            Verdict::Held { remaining, .. } if remaining == LEASE
        ));
        assert!(matches!(
            o.judge(stuck.clone(), t0 + Duration::from_secs(14), "me", LEASE),
            Verdict::Held { remaining, .. } if remaining == Duration::from_secs(1)
        ));
        assert_eq!(o.judge(stuck, t0 + LEASE, "me", LEASE), Verdict::Take);
    }

    #[test]
    fn a_holder_that_keeps_renewing_keeps_the_lease_whatever_its_renew_time_says() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        // renewTime far in the past (the holder's clock is behind), but the record changes.
        for k in 0..10u64 {
            let r = record(
                "other",
                &format!("2001-01-01T00:00:{k:02}Z"),
                &k.to_string(),
            );
            let v = o.judge(r, t0 + Duration::from_secs(10 * k), "me", LEASE);
            assert!(matches!(v, Verdict::Held { .. }), "{k}: {v:?}");
        }
        // A change of the resourceVersion alone (any write) restarts the clock too.
        let mut o = Observer::default();
        o.judge(record("other", "x", "1"), t0, "me", LEASE);
        let v = o.judge(record("other", "x", "2"), t0 + LEASE, "me", LEASE);
        assert!(matches!(v, Verdict::Held { .. }), "{v:?}");
    }

    #[test]
    fn a_released_or_own_lease_is_taken_at_once_and_the_records_duration_counts() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        assert_eq!(
            o.judge(record("", "x", "1"), t0, "me", LEASE),
            Verdict::Take
        );
        assert_eq!(
            o.judge(record("me", "x", "2"), t0, "me", LEASE),
            Verdict::Take
        );
        let mut short = record("other", "x", "3");
        short.duration_seconds = Some(1);
        o.judge(short.clone(), t0, "me", LEASE);
        assert_eq!(
            o.judge(short, t0 + Duration::from_secs(1), "me", LEASE),
            Verdict::Take
        );
        // No (or a nonsensical) duration in the record: the configured one.
        let mut none = record("other", "x", "4");
        none.duration_seconds = Some(-5);
        o.judge(none.clone(), t0, "me", LEASE);
        assert!(matches!(
            o.judge(none, t0 + Duration::from_secs(14), "me", LEASE),
            Verdict::Held { .. }
        ));
    }
}
