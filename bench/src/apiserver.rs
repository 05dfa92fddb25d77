//! Admission as a user meets it: ConnectivityProxy creates and patches through kube-apiserver, with the
//! module's webhooks registered and without them, closed loop (one write at a time) and open loop (a
//! write every 5 ms whatever the previous ones do, each timed from when it was due, so queueing counts).
//! The figure is the p99 the webhooks add (goal: ≤ 1 ms at 200 writes/s).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cp_tests::cluster::{ControlPlane, Options};
use cp_tests::webhook::Webhook;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::controller::Percentiles;

const NS: &str = "bench-admission";
/// The open loop's rate.
const RATE: u64 = 200;
/// The goal for the p99 the webhooks add at [`RATE`].
const GOAL_MS: f64 = 1.0;

/// One row: a loop, an operation, with or without the webhooks.
#[derive(Clone, Debug)]
pub struct Row {
    /// "closed" or "open 200/s".
    pub mode: String,
    /// "create" or "patch".
    pub op: &'static str,
    /// Without the webhooks.
    pub off: Percentiles,
    /// With them.
    pub on: Percentiles,
}

fn cr(name: &str) -> DynamicObject {
    serde_json::from_value(cp_api::testing::cr_json(
        NS,
        name,
        cp_api::testing::default_spec_json(),
    ))
    .unwrap_or_else(|e| panic!("the default CR does not parse: {e}"))
}

fn port_patch(i: usize) -> serde_json::Value {
    json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": 20000 + (i % 500) as i64}}}}}})
}

async fn one(api: &Api<DynamicObject>, op: &str, name: &str, i: usize) -> anyhow::Result<()> {
    match op {
        "create" => {
            api.create(&PostParams::default(), &cr(name)).await?;
        }
        _ => {
            api.patch(name, &PatchParams::default(), &Patch::Merge(port_patch(i)))
                .await?;
        }
    }
    Ok(())
}

/// `n` writes one after the other; milliseconds each.
async fn closed(
    api: &Api<DynamicObject>,
    op: &'static str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}-{:05}", i);
        let t = Instant::now();
        one(api, op, &name, i + 1).await?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

/// `n` writes at [`RATE`] per second, each timed from when it was due; milliseconds each.
async fn open(
    api: &Api<DynamicObject>,
    op: &'static str,
    prefix: &str,
    names: usize,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let start = Instant::now() + Duration::from_millis(50);
    let api = Arc::new(api.clone());
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let due = start + Duration::from_micros(i as u64 * 1_000_000 / RATE);
        tokio::time::sleep_until(due.into()).await;
        let api = api.clone();
        let name = if op == "create" {
            format!("{prefix}-{i:05}")
        } else {
            format!("{prefix}-{:05}", i % names)
        };
        tasks.push(tokio::spawn(async move {
            one(&api, op, &name, i + 7).await?;
            Ok::<f64, anyhow::Error>(due.elapsed().as_secs_f64() * 1e3)
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// The four measurements with the API server as it is (webhooks registered or not); `tag` keeps
/// the names apart.
async fn measure(admin: &Client, tag: &str, quick: bool) -> anyhow::Result<[Vec<f64>; 4]> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        NS,
        &kube::api::ApiResource::erase::<cp_api::ConnectivityProxy>(&()),
    );
    let (n_closed, n_open) = if quick { (50, 200) } else { (300, 2_000) };
    let created = closed(&api, "create", &format!("{tag}-c"), n_closed).await?;
    let patched = closed(&api, "patch", &format!("{tag}-c"), n_closed).await?;
    let open_created = open(&api, "create", &format!("{tag}-o"), 0, n_open).await?;
    let open_patched = open(&api, "patch", &format!("{tag}-c"), n_closed, n_open).await?;
    Ok([created, patched, open_created, open_patched])
}

/// Runs the section on a control plane of its own.
pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let cp: ControlPlane =
        tokio::task::spawn_blocking(|| ControlPlane::start(Options::default())).await??;
    let admin = cp.admin().await?;
    cp_tests::fixtures::apply_our_crds(&admin).await?;
    cp_tests::cluster::ensure_namespace(&admin, NS).await?;
    // Warm the API server's paths (discovery, the CRD's storage) before anything is timed.
    let _ = measure(&admin, "warm", true).await?;
    let off = measure(&admin, "off", quick).await?;
    let wh = Webhook::start(&cp, "cp-webhook", &["--privileged-groups=system:masters"]).await?;
    wh.register(&admin).await?;
    // Admission is on once a create comes back with the injected defaults.
    let api: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        NS,
        &kube::api::ApiResource::erase::<cp_api::ConnectivityProxy>(&()),
    );
    let mut probe = 0;
    loop {
        let obj = api
            .create(&PostParams::default(), &cr(&format!("probe-{probe}")))
            .await?;
        if obj.data["spec"]["deployment"].is_object() {
            break;
        }
        probe += 1;
        anyhow::ensure!(
            probe < 100,
            "the webhooks never started to inject the defaults"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = measure(&admin, "warm-on", true).await?;
    let on = measure(&admin, "on", quick).await?;
    drop(wh);
    drop(cp);
    let modes = [
        ("closed", "create"),
        ("closed", "patch"),
        ("open 200/s", "create"),
        ("open 200/s", "patch"),
    ];
    Ok(modes
        .iter()
        .zip(off.iter().zip(on.iter()))
        .map(|((mode, op), (off, on))| Row {
            mode: mode.to_string(),
            op,
            off: Percentiles::of(off),
            on: Percentiles::of(on),
        })
        .collect())
}

/// The section of BENCHMARKS.md.
pub fn render(rows: &[Row]) -> String {
    let mut s = String::from(
        "## Admission through the API server\n\n\
         ConnectivityProxy creates and patches (the default CR; a patch of `spec.config.servers.proxy.http.port`) \
         by an admin client through kube-apiserver on loopback, first without the module's webhooks, then with both \
         registered (`cp-webhook`, the mutating and the validating configuration). Closed loop: one write at a time. \
         Open loop: a write every 5 ms (200/s) whatever the earlier ones do, each timed from when it was due, so a \
         queue counts. Goal: the webhooks add ≤ 1 ms to the p99 at 200 writes/s.\n\n\
         | loop | write | n | p50 without | p99 without | p50 with | p99 with | p99 added | goal ≤ 1 ms |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        let added = r.on.p99_ms - r.off.p99_ms;
        let verdict = if !r.mode.starts_with("open") {
            "—"
        } else if added <= GOAL_MS {
            "met"
        } else {
            "missed"
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:+.2} ms | {verdict} |",
            r.mode, r.op, r.on.samples, r.off.p50_ms, r.off.p99_ms, r.on.p50_ms, r.on.p99_ms, added
        );
    }
    s.push('\n');
    s
}
