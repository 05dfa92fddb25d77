//! What the webhook section measures: its cells (a request, a load, the servers), the servers by
//! index, the rules of a run, and what the runs left.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::harness::load::{Mode, Stats};
use crate::harness::procfs::ProcMemory;
use crate::harness::stats::{Pooled, median};

/// Repeats of every cell in a full run.
pub const REPEATS: usize = 5;
/// A run during which the hypervisor gave more than this share of the machine's CPU time to other
/// guests (`steal` in `/proc/stat`), percent, is run again: a latency measured while the core is
/// taken away measures the host's neighbours, not the server.
/// 0.35 % of a 3 s open-loop window on two CPUs is two 10 ms clock ticks: at 2,000 requests per
/// second one more stolen tick can hold back the 1 % of requests a p99 is made of.
pub const STEAL_MAX_PCT: f64 = 0.35;
/// Attempts at one run in a full run; when none stays under [`STEAL_MAX_PCT`], the least-stolen is
/// kept (and its steal shown).
pub const ATTEMPTS: u32 = 6;
/// How long an attempt waits for a quiet moment (a second without steal) before it starts.
pub const QUIET_WAIT: Duration = Duration::from_secs(30);
/// ServiceMappings in the cluster (and in the webhook's uniqueness index) during the runs.
pub const MAPPINGS: usize = 10_000;
/// Open-loop rates, requests per second.
pub const RATES: [u32; 2] = [500, 2_000];
/// Further open-loop rates in the Deployment's CPU limit, cp-webhook alone: where the knee is (the
/// highest rate with p99 < 1 ms and no throttled period).
pub const KNEE_RATES: [u32; 5] = [3_000, 4_000, 5_000, 6_000, 8_000];
/// The knee's goal, requests per second, for `/mutate` and `/validate` each.
pub const KNEE_GOAL: u32 = 5_000;
/// The load generator's CPU and the server's.
pub const CLIENT_CPU: &str = "0";
pub const SERVER_CPU: &str = "1";

/// The servers under test, by index: the floor, cp-webhook, the Go peer.
pub const FLOOR: usize = 0;
pub const OURS: usize = 1;
pub const GO: usize = 2;

/// One measured combination of request, load and servers.
pub struct Cell {
    pub path: &'static str,
    pub body: Bytes,
    pub mode: Mode,
    pub servers: Vec<usize>,
    /// Run inside the Deployment's CPU limit.
    pub limited: bool,
    /// What sets the cell's request apart from the others on its path (shown after the load).
    pub note: &'static str,
}

/// The requests the cells send.
pub struct Bodies {
    pub mutate: Bytes,
    pub validate: Bytes,
    pub mapping: Bytes,
    pub channels_off: Bytes,
}

/// Every cell, in the order they run; the open-loop ones only with a CPU limit (`limited`).
pub fn all(b: &Bodies, limited: bool) -> Vec<Cell> {
    let cell = |path, body: &Bytes, mode, servers: &[usize], limited, note| Cell {
        path,
        body: body.clone(),
        mode,
        servers: servers.to_vec(),
        limited,
        note,
    };
    let all = [FLOOR, OURS, GO];
    let mut cells = Vec::new();
    for (path, body) in [("/mutate", &b.mutate), ("/validate", &b.validate)] {
        for c in [1, 16] {
            cells.push(cell(path, body, Mode::Closed(c), &all, false, ""));
        }
    }
    cells.push(cell(
        "/validate-servicemapping",
        &b.mapping,
        Mode::Closed(16),
        &[FLOOR, OURS],
        false,
        "",
    ));
    cells.push(cell(
        "/validate",
        &b.channels_off,
        Mode::Closed(16),
        &[OURS],
        false,
        ", service channels switched off (refused)",
    ));
    cells.push(cell(
        "/validate",
        &b.validate,
        Mode::Fresh(1),
        &all,
        false,
        "",
    ));
    if limited {
        for (path, body) in [("/mutate", &b.mutate), ("/validate", &b.validate)] {
            for rate in RATES {
                cells.push(cell(path, body, Mode::Open(rate), &all, true, ""));
            }
            for rate in KNEE_RATES {
                cells.push(cell(path, body, Mode::Open(rate), &[OURS], true, ""));
            }
        }
    }
    cells
}

/// One attempt of one run, kept or not: a row of the attempts CSV.
pub struct Attempt {
    pub rep: usize,
    pub attempt: u32,
    pub cell: usize,
    pub server: usize,
    pub kept: bool,
    pub stats: Stats,
}

/// Everything the section measured, for rendering.
pub struct Results {
    pub cells: Vec<Cell>,
    pub names: Vec<&'static str>,
    pub runs: BTreeMap<(usize, usize), Vec<Stats>>,
    /// Every attempt's latencies, pooled per cell and server.
    pub pooled: BTreeMap<(usize, usize), Pooled>,
    /// Every attempt, in the order made.
    pub log: Vec<Attempt>,
    pub repeats: usize,
    pub attempts: u32,
    pub measure: Duration,
    pub open_measure: Duration,
    pub pinned: bool,
    pub limit: Result<u32, String>,
    pub mappings: usize,
    pub bodies: Vec<(&'static str, usize)>,
    pub rss: Option<ProcMemory>,
    /// The refusal's message when service channels are switched off with the mappings present.
    pub off_message: String,
    pub profile: Result<String, String>,
    pub gogc: String,
}

/// The attempt to keep: the least stolen (the earliest on a tie).
pub fn keep(attempts: &[Stats]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, a) in attempts.iter().enumerate() {
        if best.is_none_or(|b| a.steal_pct < attempts[b].steal_pct) {
            best = Some(i);
        }
    }
    best
}

impl Results {
    /// The kept runs of `server` in the cell of `path` and `mode` (the one without a note).
    pub fn find(&self, path: &str, mode: Mode, server: usize) -> Option<&Vec<Stats>> {
        let ci = self
            .cells
            .iter()
            .position(|c| c.path == path && c.mode == mode && c.note.is_empty())?;
        self.runs.get(&(ci, server))
    }

    /// The median of `f` over those runs; NaN when not measured.
    pub fn med(&self, path: &str, mode: Mode, server: usize, f: impl Fn(&Stats) -> f64) -> f64 {
        self.find(path, mode, server)
            .map(|r| median(r.iter().map(f).collect()))
            .unwrap_or(f64::NAN)
    }

    /// Median figures of our webhook the analysis quotes.
    pub fn summary_line(&self) -> String {
        let cpu = |p: &str, s: usize| self.med(p, Mode::Closed(16), s, |x| x.cpu_us);
        format!(
            "CPU per request at c=16: /mutate {:.1} µs (floor {:.1}, Go {:.1}), /validate {:.1} µs (floor {:.1}, Go {:.1})",
            cpu("/mutate", OURS),
            cpu("/mutate", FLOOR),
            cpu("/mutate", GO),
            cpu("/validate", OURS),
            cpu("/validate", FLOOR),
            cpu("/validate", GO)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steal_pct: f64) -> Stats {
        Stats {
            steal_pct,
            ..Stats::default()
        }
    }

    #[test]
    fn the_least_stolen_attempt_is_kept_and_the_earlier_on_a_tie() {
        assert_eq!(keep(&[]), None);
        assert_eq!(keep(&[run(5.0)]), Some(0));
        assert_eq!(keep(&[run(5.0), run(2.0), run(9.0)]), Some(1));
        assert_eq!(keep(&[run(5.0), run(2.0), run(9.0), run(2.0)]), Some(1));
    }

    #[test]
    fn open_loop_cells_need_the_cpu_limit() {
        let b = Bodies {
            mutate: Bytes::new(),
            validate: Bytes::new(),
            mapping: Bytes::new(),
            channels_off: Bytes::new(),
        };
        let without = all(&b, false);
        assert_eq!(without.len(), 7);
        assert!(without.iter().all(|c| !matches!(c.mode, Mode::Open(_))));
        let with = all(&b, true);
        assert_eq!(with.len(), 7 + 2 * (RATES.len() + KNEE_RATES.len()));
        assert!(with[7..].iter().all(|c| c.limited));
    }
}
