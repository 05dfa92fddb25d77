//! `make bench`: runs every measurement side by side and writes `BENCHMARKS.md`.
//!
//! `cp-bench [--quick] [--out FILE]` measures; `cp-bench floor ADDR CERT KEY` is the floor server it
//! starts as a separate process (`cp_bench::floor`). `CP_BENCH_ONLY=<section>` runs one section of
//! `cp_bench::measure` (webhook, controller, apiserver, node or fleet) and writes it to
//! `BENCHMARKS-<section>.md` (unless `--out` names another file).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use cp_bench::harness::report;
use cp_bench::measure;

/// The floor server runs in this binary: it allocates like cp-webhook (`cp_webhook::memory`), so the
/// two compare on the same allocator. The load generator shares it.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("floor") {
        // As cp-webhook starts.
        if let Err(e) = cp_webhook::memory::no_huge_pages() {
            eprintln!("{e}");
        }
        let [_, addr, cert, key] = args.as_slice() else {
            anyhow::bail!("usage: cp-bench floor ADDR CERT KEY");
        };
        // The same runtime as cp-webhook's `#[tokio::main]`.
        return tokio::runtime::Runtime::new()?.block_on(cp_bench::floor::serve(addr, cert, key));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // One section alone is written beside the full report, never over it: BENCHMARKS.md's
            // figures all come from one run.
            let name = match std::env::var("CP_BENCH_ONLY").unwrap_or_default().as_str() {
                "" => "BENCHMARKS.md".to_string(),
                only => format!("BENCHMARKS-{only}.md"),
            };
            cp_tests::workspace_root().join(name)
        });
    // The webhook and the controller are the release binaries beside this one
    // (`cp_tests::own_bin_dir`); `make bench` sets CP_WEBHOOK_LOG and CP_CONTROLLER_LOG to warn.
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(quick, &out))
}

/// Measures section `name` unless CP_BENCH_ONLY names another one; `what` names it in errors.
/// The sections `CP_BENCH_ONLY` selects (all when it is empty).
struct Only(String);

impl Only {
    /// Runs `measure` when section `name` is selected; a failure names `what` was measured.
    async fn run<T>(
        &self,
        name: &str,
        what: &'static str,
        measure: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<Option<T>> {
        if self.0.is_empty() || self.0 == name {
            Ok(Some(measure.await.context(what)?))
        } else {
            Ok(None)
        }
    }
}

async fn run(quick: bool, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let only = Only(std::env::var("CP_BENCH_ONLY").unwrap_or_default());
    let webhook = measure::webhook::run(quick);
    let webhook = only.run("webhook", "webhook benchmarks", webhook).await?;
    let criterion = measure::criterion::section();
    let controller = measure::controller::run(quick);
    let controller = only
        .run("controller", "controller benchmarks", controller)
        .await?;
    let apiserver = measure::apiserver::run(quick);
    let apiserver = only
        .run("apiserver", "admission through the API server", apiserver)
        .await?;
    let node = measure::node::run(quick);
    let node = only
        .run("node", "memory and start-up on the real node", node)
        .await?;
    let fleet = only
        .run("fleet", "fleet view", measure::fleet::section(quick))
        .await?;
    let mut md = report::head(quick, started.elapsed());
    md.push_str(&measure::machine::machine());
    md.push_str(&measure::machine::images());
    md.extend(webhook.as_ref().map(measure::webhook::render));
    md.push_str(&criterion);
    md.extend(controller.as_ref().map(measure::controller::render));
    md.extend(apiserver.as_deref().map(measure::apiserver::render));
    md.extend(node.as_ref().map(measure::node::render));
    md.extend(fleet);
    report::write(out, &md)?;
    if let Some(n) = &node {
        report::write(
            &out.with_file_name(measure::node::plot::FILE),
            &measure::node::plot::svg(&n.phases),
        )?;
    }
    if let Some(w) = &webhook {
        report::write(
            &out.with_file_name(measure::webhook::ATTEMPTS_CSV),
            &measure::webhook::attempts_csv(w),
        )?;
    }
    println!("{md}");
    println!("wrote {}", out.display());
    Ok(())
}
