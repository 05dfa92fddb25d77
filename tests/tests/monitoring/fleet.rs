//! The fleet dashboard's queries against a real Prometheus holding 5,000 runtimes' series
//! (backfilled with promtool): every panel answers with series. Their query times are `make bench`'s
//! (BENCHMARKS.md, "Fleet view"), not a test's.

use cp_tests::prometheus::fleet;

/// The fleet size the dashboard is built for (issue #34).
const RUNTIMES: usize = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fleet_panel_answers_over_five_thousand_runtimes() {
    let dir = std::env::temp_dir().join(format!("cp-prometheus-fleet-{}", std::process::id()));
    let (prom, backfill) = fleet::start(&dir, RUNTIMES)
        .await
        .expect("backfilled Prometheus");
    println!("{backfill:?}");
    let queries = fleet::queries().expect("fleet dashboard");
    assert!(queries.len() >= 10, "{} queries", queries.len());
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let series = prom
            .query(expr, None)
            .await
            .unwrap_or_else(|e| panic!("panel {title:?}: {e:#}"));
        println!("{:>5} series  {title}", series.len());
        if series.is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    // The runtimes panel counts every runtime.
    let runtimes = prom
        .query(&queries[0].1, None)
        .await
        .expect("runtimes panel");
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(empty.is_empty(), "panels without series: {empty:#?}");
    assert_eq!(
        runtimes.first().map(|s| s.value.as_str()),
        Some(RUNTIMES.to_string().as_str()),
        "{:?}",
        queries[0]
    );
}
