use serde_json::{Value, json};

use super::*;

fn review_body(kind: &str, op: &str, user: &str, object: Value, old: Option<Value>) -> Vec<u8> {
    let resource = if kind == "ServiceMapping" {
        "servicemappings"
    } else {
        "connectivityproxies"
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": kind},
            "resource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": "kyma-system",
            "operation": op,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    }))
    .expect("json")
}

/// A review of `op` on a ConnectivityProxy by `user`.
fn cr_review(op: &str, user: &str, object: Value, old: Option<Value>) -> Vec<u8> {
    review_body("ConnectivityProxy", op, user, object, old)
}

/// A review of alice's update of the CR `old` to `new`.
fn alice_update(new: Value, old: Value) -> Vec<u8> {
    cr_review("UPDATE", "alice", new, Some(old))
}

/// A review of `op` on a ServiceMapping by `user`.
fn mapping_review(op: &str, user: &str, object: Value, old: Option<Value>) -> Vec<u8> {
    review_body("ServiceMapping", op, user, object, old)
}

/// The module's default CR (`kyma-system/connectivity-proxy`) as a client sends it.
fn default_cr() -> Value {
    cp_api::testing::cr_json(
        cp_api::names::KYMA_SYSTEM,
        cp_api::testing::CR_NAME,
        cp_api::testing::default_spec_json(),
    )
}

fn defaulted_cr() -> Value {
    let mut cr = default_cr();
    cr["spec"]["deployment"] = defaults::deployment_defaults_json();
    cr
}

fn policy() -> Policy {
    Policy {
        privileged: PrivilegedIdentities {
            users: vec!["system:serviceaccount:kyma-system:cp-controller".into()],
            groups: vec![],
        },
    }
}

fn run(endpoint: Endpoint, body: &[u8], facts: ClusterView) -> (Response, Decision) {
    let req = decode(body).expect("decodes");
    review(endpoint, &req, &policy(), &|| facts.clone())
}

/// The ServiceMapping endpoint's decision on `body` in a cluster of `facts`.
fn mapping_decision(body: &[u8], facts: ClusterView) -> Decision {
    run(Endpoint::ValidateServiceMapping, body, facts).1
}

/// [`mapping_decision`] with no other ServiceMappings.
fn mapping_decision_alone(body: &[u8]) -> Decision {
    mapping_decision(body, ClusterView::default())
}

/// A cluster with `n` ServiceMappings ([`mapping_index`]) and no shared tenant.
fn with_mappings(n: usize) -> ClusterView {
    ClusterView {
        service_mappings: mapping_index(n),
        shared_tenant: false,
    }
}

/// The validating endpoint's answer to `body`, with no ServiceMappings and no shared tenant.
fn validate(body: &[u8]) -> (Response, Decision) {
    run(Endpoint::Validate, body, ClusterView::default())
}

/// Asserts that the validating endpoint denies `body` with a message naming `field`; returns the
/// answer.
#[track_caller]
fn assert_denied_naming(body: &[u8], field: &str) -> Response {
    let (resp, d) = validate(body);
    assert_eq!(
        d,
        Decision::Denied,
        "denied naming {field}: {}",
        resp.result.message
    );
    assert!(
        resp.result.message.contains(field),
        "the denial names {field}: {}",
        resp.result.message
    );
    resp
}

#[test]
fn mutate_injects_complete_defaults_on_create() {
    let body = cr_review("CREATE", "alice", default_cr(), None);
    let req = decode(&body).expect("decode");
    let patch = mutate(&req).expect("ok").expect("a patch");
    let mut obj = default_cr();
    json_patch::patch(&mut obj, &patch.patch()).expect("patch applies");
    assert_eq!(
        obj["spec"]["deployment"],
        defaults::deployment_defaults_json()
    );
    assert_eq!(
        obj["spec"]["config"],
        default_cr()["spec"]["config"],
        "user fields untouched"
    );
}

#[test]
fn mutate_is_idempotent_and_fills_only_missing() {
    let body = alice_update(defaulted_cr(), defaulted_cr());
    assert!(
        mutate(&decode(&body).expect("decode"))
            .expect("ok")
            .is_none()
    );
    let mut partial = defaulted_cr();
    partial["spec"]["deployment"]["replicaCount"] = json!(3);
    partial["spec"]["deployment"]["image"]
        .as_object_mut()
        .map(|i| i.remove("tag"));
    let body = alice_update(partial.clone(), defaulted_cr());
    let patch = mutate(&decode(&body).expect("decode"))
        .expect("ok")
        .expect("patch");
    json_patch::patch(&mut partial, &patch.patch()).expect("applies");
    assert_eq!(
        partial["spec"]["deployment"]["replicaCount"], 3,
        "existing value kept"
    );
    assert_eq!(
        partial["spec"]["deployment"]["image"]["tag"],
        defaults::PROXY_TAG
    );
}

#[test]
fn normal_user_cannot_change_deployment() {
    let mut new = defaulted_cr();
    new["spec"]["deployment"]["replicaCount"] = json!(5);
    new["spec"]["deployment"]["image"]["tag"] = json!("evil");
    let body = alice_update(new.clone(), defaulted_cr());
    let resp = assert_denied_naming(&body, "spec.deployment.replicaCount");
    assert!(
        resp.result.message.contains("spec.deployment.image.tag"),
        "{}",
        resp.result.message
    );
    // Says who may without naming them: the extra identities come from a ConfigMap the caller
    // may not read.
    assert!(
        resp.result
            .message
            .contains("the operator's ServiceAccount and the privileged identities")
            && !resp.result.message.contains("cp-controller"),
        "says who may: {}",
        resp.result.message
    );
    let op = "system:serviceaccount:kyma-system:cp-controller";
    let body = cr_review("UPDATE", op, new, Some(defaulted_cr()));
    assert_eq!(validate(&body).1, Decision::Allowed);
}

#[test]
fn create_with_non_default_deployment_is_refused_for_users() {
    let mut new = defaulted_cr();
    new["spec"]["deployment"]["replicaCount"] = json!(2);
    let body = cr_review("CREATE", "alice", new, None);
    assert_denied_naming(&body, "spec.deployment.replicaCount");
}

#[test]
fn user_fields_may_change() {
    let mut new = defaulted_cr();
    new["spec"]["config"]["servers"]["proxy"] = json!({"http": {"port": 20100}});
    let body = alice_update(new, defaulted_cr());
    assert_eq!(validate(&body).1, Decision::Allowed);
}

#[test]
fn cross_field_rules_are_enforced() {
    let mut new = defaulted_cr();
    new["spec"]["config"]["multiRegionMode"] = json!({"enabled": true});
    let body = cr_review("CREATE", "alice", new, None);
    assert_denied_naming(&body, "spec.config.multiRegionMode.configMapName");
}

#[test]
fn unknown_fields_are_refused() {
    let mut new = defaulted_cr();
    new["spec"]["config"]["bogus"] = json!(1);
    let body = cr_review("CREATE", "alice", new, None);
    assert_denied_naming(&body, "spec.config.bogus");
}

fn mapping(name: &str, service: &str) -> Value {
    json!({
        "apiVersion": "connectivityproxy.sap.com/v1",
        "kind": "ServiceMapping",
        "metadata": {"name": name},
        "spec": {"type": "RFC", "serviceId": service, "internalAddress": "erp.default:3300", "subaccountId": "sub"}
    })
}

/// `n` mappings `m-0000`... of about 200 bytes each in the aggregated ConfigMap.
fn mapping_index(n: usize) -> crate::index::SharedIndex {
    let mappings: Vec<cp_api::ServiceMapping> = (0..n)
        .map(|i| {
            serde_json::from_value(mapping(
                &format!("m-{i:04}"),
                &format!("service-{i:04}.on-premise.example.com"),
            ))
            .expect("mapping")
        })
        .collect();
    crate::index::SharedIndex::new(crate::index::MappingIndex::of(mappings.iter()))
}

/// As many mappings as [`mapping_index`] makes that fit into the budget of all shards together.
fn full_mapping_count() -> usize {
    let mut used = 0;
    for i in 0.. {
        let m: cp_api::ServiceMapping = serde_json::from_value(mapping(
            &format!("m-{i:04}"),
            &format!("service-{i:04}.on-premise.example.com"),
        ))
        .expect("mapping");
        used += cp_api::mapping::entry_bytes(&format!("m-{i:04}"), &m.spec);
        if used > cp_api::mapping::MAPPINGS_TOTAL_BUDGET_BYTES {
            return i;
        }
    }
    unreachable!("the budget is finite")
}

#[test]
fn a_mapping_beyond_the_configmap_budget_is_refused_saying_why() {
    let full = full_mapping_count();
    let index = mapping_index(full);
    let used = index.read(|i| i.bytes());
    assert!(
        used > cp_api::mapping::MAPPINGS_TOTAL_BUDGET_BYTES - 200,
        "{used}: the index is not near the budget"
    );
    let facts = ClusterView {
        service_mappings: index,
        shared_tenant: false,
    };
    let body = mapping_review("CREATE", "alice", mapping("new", "one-more"), None);
    let (resp, d) = run(Endpoint::ValidateServiceMapping, &body, facts.clone());
    assert_eq!(d, Decision::Denied, "{}", resp.result.message);
    let msg = &resp.result.message;
    assert!(
        msg.contains("ServiceMapping new is refused")
            && !msg.contains(&full.to_string())
            && msg.contains("13056 KiB")
            && msg.contains("16 ConfigMaps")
            && msg.contains("connectivity-proxy-service-mappings")
            && msg.contains("delete"),
        "{msg}"
    );
    assert!(msg.len() < 450, "a short message: {} bytes", msg.len());
    // Editing an existing mapping without growing its entry stays possible.
    let body = mapping_review(
        "UPDATE",
        "alice",
        mapping("m-0001", "service-x001.on-premise.example.com"),
        Some(mapping("m-0001", "service-0001.on-premise.example.com")),
    );
    assert_eq!(mapping_decision(&body, facts), Decision::Allowed);
    // With room left: admitted.
    let facts = with_mappings(100);
    let body = mapping_review("CREATE", "alice", mapping("new", "one-more"), None);
    assert_eq!(mapping_decision(&body, facts), Decision::Allowed);
}

#[test]
fn switching_channels_off_with_10000_mappings_is_refused_in_a_short_message() {
    let facts = with_mappings(10_000);
    let mut cr = defaulted_cr();
    let old = cr.clone();
    cr["spec"]["config"]["serviceChannels"] = json!({"enabled": false});
    let (resp, d) = run(Endpoint::Validate, &alice_update(cr, old), facts);
    assert_eq!(d, Decision::Denied);
    let msg = &resp.result.message;
    assert!(
        msg.contains("10000 ServiceMappings") && msg.contains("and 9997 more"),
        "{msg}"
    );
    assert!(msg.len() < 500, "a short message: {} bytes", msg.len());
}

#[test]
fn duplicate_mapping_is_refused() {
    let existing: cp_api::ServiceMapping =
        serde_json::from_value(mapping("a", "s4")).expect("mapping");
    let facts = ClusterView {
        service_mappings: crate::index::SharedIndex::new(crate::index::MappingIndex::of([
            &existing,
        ])),
        shared_tenant: false,
    };
    let body = mapping_review("CREATE", "alice", mapping("b", "s4"), None);
    let (resp, d) = run(Endpoint::ValidateServiceMapping, &body, facts.clone());
    assert_eq!(d, Decision::Denied);
    let msg = &resp.result.message;
    assert!(msg.contains("another ServiceMapping already maps"), "{msg}");
    // The other mapping's name is not in the request, so it is not in the answer.
    assert!(
        !msg.contains(" a ") && !msg.contains("ServiceMapping a "),
        "{msg}"
    );
    // Updating the mapping itself is not a duplicate.
    let body = mapping_review(
        "UPDATE",
        "alice",
        mapping("a", "s4"),
        Some(mapping("a", "s4")),
    );
    assert_eq!(
        run(Endpoint::ValidateServiceMapping, &body, facts.clone()).1,
        Decision::Allowed
    );
    let body = mapping_review("CREATE", "alice", mapping("c", "other"), None);
    assert_eq!(mapping_decision(&body, facts), Decision::Allowed);
}

#[test]
fn bad_input_is_rejected_without_panic() {
    for body in [
        &b"not json"[..],
        br#"{"apiVersion":"v1","kind":"Pod"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":1}}"#,
        b"",
        b"[]",
    ] {
        assert!(
            decode(body).is_err(),
            "{:?} decoded",
            String::from_utf8_lossy(body)
        );
    }
    // A request without an object is denied, not a panic.
    let mut v: Value =
        serde_json::from_slice(&cr_review("CREATE", "alice", default_cr(), None)).expect("json");
    v["request"]["object"] = Value::Null;
    let body = serde_json::to_vec(&v).expect("json");
    for ep in [
        Endpoint::Mutate,
        Endpoint::Validate,
        Endpoint::ValidateServiceMapping,
    ] {
        let (resp, d) = run(ep, &body, ClusterView::default());
        assert_eq!(d, Decision::Denied, "{ep:?}");
        assert!(!resp.result.message.is_empty());
    }
    // The wrong kind on an endpoint is denied.
    let body = mapping_review("CREATE", "alice", mapping("a", "s"), None);
    assert_eq!(validate(&body).1, Decision::Denied);
}

#[test]
fn the_answer_is_an_admission_review_with_a_single_operation_base64_patch() {
    use base64::Engine;
    let body = cr_review("CREATE", "alice", default_cr(), None);
    let (resp, _) = run(Endpoint::Mutate, &body, ClusterView::default());
    let raw_patch = resp.patch_bytes().expect("a patch");
    let ours: Value =
        serde_json::from_slice(&encode_response(resp.clone()).expect("encodes")).expect("json");
    assert_eq!(ours["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(ours["kind"], "AdmissionReview");
    assert_eq!(ours["response"]["uid"], "uid-1");
    assert_eq!(ours["response"]["allowed"], true);
    assert_eq!(ours["response"]["patchType"], "JSONPatch");
    assert!(ours["response"].get("status").is_none(), "{ours}");
    let encoded = ours["response"]["patch"].as_str().expect("a base64 string");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64"),
        raw_patch
    );
    let patch: Value = serde_json::from_slice(&raw_patch).expect("a JSON patch");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/deployment", "value": defaults::deployment_defaults_json()}])
    );
    // The shared, precomputed patch is the one the pure function describes.
    let computed = serde_json::to_value(
        mutate(&decode(&body).expect("decode"))
            .expect("ok")
            .expect("patch")
            .patch(),
    )
    .expect("json");
    assert_eq!(patch, computed);
    // A denial carries a Failure status with code, reason and message, and no patch.
    let mut new = defaulted_cr();
    new["spec"]["deployment"]["replicaCount"] = json!(5);
    let body = alice_update(new, defaulted_cr());
    let (resp, d) = validate(&body);
    assert_eq!(d, Decision::Denied);
    let ours: Value =
        serde_json::from_slice(&encode_response(resp).expect("encodes")).expect("json");
    assert_eq!(ours["response"]["allowed"], false);
    assert_eq!(ours["response"]["status"]["status"], "Failure");
    assert_eq!(ours["response"]["status"]["code"], 403);
    assert_eq!(ours["response"]["status"]["reason"], "Forbidden");
    assert!(ours["response"].get("patch").is_none());
}

#[test]
fn decoding_skips_what_the_rules_do_not_read_and_refuses_what_is_not_a_review() {
    let mut cr = defaulted_cr();
    cr["metadata"]["managedFields"] = json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]);
    cr["status"] = json!({"state": "Ready", "anything": [1, 2, {"x": null}]});
    let body = cr_review("CREATE", "alice", cr, None);
    let req = decode(&body).expect("decodes");
    assert_eq!(req.operation, Operation::Create);
    assert_eq!(
        req.object.as_ref().and_then(|o| o.metadata.name.as_deref()),
        Some("connectivity-proxy")
    );
    assert!(req.object.as_ref().and_then(|o| o.spec.as_ref()).is_some());
    assert!(matches!(
        decode(b"{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}"),
        Err(DecodeError::WrongType { .. })
    ));
    assert!(matches!(
        decode(b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}"),
        Err(DecodeError::NoRequest)
    ));
    assert!(matches!(decode(b"not json"), Err(DecodeError::Json(_))));
}

/// A CR stored before a rule existed: dedicated tenant mode without a subaccount id.
fn cr_breaking_a_newer_rule() -> Value {
    let mut cr = defaulted_cr();
    cr["spec"]["config"]["subaccountId"] = Value::Null;
    cr["spec"]["config"]["tenantMode"] = json!("dedicated");
    cr
}

#[test]
fn metadata_only_updates_are_free_and_a_spec_written_while_deleting_is_judged_by_every_rule() {
    let stored = cr_breaking_a_newer_rule();
    // A spec change of that CR is judged by every rule.
    let mut edited = stored.clone();
    edited["spec"]["config"]["subaccountSubdomain"] = json!("other");
    let body = alice_update(edited, stored.clone());
    assert_eq!(validate(&body).1, Decision::Denied);
    // Removing the finalizer (spec unchanged) is not.
    let mut unfinalized = stored.clone();
    unfinalized["metadata"]["finalizers"] = json!([]);
    unfinalized["metadata"]["labels"] = json!({"team": "a"});
    let body = alice_update(unfinalized, stored.clone());
    assert_eq!(validate(&body).1, Decision::Allowed);
    // A CR being deleted: its finalizer's removal is free, a spec edit is judged by every rule.
    let mut deleting = stored.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T12:00:00Z");
    let mut released = deleting.clone();
    released["metadata"]["finalizers"] = json!([]);
    let body = alice_update(released, deleting.clone());
    assert_eq!(validate(&body).1, Decision::Allowed);
    let mut edited = deleting.clone();
    edited["spec"]["config"]["subaccountSubdomain"] = json!("other");
    let body = alice_update(edited, deleting.clone());
    assert_eq!(validate(&body).1, Decision::Denied);
    let mut edited = deleting.clone();
    edited["spec"]["deployment"]["replicaCount"] = json!(7);
    let body = alice_update(edited, deleting);
    assert_denied_naming(&body, "spec.deployment.replicaCount");
}

#[test]
fn a_mapping_stored_under_older_rules_can_still_be_labelled() {
    let stored = json!({"apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {"name": "old"}, "spec": {"type": "RFC", "serviceId": "s", "internalAddress": "no-port"}});
    let mut labelled = stored.clone();
    labelled["metadata"]["labels"] = json!({"kyma-project.io/module": "connectivity-proxy"});
    let body = mapping_review("UPDATE", "op", labelled.clone(), Some(stored.clone()));
    assert_eq!(mapping_decision_alone(&body), Decision::Allowed);
    let body = mapping_review("CREATE", "op", labelled, None);
    assert_eq!(mapping_decision_alone(&body), Decision::Denied);
}

#[test]
fn a_mapping_being_deleted_is_validated_when_its_spec_changes() {
    let stored = json!({"apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {"name": "held", "deletionTimestamp": "2026-11-30T12:00:00Z", "finalizers": ["example.com/hold"]},
        "spec": {"type": "TCP", "subaccountId": "sub-1", "serviceId": "s", "internalAddress": "a.b:1"}});
    let mut released = stored.clone();
    released["metadata"]["finalizers"] = json!([]);
    let body = mapping_review("UPDATE", "op", released, Some(stored.clone()));
    assert_eq!(mapping_decision_alone(&body), Decision::Allowed);
    let mut rewritten = stored.clone();
    rewritten["spec"]["internalAddress"] = json!("no-port");
    let body = mapping_review("UPDATE", "op", rewritten, Some(stored));
    assert_eq!(mapping_decision_alone(&body), Decision::Denied);
}

#[test]
fn a_cr_created_outside_kyma_system_is_admitted_with_a_warning() {
    let body = cr_review("CREATE", "alice", defaulted_cr(), None);
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed);
    assert!(resp.warnings.is_none(), "{:?}", resp.warnings);
    let mut review: Value = serde_json::from_slice(&body).expect("json");
    review["request"]["namespace"] = json!("team-a");
    let body = serde_json::to_vec(&review).expect("json");
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed);
    let warnings = resp.warnings.unwrap_or_default();
    assert!(
        warnings.len() == 1 && warnings[0].contains("OutsideModuleNamespace"),
        "{warnings:?}"
    );
}

#[test]
fn fields_without_effect_are_named_in_warnings_only_when_the_spec_is_written() {
    let mut cr = defaulted_cr();
    cr["spec"]["ingress"]["annotations"] = json!({"nginx.ingress.kubernetes.io/x": "y"});
    let body = cr_review("CREATE", "alice", cr.clone(), None);
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed);
    let warnings = resp.warnings.unwrap_or_default();
    assert!(
        warnings.len() == 1 && warnings[0].starts_with("spec.ingress.annotations"),
        "{warnings:?}"
    );
    // A label change of that stored CR repeats nothing.
    let mut labelled = cr.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let body = alice_update(labelled, cr);
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed);
    assert!(resp.warnings.is_none(), "{:?}", resp.warnings);
}

#[test]
fn the_same_spec_written_differently_is_judged_as_a_metadata_only_update() {
    // Stored under older rules, with a field that would draw a warning.
    let mut stored = cr_breaking_a_newer_rule();
    stored["spec"]["ingress"]["annotations"] = json!({"nginx.ingress.kubernetes.io/x": "y"});
    // The same spec, an absent field instead of an explicit null: other text, equal once parsed.
    let mut rewritten = stored.clone();
    if let Some(config) = rewritten["spec"]["config"].as_object_mut() {
        config.remove("subaccountId");
    }
    rewritten["metadata"]["labels"] = json!({"team": "a"});
    let body = alice_update(rewritten.clone(), stored.clone());
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed, "{}", resp.result.message);
    assert!(resp.warnings.is_none(), "{:?}", resp.warnings);
    // A real change of that spec is judged by every rule.
    rewritten["spec"]["config"]["subaccountSubdomain"] = json!("other");
    let body = alice_update(rewritten, stored);
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Denied);
    assert!(
        resp.result.message.contains("spec.config.subaccountId"),
        "{}",
        resp.result.message
    );
}

#[test]
fn the_answer_escapes_what_comes_from_the_request_and_carries_warnings() {
    // A uid with JSON escapes (decoded into an owned string) comes back intact.
    let body = cr_review("CREATE", "alice", defaulted_cr(), None);
    let mut review: Value = serde_json::from_slice(&body).expect("json");
    review["request"]["uid"] = json!("a\"b\\c\u{e9}");
    review["request"]["namespace"] = json!("team-\"a\"");
    let body = serde_json::to_vec(&review).expect("json");
    let (resp, decision) = validate(&body);
    assert_eq!(decision, Decision::Allowed);
    let ours: Value =
        serde_json::from_slice(&encode_response(resp).expect("encodes")).expect("json");
    assert_eq!(ours["response"]["uid"], "a\"b\\c\u{e9}");
    assert_eq!(ours["response"]["allowed"], true);
    let warnings = ours["response"]["warnings"].as_array().expect("warnings");
    assert!(
        warnings.len() == 1
            && warnings[0]
                .as_str()
                .is_some_and(|w| w.contains("team-\"a\"")),
        "{ours}"
    );
    assert!(ours["response"].get("patch").is_none(), "{ours}");
}

#[test]
fn the_operators_annotations_are_refused_to_an_editor_and_named() {
    let key = "connectivityproxy.sap.com/legacy-migration";
    let mut annotated = defaulted_cr();
    annotated["metadata"]["annotations"] = json!({key: "in-progress", "team": "a"});
    let plain = {
        let mut cr = defaulted_cr();
        cr["metadata"]["annotations"] = json!({"team": "a"});
        cr
    };
    let operator = "system:serviceaccount:kyma-system:cp-controller";
    // (user, operation, object, old object, allowed)
    let cases = [
        ("alice", "CREATE", annotated.clone(), None, false),
        (
            "alice",
            "UPDATE",
            annotated.clone(),
            Some(plain.clone()),
            false,
        ),
        (
            "alice",
            "UPDATE",
            plain.clone(),
            Some(annotated.clone()),
            false,
        ),
        (
            "alice",
            "UPDATE",
            annotated.clone(),
            Some(annotated.clone()),
            true,
        ),
        ("alice", "UPDATE", plain.clone(), Some(plain.clone()), true),
        (
            operator,
            "UPDATE",
            annotated.clone(),
            Some(plain.clone()),
            true,
        ),
        (operator, "CREATE", annotated.clone(), None, true),
    ];
    for (i, (user, op, obj, old, allowed)) in cases.into_iter().enumerate() {
        let body = cr_review(op, user, obj, old);
        let (resp, _) = validate(&body);
        assert_eq!(resp.allowed, allowed, "case {i}: {}", resp.result.message);
        if !allowed {
            assert_eq!(resp.result.code, 403, "case {i}");
            assert!(
                resp.result.message.contains(key),
                "case {i}: {}",
                resp.result.message
            );
        }
    }
    // A changed value is a change; another key of the operator's is named on its own.
    let mut other = annotated.clone();
    other["metadata"]["annotations"][key] = json!("done");
    other["metadata"]["annotations"]["connectivityproxy.sap.com/deployment-defaults-release"] =
        json!("x");
    let body = alice_update(other, annotated);
    let (resp, _) = validate(&body);
    assert!(!resp.allowed);
    assert!(
        resp.result
            .message
            .contains("connectivityproxy.sap.com/deployment-defaults-release, connectivityproxy.sap.com/legacy-migration"),
        "{}",
        resp.result.message
    );
    // Mutation never refuses on annotations (validation does).
    let mut created = default_cr();
    created["metadata"]["annotations"] = json!({key: "in-progress"});
    let body = cr_review("CREATE", "alice", created, None);
    assert!(
        run(Endpoint::Mutate, &body, ClusterView::default())
            .0
            .allowed
    );
}

#[test]
fn annotations_null_or_absent_decode_as_none_of_the_operators() {
    for meta in [
        json!({"name": "a"}),
        json!({"name": "a", "annotations": null}),
        json!({"name": "a", "annotations": {}}),
    ] {
        let mut cr = defaulted_cr();
        cr["metadata"] = meta;
        let body = cr_review("CREATE", "alice", cr, None);
        let (resp, _) = validate(&body);
        assert!(resp.allowed, "{}", resp.result.message);
    }
}
