//! The fleet view (KCP): the fleet dashboard's queries against a real Prometheus holding a fleet's
//! series.

use std::fmt::Write as _;
use std::time::Instant;

use crate::harness::report::met;
use crate::harness::stats::{median, range};

/// The fleet dashboard's queries against a real Prometheus (built from its Go module) holding a fleet's
/// series, backfilled with promtool: each panel's query time (goal < 1 s), Grafana's instant query at
/// "now" with every runtime selected, five times each.
pub async fn section(quick: bool) -> anyhow::Result<String> {
    const GOAL: f64 = 1.0;
    let runtimes = if quick { 500 } else { 5_000 };
    let dir = std::env::temp_dir().join(format!("cp-bench-fleet-{}", std::process::id()));
    let (prom, backfill) = cp_tests::prometheus::fleet::start(&dir, runtimes).await?;
    let mut rows = String::new();
    let mut worst: f64 = 0.0;
    for (title, expr) in cp_tests::prometheus::fleet::queries()? {
        let mut times = Vec::new();
        let mut series = 0;
        for _ in 0..5 {
            let t = Instant::now();
            series = prom.query(&expr, None).await?.len();
            times.push(t.elapsed().as_secs_f64());
        }
        let (mid, max) = (median(times.clone()), range(&times).1);
        worst = worst.max(max);
        writeln!(
            rows,
            "| {title} | {series} | {:.1} ms | {:.1} ms | {} |",
            mid * 1e3,
            max * 1e3,
            met(max < GOAL)
        )?;
    }
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "## Fleet view (KCP)\n\n\
         The fleet dashboard (`manifests/monitoring/fleet-dashboard.yaml`) queried by a real Prometheus (built from \
         its Go module by `hack/prom-bins.sh`) holding {runtimes} runtimes' synthetic series ({series} series, \
         {samples} samples over 25 hours: every 15 minutes, every minute in the last hour), backfilled with \
         `promtool tsdb create-blocks-from openmetrics` in {took:.0} s. Each panel's query as Grafana sends it \
         (instant, at now, every runtime selected), five times over HTTP on loopback; goal: < 1 s each. \
         Verdict: {verdict} (slowest {worst:.0} ms).\n\n\
         | panel | series | median | max | goal < 1 s |\n| --- | --- | --- | --- | --- |\n{rows}\n",
        series = backfill.series,
        samples = backfill.samples,
        took = backfill.took.as_secs_f64(),
        verdict = met(worst < GOAL),
        worst = worst * 1e3,
    ))
}
