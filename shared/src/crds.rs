//! CRD generation: the committed YAML under `manifests/crds/` must equal this output.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::names;

/// Both CRDs with the module labels.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        crate::ConnectivityProxy::crd(),
        crate::ServiceMapping::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(names::LABEL_MODULE.into(), names::MODULE_VALUE.into());
        labels.insert(
            names::LABEL_MANAGED_BY.into(),
            names::MANAGED_BY_VALUE.into(),
        );
    }
    crds
}

/// File name and YAML of each CRD.
pub fn rendered() -> Result<Vec<(String, String)>, serde_norway::Error> {
    all()
        .into_iter()
        .map(|crd| {
            let yaml = quote_yaml11_booleans(&serde_norway::to_string(&crd)?);
            Ok((
                format!("{}.yaml", crd.metadata.name.unwrap_or_default()),
                yaml,
            ))
        })
        .collect()
}

/// serde_norway writes YAML 1.2, where `off` is a string; kubectl and other YAML 1.1 readers would take
/// `off`, `on`, `yes`, `no`, `y`, `n` as booleans (`highAvailabilityMode` defaults to `off`). Quote them.
fn quote_yaml11_booleans(yaml: &str) -> String {
    const WORDS: [&str; 8] = ["off", "on", "yes", "no", "y", "n", "Off", "On"];
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let fixed = line
            .rsplit_once(": ")
            .filter(|(_, v)| WORDS.contains(v))
            .map(|(k, v)| format!("{k}: '{v}'"))
            .or_else(|| {
                line.trim_start()
                    .strip_prefix("- ")
                    .filter(|v| WORDS.contains(v))
                    .map(|v| format!("{}- '{v}'", &line[..line.len() - line.trim_start().len()]))
            });
        out.push_str(fixed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn yaml11_booleans_are_quoted() {
        assert_eq!(
            super::quote_yaml11_booleans("a: off\n- on\nb: offset\n"),
            "a: 'off'\n- 'on'\nb: offset\n"
        );
    }
}
