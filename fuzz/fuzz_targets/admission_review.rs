//! Raw bytes as an AdmissionReview body, through everything the webhook does with a request:
//! decode, the three decisions, the HTTP-level `review` of every endpoint and the encoded response.
//! Nothing may panic; a defaulting patch must apply to the object it was computed from and leave
//! nothing more to default.
#![no_main]

use std::sync::{Arc, OnceLock};

use cp_api::ServiceMapping;
use cp_api::mapping::{MappingType, ServiceMappingSpec};
use cp_api::policy::PrivilegedIdentities;
use cp_webhook::admission::{self, Endpoint, Facts, Policy};
use libfuzzer_sys::fuzz_target;

/// The operator's ServiceAccount as the webhook derives it from its default
/// `--operator-service-account kyma-system/connectivity-proxy-controller`.
const OPERATOR: &str = "system:serviceaccount:kyma-system:connectivity-proxy-controller";

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| Policy {
        privileged: PrivilegedIdentities {
            users: vec![OPERATOR.into()],
            groups: vec![],
        },
    })
}

fn mapping(
    name: &str,
    kind: MappingType,
    subaccount: Option<&str>,
    service: &str,
) -> Arc<ServiceMapping> {
    Arc::new(ServiceMapping::new(
        name,
        ServiceMappingSpec {
            kind,
            subaccount_id: subaccount.map(Into::into),
            service_id: service.into(),
            tenant_id: None,
            internal_address: "backend.default.svc.cluster.local:8080".into(),
            location_ids: None,
        },
    ))
}

/// Cluster states: empty, a dedicated cluster with mappings, a shared-tenant cluster with mappings.
fn facts() -> &'static [Facts; 3] {
    static FACTS: OnceLock<[Facts; 3]> = OnceLock::new();
    FACTS.get_or_init(|| {
        let mappings = vec![
            mapping("erp", MappingType::Rfc, None, "erp.internal"),
            mapping(
                "db",
                MappingType::Tcp,
                Some("00000000-0000-0000-0000-000000000000"),
                "db.internal",
            ),
        ];
        let index = || {
            cp_webhook::index::SharedIndex::new(cp_webhook::index::MappingIndex::of(
                mappings.iter().map(|m| m.as_ref()),
            ))
        };
        [
            Facts::default(),
            Facts {
                service_mappings: index(),
                shared_tenant: false,
            },
            Facts {
                service_mappings: index(),
                shared_tenant: true,
            },
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = admission::decode(data) else {
        return;
    };

    if let Ok(Some(defaulting)) = admission::mutate(&req) {
        // The patch applies to the object it was computed from, and the patched object needs no
        // second patch. (A body the webhook decodes but serde_json's Value refuses, e.g. a number
        // out of f64 range in a skipped field, is left out of this check.)
        if let Ok(mut review) = serde_json::from_slice::<serde_json::Value>(data) {
            let object = &mut review["request"]["object"];
            json_patch::patch(object, &defaulting.patch())
                .expect("the defaulting patch applies to the object it was computed from");
            let body = serde_json::to_vec(&review).expect("the patched review encodes");
            let again = admission::decode(&body).expect("the patched review decodes");
            assert!(
                matches!(admission::mutate(&again), Ok(None)),
                "a defaulted object needs no second patch"
            );
        }
    }

    for facts in facts() {
        let _ = admission::validate_cp(&req, policy(), &|| facts.clone());
        let _ = admission::validate_sm(&req, facts);
        for endpoint in [
            Endpoint::Mutate,
            Endpoint::Validate,
            Endpoint::ValidateServiceMapping,
        ] {
            let (resp, _decision) = admission::review(endpoint, &req, policy(), &|| facts.clone());
            let answer = admission::encode_response(resp).expect("the AdmissionReview answer encodes");
            serde_json::from_slice::<serde_json::Value>(&answer).expect("the answer is JSON");
        }
    }
});
