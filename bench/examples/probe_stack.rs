//! For profilers (`perf stat -p`, `perf record -p`, `strace -c -p`): the floor or cp-webhook's full
//! admission router on their own, without an API server (no caches), and a load loop against them.
//!
//! `probe_stack serve floor|ours ADDR DIR` writes a CA and a serving certificate into DIR and serves;
//! `probe_stack load ADDR DIR mutate|validate C|open:RATE SECONDS` loads it (closed loop on C
//! connections, or open loop at RATE requests per second) and prints the figures.

use std::time::Duration;

use cp_bench::harness::load::{self, Mode, Target};
use cp_webhook::server::admission_router;

/// cp-webhook's allocator, so the figures are the shipped binary's.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

fn main() -> anyhow::Result<()> {
    // As cp-webhook starts; PROBE_THP=1 leaves transparent huge pages on (to see what they cost).
    if std::env::var("PROBE_THP").is_err()
        && let Err(e) = cp_webhook::memory::no_huge_pages()
    {
        eprintln!("{e}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // PROBE_RT=current: a current-thread runtime instead of cp-webhook's multi-thread one.
    let rt = if std::env::var("PROBE_RT").is_ok_and(|v| v == "current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Runtime::new()?
    };
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", which, addr, dir] => rt.block_on(serve(which, addr, dir)),
        ["load", addr, dir, path, c, secs] => rt.block_on(drive(addr, dir, path, c, secs)),
        _ => anyhow::bail!(
            "usage: probe_stack serve floor|ours ADDR DIR | load ADDR DIR mutate|validate C|open:RATE SECONDS"
        ),
    }
}

async fn serve(which: &str, addr: &str, dir: &str) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let ca = cp_certs::Ca::generate(
        "probe",
        now,
        now + time::Duration::days(1),
        cp_certs::KeyAlgorithm::default(),
    )?;
    let leaf = cp_tests::webhook::serving_cert(&ca, time::Duration::days(1))?;
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ca.pem"), &ca.cert_pem)?;
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, &leaf.cert_pem)?;
    std::fs::write(&key, &leaf.key_pem)?;
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    if which == "floor" {
        cp_bench::floor::serve(addr, &cert, &key).await
    } else {
        cp_bench::floor::serve_with(addr, &cert, &key, admission_router).await
    }
}

async fn drive(addr: &str, dir: &str, path: &str, c: &str, secs: &str) -> anyhow::Result<()> {
    let body = match path {
        "validate" => cp_bench::reviews::validate_update()?,
        _ => cp_bench::reviews::mutate_create()?,
    };
    let target = Target {
        addr: addr.to_string(),
        path: format!("/{path}"),
        body: body.into(),
        ca_pem: std::fs::read_to_string(std::path::Path::new(dir).join("ca.pem"))?,
        server_name: None,
        dial: None,
    };
    let stats = load::run(
        &target,
        match c.strip_prefix("open:") {
            Some(rate) => Mode::Open(rate.parse()?),
            None => Mode::Closed(c.parse()?),
        },
        Duration::from_secs(1),
        Duration::from_secs(secs.parse()?),
        std::process::id(),
    )
    .await?;
    println!(
        "{} requests, {:.0}/s, p50 {} µs, p99 {} µs, errors {}",
        stats.requests, stats.rps, stats.p50_us, stats.p99_us, stats.errors
    );
    Ok(())
}
