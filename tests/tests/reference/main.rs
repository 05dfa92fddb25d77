//! `make check-reference`: the project against the upstream files in `../shared/reference` (or
//! `CP_REFERENCE_DIR`). Not part of `make test`: a clone of this repository alone has no such files. CI
//! runs it after `make test` where they exist.
//!
//! - our ConnectivityProxy CRD against the existing module's, field by field, every difference listed in
//!   `docs/crd-compatibility.md`;
//! - our stand-in third-party CRDs (`tests/fixtures/crds/`) against the upstream CRDs: same group, scope,
//!   names and versions, and every field we type exists upstream with the same type;
//! - every upstream CRD applies to the API server;
//! - the dashboard extension against Busola's schemas;
//! - the default CR and the legacy fixtures against the upstream examples.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cp_tests::{ControlPlane, fixtures, manifest};
use kube::CustomResourceExt;
use serde_json::Value;

/// The upstream files: `CP_REFERENCE_DIR`, or `../shared/reference` beside the project (set by
/// `make check-reference`). Nothing else in the project reads outside the repository.
fn reference(rel: &str) -> PathBuf {
    std::env::var_os("CP_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cp_tests::workspace_root().join("../shared/reference"))
        .join(rel)
}

fn yaml_file(path: &std::path::Path) -> Vec<Value> {
    assert!(
        path.exists(),
        "{}: absent (set CP_REFERENCE_DIR)",
        path.display()
    );
    cp_tests::manifest::yaml_values(path)
}

fn schema_of(crd: &Value, version: &str) -> Value {
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap_or(Value::Null)
}

/// One difference: (path, aspect, upstream, ours).
type Diff = (String, String, String, String);

const ASPECTS: [&str; 8] = [
    "type", "enum", "pattern", "default", "nullable", "format", "minimum", "maximum",
];

fn compare(up: &Value, ours: &Value, path: &str, out: &mut Vec<Diff>) {
    if ours.is_null() {
        out.push((
            path.into(),
            "missing field".into(),
            "present".into(),
            "absent".into(),
        ));
        return;
    }
    for a in ASPECTS {
        if up.get(a) != ours.get(a) {
            let show = |v: Option<&Value>| v.map(Value::to_string).unwrap_or_else(|| "-".into());
            out.push((path.into(), a.into(), show(up.get(a)), show(ours.get(a))));
        }
    }
    let req = |v: &Value| -> BTreeSet<String> {
        v["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    let (ur, or) = (req(up), req(ours));
    if ur != or {
        out.push((
            path.into(),
            "required".into(),
            format!("{ur:?}"),
            format!("{or:?}"),
        ));
    }
    let empty = serde_json::Map::new();
    let up_props = up["properties"].as_object().unwrap_or(&empty);
    let our_props = ours["properties"].as_object().unwrap_or(&empty);
    for (k, v) in up_props {
        compare(
            v,
            our_props.get(k).unwrap_or(&Value::Null),
            &format!("{path}.{k}"),
            out,
        );
    }
    for k in our_props.keys().filter(|k| !up_props.contains_key(*k)) {
        out.push((
            format!("{path}.{k}"),
            "extra field".into(),
            "absent".into(),
            "present".into(),
        ));
    }
    if up.get("items").is_some() {
        compare(&up["items"], &ours["items"], &format!("{path}[]"), out);
    }
    if up["additionalProperties"].is_object() {
        compare(
            &up["additionalProperties"],
            &ours["additionalProperties"],
            &format!("{path}{{}}"),
            out,
        );
    }
}

/// Rows of the table in docs/crd-compatibility.md: (path pattern, aspect).
fn documented_differences() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(cp_tests::workspace_root().join("docs/crd-compatibility.md"))
        .expect("docs/crd-compatibility.md");
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let path = cells.get(1)?.split('`').nth(1)?.to_string();
            Some((path, cells.get(2)?.to_string()))
        })
        .collect()
}

fn row_matches(pattern: &str, aspect: &str, d: &Diff) -> bool {
    let path_ok = match pattern.strip_suffix('*') {
        Some(prefix) => d.0.starts_with(prefix),
        None => d.0 == pattern,
    };
    path_ok && aspect == d.1
}

#[test]
fn connectivityproxy_crd_differs_from_the_existing_module_only_where_documented() {
    let upstream = yaml_file(&reference(
        "crds/connectivityproxies.connectivityproxy.sap.com.yaml",
    ));
    let upstream = &upstream[0];
    let ours = serde_json::to_value(cp_api::ConnectivityProxy::crd()).expect("crd");
    assert_eq!(upstream["spec"]["group"], ours["spec"]["group"]);
    assert_eq!(upstream["spec"]["scope"], ours["spec"]["scope"]);
    assert_eq!(
        upstream["spec"]["names"]["kind"],
        ours["spec"]["names"]["kind"]
    );
    assert_eq!(
        upstream["spec"]["names"]["plural"],
        ours["spec"]["names"]["plural"]
    );
    for v in upstream["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = v["name"].as_str().unwrap_or_default();
        let mut diffs = Vec::new();
        compare(
            &v["schema"]["openAPIV3Schema"],
            &schema_of(&ours, name),
            "",
            &mut diffs,
        );
        let rows = documented_differences();
        assert!(
            !rows.is_empty(),
            "no rows read from docs/crd-compatibility.md"
        );
        let undocumented: Vec<String> = diffs
            .iter()
            .filter(|d| !rows.iter().any(|(p, a)| row_matches(p, a, d)))
            .map(|(p, a, u, o)| format!("{p} {a}: existing {u}, ours {o}"))
            .collect();
        assert!(
            undocumented.is_empty(),
            "version {name}: differences not listed in docs/crd-compatibility.md:\n{}",
            undocumented.join("\n")
        );
        let stale: Vec<String> = rows
            .iter()
            .filter(|(p, a)| !diffs.iter().any(|d| row_matches(p, a, d)))
            .map(|(p, a)| format!("{p} {a}"))
            .collect();
        assert!(
            stale.is_empty(),
            "rows of docs/crd-compatibility.md that no longer match a difference: {stale:?}"
        );
        // Accepting more, never less: a field we require must be required upstream too, except the root.
        for (p, a, u, o) in &diffs {
            if a == "required" && !p.is_empty() {
                let parse = |s: &str| -> BTreeSet<String> {
                    s.trim_matches(|c| c == '{' || c == '}')
                        .split(", ")
                        .map(|x| x.trim_matches('"').to_string())
                        .filter(|x| !x.is_empty())
                        .collect()
                };
                let extra: Vec<String> = parse(o).difference(&parse(u)).cloned().collect();
                assert!(
                    extra.is_empty(),
                    "{p}: we require {extra:?}, the existing CRD does not"
                );
            }
        }
    }
}

/// Typed property paths of a schema: path -> type.
fn typed_paths(schema: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    if let Some(t) = schema["type"].as_str() {
        out.insert(path.to_string(), t.to_string());
    }
    for (k, v) in schema["properties"].as_object().into_iter().flatten() {
        typed_paths(v, &format!("{path}.{k}"), out);
    }
    if schema.get("items").is_some() {
        typed_paths(&schema["items"], &format!("{path}[]"), out);
    }
    if schema["additionalProperties"].is_object() {
        typed_paths(&schema["additionalProperties"], &format!("{path}{{}}"), out);
    }
}

/// Whether some object on the way to `path` in `schema` keeps unknown fields.
fn open_ancestor(schema: &Value, path: &str) -> bool {
    let mut node = schema;
    let mut rest = path;
    loop {
        if node["x-kubernetes-preserve-unknown-fields"] == true {
            return true;
        }
        let Some(r) = rest.strip_prefix('.') else {
            // `[]` and `{}` steps.
            if let Some(r) = rest.strip_prefix("[]") {
                node = &node["items"];
                rest = r;
                continue;
            }
            if let Some(r) = rest.strip_prefix("{}") {
                node = &node["additionalProperties"];
                rest = r;
                continue;
            }
            return false;
        };
        let end = r.find(['.', '[', '{']).unwrap_or(r.len());
        let key = &r[..end];
        match node["properties"].get(key) {
            Some(n) => {
                node = n;
                rest = &r[end..];
            }
            None => return false,
        }
    }
}

#[test]
fn stand_in_crds_agree_with_upstream() {
    let upstream_files = [
        "crds/istio.io.yaml",
        "crds/services.cloud.sap.com_serviceinstances.yaml",
        "crds/services.cloud.sap.com_servicebindings.yaml",
        "crds/cert.gardener.cloud_certificates.yaml",
        "crds/cert-manager.io_certificates.yaml",
    ];
    let upstream: BTreeMap<String, Value> = upstream_files
        .iter()
        .flat_map(|f| yaml_file(&reference(f)))
        .map(|c| {
            (
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c,
            )
        })
        .collect();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for f in [
        fixtures::ISTIO_CRDS,
        fixtures::BTP_CRDS,
        fixtures::GARDENER_CERT_CRD,
        fixtures::CERT_MANAGER_CRD,
    ] {
        for ours in yaml_file(&fixtures::path(f)) {
            let name = ours["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let up = upstream
                .get(&name)
                .unwrap_or_else(|| panic!("{f}: no upstream CRD {name}"));
            for k in ["group", "scope"] {
                assert_eq!(ours["spec"][k], up["spec"][k], "{name} {k}");
            }
            for k in ["kind", "plural", "singular", "listKind"] {
                assert_eq!(
                    ours["spec"]["names"][k], up["spec"]["names"][k],
                    "{name} names.{k}"
                );
            }
            for v in ours["spec"]["versions"].as_array().into_iter().flatten() {
                let vname = v["name"].as_str().unwrap_or_default();
                let up_schema = schema_of(up, vname);
                assert!(
                    !up_schema.is_null(),
                    "{name}: upstream does not serve {vname}"
                );
                let (mut mine, mut theirs) = (BTreeMap::new(), BTreeMap::new());
                typed_paths(&v["schema"]["openAPIV3Schema"], "", &mut mine);
                typed_paths(&up_schema, "", &mut theirs);
                for (p, t) in &mine {
                    // apiVersion, kind and metadata are every object's; upstream may not spell them out.
                    if ["", ".apiVersion", ".kind", ".metadata"].contains(&p.as_str()) {
                        continue;
                    }
                    match theirs.get(p) {
                        Some(ut) if ut == t => {}
                        Some(ut) => wrong.push(format!("{name} {vname} {p}: {t}, upstream {ut}")),
                        // Upstream may leave an enclosing object open where we type a field.
                        None if open_ancestor(&up_schema, p) => {}
                        None => wrong.push(format!("{name} {vname} {p} ({t}): not upstream")),
                    }
                    checked += 1;
                }
                let has_status = up_schema["properties"].get("status").is_some();
                if v["subresources"].get("status").is_some() {
                    assert!(has_status, "{name}: upstream has no status");
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "stand-in CRDs disagree with upstream:\n{}",
        wrong.join("\n")
    );
    assert!(checked > 100, "only {checked} typed fields compared");
}

#[tokio::test]
async fn every_upstream_crd_applies() {
    let cp = ControlPlane::shared().expect("control plane");
    let client = cp.admin().await.expect("admin client");
    for f in [
        "crds/istio.io.yaml",
        "crds/services.cloud.sap.com_serviceinstances.yaml",
        "crds/services.cloud.sap.com_servicebindings.yaml",
        "crds/cert.gardener.cloud_certificates.yaml",
        "crds/cert-manager.io_certificates.yaml",
    ] {
        let applied = manifest::apply_file(&client, &reference(f), None)
            .await
            .unwrap_or_else(|e| panic!("{f}: {e:#}"));
        assert!(!applied.is_empty(), "{f} holds no objects");
    }
    // The existing module's CRD has our CRD's name: apply it under another group.
    let yaml = std::fs::read_to_string(reference(
        "crds/connectivityproxies.connectivityproxy.sap.com.yaml",
    ))
    .expect("existing CRD")
    .replace("connectivityproxy.sap.com", "legacy.connectivityproxy.test");
    for o in manifest::apply_yaml(&client, &yaml, None)
        .await
        .expect("existing CRD applies")
    {
        manifest::wait_crd_established(&client, &o.metadata.name.unwrap_or_default())
            .await
            .expect("existing CRD established");
    }
}

#[test]
fn dashboard_extension_sections_validate_against_busola_schemas() {
    for file in ["extension.yaml", "servicemapping-extension.yaml"] {
        validate_extension(file);
    }
}

fn validate_extension(file: &str) {
    let ext = yaml_file(&cp_tests::workspace_root().join("manifests/ui").join(file)).remove(0);
    for name in ["general", "list", "details", "form"] {
        let mut schema =
            yaml_file(&reference(&format!("busola-schemas/schema-{name}.yaml"))).remove(0);
        // The published form schema defines the Switch and Number widgets under `$widgets` but leaves
        // them out of the `widget` enum; accept every widget it defines.
        let defined: Vec<Value> = schema["$widgets"]
            .as_object()
            .map(|w| w.keys().map(|k| Value::String(k.clone())).collect())
            .unwrap_or_default();
        if let Some(e) = schema
            .pointer_mut("/$defs/component/properties/widget/enum")
            .and_then(Value::as_array_mut)
        {
            for w in defined {
                if !e.contains(&w) {
                    e.push(w);
                }
            }
        }
        let validator =
            jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("schema {name}: {e}"));
        let text = ext["data"][name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} section"));
        let instance: Value =
            serde_norway::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{file}: section {name} does not match the Busola schema: {errors:?}"
        );
    }
}

#[test]
fn default_cr_is_kyma_default_cr() {
    let upstream = yaml_file(&reference("examples/kyma-default-cr.yaml")).remove(0);
    let ours = yaml_file(&fixtures::default_cr_path()).remove(0);
    assert_eq!(
        ours, upstream,
        "manifests/default-cr.yaml differs from Kyma's default CR"
    );
}
