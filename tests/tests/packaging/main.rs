//! Checks of what ships, no cluster needed: the Kyma dashboard extension, RBAC, Pod Security,
//! the Grafana dashboard and alert rules against the exported metrics, and the docs' test references.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use kube::CustomResourceExt;
use serde_json::Value;

fn root() -> PathBuf {
    cp_tests::workspace_root()
}

fn yaml_docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    cp_tests::manifest::parse_documents(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("json"))
        .collect()
}

fn extension() -> Value {
    yaml_docs("manifests/ui/extension.yaml").remove(0)
}

fn section(name: &str) -> Value {
    let text = extension()["data"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} section"))
        .to_string();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn dashboard_extension_has_every_section() {
    let ext = extension();
    let labels = &ext["metadata"]["labels"];
    assert_eq!(labels["busola.io/extension"], "resource");
    assert_eq!(labels["busola.io/extension-version"], "0.5");
    assert_eq!(labels["app.kubernetes.io/part-of"], "Kyma");
    // The sections are validated against Busola's own schemas by `make check-reference`.
    for name in ["general", "list", "details", "form"] {
        let s = section(name);
        assert!(s.is_object() || s.is_array(), "section {name}: {s}");
    }
    assert!(
        ext["data"]["translations"]
            .as_str()
            .is_some_and(|t| t.contains("en:")),
        "translations section"
    );
    let general = section("general");
    assert_eq!(general["features"]["actions"]["disableCreate"], true);
    assert_eq!(general["features"]["actions"]["disableDelete"], true);
}

fn form_paths(items: &Value, prefix: &str, out: &mut Vec<String>) {
    for item in items.as_array().into_iter().flatten() {
        let path = item["path"].as_str().unwrap_or_default();
        let full = if prefix.is_empty() {
            path.to_string()
        } else {
            format!("{prefix}.{path}")
        };
        out.push(full.clone());
        if let Some(children) = item.get("children") {
            form_paths(children, &full, out);
        }
    }
}

fn schema_has(schema: &Value, path: &str) -> bool {
    let mut node = schema;
    for part in path.split('.') {
        match node.get("properties").and_then(|p| p.get(part)) {
            Some(n) => node = n,
            None => return false,
        }
    }
    true
}

#[test]
fn dashboard_form_offers_only_user_fields_that_exist_in_the_crd() {
    let mut paths = Vec::new();
    form_paths(&section("form"), "", &mut paths);
    assert!(!paths.is_empty());
    let crd = serde_json::to_value(cp_api::ConnectivityProxy::crd()).expect("crd");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for p in &paths {
        assert!(
            !p.starts_with("spec.deployment"),
            "the form offers protected field {p}"
        );
        assert!(
            schema_has(schema, p),
            "form path {p} is not in the CRD schema"
        );
    }
}

fn all_manifest_docs() -> Vec<Value> {
    let mut docs = yaml_docs(&format!("manifests/{}", cp_api::bundle::BUNDLE));
    docs.extend(yaml_docs("manifests/monitoring/alerts.yaml"));
    docs
}

#[test]
fn rbac_rules_have_no_wildcards() {
    let mut rules = 0;
    for doc in all_manifest_docs() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for rule in doc["rules"].as_array().into_iter().flatten() {
            rules += 1;
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for v in rule[field].as_array().into_iter().flatten() {
                    assert!(
                        !v.as_str().unwrap_or_default().contains('*'),
                        "{kind} {name}: wildcard in {field}: {rule}"
                    );
                }
            }
            println!(
                "{kind} {name}: {} {} {} {}",
                rule["apiGroups"], rule["resources"], rule["verbs"], rule["resourceNames"]
            );
        }
    }
    assert!(rules > 10, "only {rules} RBAC rules found");
}

#[test]
fn deployments_satisfy_the_restricted_pod_security_standard() {
    let mut seen = 0;
    for doc in all_manifest_docs() {
        if doc["kind"] != "Deployment" {
            continue;
        }
        seen += 1;
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pod = &doc["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        for c in pod["containers"].as_array().into_iter().flatten() {
            let sc = &c["securityContext"];
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(
                sc["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{name}"
            );
            for q in ["requests", "limits"] {
                assert!(
                    c["resources"][q]["cpu"].is_string() && c["resources"][q]["memory"].is_string(),
                    "{name} {q}"
                );
            }
            assert!(
                c["readinessProbe"].is_object() && c["livenessProbe"].is_object(),
                "{name} probes"
            );
            let image = c["image"].as_str().unwrap_or_default();
            let registry = image.split('/').next().unwrap_or_default();
            assert!(
                registry.contains('.') && image.contains(':'),
                "{name}: image {image} is not fully qualified"
            );
        }
    }
    assert_eq!(seen, 2, "controller and webhook Deployments");
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

fn test_names_in(dir: &std::path::Path, out: &mut BTreeSet<String>) {
    let re = regex_lite::Regex::new(r"fn ([a-z0-9_]+)\s*\(").expect("regex");
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            test_names_in(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.extend(re.captures_iter(&text).map(|c| c[1].to_string()));
        }
    }
}

#[test]
fn module_checklist_names_only_existing_tests() {
    let checklist =
        std::fs::read_to_string(root().join("docs/module-checklist.md")).expect("checklist");
    let mut defined = BTreeSet::new();
    for dir in [
        "tests",
        "shared/src",
        "certs/src",
        "webhook/src",
        "controller/src",
    ] {
        test_names_in(&root().join(dir), &mut defined);
    }
    let mut named = 0;
    for line in checklist.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').collect();
        let Some(tests) = cells.get(3) else { continue };
        for name in tests.split('`').skip(1).step_by(2) {
            named += 1;
            assert!(
                defined.contains(name),
                "docs/module-checklist.md names test {name}, which does not exist"
            );
        }
    }
    assert!(named >= 20, "only {named} tests named");
}

#[test]
fn docs_are_linked_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    for doc in [
        "docs/user-guide.md",
        "docs/migration-guide.md",
        "docs/runbook.md",
        "docs/module-checklist.md",
        "BENCHMARKS.md",
    ] {
        if doc == "BENCHMARKS.md" && !root().join(doc).exists() {
            continue;
        }
        assert!(readme.contains(doc), "README does not link {doc}");
    }
}
