//! The controller's CPU for a reconcile in which nothing changed.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cp_api::ConnectivityProxy;
use cp_tests::ControlPlane;
use cp_tests::controller::ControllerProcess;
use kube::api::Api;
use serde::Serialize;

use crate::harness::plane::pid;
use crate::harness::procfs::process_cpu_us;
use crate::harness::report::yes_no;
use crate::measure::controller::common::{reconciles, settle, touch};

/// Goals of our choosing, stated before the first measurement (issue #33, item 6): controller CPU
/// per reconcile in which nothing changed, without and with the 10,000 mappings.
pub const RECONCILE_CPU_GOAL_MS: f64 = 5.0;
pub const RECONCILE_CPU_GOAL_MS_MAPPINGS: f64 = 25.0;

/// Controller CPU for reconciles in which nothing changed: a burst of annotation touches.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileCpu {
    /// ServiceMappings in the cluster meanwhile.
    pub mappings: usize,
    /// Reconciles the controller counted in the burst.
    pub reconciles: u64,
    /// Controller CPU (user + system) over the burst, ms, its idle rate taken off.
    pub cpu_ms: f64,
    /// The idle rate measured just before, ms CPU per second.
    pub idle_ms_per_s: f64,
    pub goal_ms: f64,
}

impl ReconcileCpu {
    pub fn per_reconcile(&self) -> f64 {
        self.cpu_ms / self.reconciles.max(1) as f64
    }
}

/// Controller CPU per reconcile in which nothing changed: its idle rate over 5 s, then `touches`
/// annotation changes on the CR 50 ms apart; the CPU from the first touch until the controller
/// counted that many reconciles (or 10 s after the last touch), less the idle rate over that time,
/// divided by the reconciles counted. CPU comes from `/proc/<pid>/stat` (10 ms ticks: a burst of
/// 100 keeps the rounding under a few percent).
pub async fn reconcile_cpu(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    crs: &Api<ConnectivityProxy>,
    touches: usize,
    mappings: usize,
    goal_ms: f64,
) -> anyhow::Result<ReconcileCpu> {
    let pid = pid(cp, &ctrl.name)?;
    settle(ctrl).await?;
    let idle_from = (Instant::now(), process_cpu_us(pid)?);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_to = (Instant::now(), process_cpu_us(pid)?);
    let idle_ms_per_s = idle_to.1.saturating_sub(idle_from.1) as f64
        / 1e3
        / idle_to.0.duration_since(idle_from.0).as_secs_f64();
    let before = reconciles(ctrl).await?;
    let (t0, cpu0) = (Instant::now(), process_cpu_us(pid)?);
    for i in 0..touches {
        touch(crs, format!("cpu-{mappings}-{i}")).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while reconciles(ctrl).await? < before + touches as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (t1, cpu1) = (Instant::now(), process_cpu_us(pid)?);
    let counted = reconciles(ctrl).await?.saturating_sub(before);
    let raw_ms = cpu1.saturating_sub(cpu0) as f64 / 1e3;
    let cpu_ms = (raw_ms - idle_ms_per_s * t1.duration_since(t0).as_secs_f64()).max(0.0);
    Ok(ReconcileCpu {
        mappings,
        reconciles: counted,
        cpu_ms,
        idle_ms_per_s,
        goal_ms,
    })
}

/// The CPU-per-reconcile table.
pub fn render(bursts: &[ReconcileCpu]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Controller CPU per reconcile\n\n\
         Reconciles in which nothing changed, each triggered by an annotation change on the Ready CR, 50 ms apart; \
         the controller's CPU (user + system, `/proc/<pid>/stat`) from the first change until it counted as many \
         reconciles, less its idle rate measured over the 5 s before, divided by the reconciles counted. Goals \
         chosen before the first measurement.\n"
    );
    let _ = writeln!(
        s,
        "| ServiceMappings present | reconciles | CPU ms | idle rate ms/s | CPU per reconcile ms | Goal | Met |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---|---|");
    for c in bursts {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {:.2} | ≤ {:.0} ms | {} |",
            c.mappings,
            c.reconciles,
            c.cpu_ms,
            c.idle_ms_per_s,
            c.per_reconcile(),
            c.goal_ms,
            yes_no(c.reconciles > 0 && c.per_reconcile() <= c.goal_ms)
        );
    }
    s.push('\n');
    s
}
