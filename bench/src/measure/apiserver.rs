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

use crate::harness::metrics::metric_sum;
use crate::harness::plane::with_control_plane;
use crate::harness::procfs::process_cpu_us;
use crate::harness::report::met;
use crate::harness::stats::{Percentiles, ms};

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
    /// Where the CPU went, without and with the webhooks.
    pub cost_off: Cost,
    pub cost_on: Cost,
}

/// CPU per write of each process over one measurement, and the webhook calls the API server made
/// in it as its own metrics count them.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    pub writes: usize,
    /// kube-apiserver, etcd, cp-webhook, this client: CPU ms per write.
    pub apiserver_ms: f64,
    pub etcd_ms: f64,
    pub webhook_ms: f64,
    pub client_ms: f64,
    /// Webhook calls (`apiserver_admission_webhook_admission_duration_seconds_count`) and their
    /// mean duration as the API server measured it, ms.
    pub calls: f64,
    pub call_mean_ms: f64,
    /// The API server's whole admission step per write (`apiserver_admission_step_admission_duration_seconds`), ms.
    pub admission_mean_ms: f64,
    /// Connections the webhook refused in the measurement (`cp_webhook_connections_refused_total`).
    pub refused: f64,
    /// Connections the webhook accepted since it started, HTTP/2 and HTTP/1.1, counted at the end of
    /// the measurement (`cp_webhook_connections_total`; the API server keeps its connections open).
    pub h2: f64,
    pub h1: f64,
}

/// What [`Cost`] is computed from: CPU so far of each process, and the metric sums.
#[derive(Clone, Copy, Default)]
struct Snapshot {
    cpu_us: [u64; 4],
    call_sum: f64,
    call_count: f64,
    step_sum: f64,
    refused: f64,
    h2: f64,
    h1: f64,
}

/// The processes [`Cost`] reads, by name in the control plane (the client is this process).
struct Meter<'a> {
    cp: &'a ControlPlane,
    admin: Client,
    webhook_metrics: Option<String>,
}

impl Meter<'_> {
    async fn snapshot(&self) -> Snapshot {
        let cpu = |pid: Option<u32>| pid.and_then(|p| process_cpu_us(p).ok()).unwrap_or(0);
        let mut s = Snapshot {
            cpu_us: [
                cpu(self.cp.pid("kube-apiserver")),
                cpu(self.cp.pid("etcd")),
                cpu(self.cp.pid("cp-webhook")),
                cpu(Some(std::process::id())),
            ],
            ..Snapshot::default()
        };
        let req = http::Request::get("/metrics").body(Vec::new());
        if let Ok(req) = req
            && let Ok(text) = self.admin.request_text(req).await
        {
            s.call_sum = metric_sum(
                &text,
                "apiserver_admission_webhook_admission_duration_seconds_sum",
            );
            s.call_count = metric_sum(
                &text,
                "apiserver_admission_webhook_admission_duration_seconds_count",
            );
            s.step_sum = metric_sum(
                &text,
                "apiserver_admission_step_admission_duration_seconds_sum",
            );
        }
        if let Some(addr) = &self.webhook_metrics
            && let Ok((200, text)) = cp_tests::webhook::http_get(addr, "/metrics").await
        {
            s.refused = metric_sum(&text, "cp_webhook_connections_refused_total");
            s.h2 = metric_sum(&text, "cp_webhook_connections_total{protocol=\"h2\"}");
            s.h1 = metric_sum(&text, "cp_webhook_connections_total{protocol=\"http/1.1\"}");
        }
        s
    }

    fn cost(a: Snapshot, b: Snapshot, writes: usize) -> Cost {
        let per =
            |i: usize| b.cpu_us[i].saturating_sub(a.cpu_us[i]) as f64 / 1e3 / writes.max(1) as f64;
        let calls = b.call_count - a.call_count;
        Cost {
            writes,
            apiserver_ms: per(0),
            etcd_ms: per(1),
            webhook_ms: per(2),
            client_ms: per(3),
            calls,
            call_mean_ms: if calls > 0.0 {
                (b.call_sum - a.call_sum) * 1e3 / calls
            } else {
                0.0
            },
            admission_mean_ms: (b.step_sum - a.step_sum) * 1e3 / writes.max(1) as f64,
            refused: b.refused - a.refused,
            h2: b.h2,
            h1: b.h1,
        }
    }
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
        out.push(ms(t.elapsed()));
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
            Ok::<f64, anyhow::Error>(ms(due.elapsed()))
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// The four measurements with the API server as it is (webhooks registered or not), each with
/// where its CPU went; `tag` keeps the names apart.
async fn measure(
    meter: &Meter<'_>,
    tag: &str,
    quick: bool,
) -> anyhow::Result<[(Vec<f64>, Cost); 4]> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        meter.admin.clone(),
        NS,
        &kube::api::ApiResource::erase::<cp_api::ConnectivityProxy>(&()),
    );
    let (n_closed, n_open) = if quick { (50, 200) } else { (300, 2_000) };
    let a = meter.snapshot().await;
    let created = closed(&api, "create", &format!("{tag}-c"), n_closed).await?;
    let b = meter.snapshot().await;
    let patched = closed(&api, "patch", &format!("{tag}-c"), n_closed).await?;
    let c = meter.snapshot().await;
    let open_created = open(&api, "create", &format!("{tag}-o"), 0, n_open).await?;
    let d = meter.snapshot().await;
    let open_patched = open(&api, "patch", &format!("{tag}-c"), n_closed, n_open).await?;
    let e = meter.snapshot().await;
    Ok([
        (created, Meter::cost(a, b, n_closed)),
        (patched, Meter::cost(b, c, n_closed)),
        (open_created, Meter::cost(c, d, n_open)),
        (open_patched, Meter::cost(d, e, n_open)),
    ])
}

/// Runs the section on a control plane of its own.
pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (off, on) =
        with_control_plane(Options::default(), async |cp| measure_both(cp, quick).await).await?;
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
            off: Percentiles::of(&off.0),
            on: Percentiles::of(&on.0),
            cost_off: off.1.clone(),
            cost_on: on.1.clone(),
        })
        .collect())
}

/// The four measurements without the webhooks, then with them registered.
async fn measure_both(
    cp: &ControlPlane,
    quick: bool,
) -> anyhow::Result<([(Vec<f64>, Cost); 4], [(Vec<f64>, Cost); 4])> {
    let admin = cp.admin().await?;
    cp_tests::fixtures::apply_our_crds(&admin).await?;
    cp_tests::cluster::ensure_namespace(&admin, NS).await?;
    let mut meter = Meter {
        cp,
        admin: admin.clone(),
        webhook_metrics: None,
    };
    // Warm the API server's paths (discovery, the CRD's storage) before anything is timed.
    let _ = measure(&meter, "warm", true).await?;
    let off = measure(&meter, "off", quick).await?;
    let wh = Webhook::start(cp, "cp-webhook", &["--privileged-groups=system:masters"]).await?;
    wh.register(&admin).await?;
    meter.webhook_metrics = Some(wh.metrics_addr.clone());
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
    let _ = measure(&meter, "warm-on", true).await?;
    let on = measure(&meter, "on", quick).await?;
    Ok((off, on))
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
        let verdict = if r.mode.starts_with("open") {
            met(added <= GOAL_MS)
        } else {
            "—"
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:+.2} ms | {verdict} |",
            r.mode, r.op, r.on.samples, r.off.p50_ms, r.off.p99_ms, r.on.p50_ms, r.on.p99_ms, added
        );
    }
    s.push_str(
        "\nWhere the time and the CPU went (CPU per write of each process over the measurement, from \
         `/proc/<pid>/stat`; the webhook calls and their mean duration as kube-apiserver's own metrics \
         `apiserver_admission_webhook_admission_duration_seconds` count them; the API server's whole admission step per \
         write from `apiserver_admission_step_admission_duration_seconds`; connections `cp-webhook` refused from \
         `cp_webhook_connections_refused_total`). Everything shares this machine's 2 cores.\n\n\
         | loop | write | webhooks | kube-apiserver CPU ms/write | etcd | cp-webhook | client | webhook calls | mean call ms (API server's view) | admission step ms/write | connections opened since the webhook started (h2 / http/1.1) | refused connections |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        for (label, c) in [("without", &r.cost_off), ("with", &r.cost_on)] {
            let _ = writeln!(
                s,
                "| {} | {} | {label} | {:.2} | {:.2} | {:.3} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} / {:.0} | {:.0} |",
                r.mode,
                r.op,
                c.apiserver_ms,
                c.etcd_ms,
                c.webhook_ms,
                c.client_ms,
                c.calls,
                c.call_mean_ms,
                c.admission_mean_ms,
                c.h2,
                c.h1,
                c.refused
            );
        }
    }
    s.push('\n');
    s
}
