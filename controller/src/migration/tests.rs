//! Progress → [`Step`]: one case per migration step.

use std::collections::BTreeMap;

use cp_api::names;
use cp_api::testing::default_spec;
use serde_json::json;

use super::plan::tests::{DEDICATED, legacy_facts};
use super::plan::{Disposition, Leftovers};
use super::*;

const ID: &str = "20261130-120000";

fn in_progress(imported: bool, takeover: Leftovers) -> Progress {
    Progress::InProgress {
        id: ID.into(),
        imported,
        takeover,
    }
}

fn decided(facts: &Progress) -> Step {
    decide(&default_spec(), facts)
}

/// `facts` with this takeover's backups of both legacy ConfigMaps written.
fn backed_up(mut facts: Leftovers) -> Leftovers {
    facts.backups = facts.live.clone();
    facts
}

#[test]
fn no_takeover_and_no_legacy_statefulset_needs_nothing() {
    let facts = Progress::Idle {
        legacy_statefulset: false,
    };
    assert_eq!(decided(&facts), Step::NotNeeded);
}

#[test]
fn a_legacy_statefulset_starts_a_takeover() {
    // Also after an earlier takeover ("done"): a legacy installation back after a rollback.
    let facts = Progress::Idle {
        legacy_statefulset: true,
    };
    assert_eq!(decided(&facts), Step::Start);
}

#[test]
fn a_takeover_without_an_id_records_one() {
    assert_eq!(decided(&Progress::WithoutId), Step::RecordId);
}

#[test]
fn a_takeover_without_any_legacy_installation_is_closed() {
    let facts = in_progress(false, Leftovers::default());
    assert_eq!(decided(&facts), Step::CloseNoEvidence { id: ID.into() });
    // Unmarked look-alikes or objects already adopted are no evidence either.
    let mut takeover = legacy_facts(DEDICATED);
    takeover.legacy_statefulset = false;
    takeover.live.clear();
    for f in &mut takeover.found {
        f.marked = false;
    }
    takeover.found[0].ours = true;
    takeover.found[0].marked = true;
    assert_eq!(
        decided(&in_progress(false, takeover)),
        Step::CloseNoEvidence { id: ID.into() }
    );
}

#[test]
fn a_backup_or_a_done_import_is_evidence_and_the_takeover_goes_on() {
    // Only this takeover's backups show that a legacy installation was here.
    let mut takeover = backed_up(legacy_facts(DEDICATED));
    takeover.legacy_statefulset = false;
    for f in &mut takeover.found {
        f.marked = false;
    }
    assert!(matches!(
        decided(&in_progress(false, takeover)),
        Step::Import { .. }
    ));
    // Imported, then everything legacy gone: the teardown finishes with nothing left to do.
    match decided(&in_progress(true, Leftovers::default())) {
        Step::Teardown {
            objects,
            left_alone,
            backups,
            ..
        } => {
            assert!(objects.is_empty() && left_alone.is_empty());
            assert_eq!(backups, Backups::default());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_blocker_stops_the_takeover_before_any_write() {
    let takeover = legacy_facts(&DEDICATED.replace(
        "tenantMode: dedicated",
        "tenantMode: dedicated\nunknownKey: 1",
    ));
    for imported in [false, true] {
        match decided(&in_progress(imported, takeover.clone())) {
            Step::Blocked(blockers) => {
                assert_eq!(blockers.len(), 1, "{blockers:?}");
                assert!(blockers[0].subject.contains("unknownKey"), "{blockers:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_import_backs_up_first_and_patches_spec_and_annotation() {
    let takeover = legacy_facts(DEDICATED);
    let Step::Import {
        id,
        backups,
        patch,
        imported,
    } = decided(&in_progress(false, takeover.clone()))
    else {
        panic!("not an import");
    };
    let patch = serde_json::to_value(&patch).expect("JSON");
    assert_eq!(id, ID);
    let names: Vec<&str> = backups
        .config_maps
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        names,
        vec![names::CONFIGMAP_CONFIG, names::CONFIGMAP_INFO],
        "both live legacy ConfigMaps"
    );
    assert!(backups.service_key);
    assert!(imported.iter().any(|p| p == "subaccountId"), "{imported:?}");
    assert_eq!(
        patch["metadata"]["annotations"][IMPORTED_ANNOTATION],
        json!(imported.join(","))
    );
    assert_eq!(patch["spec"]["config"]["subaccountId"], json!("sub-1"));
    assert!(
        patch["spec"].get("secretConfig").is_none(),
        "dedicated: no key reference"
    );

    // A backup written before a crash is not written again.
    let mut takeover = takeover;
    takeover.backups.insert(
        names::CONFIGMAP_CONFIG.into(),
        takeover.live[names::CONFIGMAP_CONFIG].clone(),
    );
    let Step::Import { backups, .. } = decided(&in_progress(false, takeover)) else {
        panic!("not an import");
    };
    assert_eq!(
        backups.config_maps,
        vec![(
            names::CONFIGMAP_INFO.to_string(),
            BTreeMap::from([("onpremise_proxy_http_port".into(), "20003".into())])
        )]
    );
}

#[test]
fn a_shared_tenant_import_references_the_users_service_key() {
    let cfg = DEDICATED.replace("tenantMode: dedicated", "tenantMode: shared");
    let Step::Import { patch, .. } = decided(&in_progress(false, legacy_facts(&cfg))) else {
        panic!("not an import");
    };
    let patch = serde_json::to_value(&patch).expect("JSON");
    assert_eq!(
        patch["spec"]["secretConfig"]["integration"]["connectivityService"]["secretName"],
        json!(LEGACY_SERVICE_KEY)
    );
}

#[test]
fn after_the_import_the_teardown_removes_the_legacy_webhook_first_and_adopts_same_names() {
    let takeover = backed_up(legacy_facts(DEDICATED));
    let Step::Teardown {
        id,
        backups,
        objects,
        left_alone,
    } = decided(&in_progress(true, takeover.clone()))
    else {
        panic!("not a teardown");
    };
    assert_eq!(id, ID);
    assert!(
        backups.config_maps.is_empty(),
        "backed up before the import"
    );
    assert!(backups.service_key, "its backup is checked when written");
    assert!(left_alone.is_empty());
    assert_eq!(
        objects.len(),
        takeover.found.len(),
        "every legacy object, in order"
    );
    assert_eq!(
        (objects[0].found.display().as_str(), objects[0].disposition),
        (
            "ValidatingWebhookConfiguration webhook-secret",
            Disposition::Delete
        )
    );
    let disposition = |display: &str| {
        objects
            .iter()
            .find(|o| o.found.display() == display)
            .map(|o| o.disposition)
    };
    assert_eq!(
        disposition("PriorityClass connectivity-proxy-priority-class"),
        Some(Disposition::Adopt)
    );
    assert_eq!(
        disposition("Secret kyma-system/connectivity-proxy-service-key"),
        Some(Disposition::Delete)
    );
}

#[test]
fn the_teardown_keeps_the_shared_key_and_leaves_unmarked_objects_alone() {
    let cfg = DEDICATED.replace("tenantMode: dedicated", "tenantMode: shared");
    let mut takeover = backed_up(legacy_facts(&cfg));
    for f in &mut takeover.found {
        if f.kind == "ClusterRole" {
            f.marked = false;
        }
    }
    // An object adopted in an earlier, interrupted teardown is not touched again.
    takeover.found[1].ours = true;
    let adopted = takeover.found[1].display();
    let Step::Teardown {
        objects,
        left_alone,
        ..
    } = decided(&in_progress(true, takeover))
    else {
        panic!("not a teardown");
    };
    assert!(!objects.iter().any(|o| o.found.display() == adopted));
    assert_eq!(
        objects
            .iter()
            .find(|o| o.found.display() == "Secret kyma-system/connectivity-proxy-service-key")
            .map(|o| o.disposition),
        Some(Disposition::Keep)
    );
    assert!(
        left_alone
            .iter()
            .any(|l| l == "ClusterRole connectivity-proxy-restart-watcher"),
        "{left_alone:?}"
    );
    let unmarked: Vec<String> = objects
        .iter()
        .filter(|o| o.disposition == Disposition::LeaveAlone)
        .map(|o| o.found.display())
        .collect();
    assert_eq!(unmarked, left_alone);
}
