//! The Grafana dashboards (in-cluster and the fleet view in KCP) and the alert rules query only metrics
//! the two binaries export, with label values they emit. A test of the controller's (and webhook's)
//! library: it needs the metric registries, not a cluster.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

fn root() -> PathBuf {
    cp_tests::workspace_root()
}

fn yaml_docs(path: &str) -> Vec<Value> {
    cp_tests::manifest::yaml_values(&root().join(path))
}

fn exported() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = cp_controller::metrics::Metrics::new()
        .expect("metrics")
        .metric_names()
        .into_iter()
        .collect();
    names.extend(
        cp_webhook::metrics::Metrics::new()
            .expect("metrics")
            .metric_names(),
    );
    names
}

fn metrics_in(expr: &str) -> Vec<String> {
    let re = regex_lite::Regex::new(r"\bcp_[a-z0-9_]+").expect("regex");
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let cm = yaml_docs("manifests/monitoring/grafana-dashboard.yaml").remove(0);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = cm["data"]["connectivity-proxy-operator.json"]
        .as_str()
        .expect("dashboard json");
    let dash: Value = serde_json::from_str(json).expect("dashboard parses");
    let exported = exported();
    let mut queries = 0;
    for panel in dash["panels"].as_array().into_iter().flatten() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            queries += 1;
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "query uses no operator metric: {expr}");
            for m in used {
                assert!(
                    exported.contains(&m),
                    "panel {:?} queries {m}, which is not exported",
                    panel["title"]
                );
            }
        }
    }
    assert!(queries >= 10);
}

#[test]
fn alert_rules_use_only_exported_metrics() {
    let rule = yaml_docs("manifests/monitoring/alerts.yaml").remove(0);
    let exported = exported();
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().into_iter().flatten() {
        for r in group["rules"].as_array().into_iter().flatten() {
            alerts += 1;
            let expr = r["expr"].as_str().unwrap_or_default();
            for m in metrics_in(expr) {
                assert!(
                    exported.contains(&m),
                    "alert {} uses {m}, which is not exported",
                    r["alert"]
                );
            }
        }
    }
    assert!(alerts >= 6, "{alerts} alerts");
}

// Fleet view in KCP (issue #20 item 6): the fleet dashboard over `cp_module_info` and friends.

const FLEET_DASHBOARD: &str = "manifests/monitoring/fleet-dashboard.yaml";

fn fleet_dashboard() -> (Value, Value) {
    let cm = yaml_docs(FLEET_DASHBOARD).remove(0);
    let json = cm["data"]["connectivity-proxy-fleet.json"]
        .as_str()
        .expect("fleet dashboard json")
        .to_string();
    let dash: Value = serde_json::from_str(&json).expect("fleet dashboard parses");
    (cm, dash)
}

/// Values a query matches label `label` against (`label="v"`, `label!="v"`, `label=~"a|b"`).
fn matched_values(expr: &str, label: &str) -> Vec<String> {
    let re =
        regex_lite::Regex::new(&format!(r#"\b{label}\s*(=~|!~|!=|=)\s*"([^"]*)""#)).expect("regex");
    re.captures_iter(expr)
        .flat_map(|c| c[2].split('|').map(String::from).collect::<Vec<String>>())
        .collect()
}

#[test]
fn fleet_dashboard_queries_only_exported_metrics_and_aggregate_by_the_runtime_label() {
    let (cm, dash) = fleet_dashboard();
    let labels = &cm["metadata"]["labels"];
    assert_eq!(labels["grafana_dashboard"], "1");
    assert_eq!(
        labels["app.kubernetes.io/managed-by"],
        "connectivity-proxy-operator"
    );
    assert_eq!(labels["kyma-project.io/module"], "connectivity-proxy");
    assert_eq!(cm["metadata"]["namespace"], "kyma-system");
    assert!(
        cm["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .any(|(_, v)| v.as_str().is_some_and(|v| v.contains("KCP"))),
        "an annotation says the dashboard is meant for the KCP Grafana"
    );

    // The runtime label is a parameter, runtime_id unless KCP's scraper names it otherwise.
    let vars = dash["templating"]["list"].as_array().expect("templating");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no dashboard variable {name}"))
    };
    let runtime_label = var("runtime_label");
    assert!(
        ["custom", "constant", "textbox"].contains(&runtime_label["type"].as_str().unwrap_or("")),
        "runtime_label: {runtime_label}"
    );
    assert_eq!(runtime_label["query"], "runtime_id");
    assert_eq!(runtime_label["current"]["value"], "runtime_id");
    let runtime = var("runtime");
    assert_eq!(runtime["type"], "query");
    let runtime_query = runtime["definition"].as_str().unwrap_or_default();
    assert!(
        runtime_query.contains("${runtime_label}"),
        "runtime: {runtime}"
    );

    let exported = exported();
    let states: Vec<&str> = cp_api::State::ALL.iter().map(|s| s.as_str()).collect();
    let migrations: Vec<&str> = [
        cp_controller::metrics::Migration::None,
        cp_controller::metrics::Migration::InProgress,
        cp_controller::metrics::Migration::Blocked,
        cp_controller::metrics::Migration::Done,
    ]
    .iter()
    .map(|m| m.as_str())
    .collect();
    // The webhook's decisions, and the one for a body that is no AdmissionReview (server.rs).
    let decisions: Vec<&str> = [
        cp_webhook::admission::Decision::Allowed,
        cp_webhook::admission::Decision::Patched,
        cp_webhook::admission::Decision::Denied,
    ]
    .iter()
    .map(|d| d.as_str())
    .chain(["bad_request"])
    .collect();
    let aggregation =
        regex_lite::Regex::new(r"\b(sum|count|min|max|avg|group|topk|bottomk|stddev|stdvar|quantile|count_values)\s*(by|without|\()")
            .expect("regex");
    let mut exprs = vec![runtime_query.to_string()];
    for panel in dash["panels"].as_array().into_iter().flatten() {
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(
            !targets.is_empty(),
            "panel {:?} has no query",
            panel["title"]
        );
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default().to_string();
            assert!(
                !expr.contains("without"),
                "panel {:?} aggregates without: {expr}",
                panel["title"]
            );
            assert!(
                !expr.contains("runtime_id"),
                "panel {:?} names the runtime label instead of ${{runtime_label}}: {expr}",
                panel["title"]
            );
            if aggregation.is_match(&expr) {
                // Every aggregation keeps one series per runtime first; the state and version counts
                // count those runtimes.
                assert!(
                    expr.contains("by (${runtime_label}"),
                    "panel {:?} aggregates but not by ${{runtime_label}}: {expr}",
                    panel["title"]
                );
            }
            assert!(
                expr.contains(r#"${runtime_label}=~"${runtime:regex}""#),
                "panel {:?} ignores the runtime variable: {expr}",
                panel["title"]
            );
            exprs.push(expr);
        }
    }
    assert!(exprs.len() >= 8, "{} queries", exprs.len());
    for expr in &exprs {
        let used = metrics_in(expr);
        assert!(!used.is_empty(), "query uses no operator metric: {expr}");
        for m in used {
            assert!(
                exported.contains(&m),
                "{expr} queries {m}, which is not exported"
            );
        }
        for v in matched_values(expr, "state") {
            assert!(states.contains(&v.as_str()), "{expr}: no state {v}");
        }
        for v in matched_values(expr, "migration") {
            assert!(
                migrations.contains(&v.as_str()),
                "{expr}: no migration phase {v}"
            );
        }
        for v in matched_values(expr, "decision") {
            assert!(decisions.contains(&v.as_str()), "{expr}: no decision {v}");
        }
    }
    // The panels the fleet view promises.
    let all = exprs.join("\n");
    for needle in [
        "count by (state)",
        r#"state!="Ready""#,
        r#"migration="blocked""#,
        r#"cp_certificate_expiry_timestamp_seconds{certificate="tunnel""#,
        "- time() < 14 * 86400",
        "cp_webhook_admission_requests_total{decision=~\"denied|bad_request\"",
        "count by (operator_version, proxy_version)",
    ] {
        assert!(all.contains(needle), "no fleet query with {needle}");
    }
}

#[test]
fn fleet_dashboard_is_for_kcp_and_not_in_the_module_bundle() {
    assert!(
        !cp_api::bundle::EXTRAS
            .iter()
            .any(|e| e.contains("fleet-dashboard")),
        "the fleet dashboard is for KCP, not for every runtime"
    );
    let (cm, _) = fleet_dashboard();
    let name = cm["metadata"]["name"].as_str().expect("name");
    assert!(
        yaml_docs(&format!("manifests/{}", cp_api::bundle::BUNDLE))
            .iter()
            .all(|d| d["metadata"]["name"] != name),
        "{name} is in the bundle"
    );
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).expect("runbook");
    assert!(
        runbook.contains("## Fleet view in KCP") && runbook.contains("fleet-dashboard.yaml"),
        "the runbook says how KCP picks the fleet view up"
    );
}
