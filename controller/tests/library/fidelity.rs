//! The proxy reads what the CR says: each legacy configuration the project ships (and variants with the
//! strings YAML 1.1 reads as something else) is imported into the module's default CR, rendered as the
//! operator renders `connectivity-proxy-config.yml`, and both files are read as YAML 1.1 (PyYAML, the
//! way the Java proxy reads them): every key of the legacy file must read back the same.

use std::collections::BTreeMap;

use cp_api::ConnectivityProxy;
use cp_controller::desired::{Resolved, render_config};

fn legacy_config() -> String {
    let text = std::fs::read_to_string(cp_tests::fixtures::path(cp_tests::fixtures::LEGACY_CONFIG))
        .expect("fixture");
    let cm = cp_tests::manifest::parse_documents(&text)
        .expect("yaml")
        .remove(0);
    serde_json::to_value(cm).expect("json")["data"]["connectivity-proxy-config.yml"]
        .as_str()
        .expect("config key")
        .to_string()
}

fn default_cr() -> ConnectivityProxy {
    serde_json::from_value(cp_tests::fixtures::shipped_default_cr()).expect("typed")
}

/// Imports `legacy` into the default CR and renders the proxy's file.
fn render(legacy: &str) -> String {
    let mut cr = default_cr();
    let config = serde_json::to_value(&cr.spec.config).expect("json");
    let info: BTreeMap<String, String> =
        [("onpremise_proxy_http_port".to_string(), "20003".to_string())].into();
    let (config, _) = cp_controller::migration::import(&config, legacy, &info)
        .unwrap_or_else(|e| panic!("import of\n{legacy}\nfailed: {e}"));
    cr.spec.config = serde_json::from_value(config.clone()).expect("spec.config");
    let host = config["servers"]["businessDataTunnel"]["externalHost"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let resolved = Resolved {
        external_host: host,
        tls_secret: "cp-tls".into(),
        tls_auto: true,
        istio_namespace: "istio-system".into(),
        service_key_secret: "connectivity-proxy-service-key".into(),
        service_key_auto: true,
        subaccount_id: config["subaccountId"].as_str().map(String::from),
        subaccount_subdomain: config["subaccountSubdomain"].as_str().map(String::from),
        secrets_hash: None,
        auditlog_secret: None,
    };
    render_config(&cr, &resolved)
}

#[test]
fn rendered_config_reads_back_like_every_legacy_file_under_yaml_1_1() {
    let base = legacy_config();
    // The legacy renderer quoted what YAML 1.1 would misread; so do these variants.
    let mut files = vec![
        base.clone(),
        base.replace("tenantMode: dedicated", "tenantMode: shared"),
    ];
    for tricky in [
        "on",
        "yes",
        "No",
        "y",
        "~",
        "null",
        "0x1F",
        "0123",
        "1_000",
        "1:20",
        "2001-12-14",
        ".inf",
        "1e3",
        "true",
        "12",
    ] {
        files.push(base.replace(
            "subaccountSubdomain: legacy-subdomain",
            &format!("subaccountSubdomain: \"{tricky}\""),
        ));
    }
    files.push(base.replace("mode: console", "mode: \"off\""));
    let pairs: Vec<(String, String)> = files.iter().map(|f| (f.clone(), render(f))).collect();
    for (_, rendered) in &pairs {
        assert!(
            rendered.contains("highAvailabilityMode: \"off\""),
            "{rendered}"
        );
    }
    let diffs = cp_tests::yaml11::mismatches(&pairs).expect("PyYAML");
    assert!(
        diffs.is_empty(),
        "the proxy would read something else:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn the_oracle_catches_an_unquoted_off() {
    let legacy = "highAvailabilityMode: \"off\"\n".to_string();
    let diffs = cp_tests::yaml11::mismatches(&[(legacy, "highAvailabilityMode: off\n".into())])
        .expect("PyYAML");
    assert_eq!(diffs.len(), 1, "{diffs:?}");
}
