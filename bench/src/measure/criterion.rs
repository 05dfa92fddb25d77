//! Handler CPU per request and the controller's aggregation, as criterion measured them
//! (`cargo bench -p cp-bench --bench admission`, run by `make bench` before `cp-bench`): the section
//! reads criterion's estimates.

use std::path::{Path, PathBuf};

/// Criterion's estimates from `cargo bench -p cp-bench --bench admission` (run by `make bench` first).
pub fn section() -> String {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cp_tests::workspace_root().join("target"));
    section_in(&target)
}

/// The section from the estimates under `target` (a Cargo target directory).
pub fn section_in(target: &Path) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_are_read_and_missing_ones_named() {
        let target =
            std::env::temp_dir().join(format!("cp-bench-criterion-test-{}", std::process::id()));
        let dir = target.join("criterion/handler/mutate/new");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("estimates.json"),
            r#"{"mean":{"point_estimate":12345.6,"confidence_interval":{"lower_bound":999.0,"upper_bound":2500000.0}}}"#,
        )
        .unwrap();
        let md = section_in(&target);
        assert!(
            md.contains("| `handler/mutate` | 12.3 µs | 999 ns – 2.50 ms |"),
            "{md}"
        );
        assert!(md.contains("| `handler/validate` | not run ("), "{md}");
        let _ = std::fs::remove_dir_all(&target);
    }
}
