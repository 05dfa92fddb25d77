//! `promtool test rules` over `tests/prometheus/alerts_test.yaml`: every alert of
//! `manifests/monitoring/alerts.yaml` fires on the fault it names and resolves after it.

use std::collections::BTreeSet;

use cp_tests::prometheus::{output_text, promtool};
use serde_json::Value;

fn yaml_file(rel: &str) -> Value {
    let path = cp_tests::workspace_root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The PrometheusRule's `spec` (its rule groups) as a plain rules file, as prometheus-operator hands it
/// to Prometheus.
fn rules_file(dir: &std::path::Path) -> Vec<String> {
    let rule = yaml_file("manifests/monitoring/alerts.yaml");
    assert_eq!(rule["kind"], "PrometheusRule");
    let spec = serde_norway::to_string(&rule["spec"]).expect("rules yaml");
    std::fs::write(dir.join("rules.yaml"), spec).expect("write rules.yaml");
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect()
}

#[test]
fn every_alert_fires_on_its_fault_and_resolves_after_it_under_promtool() {
    let dir = std::env::temp_dir().join(format!("cp-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let alerts = rules_file(&dir);
    assert!(alerts.len() >= 7, "{alerts:?}");
    std::fs::copy(
        cp_tests::workspace_root().join("tests/prometheus/alerts_test.yaml"),
        dir.join("alerts_test.yaml"),
    )
    .expect("copy the rule tests");

    let check = promtool(&dir, &["check", "rules", "rules.yaml"]).expect("promtool");
    assert!(check.status.success(), "{}", output_text(&check));
    let test = promtool(&dir, &["test", "rules", "alerts_test.yaml"]).expect("promtool");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        test.status.success(),
        "promtool test rules failed:\n{}",
        output_text(&test)
    );

    // Every alert is tested both ways: firing (an expected alert) and, later in the same case,
    // resolved (none expected).
    let tests = yaml_file("tests/prometheus/alerts_test.yaml");
    let (mut fires, mut resolves) = (BTreeSet::new(), BTreeSet::new());
    for case in tests["tests"].as_array().into_iter().flatten() {
        let mut fired_at: Vec<(String, String)> = Vec::new();
        for t in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = t["alertname"].as_str().unwrap_or_default().to_string();
            let at = t["eval_time"].as_str().unwrap_or_default().to_string();
            let expected = t["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name.clone());
                fired_at.push((name, at));
            } else if fired_at.iter().any(|(n, _)| *n == name) {
                resolves.insert(name);
            }
        }
    }
    for a in &alerts {
        assert!(
            fires.contains(a),
            "{a}: no case in tests/prometheus/alerts_test.yaml shows it firing"
        );
        assert!(
            resolves.contains(a),
            "{a}: no case in tests/prometheus/alerts_test.yaml shows it resolved after firing"
        );
    }
}
