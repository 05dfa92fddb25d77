//! CRD generation: the committed YAML under `manifests/crds/` must equal this output.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

use crate::names;

/// Both CRDs with the module labels.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        crate::ConnectivityProxy::crd(),
        crate::ServiceMapping::crd(),
    ];
    for crd in &mut crds {
        for v in &mut crd.spec.versions {
            if let Some(spec) = v
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
                .and_then(|s| s.properties.as_mut())
                .and_then(|p| p.get_mut("spec"))
            {
                limit_sizes("spec", spec);
            }
        }
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(names::LABEL_MODULE.into(), names::MODULE_VALUE.into());
        labels.insert(
            names::LABEL_MANAGED_BY.into(),
            names::MANAGED_BY_VALUE.into(),
        );
    }
    crds
}

/// Longest value of a name or host field (a DNS subdomain).
pub const MAX_NAME: i64 = 253;
/// Longest inline service key (`secretData`, base64).
pub const MAX_SECRET_DATA: i64 = 65536;
/// Longest value of any other free-form string.
pub const MAX_STRING: i64 = 1024;
/// Most items of a list.
pub const MAX_ITEMS: i64 = 256;
/// Most keys of a map.
pub const MAX_PROPERTIES: i64 = 64;

/// Gives every free-form field of a spec schema a size limit the API server enforces: strings
/// (`maxLength`, unless an enum already bounds them), lists (`maxItems`) and maps (`maxProperties`).
/// Another namespace's editor can then neither store a megabyte CR nor make the operator or the
/// webhook hold one; the limits are far above any real value.
pub fn limit_sizes(name: &str, schema: &mut JSONSchemaProps) {
    match schema.type_.as_deref() {
        Some("string") if schema.enum_.is_none() && schema.max_length.is_none() => {
            schema.max_length = Some(if name == "secretData" {
                MAX_SECRET_DATA
            } else if name.ends_with("Name") || name.ends_with("name") || name.ends_with("Host") {
                MAX_NAME
            } else {
                MAX_STRING
            });
        }
        Some("array") if schema.max_items.is_none() => schema.max_items = Some(MAX_ITEMS),
        Some("object")
            if schema.additional_properties.is_some() && schema.max_properties.is_none() =>
        {
            schema.max_properties = Some(MAX_PROPERTIES)
        }
        _ => {}
    }
    for (k, p) in schema.properties.iter_mut().flatten() {
        limit_sizes(k, p);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = schema.items.as_mut() {
        limit_sizes(name, items);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut() {
        limit_sizes(name, values);
    }
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
/// `off`, `On`, `YES`, `no`, `y`, `N`... as booleans (`highAvailabilityMode` defaults to `off`). Quote
/// every such word ([`crate::yaml11::is_yaml11_only_boolean`], the YAML 1.1 writer's own list).
fn quote_yaml11_booleans(yaml: &str) -> String {
    let is_word = |v: &&str| crate::yaml11::is_yaml11_only_boolean(v);
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let fixed = line
            .rsplit_once(": ")
            .filter(|(_, v)| is_word(v))
            .map(|(k, v)| format!("{k}: '{v}'"))
            .or_else(|| {
                line.trim_start()
                    .strip_prefix("- ")
                    .filter(is_word)
                    .map(|v| format!("{}- '{v}'", &line[..line.len() - line.trim_start().len()]))
            });
        out.push_str(fixed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_free_form_spec_field_has_a_size_limit() {
        fn walk(path: &str, s: &JSONSchemaProps, missing: &mut Vec<String>) {
            match s.type_.as_deref() {
                Some("string") if s.enum_.is_none() && s.max_length.is_none() => {
                    missing.push(format!("{path} maxLength"))
                }
                Some("array") if s.max_items.is_none() => missing.push(format!("{path} maxItems")),
                Some("object")
                    if s.additional_properties.is_some() && s.max_properties.is_none() =>
                {
                    missing.push(format!("{path} maxProperties"))
                }
                _ => {}
            }
            for (k, p) in s.properties.iter().flatten() {
                walk(&format!("{path}.{k}"), p, missing);
            }
            if let Some(JSONSchemaPropsOrArray::Schema(i)) = &s.items {
                walk(&format!("{path}[]"), i, missing);
            }
            if let Some(JSONSchemaPropsOrBool::Schema(v)) = &s.additional_properties {
                walk(&format!("{path}{{}}"), v, missing);
            }
        }
        let mut missing = Vec::new();
        let mut strings = 0;
        for crd in all() {
            for v in &crd.spec.versions {
                let spec = &v
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .expect("schema")
                    .properties
                    .as_ref()
                    .expect("properties")["spec"];
                walk("spec", spec, &mut missing);
                strings += serde_json::to_string(spec)
                    .expect("json")
                    .matches("maxLength")
                    .count();
            }
        }
        assert!(missing.is_empty(), "{missing:?}");
        assert!(strings > 20, "only {strings} limited strings");
    }

    #[test]
    fn yaml11_booleans_are_quoted() {
        assert_eq!(
            super::quote_yaml11_booleans("a: off\n- on\nb: offset\n"),
            "a: 'off'\n- 'on'\nb: offset\n"
        );
        // Every YAML 1.1 spelling, not only the lower-case ones; YAML 1.2's own words are left alone
        // (serde_norway writes them only for real booleans and nulls).
        assert_eq!(
            super::quote_yaml11_booleans("a: YES\nb: No\n- OFF\n- Y\nc: true\nd: null\ne: False\n"),
            "a: 'YES'\nb: 'No'\n- 'OFF'\n- 'Y'\nc: true\nd: null\ne: False\n"
        );
    }
}
