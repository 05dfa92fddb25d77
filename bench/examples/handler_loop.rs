//! Runs one admission handler N times, for profilers (`valgrind --tool=callgrind`, `perf record`):
//! `handler_loop mutate|validate N`.

use cp_webhook::admission::{self, ClusterView, Endpoint, Policy};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (endpoint, body) = match args.get(1).map(String::as_str) {
        Some("validate") => (Endpoint::Validate, cp_bench::reviews::validate_update()?),
        _ => (Endpoint::Mutate, cp_bench::reviews::mutate_create()?),
    };
    let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1000);
    let policy = Policy::default();
    let mut bytes = 0;
    for _ in 0..n {
        let req = admission::decode(&body)?;
        let (resp, _) = admission::review(endpoint, &req, &policy, &ClusterView::default);
        bytes += admission::encode_response(resp)?.len();
    }
    println!("{n} requests, {bytes} bytes answered");
    Ok(())
}
