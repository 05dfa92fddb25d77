//! The Kyma dashboard writes what its forms say: every form path gets a value of the type its widget
//! writes (Text: a string, Number: a number, Switch: a boolean, Text with an enum: each value), and the
//! API server (schema and webhook) must accept it and store it with the CRD's type. `kubectl explain`
//! offers the enums.

use cp_tests::fixtures::{default_cr, dynamic_crs, dynamic_mappings, service_mapping_json};
use cp_tests::shared::{MAPPINGS_LOCK, control_plane, webhook};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

/// `(absolute path, widget, enum values or the placeholder)` of every form field, FormGroup children
/// resolved.
fn fields(items: &Value, prefix: &str, out: &mut Vec<(String, String, Vec<Value>)>) {
    for item in items.as_array().into_iter().flatten() {
        let full = cp_tests::fixtures::form_item_path(prefix, item);
        let widget = item["widget"].as_str().unwrap_or_default().to_string();
        if widget == "FormGroup" {
            fields(&item["children"], &full, out);
            continue;
        }
        let values = item["enum"].as_array().cloned().unwrap_or_else(|| {
            // A Text field's placeholder shows the shape a user types (e.g. host:port).
            item["placeholder"]
                .as_str()
                .map(|p| {
                    vec![json!(
                        p.replace("host", "sample-svc.sample-ns")
                            .replace("port", "8080")
                    )]
                })
                .unwrap_or_default()
        });
        out.push((full, widget, values));
    }
}

fn form(file: &str) -> Value {
    let text = std::fs::read_to_string(cp_tests::workspace_root().join("manifests/ui").join(file))
        .expect("extension");
    let cm: Value = serde_norway::from_str(&text).expect("yaml");
    serde_norway::from_str(cm["data"]["form"].as_str().expect("form")).expect("form yaml")
}

/// What the widget writes: the values a user can enter, typed as the dashboard sends them.
fn written(widget: &str, values: &[Value]) -> Vec<Value> {
    match widget {
        "Switch" => vec![json!(true), json!(false)],
        "Number" => vec![json!(30443)],
        "SimpleList" => vec![json!(["loc-1", "loc-2"])],
        _ if !values.is_empty() => values.to_vec(),
        _ => vec![json!("sample-value-1")],
    }
}

fn set(obj: &mut Value, path: &str, v: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        if !cur[*p].is_object() {
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
    cur[parts[parts.len() - 1]] = v;
}

fn get<'a>(obj: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(obj, |cur, p| &cur[p])
}

async fn dry_run(api: &Api<DynamicObject>, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let o: DynamicObject = serde_json::from_value(obj.clone()).expect("object");
    api.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &o,
    )
    .await
}

#[tokio::test]
async fn every_form_value_the_dashboard_writes_is_accepted_with_the_crds_type() {
    webhook().await;
    // Switching service channels off is refused while mappings exist: none may appear meanwhile.
    let _mappings = MAPPINGS_LOCK.lock().await;
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    let ns = cp.namespace("dashboard-form").await.expect("ns");
    let cps = dynamic_crs(&admin, &ns);
    let sms = dynamic_mappings(&admin);
    let mut checked = 0;
    for (file, api, base) in [
        ("extension.yaml", &cps, default_cr("form")),
        (
            "servicemapping-extension.yaml",
            &sms,
            service_mapping_json(
                "form-mapping",
                json!({"type": "TCP", "serviceId": "form-service", "internalAddress": "svc.ns:8080"}),
            ),
        ),
    ] {
        let mut all = Vec::new();
        fields(&form(file), "", &mut all);
        assert!(all.len() >= 6, "{file}: only {} form fields", all.len());
        for (path, widget, values) in all {
            for v in written(&widget, &values) {
                let mut obj = base.clone();
                set(&mut obj, &path, v.clone());
                let stored = dry_run(api, &obj).await.unwrap_or_else(|e| {
                    panic!("{file}: {path} = {v} (widget {widget}) is refused: {e}")
                });
                let back = get(&serde_json::to_value(&stored).expect("json"), &path).clone();
                assert_eq!(back, v, "{file}: {path} stored as {back}, written as {v}");
                checked += 1;
                // The control: what a Text widget would have written for a typed field is refused,
                // so the widget choice is what makes the form work.
                if widget == "Switch" || widget == "Number" {
                    let mut wrong = base.clone();
                    set(&mut wrong, &path, json!(v.to_string()));
                    assert!(
                        dry_run(api, &wrong).await.is_err(),
                        "{file}: {path} accepts the string {v:?}: the widget test proves nothing"
                    );
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} values checked");
}

#[tokio::test]
async fn kubectl_explain_lists_the_enum_values() {
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    cp_tests::fixtures::install_our_crds(&admin).await;
    let kubeconfig = cp
        .write_kubeconfig("explain.kubeconfig", &cp_tests::Identity::Admin)
        .await
        .expect("kubeconfig");
    let kubectl = cp_tests::cluster::k8s_bin_dir()
        .expect("bins")
        .join("kubectl");
    for (field, values) in [
        (
            "connectivityproxy.spec.config.tenantMode",
            &["dedicated", "shared"][..],
        ),
        (
            "connectivityproxy.spec.config.highAvailabilityMode",
            &["off", "path", "subdomain"][..],
        ),
    ] {
        // The API server publishes a new CRD's OpenAPI a moment after it is established.
        let text = cp_tests::wait::until(
            &format!("kubectl explain {field}"),
            std::time::Duration::from_secs(30),
            || async {
                let out = tokio::process::Command::new(&kubectl)
                    .args(["explain", field])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .await
                    .map_err(|e| e.to_string())?;
                if out.status.success() {
                    Ok(Some(String::from_utf8_lossy(&out.stdout).to_string()))
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).to_string())
                }
            },
        )
        .await
        .expect("kubectl explain");
        let listed: Vec<&str> = text
            .split("ENUM:")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .map(str::trim)
            .collect();
        assert_eq!(
            listed, values,
            "{field}: kubectl explain's ENUM block:\n{text}"
        );
        println!("{text}");
    }
}
