//! Resident memory of the webhook and the controller: idle, with many ServiceMappings, restarted
//! with them.

use std::fmt::Write as _;

use cp_tests::ControlPlane;
use serde::Serialize;

use crate::harness::plane::pid;
use crate::harness::procfs::{ProcMemory, process_memory};
use crate::harness::report::{kib_to_mib, yes_no};

/// Anonymous memory goals, idle and with the mappings (issue #18).
pub const WEBHOOK_GOAL_MIB: (f64, f64) = (10.0, 16.0);
pub const CONTROLLER_GOAL_MIB: (f64, f64) = (20.0, 40.0);

/// Memory of one process: anonymous resident memory (`RssAnon`, what the process allocated; file
/// pages of its binary excluded), KiB.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    pub process: String,
    /// After Ready, idle.
    pub idle_kib: u64,
    /// With the ServiceMappings aggregated and adopted.
    pub loaded_kib: u64,
    /// After a restart with the mappings still there, once settled.
    pub restarted_kib: u64,
    /// VmRSS (anonymous + file pages) with the mappings, for comparison.
    pub loaded_rss_kib: u64,
    /// VmHWM (peak resident) before the restart.
    pub peak_kib: u64,
    pub idle_goal_mib: f64,
    pub loaded_goal_mib: f64,
}

impl Memory {
    /// The figures of `process` from its three readings, against `goal` (idle, with the mappings).
    pub fn of(
        process: &str,
        idle: &ProcMemory,
        loaded: &ProcMemory,
        restarted: &ProcMemory,
        goal: (f64, f64),
    ) -> Self {
        Self {
            process: process.into(),
            idle_kib: idle.anon,
            loaded_kib: loaded.anon,
            restarted_kib: restarted.anon,
            loaded_rss_kib: loaded.rss,
            peak_kib: loaded.hwm,
            idle_goal_mib: goal.0,
            loaded_goal_mib: goal.1,
        }
    }

    pub fn met(&self) -> bool {
        let kib = |mib: f64| (mib * 1024.0) as u64;
        self.idle_kib < kib(self.idle_goal_mib)
            && self.loaded_kib < kib(self.loaded_goal_mib)
            && self.restarted_kib < kib(self.loaded_goal_mib)
    }
}

/// RssAnon, VmRSS and VmHWM of the control-plane process `name`.
pub fn read(cp: &ControlPlane, name: &str) -> anyhow::Result<ProcMemory> {
    process_memory(pid(cp, name)?)
}

/// The memory table; `mappings` were present when it was read with them.
pub fn render(memory: &[Memory], mappings: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Memory\n\n\
         Anonymous resident memory (`RssAnon` in `/proc/<pid>/status`: what the process allocated, the binary's file \
         pages excluded): idle after Ready; after {} ServiceMappings were created through the API server and the \
         webhook and aggregated and adopted by the controller; and after each process was restarted (SIGTERM, \
         started again, settled) with the mappings still in the cluster. VmRSS with the mappings and the peak \
         (VmHWM) before the restart for comparison.\n",
        mappings
    );
    let _ = writeln!(
        s,
        "| Process | idle MiB | with {n} mappings MiB | restarted with {n} MiB | VmRSS with them MiB | peak MiB | Goal (idle / with mappings) | Met |",
        n = mappings
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---|");
    for m in memory {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | < {:.0} / < {:.0} MiB | {} |",
            m.process,
            kib_to_mib(m.idle_kib),
            kib_to_mib(m.loaded_kib),
            kib_to_mib(m.restarted_kib),
            kib_to_mib(m.loaded_rss_kib),
            kib_to_mib(m.peak_kib),
            m.idle_goal_mib,
            m.loaded_goal_mib,
            yes_no(m.met())
        );
    }
    s.push('\n');
    s
}
