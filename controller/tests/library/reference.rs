//! The upstream legacy configuration (`../shared/reference/legacy-install`, or `CP_REFERENCE_DIR`)
//! imports into the module's configuration. Ignored by `cargo test`: a clone of this repository alone
//! has no such files; `make check-reference` runs it with `--ignored`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

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

#[test]
#[ignore = "needs the upstream files: make check-reference"]
fn upstream_legacy_config_imports() {
    for f in [
        "legacy-install/cp_cm.yaml",
        "legacy-install/cp_cm_info.yaml",
    ] {
        assert!(!yaml_file(&reference(f)).is_empty(), "{f}");
    }
    let cm = yaml_file(&reference("legacy-install/cp_cm.yaml")).remove(0);
    let info = yaml_file(&reference("legacy-install/cp_cm_info.yaml")).remove(0);
    let info: BTreeMap<String, String> =
        serde_json::from_value(info["data"].clone()).expect("info data");
    let legacy = cm["data"]["connectivity-proxy-config.yml"]
        .as_str()
        .expect("config key");
    let defaults = serde_json::json!({"servers": {"businessDataTunnel": {"externalHost": "auto-provision"}},
        "subaccountId": "auto-provision", "subaccountSubdomain": "auto-provision"});
    let (config, imported) = cp_controller::migration::import(&defaults, legacy, &info)
        .expect("upstream legacy config imports");
    assert!(!imported.is_empty(), "nothing imported");
    let legacy: Value = serde_norway::from_str(legacy).expect("yaml");
    assert_eq!(config["subaccountId"], legacy["subaccountId"]);
    assert_eq!(
        config["servers"]["businessDataTunnel"]["externalHost"],
        legacy["servers"]["businessDataTunnel"]["externalHost"]
    );
}
