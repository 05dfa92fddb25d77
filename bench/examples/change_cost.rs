//! What one ServiceMapping change costs the controller with many present, on a local control plane
//! (no node): for profiling, not a BENCHMARKS.md figure (the node section's scale phase is).
//!
//!     CP_BIN_DIR=<dir with cp-controller> change_cost [mappings] [changes]
//!
//! Starts a control plane, the controller from `CP_BIN_DIR`, the default CR (the bench's stand-ins
//! bring it to Ready), creates `mappings` (default 50,000) straight through the API server, waits
//! until every one is taken over with its endpoint, then creates `changes` (default 30) more one at
//! a time, each waited for until it has its endpoint. Prints the time to adopt them all, the
//! controller's CPU per change and its reconciles and API writes per change. With `CP_PERF_OUT` set,
//! `perf record -g` follows the controller over the single changes and writes there.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use anyhow::Context;
use cp_api::{ConnectivityProxy, ServiceMapping};
use cp_bench::harness::mappings::{adopted, create_mappings, numbered_mappings, tcp_mapping};
use cp_bench::harness::metrics::{metric_sum, scrape};
use cp_bench::harness::plane::{pid, with_control_plane};
use cp_bench::harness::procfs::process_cpu_us;
use cp_bench::harness::watch::{wait_until, watch_count, watch_one};
use cp_bench::measure::controller::common::{
    CONTROLLER_PROCESS, CR, CrView, DOMAIN, NS, install_prerequisites, play_until_ready, settle,
};
use cp_tests::controller::ControllerProcess;
use kube::api::{Api, PostParams};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(50_000), |s| s.parse())?;
    let changes: usize = args.next().map_or(Ok(30), |s| s.parse())?;
    with_control_plane(Default::default(), async |cp| {
        let admin = cp.admin().await?;
        install_prerequisites(&admin, DOMAIN).await?;
        let ctrl =
            ControllerProcess::start(cp, CONTROLLER_PROCESS, &["--webhook-ips=127.0.0.1"]).await?;
        let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
        let cr_watch = watch_one(crs.clone(), CR, CrView::of);
        crs.create(
            &PostParams::default(),
            &cp_tests::fixtures::default_connectivity_proxy(CR),
        )
        .await?;
        play_until_ready(&admin, cr_watch.rx.clone(), Duration::from_secs(60)).await?;
        settle(&ctrl).await?;
        let api: Api<ServiceMapping> = Api::all(admin.clone());
        let mut taken = watch_count(api.clone(), adopted);
        let t0 = Instant::now();
        create_mappings(&admin, numbered_mappings(n)).await?;
        let created = t0.elapsed();
        let (at, _) = wait_until(
            &mut taken,
            &format!("{n} adopted"),
            Duration::from_secs(1800),
            |c| *c == n,
        )
        .await?;
        println!(
            "created {n} in {:.1} s; all adopted {:.1} s after the last create",
            created.as_secs_f64(),
            at.saturating_duration_since(t0 + created).as_secs_f64()
        );
        settle(&ctrl).await?;
        let p = pid(cp, CONTROLLER_PROCESS)?;
        let perf = match std::env::var("CP_PERF_OUT") {
            Ok(out) => Some(
                std::process::Command::new("perf")
                    .args(["record", "-F", "499", "-g", "-o", &out, "-p", &p.to_string()])
                    .spawn()
                    .context("starting perf")?,
            ),
            Err(_) => None,
        };
        let metrics = |text: &str| {
            (
                metric_sum(text, "cp_controller_reconcile_total"),
                metric_sum(text, "cp_controller_writes_total"),
            )
        };
        let before = metrics(&scrape(&ctrl.metrics_addr, "controller").await?);
        let (c0, w0) = (process_cpu_us(p)?, Instant::now());
        for i in 1..=changes {
            let name = format!("one-{i:03}");
            api.create(&PostParams::default(), &tcp_mapping(&name))
                .await?;
            wait_until(
                &mut taken,
                &format!("{name} adopted"),
                Duration::from_secs(60),
                |c| *c == n + i,
            )
            .await?;
        }
        let window = w0.elapsed();
        let spent = process_cpu_us(p)? - c0;
        settle(&ctrl).await?;
        let after = metrics(&scrape(&ctrl.metrics_addr, "controller").await?);
        if let Some(mut perf) = perf {
            cp_bench::harness::plane::signal(perf.id(), "INT");
            let _ = perf.wait();
        }
        println!(
            "{changes} changes in {:.1} s: controller CPU {:.2} ms per change, {:.1} reconciles and {:.1} writes per change",
            window.as_secs_f64(),
            spent as f64 / 1000.0 / changes as f64,
            (after.0 - before.0) / changes as f64,
            (after.1 - before.1) / changes as f64,
        );
        Ok(())
    })
    .await
}
