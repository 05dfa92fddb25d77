//! The API requests the controller (and the webhook) make, from the control plane's audit log: over
//! an idle window, and per full reconcile.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use cp_api::ConnectivityProxy;
use cp_tests::ControlPlane;
use cp_tests::cluster::AuditWrite;
use cp_tests::controller::{CONTROLLER_USER, ControllerProcess};
use kube::api::Api;
use serde::Serialize;

use crate::harness::plane::pid;
use crate::harness::procfs::process_cpu_us;
use crate::harness::report::{list, list_ms, yes_no};
use crate::harness::stats::{ms, per_second};
use crate::measure::controller::common::{
    CONTROLLER_PROCESS, WEBHOOK_PROCESS, WEBHOOK_USER, reconciles, settle, touch,
};

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
/// A goal of our choosing, stated before the first measurement (issue #33, item 6): controller CPU
/// per idle hour.
const IDLE_CPU_GOAL_S_PER_HOUR: f64 = 10.0;

/// Requests of one verb on one resource (and object name, where it matters).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestCount {
    pub verb: String,
    pub resource: String,
    /// Empty when counted over every object.
    pub name: String,
    pub count: usize,
}

/// The controller's (and the webhook's) API requests over an idle window after Ready.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IdleRequests {
    pub window_secs: f64,
    /// Lease renewals (leader election): writes on `leases`.
    pub lease_writes: usize,
    /// Reads of the Lease before each renewal.
    pub lease_reads: usize,
    /// Every other write, by verb, resource and name.
    pub other_writes: Vec<RequestCount>,
    /// get/list on anything but leases.
    pub reads: usize,
    /// Those reads by verb and resource.
    pub read_counts: Vec<RequestCount>,
    /// Watch requests that completed (and were re-established) in the window.
    pub watches: usize,
    pub webhook_writes: usize,
    pub webhook_reads: usize,
    pub webhook_watches: usize,
    /// ServiceMappings in the cluster during the window.
    pub mappings: usize,
    /// CPU (user + system) of the controller and the webhook over the window, ms.
    pub controller_cpu_ms: f64,
    pub webhook_cpu_ms: f64,
}

impl IdleRequests {
    /// `n` requests over the window, per minute.
    pub fn per_minute(&self, n: usize) -> f64 {
        per_second(n as f64 * 60.0, self.window_secs)
    }

    /// Writes other than Lease renewals.
    pub fn other_write_count(&self) -> usize {
        self.other_writes.iter().map(|r| r.count).sum()
    }
}

/// One full reconcile, triggered by an annotation change on the CR (no new generation).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileRequests {
    /// Requests of the first triggered reconcile by verb and resource (leases and watches excluded).
    pub requests: Vec<RequestCount>,
    /// Total requests (leases and watches excluded) of each triggered reconcile.
    pub totals: Vec<usize>,
    /// Writes among them, per triggered reconcile.
    pub writes: Vec<usize>,
    /// Reconciles the controller counted in each window (1 = the trigger caused exactly one).
    pub reconciles: Vec<u64>,
    /// Trigger to completion (the reconcile counter increased), per triggered reconcile.
    pub durations_ms: Vec<f64>,
    /// Lease requests that fell into the windows (not part of the reconcile).
    pub lease_requests: usize,
    /// Watch requests that completed in the windows (not part of the reconcile).
    pub watch_requests: usize,
}

fn is_write(r: &AuditWrite) -> bool {
    WRITE_VERBS.contains(&r.verb.as_str())
}

fn is_lease(r: &AuditWrite) -> bool {
    r.resource == "leases"
}

fn is_read(r: &AuditWrite) -> bool {
    r.verb == "get" || r.verb == "list"
}

/// Counts by verb, resource and (if `by_name`) name, most frequent first.
fn count_requests<'a>(
    reqs: impl Iterator<Item = &'a AuditWrite>,
    by_name: bool,
) -> Vec<RequestCount> {
    let mut counts: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in reqs {
        let name = if by_name {
            r.name.clone()
        } else {
            String::new()
        };
        *counts
            .entry((r.verb.clone(), r.resource.clone(), name))
            .or_default() += 1;
    }
    let mut out: Vec<RequestCount> = counts
        .into_iter()
        .map(|((verb, resource, name), count)| RequestCount {
            verb,
            resource,
            name,
            count,
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.count));
    out
}

pub async fn idle_requests(cp: &ControlPlane, window: Duration) -> anyhow::Result<IdleRequests> {
    let offset = cp.audit_offset();
    let cpu = |name: &str| process_cpu_us(pid(cp, name)?);
    let (ctrl_cpu, wh_cpu) = (cpu(CONTROLLER_PROCESS)?, cpu(WEBHOOK_PROCESS)?);
    let started = Instant::now();
    // The window itself: nothing happens in it but what the processes do by themselves.
    tokio::time::sleep(window).await;
    let window_secs = started.elapsed().as_secs_f64();
    let controller_cpu_ms = cpu(CONTROLLER_PROCESS)?.saturating_sub(ctrl_cpu) as f64 / 1e3;
    let webhook_cpu_ms = cpu(WEBHOOK_PROCESS)?.saturating_sub(wh_cpu) as f64 / 1e3;
    let reqs = cp.audit_requests_since(offset)?;
    let ctrl: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == CONTROLLER_USER).collect();
    let wh: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == WEBHOOK_USER).collect();
    Ok(IdleRequests {
        window_secs,
        lease_writes: ctrl.iter().filter(|r| is_lease(r) && is_write(r)).count(),
        lease_reads: ctrl.iter().filter(|r| is_lease(r) && is_read(r)).count(),
        other_writes: count_requests(
            ctrl.iter().filter(|r| !is_lease(r) && is_write(r)).copied(),
            true,
        ),
        reads: ctrl.iter().filter(|r| !is_lease(r) && is_read(r)).count(),
        read_counts: count_requests(
            ctrl.iter().filter(|r| !is_lease(r) && is_read(r)).copied(),
            false,
        ),
        watches: ctrl.iter().filter(|r| r.verb == "watch").count(),
        webhook_writes: wh.iter().filter(|r| is_write(r)).count(),
        webhook_reads: wh.iter().filter(|r| is_read(r)).count(),
        webhook_watches: wh.iter().filter(|r| r.verb == "watch").count(),
        mappings: 0,
        controller_cpu_ms,
        webhook_cpu_ms,
    })
}

pub async fn reconcile_requests(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    crs: &Api<ConnectivityProxy>,
    samples: usize,
) -> anyhow::Result<ReconcileRequests> {
    let mut out = ReconcileRequests::default();
    for i in 0..samples {
        settle(ctrl).await?;
        let before = reconciles(ctrl).await?;
        let offset = cp.audit_offset();
        let t0 = Instant::now();
        touch(crs, format!("{i}")).await?;
        let deadline = t0 + Duration::from_secs(10);
        while reconciles(ctrl).await? <= before {
            if Instant::now() > deadline {
                bail!("no reconcile within 10 s of annotating the CR");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = t0.elapsed();
        // Let the audit log catch up with the reconcile's last response, then see whether it caused
        // another one.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let count = reconciles(ctrl).await?.saturating_sub(before);
        let reqs = cp.audit_requests_since(offset)?;
        let mine: Vec<&AuditWrite> = reqs.iter().filter(|r| r.user == CONTROLLER_USER).collect();
        let counted: Vec<&AuditWrite> = mine
            .iter()
            .filter(|r| !is_lease(r) && r.verb != "watch")
            .copied()
            .collect();
        out.lease_requests += mine.iter().filter(|r| is_lease(r)).count();
        out.watch_requests += mine.iter().filter(|r| r.verb == "watch").count();
        if i == 0 {
            out.requests = count_requests(counted.iter().copied(), false);
        }
        out.totals.push(counted.len());
        out.writes
            .push(counted.iter().filter(|r| is_write(r)).count());
        out.reconciles.push(count);
        out.durations_ms.push(ms(took));
    }
    Ok(out)
}

/// The idle-window table.
pub fn render_idle(i: &IdleRequests) -> String {
    let mut s = String::new();
    let others = i.other_write_count();
    let _ = writeln!(
        s,
        "### API requests per idle minute, with {} ServiceMappings\n\n\
         After Ready, with the mappings aggregated and adopted, {:.0} s without any change{}, scaled to one minute and one hour. Requests by the controller's \
         ServiceAccount (and, for comparison, the webhook's); the leader-election Lease is counted on its own rows.\n",
        i.mappings,
        i.window_secs,
        if i.window_secs > 600.0 {
            " (longer than the controller's 600 s resync, so the resync's reconcile is in the window)"
        } else {
            " (**shorter than the 600 s resync**: a quick run)"
        }
    );
    let _ = writeln!(
        s,
        "| Requests | in window | per minute | per hour | Goal | Met |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---|---|");
    let mut count = |what: &str, n: usize, goal: &str, met: &str| {
        let _ = writeln!(
            s,
            "| {what} | {n} | {:.1} | {:.0} | {goal} | {met} |",
            i.per_minute(n),
            i.per_minute(n) * 60.0
        );
    };
    count(
        "controller writes besides Lease renewals",
        others,
        "0 per hour",
        yes_no(others == 0),
    );
    count(
        "controller Lease renewals (writes)",
        i.lease_writes,
        "leader election only",
        "—",
    );
    count("controller Lease reads", i.lease_reads, "—", "—");
    count("controller other reads (get/list)", i.reads, "—", "—");
    for c in &i.read_counts {
        count(
            &format!("&nbsp;&nbsp;{} {}", c.verb, c.resource),
            c.count,
            "—",
            "—",
        );
    }
    count("controller watches re-established", i.watches, "—", "—");
    let _ = writeln!(
        s,
        "| webhook writes / reads / watches | {} / {} / {} | {:.1} / {:.1} / {:.1} | {:.0} / {:.0} / {:.0} | 0 writes | {} |",
        i.webhook_writes,
        i.webhook_reads,
        i.webhook_watches,
        i.per_minute(i.webhook_writes),
        i.per_minute(i.webhook_reads),
        i.per_minute(i.webhook_watches),
        i.per_minute(i.webhook_writes) * 60.0,
        i.per_minute(i.webhook_reads) * 60.0,
        i.per_minute(i.webhook_watches) * 60.0,
        yes_no(i.webhook_writes == 0)
    );
    let hour = |ms: f64| per_second(ms / 1e3 * 3600.0, i.window_secs);
    let mut cpu = |what: &str, ms: f64, goal: &str, met: &str| {
        let _ = writeln!(
            s,
            "| {what} CPU (user + system), s | {:.2} | {:.3} | {:.1} | {goal} | {met} |",
            ms / 1e3,
            hour(ms) / 60.0,
            hour(ms),
        );
    };
    cpu(
        "controller",
        i.controller_cpu_ms,
        &format!("≤ {IDLE_CPU_GOAL_S_PER_HOUR:.0} s per hour"),
        yes_no(i.window_secs > 0.0 && hour(i.controller_cpu_ms) <= IDLE_CPU_GOAL_S_PER_HOUR),
    );
    cpu("webhook", i.webhook_cpu_ms, "—", "—");
    if !i.other_writes.is_empty() {
        let _ = writeln!(s, "\nThe controller's other writes in the window:\n");
        for r in &i.other_writes {
            let _ = writeln!(s, "- {} × {} {} {}", r.count, r.verb, r.resource, r.name);
        }
    }
    s.push('\n');
    s
}

/// The per-reconcile tables.
pub fn render_reconcile(r: &ReconcileRequests) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### API requests per full reconcile\n\n\
         {} reconciles, each triggered by an annotation change on the Ready CR (no new generation, every step \
         runs), counted from the trigger until the controller's reconcile counter increased (plus 300 ms for the \
         audit log). Leases and watches are not part of a reconcile and are listed separately.\n",
        r.totals.len()
    );
    let _ = writeln!(s, "| Requests of the first reconcile | count |");
    let _ = writeln!(s, "|---|---:|");
    for c in &r.requests {
        let _ = writeln!(s, "| {} {} | {} |", c.verb, c.resource, c.count);
    }
    let _ = writeln!(s, "\n| Measure | value | Goal | Met |");
    let _ = writeln!(s, "|---|---|---|---|");
    let mut measure = |what: &str, value: String, goal: &str, met: &str| {
        let _ = writeln!(s, "| {what} | {value} | {goal} | {met} |");
    };
    measure(
        "requests per reconcile",
        list(&r.totals),
        "1 (the quorum GET of the CR)",
        yes_no(r.totals.iter().all(|t| *t == 1)),
    );
    measure(
        "writes per reconcile (nothing changed)",
        list(&r.writes),
        "0",
        yes_no(r.writes.iter().all(|w| *w == 0)),
    );
    measure(
        "reconciles per trigger",
        list(&r.reconciles),
        "1",
        yes_no(r.reconciles.iter().all(|c| *c == 1)),
    );
    measure(
        "trigger → reconcile done, ms",
        list_ms(&r.durations_ms),
        "—",
        "—",
    );
    measure(
        "Lease / watch requests in the windows (excluded)",
        format!("{} / {}", r.lease_requests, r.watch_requests),
        "—",
        "—",
    );
    s.push('\n');
    s
}
