//! `make bench`: runs every measurement side by side and writes `BENCHMARKS.md`.
//!
//! `cp-bench [--quick] [--out FILE]` measures; `cp-bench ceiling ADDR CERT KEY` is the TLS ceiling
//! server it starts as a separate process.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use cp_bench::load::{self, Stats, Target};
use cp_bench::reviews;
use cp_tests::ControlPlane;
use cp_tests::cluster::Options;
use cp_tests::webhook::Webhook;

const CONCURRENCY: [usize; 3] = [1, 16, 64];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("ceiling") {
        let [_, addr, cert, key] = args.as_slice() else {
            anyhow::bail!("usage: cp-bench ceiling ADDR CERT KEY");
        };
        let body = Bytes::from(reviews::fixed_response()?);
        return tokio::runtime::Runtime::new()?
            .block_on(cp_bench::ceiling::serve(addr, cert, key, body));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| cp_tests::workspace_root().join("BENCHMARKS.md"));
    // The webhook and the controller are the release binaries beside this one
    // (`cp_tests::own_bin_dir`); `make bench` sets CP_WEBHOOK_LOG and CP_CONTROLLER_LOG to warn.
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(quick, &out))
}

async fn run(quick: bool, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut md = String::new();
    let only = std::env::var("CP_BENCH_ONLY").unwrap_or_default();
    let webhook = if only.is_empty() || only == "webhook" {
        webhook_section(quick).await.context("webhook benchmarks")?
    } else {
        String::new()
    };
    let criterion = criterion_section();
    let controller = if only.is_empty() || only == "controller" {
        cp_bench::controller::render(
            &cp_bench::controller::run(quick)
                .await
                .context("controller benchmarks")?,
        )
    } else {
        String::new()
    };
    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Written by `make bench` ({}) on {}; the whole run took {:.0} s. Loopback only; client and \
         servers share the machine's cores.\n",
        if quick { "quick mode" } else { "full run" },
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        started.elapsed().as_secs_f64()
    )?;
    md.push_str(&machine());
    md.push_str(&images());
    md.push_str(&webhook);
    md.push_str(&criterion);
    md.push_str(&controller);
    let analysis = cp_tests::workspace_root().join("bench/ANALYSIS.md");
    if let Ok(text) = std::fs::read_to_string(&analysis) {
        md.push('\n');
        md.push_str(&text);
    }
    std::fs::write(out, &md).with_context(|| format!("writing {}", out.display()))?;
    println!("{md}");
    println!("wrote {}", out.display());
    Ok(())
}

fn cmd_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| "not found".into())
}

/// The images `make images` built (goal: each < 20 MB).
fn images() -> String {
    let mut out = String::from(
        "## Images

Built by `make images` (static release binaries on an empty base); goal: each < 20 MB.

         | image | size | goal |\n| --- | --- | --- |\n",
    );
    for name in ["webhook", "controller"] {
        let image = cp_tests::container::image(name);
        let size =
            cp_tests::container::podman(&["image", "inspect", "--format", "{{.Size}}", &image])
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .trim()
                        .parse::<u64>()
                        .ok()
                });
        match size {
            Some(b) => out.push_str(&format!(
                "| `{image}` | {:.1} MB ({b} bytes) | {} |\n",
                b as f64 / 1e6,
                if b < 20_000_000 { "met" } else { "missed" }
            )),
            None => out.push_str(&format!(
                "| `{image}` | not built (run `make images`) | |\n"
            )),
        }
    }
    out.push('\n');
    out
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        .and_then(|k| k.parse::<u64>().ok())
        .map(|k| format!("{:.1} GiB", k as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let k8s = cp_tests::cluster::k8s_bin_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    format!(
        "## Machine and versions\n\n| | |\n| --- | --- |\n| CPU | {model}, {cores} cores |\n| memory | {mem} |\n\
         | rustc | {} |\n| go | {} |\n| Kubernetes binaries | `{}` |\n| operator | {} (release build) |\n\n",
        cmd_version("rustc", &["-V"]),
        cmd_version("go", &["version"]),
        k8s.rsplit('/').nth(1).unwrap_or(&k8s),
        env!("CARGO_PKG_VERSION"),
    )
}

fn go_peer() -> PathBuf {
    std::env::var_os("CP_GO_PEER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/cp-operator/bench/go-webhook")
        })
}

async fn wait_answers(target: &Target, what: &str) -> anyhow::Result<Bytes> {
    cp_tests::wait::until(
        &format!("{what} to answer 200"),
        Duration::from_secs(30),
        || async {
            match load::probe(target).await {
                Ok((true, body)) => Ok(Some(body)),
                Ok((false, body)) => Err(format!("non-200: {}", String::from_utf8_lossy(&body))),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await
}

struct Row {
    server: &'static str,
    path: &'static str,
    concurrency: usize,
    stats: Stats,
}

async fn webhook_section(quick: bool) -> anyhow::Result<String> {
    let cp = tokio::task::spawn_blocking(|| ControlPlane::start(Options::default())).await??;
    // The webhook's caches need the CRDs.
    let admin = cp.admin().await?;
    for crd in [
        "connectivityproxies.connectivityproxy.sap.com",
        "servicemappings.connectivityproxy.sap.com",
    ] {
        let file = cp_tests::workspace_root().join(format!("manifests/crds/{crd}.yaml"));
        cp_tests::manifest::apply_file(&admin, &file, None).await?;
    }
    let rust = Webhook::start(&cp, "cp-webhook", &[]).await?;
    let ca = rust
        .ca
        .as_ref()
        .context("the harness webhook has its own CA")?;
    let ca_pem = ca.cert_pem.clone();
    let cert = rust.cert_file.display().to_string();
    let key = rust.key_file.display().to_string();

    let ceiling_port = cp_tests::cluster::free_port()?;
    cp.spawn_process(
        "ceiling",
        Command::new(std::env::current_exe()?).args([
            "ceiling",
            &format!("127.0.0.1:{ceiling_port}"),
            &cert,
            &key,
        ]),
    )?;
    let go_port = cp_tests::cluster::free_port()?;
    let defaults = cp.dir.join("defaults.json");
    std::fs::write(
        &defaults,
        serde_json::to_vec(cp_api::defaults::deployment_defaults_value())?,
    )?;
    let go = go_peer();
    anyhow::ensure!(
        go.exists(),
        "{} missing: run `bash hack/build-go-peer.sh`",
        go.display()
    );
    cp.spawn_process(
        "go-webhook",
        Command::new(&go).args([
            format!("--addr=127.0.0.1:{go_port}"),
            format!("--tls-cert-file={cert}"),
            format!("--tls-key-file={key}"),
            format!("--defaults-file={}", defaults.display()),
            "--privileged-users=system:serviceaccount:kyma-system:connectivity-proxy-controller"
                .into(),
            "--privileged-groups=system:masters".into(),
            "--zap-log-level=error".into(),
        ]),
    )?;

    let bodies = [
        ("/mutate", Bytes::from(reviews::mutate_create()?)),
        ("/validate", Bytes::from(reviews::validate_update()?)),
    ];
    let servers: [(&'static str, String); 3] = [
        (
            "ceiling (rustls + hyper, fixed answer)",
            format!("127.0.0.1:{ceiling_port}"),
        ),
        (
            "cp-webhook (this operator)",
            rust.url.trim_start_matches("https://").to_string(),
        ),
        (
            "controller-runtime peer (Go)",
            format!("127.0.0.1:{go_port}"),
        ),
    ];
    // Check every server's answer before loading it: a fast wrong answer is no result.
    for (server, addr) in &servers {
        for (path, body) in &bodies {
            let target = Target {
                addr: addr.clone(),
                path: path.to_string(),
                body: body.clone(),
                ca_pem: ca_pem.clone(),
            };
            let answer = wait_answers(&target, server).await?;
            let v: serde_json::Value =
                serde_json::from_slice(&answer).with_context(|| format!("{server} {path}"))?;
            anyhow::ensure!(
                v["response"]["allowed"] == true,
                "{server} {path} did not allow: {v}"
            );
            if *path == "/mutate" {
                anyhow::ensure!(
                    v["response"]["patch"].is_string(),
                    "{server} {path} sent no patch: {v}"
                );
            }
        }
    }
    let (warmup, measure) = if quick {
        (Duration::from_millis(300), Duration::from_secs(1))
    } else {
        (Duration::from_millis(500), Duration::from_secs(4))
    };
    let mut rows = Vec::new();
    for (path, body) in &bodies {
        for &c in &CONCURRENCY {
            for (server, addr) in &servers {
                let target = Target {
                    addr: addr.clone(),
                    path: path.to_string(),
                    body: body.clone(),
                    ca_pem: ca_pem.clone(),
                };
                let stats = load::run(&target, c, warmup, measure).await?;
                println!("{server} {path} c={c}: {stats:?}");
                rows.push(Row {
                    server,
                    path,
                    concurrency: c,
                    stats,
                });
            }
        }
    }
    Ok(render_webhook(&rows, &bodies, measure))
}

fn render_webhook(rows: &[Row], bodies: &[(&str, Bytes)], measure: Duration) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Webhook throughput and latency\n\nHTTPS (TLS 1.3, HTTP/1.1 keep-alive), `c` connections each with one \
         request in flight, {:.0} s measured after a warm-up, every latency kept (exact percentiles). Requests: \
         `/mutate` CREATE of the module's default CR without `spec.deployment` ({} bytes; the answer is the defaults \
         as a JSON patch), `/validate` UPDATE of the defaulted CR by a non-privileged user ({} bytes; allowed). The \
         ceiling answers a fixed, allowed AdmissionReview with a patch of the same size after reading the body. The Go \
         peer is controller-runtime's webhook package doing the same defaulting and protected-field check \
         (`bench/peers/go-webhook`). Logs at warn/error level for both.\n",
        measure.as_secs_f64(),
        bodies.first().map(|b| b.1.len()).unwrap_or(0),
        bodies.get(1).map(|b| b.1.len()).unwrap_or(0),
    );
    let _ = writeln!(
        md,
        "| path | c | server | req/s | p50 µs | p99 µs | p99.9 µs | max µs | errors |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in rows {
        let s = &r.stats;
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
            r.path,
            r.concurrency,
            r.server,
            s.rps,
            s.p50_us,
            s.p99_us,
            s.p999_us,
            s.max_us,
            s.errors
        );
    }
    let _ = writeln!(
        md,
        "\n### Ratios and goals\n\nGoals: throughput ≥ 0.8× the ceiling and ≥ 2× the Go peer; p99 < 2 ms at c = 16.\n"
    );
    let _ = writeln!(
        md,
        "| path | c | vs ceiling | vs Go peer | p99 at c=16 | goals |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- |");
    let find = |path: &str, c: usize, prefix: &str| {
        rows.iter()
            .find(|r| r.path == path && r.concurrency == c && r.server.starts_with(prefix))
            .map(|r| r.stats.clone())
            .unwrap_or_default()
    };
    for (path, _) in bodies {
        for &c in &CONCURRENCY {
            let ours = find(path, c, "cp-webhook");
            let ceiling = find(path, c, "ceiling");
            let go = find(path, c, "controller-runtime");
            let vs_ceiling = ours.rps / ceiling.rps.max(1.0);
            let vs_go = ours.rps / go.rps.max(1.0);
            let p99 = if c == 16 {
                format!("{:.2} ms", ours.p99_us as f64 / 1000.0)
            } else {
                "—".into()
            };
            let mut missed = Vec::new();
            if vs_ceiling < 0.8 {
                missed.push("ceiling");
            }
            if vs_go < 2.0 {
                missed.push("Go peer");
            }
            if c == 16 && ours.p99_us >= 2000 {
                missed.push("p99");
            }
            let verdict = if missed.is_empty() {
                "met".to_string()
            } else {
                format!("**missed: {}**", missed.join(", "))
            };
            let _ = writeln!(
                md,
                "| `{path}` | {c} | {vs_ceiling:.2}× | {vs_go:.2}× | {p99} | {verdict} |"
            );
        }
    }
    md.push('\n');
    md
}

/// Criterion's estimates from `cargo bench -p cp-bench --bench admission` (run by `make bench` first).
fn criterion_section() -> String {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cp_tests::workspace_root().join("target"));
    let mut md = String::from(
        "## Handler CPU per request (criterion)\n\nDecode the AdmissionReview, review it and encode the answer, \
         without TLS or HTTP (`bench/benches/admission.rs`); and the controller's pure aggregation of 10,000 \
         ServiceMappings into the ConfigMap JSON.\n\n| benchmark | mean | 95% interval |\n| --- | --- | --- |\n",
    );
    for (group, name) in [
        ("handler", "mutate"),
        ("handler", "validate"),
        ("controller", "aggregate_10000_mappings"),
    ] {
        let file = target
            .join("criterion")
            .join(group)
            .join(name)
            .join("new/estimates.json");
        let row = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .map(|v| {
                let ns = |p: &str| v.pointer(p).and_then(|x| x.as_f64()).unwrap_or(0.0);
                format!(
                    "| `{group}/{name}` | {} | {} – {} |",
                    human_ns(ns("/mean/point_estimate")),
                    human_ns(ns("/mean/confidence_interval/lower_bound")),
                    human_ns(ns("/mean/confidence_interval/upper_bound"))
                )
            })
            .unwrap_or_else(|| {
                format!(
                    "| `{group}/{name}` | not run (`{}` missing) | |",
                    file.display()
                )
            });
        md.push_str(&row);
        md.push('\n');
    }
    md.push('\n');
    md
}

fn human_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}
