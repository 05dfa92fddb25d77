//! Checks of what ships, no cluster needed: the Kyma dashboard extension, RBAC, Pod Security,
//! and the docs' test references (the dashboards and alerts against the exported metrics:
//! `controller/tests/library/monitoring.rs`).
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use kube::CustomResourceExt;
use serde_json::Value;

fn root() -> PathBuf {
    cp_tests::workspace_root()
}

fn yaml_docs(path: &str) -> Vec<Value> {
    cp_tests::manifest::yaml_values(&root().join(path))
}

fn extension() -> Value {
    yaml_docs("manifests/ui/extension.yaml").remove(0)
}

fn section(name: &str) -> Value {
    let text = extension()["data"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} section"))
        .to_string();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
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
        let full = cp_tests::fixtures::form_item_path(prefix, item);
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

/// The strings of a JSON array (none for anything else).
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// ClusterRole `name` among `docs`; panics without one.
fn cluster_role<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("ClusterRole {name} missing"))
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

/// Write verbs (what a stolen token could change with).
const WRITE_VERBS: [&str; 6] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
];

#[test]
fn cluster_wide_grants_write_no_core_kind_and_read_no_secret() {
    let docs = all_manifest_docs();
    let cluster_bound: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .map(|d| {
            d["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let mut checked = 0;
    for doc in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        if !cluster_bound.contains(name) {
            continue;
        }
        for rule in doc["rules"].as_array().into_iter().flatten() {
            checked += 1;
            let strs = |f: &str| -> Vec<String> {
                rule[f]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            let (groups, resources, verbs) = (strs("apiGroups"), strs("resources"), strs("verbs"));
            let named = !strs("resourceNames").is_empty();
            let core = groups.iter().any(|g| {
                [
                    "",
                    "apps",
                    "rbac.authorization.k8s.io",
                    "admissionregistration.k8s.io",
                ]
                .contains(&g.as_str())
            });
            let writes = verbs.iter().any(|v| WRITE_VERBS.contains(&v.as_str()));
            assert!(
                !(core && writes && !named),
                "ClusterRole {name} (bound cluster-wide) writes core kinds everywhere: {rule}"
            );
            let namespaces_or_bindings = resources.iter().any(|r| {
                [
                    "namespaces",
                    "rolebindings",
                    "clusterrolebindings",
                    "clusterroles",
                    "roles",
                ]
                .contains(&r.as_str())
            });
            assert!(
                !(namespaces_or_bindings && writes && !named),
                "ClusterRole {name} may create namespaces or bindings: {rule}"
            );
            assert!(
                !(groups.iter().any(|g| g.is_empty()) && resources.iter().any(|r| r == "secrets")),
                "ClusterRole {name} (bound cluster-wide) reads or writes Secrets everywhere: {rule}"
            );
        }
    }
    assert!(checked > 5, "only {checked} cluster-wide rules found");
    // The controller's namespaced writes are granted by RoleBindings in exactly these namespaces.
    let mut bound_in: Vec<String> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "RoleBinding"
                && d["roleRef"]["name"] == "connectivity-proxy-operator-namespaced"
        })
        .map(|d| {
            d["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    bound_in.sort();
    assert_eq!(bound_in, vec!["kyma-system"]);
    assert!(!cluster_bound.contains("connectivity-proxy-operator-namespaced"));
    // The Istio namespace gets only the tunnel's Secrets and certificates: no workload runs there.
    let istio: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "istio-system")
        .collect();
    assert_eq!(istio.len(), 1, "one RoleBinding in istio-system");
    assert_eq!(
        istio[0]["roleRef"]["name"],
        "connectivity-proxy-operator-istio"
    );
    assert!(!cluster_bound.contains("connectivity-proxy-operator-istio"));
    let role = cluster_role(&docs, "connectivity-proxy-operator-istio");
    for rule in role["rules"].as_array().into_iter().flatten() {
        for r in rule["resources"].as_array().into_iter().flatten() {
            assert!(
                ["secrets", "certificates", "envoyfilters"]
                    .contains(&r.as_str().unwrap_or_default()),
                "the controller may write {r} in the Istio namespace"
            );
        }
    }
}

#[test]
fn the_controller_writes_exactly_the_modules_network_policies_and_only_by_name() {
    let docs = all_manifest_docs();
    let role = cluster_role(&docs, "connectivity-proxy-operator-namespaced");
    let rules: Vec<&Value> = role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["resources"].to_string().contains("networkpolicies"))
        .collect();
    assert_eq!(rules.len(), 2, "{rules:?}");
    for r in rules {
        let verbs = strings(&r["verbs"]);
        if verbs
            .iter()
            .any(|v| ["create", "patch", "update", "delete"].contains(v))
        {
            assert_eq!(
                strings(&r["resourceNames"]),
                cp_api::names::NETWORK_POLICIES
            );
        } else {
            assert_eq!(verbs, ["get", "list", "watch"]);
        }
    }
    // No NetworkPolicy in the bundle: the controller applies them, so one annotation switches them off.
    assert!(docs.iter().all(|d| d["kind"] != "NetworkPolicy"));
}

#[test]
fn editors_and_viewers_reach_the_operators_kinds_through_the_aggregated_roles() {
    let docs = all_manifest_docs();
    let role = |name: &str| cluster_role(&docs, name).clone();
    let grants = |r: &Value, resource: &str, verb: &str| {
        r["rules"].as_array().into_iter().flatten().any(|rule| {
            rule["apiGroups"]
                .to_string()
                .contains("connectivityproxy.sap.com")
                && rule["resources"]
                    .to_string()
                    .contains(&format!("\"{resource}\""))
                && rule["verbs"].to_string().contains(&format!("\"{verb}\""))
        })
    };
    let edit = role("connectivity-proxy-operator-edit");
    let view = role("connectivity-proxy-operator-view");
    let label = |r: &Value, l: &str| r["metadata"]["labels"][l] == "true";
    assert!(label(&edit, "rbac.authorization.k8s.io/aggregate-to-edit"));
    assert!(label(&edit, "rbac.authorization.k8s.io/aggregate-to-admin"));
    assert!(label(&view, "rbac.authorization.k8s.io/aggregate-to-view"));
    assert!(!label(&view, "rbac.authorization.k8s.io/aggregate-to-edit"));
    for kind in ["connectivityproxies", "servicemappings"] {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            assert!(grants(&edit, kind, verb), "edit lacks {verb} {kind}");
        }
        // A CR may carry a service key inline: like Secrets, it is not for `view`.
        for verb in ["get", "list", "watch"] {
            assert_eq!(
                grants(&view, kind, verb),
                kind == "servicemappings",
                "view and {verb} {kind}"
            );
        }
        for verb in ["create", "update", "patch", "delete"] {
            assert!(!grants(&view, kind, verb), "view may {verb} {kind}");
        }
    }
    // Users never get the status subresource for writing: the status is the operator's.
    for r in [&edit, &view] {
        for verb in ["update", "patch"] {
            assert!(!grants(r, "connectivityproxies/status", verb));
        }
    }
}

/// The rules docs/module-checklist.md lists under "module-config.yaml (modulectl)".
#[test]
fn module_config_satisfies_modulectls_documented_rules() {
    let cfg = yaml_docs("manifests/module-config.yaml").remove(0);
    let text = |k: &str| cfg[k].as_str().unwrap_or_default().to_string();
    let name = text("name");
    let short = name
        .strip_prefix("kyma-project.io/module/")
        .unwrap_or_else(|| panic!("name {name:?} must be kyma-project.io/module/<name>"));
    assert!(
        !short.is_empty()
            && name.len() <= 255
            && short
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "name {name:?}"
    );
    assert_eq!(
        text("version"),
        cp_api::defaults::RELEASE,
        "version comes from the workspace"
    );
    for (k, v) in [
        ("repository", text("repository")),
        ("documentation", text("documentation")),
    ] {
        assert!(v.starts_with("https://"), "{k} must be an https URL: {v:?}");
    }
    assert!(
        !text("team").is_empty(),
        "team is required while security scanning is on"
    );
    let icons = cfg["icons"].as_array().cloned().unwrap_or_default();
    assert!(
        !icons.is_empty()
            && icons.iter().all(|i| i["name"].is_string()
                && i["link"]
                    .as_str()
                    .is_some_and(|l| l.starts_with("https://"))),
        "icons: {icons:?}"
    );
    // Files it names exist beside it; the manifest is the rendered bundle.
    for k in ["manifest", "defaultCR", "security"] {
        let rel = text(k);
        assert!(
            root().join("manifests").join(&rel).exists(),
            "{k}: manifests/{rel} missing"
        );
    }
    assert_eq!(text("manifest"), cp_api::bundle::BUNDLE);
    // The scanners scan exactly the images the Deployments name, as modulectl finds them
    // (contentprovider/manifest.go ExtractImagesFromManifest): every container's and init container's
    // `image`, and every env value that looks like an image reference (3-256 characters, a ':' or '@',
    // no white space; image/image.go IsImageReferenceCandidate) — the proxy's and utility images.
    let security = yaml_docs(&format!("manifests/{}", text("security"))).remove(0);
    let mut scanned: Vec<String> = security["bdba"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    scanned.sort();
    let docs = all_manifest_docs();
    let running: Vec<String> = cp_tests::lifecycle::modulectl_images(&docs)
        .into_iter()
        .collect();
    assert_eq!(scanned, running, "sec-scanners-config bdba images");
    // Every env image candidate is a reference modulectl accepts: a tag (not latest or main) or a digest.
    for image in &running {
        let r = cp_api::images::ImageRef::parse(image).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            r.digest.is_some() || !["latest", "main", ""].contains(&r.tag.as_str()),
            "{image}: modulectl refuses it"
        );
    }
    // The proxy's and utility images the Deployments name are this release's defaults.
    for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let env = |name: &str| {
                c["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|e| e["name"] == name)
                    .and_then(|e| e["value"].as_str())
                    .map(String::from)
            };
            assert_eq!(
                env(cp_api::images::PROXY_IMAGE_ENV),
                Some(cp_api::defaults::release_proxy_image()),
                "{}",
                d["metadata"]["name"]
            );
            assert_eq!(
                env(cp_api::images::UTILITY_IMAGE_ENV),
                Some(cp_api::defaults::release_utility_image()),
                "{}",
                d["metadata"]["name"]
            );
        }
    }
    // The manager is a Deployment of the bundle.
    let m = &cfg["manager"];
    assert!(
        docs.iter().any(|d| d["kind"] == m["kind"]
            && d["apiVersion"]
                == format!(
                    "{}/{}",
                    m["group"].as_str().unwrap_or_default(),
                    m["version"].as_str().unwrap_or_default()
                )
            && d["metadata"]["name"] == m["name"]
            && d["metadata"]["namespace"] == m["namespace"]),
        "manager {m} is not in the bundle"
    );
    // modulectl's image version check (internal/service/verifier/image_version_verifier.go,
    // verifyModuleImageVersion): a container of the manager runs an image tagged with the module version.
    let manager = docs
        .iter()
        .find(|d| d["kind"] == m["kind"] && d["metadata"]["name"] == m["name"])
        .expect("manager");
    assert!(
        manager["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["image"].as_str())
            .any(|i| i.ends_with(&format!(":{}", cfg["version"].as_str().unwrap_or_default()))),
        "no container of the manager runs the module version"
    );
    // lifecycle-manager judges the module's state by the first Deployment of the raw manifest (or the
    // first StatefulSet when there is none), whatever `manager` says
    // (internal/manifest/statecheck/state_check.go findManager): that must be the manager.
    let workloads: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .chain(docs.iter().filter(|d| d["kind"] == "StatefulSet"))
        .collect();
    assert_eq!(
        workloads.first().map(|d| &d["metadata"]["name"]),
        Some(&m["name"]),
        "lifecycle-manager would take {:?} for the manager: put the manager's Deployment first",
        workloads.first().map(|d| &d["metadata"]["name"])
    );
    // Both of the module's kinds are associated resources, with the CRDs' group and version.
    let associated: Vec<String> = cfg["associatedResources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{}/{}",
                r["group"].as_str().unwrap_or_default(),
                r["version"].as_str().unwrap_or_default(),
                r["kind"].as_str().unwrap_or_default()
            )
        })
        .collect();
    for kind in ["ConnectivityProxy", "ServiceMapping"] {
        assert!(
            associated.contains(&format!("connectivityproxy.sap.com/v1/{kind}")),
            "{kind} not in associatedResources: {associated:?}"
        );
    }
    assert!(cfg["requiresDowntime"].is_boolean());
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
        "controller/tests",
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
