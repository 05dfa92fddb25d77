//! Admission that a pod cannot starve.
//!
//! Anything that can reach the webhook port can open connections and start requests; with
//! `failurePolicy: Fail` a webhook that is too busy to answer the API server fails every
//! ConnectivityProxy and ServiceMapping write. So every resource a client can hold is bounded, and
//! bounded per source address, below the global bound:
//! - connections: at most [`Limits::max_connections`] open, at most
//!   [`Limits::max_connections_per_source`] of them from one IP address (the API server's address
//!   gets in while a few others are at their cap);
//! - buffered request bodies: a request reserves its declared `Content-Length` (or [`MAX_BODY`] when
//!   it declares none) from a byte budget before its body is read, at most
//!   [`Limits::body_budget_per_source`] per address; a request that cannot get its reservation within
//!   [`Limits::slot_wait`] is shed (429 for a source over its share, 503 when the budget is spent), so
//!   it counts against its deadline instead of queueing behind slow clients;
//! - time: the body must arrive within [`Limits::body_timeout`] and the whole request within
//!   [`Limits::request_timeout`], both well inside the API server's 5 s webhook timeout.
//!
//! A slow client therefore holds only what it declared, for at most the body timeout, and never a slot
//! another request waits for. Handshake, header and idle limits are in [`crate::server`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Largest AdmissionReview accepted: an object and its old version at the API server's 1.5 MiB
/// object limit, plus the envelope.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Limits of the admission server. The defaults are the Deployment's; the connection caps are flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most; one beyond it is closed at once (the API server retries on a new one).
    pub max_connections: usize,
    /// Open connections from one IP address at most.
    pub max_connections_per_source: usize,
    /// Bytes of request bodies reserved at once (declared lengths). With [`MAX_BODY`] the default
    /// bounds buffered bodies to 32 MiB, a quarter of the Deployment's 128 Mi memory limit.
    pub body_budget: usize,
    /// Bytes of request bodies one IP address may have reserved at once.
    pub body_budget_per_source: usize,
    /// How long a request may wait for its reservation before it is shed.
    pub slot_wait: Duration,
    /// The whole body must arrive within this after the headers (a hard deadline, not per read).
    pub body_timeout: Duration,
    /// A request (waiting, body read, review, answer) must complete within this.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 768,
            max_connections_per_source: 32,
            body_budget: 8 * MAX_BODY,
            body_budget_per_source: 2 * MAX_BODY,
            slot_wait: Duration::from_secs(1),
            body_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
        }
    }
}

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// [`Limits::max_connections`] are open.
    Global,
    /// This address has [`Limits::max_connections_per_source`] open.
    Source,
}

impl Refused {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Global => "global_limit",
            Refused::Source => "source_limit",
        }
    }
}

/// Why a request was answered without being reviewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// Its address has [`Limits::body_budget_per_source`] reserved (429).
    SourceBusy,
    /// The body budget stayed spent for [`Limits::slot_wait`] (503).
    Busy,
}

impl Shed {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Shed::SourceBusy => "source_busy",
            Shed::Busy => "busy",
        }
    }
}

/// Connections and body reservations, by source address.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    table: Mutex<Table>,
    budget: Arc<Semaphore>,
    drained: Notify,
}

#[derive(Debug, Default)]
struct Table {
    open: usize,
    sources: HashMap<IpAddr, (usize, Arc<Source>)>,
}

/// What one source address holds besides its connections.
#[derive(Debug, Default)]
struct Source {
    reserved: AtomicUsize,
}

impl Gate {
    /// A gate enforcing `limits`.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            table: Mutex::new(Table::default()),
            budget: Arc::new(Semaphore::new(limits.body_budget)),
            drained: Notify::new(),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent even if a holder panicked: every update is a single step.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new connection from `ip`, or says why not. The permit is released when dropped.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnPermit, Refused> {
        let ip = ip.to_canonical();
        let mut t = self.table();
        if t.open >= self.limits.max_connections {
            return Err(Refused::Global);
        }
        let entry = t.sources.entry(ip).or_default();
        if entry.0 >= self.limits.max_connections_per_source {
            return Err(Refused::Source);
        }
        entry.0 += 1;
        let source = entry.1.clone();
        t.open += 1;
        Ok(ConnPermit {
            gate: self.clone(),
            ip,
            source,
        })
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.table().open
    }

    /// Resolves once no connection is open.
    pub async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// An admitted connection; its requests reserve body bytes through it.
#[derive(Debug)]
pub struct ConnPermit {
    gate: Arc<Gate>,
    ip: IpAddr,
    source: Arc<Source>,
}

impl ConnPermit {
    /// The connection's source address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.gate.limits
    }

    /// Reserves `bytes` (at most [`Limits::body_budget_per_source`]) of the body budget, waiting at
    /// most [`Limits::slot_wait`]; the reservation is returned when dropped.
    pub async fn reserve(&self, bytes: usize) -> Result<Reservation, Shed> {
        let limits = &self.gate.limits;
        let mut r = Reservation {
            source: self.source.clone(),
            bytes: 0,
            _permit: None,
        };
        if bytes == 0 {
            return Ok(r);
        }
        let before = self.source.reserved.fetch_add(bytes, Ordering::AcqRel);
        r.bytes = bytes;
        if before + bytes > limits.body_budget_per_source {
            return Err(Shed::SourceBusy);
        }
        let n = u32::try_from(bytes).map_err(|_| Shed::Busy)?;
        if bytes > limits.body_budget {
            return Err(Shed::Busy);
        }
        let budget = self.gate.budget.clone();
        let permit = match budget.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                match tokio::time::timeout(limits.slot_wait, budget.acquire_many_owned(n)).await {
                    Ok(Ok(p)) => p,
                    _ => return Err(Shed::Busy),
                }
            }
        };
        r._permit = Some(permit);
        Ok(r)
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut t = self.gate.table();
        if let Some(entry) = t.sources.get_mut(&self.ip) {
            entry.0 = entry.0.saturating_sub(1);
            if entry.0 == 0 {
                t.sources.remove(&self.ip);
            }
        }
        t.open = t.open.saturating_sub(1);
        let none = t.open == 0;
        drop(t);
        if none {
            self.gate.drained.notify_waiters();
        }
    }
}

/// Reserved body bytes, returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    source: Arc<Source>,
    bytes: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.source.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

/// Requests in progress on one connection and when the last one ended: the idle watchdog's input
/// (HTTP/2 has no idle timeout of its own in hyper, and a TLS client that never sends a request is
/// caught by nothing else).
#[derive(Debug)]
pub struct Activity {
    start: tokio::time::Instant,
    active: AtomicUsize,
    /// Milliseconds after `start` at which the last request ended (or the connection opened).
    last_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Activity {
    /// Marks a request in progress until the guard is dropped.
    pub fn begin(&self) -> Busy<'_> {
        self.active.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    /// Since when the connection has had no request in progress (`None`: one is).
    pub fn idle_since(&self) -> Option<tokio::time::Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.start + Duration::from_millis(self.last_ms.load(Ordering::Acquire)))
    }

    /// Resolves once the connection has been idle for `limit`.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let wake = self
                .idle_since()
                .map_or_else(|| tokio::time::Instant::now() + limit, |t| t + limit);
            tokio::time::sleep_until(wake).await;
            if self.idle_since().is_some_and(|t| t.elapsed() >= limit) {
                return;
            }
        }
    }
}

/// A request in progress (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Busy<'a>(&'a Activity);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Lets one log line through per interval: refusals and sheds are counted by metrics, and a flood of
/// them must not become a flood of log lines.
#[derive(Debug)]
pub struct Throttle {
    start: Instant,
    every_ms: u64,
    next_ms: AtomicU64,
}

impl Throttle {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            start: Instant::now(),
            every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now.
    pub fn allow(&self) -> bool {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Acquire);
        now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.every_ms),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn small() -> Limits {
        Limits {
            max_connections: 5,
            max_connections_per_source: 2,
            body_budget: 100,
            body_budget_per_source: 60,
            slot_wait: Duration::from_millis(50),
            ..Limits::default()
        }
    }

    #[test]
    fn a_source_at_its_cap_is_refused_while_others_still_get_in() {
        let gate = Gate::new(small());
        let a: Vec<_> = (0..2).map(|_| gate.admit(ip(2)).expect("a")).collect();
        assert_eq!(gate.admit(ip(2)).err(), Some(Refused::Source));
        let b: Vec<_> = (0..2).map(|_| gate.admit(ip(3)).expect("b")).collect();
        // The API server's address still gets in, up to the global cap.
        let api = gate.admit(ip(1)).expect("api server");
        assert_eq!(gate.admit(ip(4)).err(), Some(Refused::Global));
        assert_eq!(gate.open(), 5);
        drop(a);
        assert_eq!(gate.open(), 3);
        let again = gate.admit(ip(2)).expect("a's slots are free again");
        drop((b, api, again));
        assert_eq!(gate.open(), 0);
        assert!(gate.table().sources.is_empty(), "no entry left behind");
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_their_ipv4_source() {
        let gate = Gate::new(small());
        let _a = gate.admit(ip(2)).expect("v4");
        let _b = gate
            .admit(IpAddr::V6(Ipv4Addr::new(127, 0, 0, 2).to_ipv6_mapped()))
            .expect("mapped");
        assert_eq!(gate.admit(ip(2)).err(), Some(Refused::Source));
    }

    #[tokio::test]
    async fn a_request_that_cannot_get_its_reservation_in_time_is_shed() {
        let gate = Gate::new(small());
        let a = gate.admit(ip(2)).expect("a");
        let b = gate.admit(ip(3)).expect("b");
        let api = gate.admit(ip(1)).expect("api");
        let held_a = a.reserve(60).await.expect("a's share");
        // Over a's share: refused at once, without waiting.
        let t = Instant::now();
        assert_eq!(a.reserve(1).await.err(), Some(Shed::SourceBusy));
        assert!(t.elapsed() < Duration::from_millis(40));
        let held_b = b.reserve(40).await.expect("b's part");
        // The budget is spent: the API server's request waits slot_wait, then is shed.
        let t = Instant::now();
        assert_eq!(api.reserve(10).await.err(), Some(Shed::Busy));
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "{:?}",
            t.elapsed()
        );
        // A failed attempt gives back what it counted.
        drop(held_b);
        let ok = api.reserve(40).await.expect("budget returned");
        drop((ok, held_a));
        assert_eq!(a.source.reserved.load(Ordering::Acquire), 0);
        assert_eq!(api.source.reserved.load(Ordering::Acquire), 0);
        // Bodies without content take nothing.
        assert!(a.reserve(0).await.is_ok());
    }

    #[tokio::test]
    async fn drained_resolves_once_the_last_connection_closes() {
        let gate = Gate::new(small());
        let c = gate.admit(ip(2)).expect("c");
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.drained().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(c);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("drained")
            .expect("task");
    }

    #[tokio::test]
    async fn idle_for_waits_for_the_last_request_to_end() {
        let limit = Duration::from_millis(100);
        let activity = Activity::default();
        let busy = activity.begin();
        assert!(activity.idle_since().is_none());
        assert!(
            tokio::time::timeout(limit * 3, activity.idle_for(limit))
                .await
                .is_err(),
            "idle while a request is in progress"
        );
        drop(busy);
        let ended = Instant::now();
        assert!(activity.idle_since().is_some());
        tokio::time::timeout(Duration::from_secs(5), activity.idle_for(limit))
            .await
            .expect("idle after the request ended");
        assert!(ended.elapsed() >= limit, "{:?}", ended.elapsed());
    }

    #[test]
    fn the_throttle_lets_one_line_through_per_interval() {
        let t = Throttle::new(Duration::from_secs(3600));
        assert!(t.allow());
        assert!(!t.allow());
    }
}
