//! The webhook benchmarks: `cp-webhook` against the floor (the same server stack answering a
//! precomputed review after reading only the envelope) and a controller-runtime peer in Go doing the
//! same work, each alone on its own core while the load generator runs on the other.
//!
//! Method, as written into BENCHMARKS.md: every server is started pinned to CPU 1 (`taskset`), so
//! tokio and the Go runtime size themselves to one core; the bench pins itself (the load generator)
//! to CPU 0. During a run only the server under test is running: the other two, etcd, the API
//! server and the controller manager are stopped (SIGSTOP) and resumed afterwards. Each cell is run
//! `cells::REPEATS` times, the repeats interleaved (every cell once, then again), and reported as
//! median and range. Server CPU per request is the server's utime + stime over the measured window
//! divided by the requests answered in it.
//!
//! `cells` says what is measured, `servers` starts and checks the servers, [`run`] runs every cell
//! on each of its servers while everything else sleeps, `render` writes the section.

pub mod cells;
pub mod render;
pub mod servers;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cp_tests::ControlPlane;
use cp_tests::cluster::Options;

use crate::harness::load::{self, Mode, Stats};
use crate::harness::mappings::{create_mappings, numbered_mappings};
use crate::harness::plane::{Paused, pin_self, signal, with_control_plane};
use crate::harness::procfs::{machine_ticks, process_memory};
use crate::harness::stats::Pooled;
use crate::reviews;
use cells::{
    ATTEMPTS, Attempt, Bodies, CLIENT_CPU, GO, MAPPINGS, OURS, QUIET_WAIT, REPEATS, SERVER_CPU,
    STEAL_MAX_PCT, keep,
};
use servers::{
    CpuLimit, answer, check_answers, deployment_cpu_limit, go_profile, start as start_servers,
};

pub use cells::Results;
pub use render::{ATTEMPTS_CSV, attempts_csv, render};

/// Waits until a second passes without steal, or [`QUIET_WAIT`] has passed.
async fn wait_for_quiet() {
    let deadline = tokio::time::Instant::now() + QUIET_WAIT;
    let Ok(mut before) = machine_ticks() else {
        return;
    };
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(now) = machine_ticks() else {
            return;
        };
        if now.steal == before.steal {
            return;
        }
        before = now;
    }
}

/// Runs the whole section on a control plane of its own.
pub async fn run(quick: bool) -> anyhow::Result<Results> {
    with_control_plane(Options::default(), async |cp| measure(cp, quick).await).await
}

async fn measure(cp: &ControlPlane, quick: bool) -> anyhow::Result<Results> {
    let admin = cp.admin().await?;
    cp_tests::fixtures::apply_our_crds(&admin).await?;
    // The mappings exist before the webhook starts (no admission for them: it is not registered);
    // its readiness waits for the first complete listing in its index.
    let mappings = if quick { 2_000 } else { MAPPINGS };
    create_mappings(&admin, numbered_mappings(mappings)).await?;

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let pinned = cores >= 2;
    let wrap: Vec<&str> = if pinned {
        vec!["taskset", "-c", SERVER_CPU]
    } else {
        vec![]
    };
    let servers = start_servers(cp, &wrap).await?;
    let bodies = Bodies {
        mutate: Bytes::from(reviews::mutate_create()?),
        validate: Bytes::from(reviews::validate_update()?),
        mapping: Bytes::from(reviews::mapping_create("m-new", "m-new")?),
        channels_off: Bytes::from(reviews::validate_channels_off()?),
    };
    check_answers(&servers, &bodies.mutate, &bodies.validate).await?;
    let v = answer(
        &servers.target(OURS, "/validate-servicemapping", &bodies.mapping),
        "cp-webhook",
    )
    .await?;
    anyhow::ensure!(v["response"]["allowed"] == true, "a new mapping: {v}");
    let duplicate = Bytes::from(reviews::mapping_create("m-dup", "m-00042")?);
    let v = answer(
        &servers.target(OURS, "/validate-servicemapping", &duplicate),
        "cp-webhook",
    )
    .await?;
    anyhow::ensure!(
        v["response"]["allowed"] == false
            && v["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("m-00042 already maps")),
        "the webhook's index must hold the mappings (a duplicate of m-00042 was not refused): {v}"
    );

    // Switching service channels off while the mappings exist: refused, with a message that names a
    // count and three of them, in time independent of how many there are.
    let v = answer(
        &servers.target(OURS, "/validate", &bodies.channels_off),
        "cp-webhook",
    )
    .await?;
    let off_message = v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        v["response"]["allowed"] == false && off_message.contains(&mappings.to_string()),
        "switching service channels off with {mappings} mappings must be refused naming their count: {v}"
    );
    let limit = deployment_cpu_limit()
        .map_err(|e| format!("{e:#}"))
        .and_then(|m| {
            CpuLimit::new(m)
                .map(|l| (m, l))
                .map_err(|e| format!("{e:#}"))
        });
    let cells = cells::all(&bodies, limit.is_ok());
    let (repeats, attempts, warmup, measure, open_measure) = if quick {
        (
            1,
            1,
            Duration::from_millis(200),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
    } else {
        (
            REPEATS,
            ATTEMPTS,
            Duration::from_millis(300),
            Duration::from_secs(2),
            Duration::from_secs(3),
        )
    };
    if pinned {
        pin_self(CLIENT_CPU)?;
    }
    let mut runs: BTreeMap<(usize, usize), Vec<Stats>> = BTreeMap::new();
    let mut pooled: BTreeMap<(usize, usize), Pooled> = BTreeMap::new();
    let mut log: Vec<Attempt> = Vec::new();
    let profile;
    {
        // The control plane sleeps through the admission runs; the servers take turns.
        let plane: Vec<u32> = ["etcd", "kube-apiserver", "kube-controller-manager"]
            .iter()
            .filter_map(|n| cp.pid(n))
            .collect();
        let _plane = Paused::new(plane);
        let _servers = Paused::new(servers.list.iter().map(|s| s.pid).collect());
        for rep in 0..repeats {
            for (ci, cell) in cells.iter().enumerate() {
                for &si in &cell.servers {
                    let server = &servers.list[si];
                    let m = if matches!(cell.mode, Mode::Open(_)) {
                        open_measure
                    } else {
                        measure
                    };
                    let mut made: Vec<Stats> = Vec::new();
                    for attempt in 1..=attempts {
                        if attempts > 1 {
                            wait_for_quiet().await;
                        }
                        signal(server.pid, "CONT");
                        let limited = match (&limit, cell.limited) {
                            (Ok((_, l)), true) => {
                                l.enter(server.pid)?;
                                Some(l)
                            }
                            _ => None,
                        };
                        let stats = load::run_in(
                            &servers.target(si, cell.path, &cell.body),
                            cell.mode,
                            warmup,
                            m,
                            server.pid,
                            limited.map(|l| l.dir.clone()),
                        )
                        .await;
                        if let Some(l) = limited {
                            l.leave(server.pid)?;
                        }
                        signal(server.pid, "STOP");
                        let what = format!("{} {} {}", server.name, cell.path, cell.mode.label());
                        let stats = stats.with_context(|| what.clone())?;
                        println!("rep {rep} attempt {attempt} {what}: {stats:?}");
                        let quiet = stats.steal_pct <= STEAL_MAX_PCT;
                        pooled.entry((ci, si)).or_default().add(&stats.latencies.0);
                        made.push(stats);
                        if quiet {
                            break;
                        }
                    }
                    let kept = keep(&made);
                    let n = made.len() as u32;
                    for (i, mut stats) in made.into_iter().enumerate() {
                        // The latencies are pooled; the log keeps the figures.
                        stats.latencies = Default::default();
                        if Some(i) == kept {
                            let mut k = stats.clone();
                            k.attempts = n;
                            runs.entry((ci, si)).or_default().push(k);
                        }
                        log.push(Attempt {
                            rep,
                            attempt: i as u32 + 1,
                            cell: ci,
                            server: si,
                            kept: Some(i) == kept,
                            stats,
                        });
                    }
                }
            }
        }
        let go = &servers.list[GO];
        signal(go.pid, "CONT");
        profile = go_profile(
            &servers.pprof_addr,
            &servers.target(GO, "/validate", &bodies.validate),
            go.pid,
            &cp.dir,
        )
        .await
        .map_err(|e| format!("{e:#}"));
        signal(go.pid, "STOP");
    }
    if pinned {
        pin_self(&format!("0-{}", cores - 1))?;
    }
    let rss = process_memory(servers.list[OURS].pid).ok();
    Ok(Results {
        names: servers.list.iter().map(|s| s.name).collect(),
        cells,
        runs,
        pooled,
        log,
        repeats,
        attempts,
        measure,
        open_measure,
        pinned,
        limit: limit.map(|(m, _)| m),
        mappings,
        bodies: vec![
            ("/mutate", bodies.mutate.len()),
            ("/validate", bodies.validate.len()),
            ("/validate-servicemapping", bodies.mapping.len()),
        ],
        rss,
        off_message,
        profile,
        gogc: std::env::var("GOGC").unwrap_or_else(|_| "unset (100)".into()),
    })
}
