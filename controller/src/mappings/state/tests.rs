use super::*;
use serde_json::json;

fn mapping(name: &str, created: &str, service: &str, address: &str) -> ServiceMapping {
    serde_json::from_value(json!({
        "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
        "spec": {"type": "TCP", "subaccountId": "sub", "serviceId": service, "internalAddress": address}
    }))
    .expect("mapping")
}

fn numbered(i: usize) -> ServiceMapping {
    mapping(
        &format!("m-{i:05}"),
        "2026-01-01T00:00:00Z",
        &format!("service-{i:05}"),
        &format!("host-{i}.apps:443"),
    )
}

/// The oracle: the oldest mapping of each key (creation time, then name), computed from scratch.
fn oldest_of_each_key(mappings: &[ServiceMapping]) -> Vec<ServiceMapping> {
    let mut sorted: Vec<&ServiceMapping> = mappings.iter().collect();
    sorted.sort_by_key(|m| {
        (
            m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            m.name_any(),
        )
    });
    let mut seen = std::collections::HashSet::new();
    sorted
        .into_iter()
        .filter(|m| seen.insert(mapping_key(&m.spec)))
        .cloned()
        .collect()
}

fn entries(text: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(text).expect("a JSON list")
}

#[test]
fn a_change_of_one_mapping_updates_exactly_one_entry_of_one_shard() {
    let mappings: Vec<ServiceMapping> = (0..10_000).map(numbered).collect();
    let mut state = MappingState::of(&mappings);
    assert_eq!(state.len(), 10_000);
    let before = state.shards(4);
    assert_eq!(state.renders(), 4);
    // Asked again without a change: the same texts, nothing rendered.
    let again = state.shards(4);
    assert!(before.iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)));
    assert_eq!(state.renders(), 4);

    let mut edited = mappings[1234].clone();
    edited.spec.internal_address = "elsewhere.apps:443".into();
    assert_eq!(
        state.apply(&edited),
        Change {
            records: 1,
            entries: 1,
            wakes: true
        }
    );
    let after = state.shards(4);
    assert_eq!(state.renders(), 5, "one shard rendered again");
    let shard = shard_of("m-01234", 4);
    for s in 0..4 {
        if s == shard {
            continue;
        }
        assert!(Arc::ptr_eq(&before[s], &after[s]), "shard {s} untouched");
    }
    let (old, new) = (entries(&before[shard].text), entries(&after[shard].text));
    assert_eq!(old.len(), new.len());
    let differing: Vec<usize> = (0..old.len()).filter(|i| old[*i] != new[*i]).collect();
    assert_eq!(differing.len(), 1, "exactly one entry differs");
    assert_eq!(new[differing[0]]["name"], "m-01234");
    assert_eq!(new[differing[0]]["internalAddress"], "elsewhere.apps:443");
}

#[test]
fn writes_that_change_no_entry_render_nothing() {
    let mappings: Vec<ServiceMapping> = (0..100).map(numbered).collect();
    let mut state = MappingState::of(&mappings);
    let before = state.shards(1);
    // The same object again (a resync, a re-list): no change at all.
    assert_eq!(state.apply(&mappings[7]), Change::default());
    // The controller's own writes: the endpoint, the takeover label.
    let mut written = mappings[7].clone();
    written.status = Some(cp_api::mapping::ServiceMappingStatus {
        endpoint: Some("tcp://cp.example.com:443/service-00007".into()),
    });
    written.metadata.labels =
        Some([(names::LABEL_MODULE.into(), names::MODULE_VALUE.into())].into());
    assert_eq!(
        state.apply(&written),
        Change {
            records: 1,
            entries: 0,
            // No endpoint expected yet (no reconcile said which): a reconcile looks at it.
            wakes: true
        }
    );
    let after = state.shards(1);
    assert!(Arc::ptr_eq(&before[0], &after[0]));
    assert_eq!(state.renders(), 1);
    assert_eq!(
        state.get("m-00007").and_then(|m| m.endpoint.as_deref()),
        Some("tcp://cp.example.com:443/service-00007")
    );
}

/// The echoes of the controller's own writes (the takeover label and annotation, then the endpoint it
/// publishes) change records but wake no reconcile; a change that takes either away, or an endpoint
/// the controller would not write, wakes one.
#[test]
fn the_echo_of_an_own_label_or_endpoint_write_wakes_nobody_and_a_regression_does() {
    let mappings: Vec<ServiceMapping> = (0..10).map(numbered).collect();
    let mut state = MappingState::of(&mappings);
    state.expect_endpoints("cp.example.com", 443);
    let mut labelled = mappings[3].clone();
    labelled.metadata.labels =
        Some([(names::LABEL_MODULE.into(), names::MODULE_VALUE.into())].into());
    labelled.metadata.annotations = Some(
        [(
            cp_api::keys::ADOPTED_ANNOTATION.into(),
            "connectivity-proxy".into(),
        )]
        .into(),
    );
    let c = state.apply(&labelled);
    assert_eq!(
        (c.records, c.entries, c.wakes),
        (1, 0, false),
        "the label's echo"
    );
    let mut published = labelled.clone();
    published.status = Some(cp_api::mapping::ServiceMappingStatus {
        endpoint: Some("tcp://cp.example.com:443/service-00003".into()),
    });
    let c = state.apply(&published);
    assert_eq!(
        (c.records, c.entries, c.wakes),
        (1, 0, false),
        "the endpoint's echo"
    );
    // Someone else's: a wrong endpoint, the label taken off, the endpoint removed.
    let mut wrong = published.clone();
    wrong.status = Some(cp_api::mapping::ServiceMappingStatus {
        endpoint: Some("tcp://elsewhere:443/service-00003".into()),
    });
    assert!(state.apply(&wrong).wakes, "a wrong endpoint");
    assert!(
        !state.apply(&published).wakes,
        "set right again (the controller's fix)"
    );
    assert!(
        state.apply(&mappings[3]).wakes,
        "label and endpoint taken away"
    );
    // Another port than the one expected is not the controller's.
    state.apply(&labelled);
    state.expect_endpoints("cp.example.com", 444);
    assert!(state.apply(&published).wakes, "an endpoint on another port");
    // An edit of the entry always wakes.
    let mut edited = published.clone();
    edited.spec.internal_address = "moved:443".into();
    assert!(state.apply(&edited).wakes);
}

#[test]
fn the_oldest_of_a_key_is_published_and_its_successor_once_it_is_gone() {
    let mut state = MappingState::new();
    let old = mapping("old", "2026-01-01T00:00:00Z", "erp", "a:1");
    let young = mapping("young", "2026-02-01T00:00:00Z", " ERP ", "b:1");
    state.apply(&young);
    assert!(state.is_published("young"));
    // The older one arrives later: it wins, the younger is taken out.
    assert_eq!(
        state.apply(&old),
        Change {
            records: 1,
            entries: 2,
            wakes: true
        }
    );
    assert!(state.is_published("old") && !state.is_published("young"));
    let conflicts = state.conflicts();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(
        (conflicts[0].loser.name(), conflicts[0].winner.name()),
        ("young", "old")
    );
    let list = entries(&state.shards(1)[0].text);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "old");
    // The winner deleted: the younger one is published again, nothing is in conflict.
    assert_eq!(
        state.delete("old"),
        Change {
            records: 1,
            entries: 2,
            wakes: true
        }
    );
    assert!(state.is_published("young"));
    assert!(state.conflicts().is_empty());
    // The younger one's key changed: no longer a duplicate of anything.
    state.apply(&old);
    let mut moved = young.clone();
    moved.spec.service_id = "crm".into();
    state.apply(&moved);
    assert!(state.is_published("old") && state.is_published("young"));
    assert!(state.conflicts().is_empty());
    assert_eq!(state.published_bytes(), {
        let p = state.published();
        p.iter().map(|m| m.bytes).sum::<usize>()
    });
}

#[test]
fn the_shards_are_those_the_pure_split_makes_of_the_published_mappings() {
    // Duplicates, deletions and re-creations in a mixed order: the incremental state ends where the
    // whole computation over the final set does.
    let mut all: Vec<ServiceMapping> = (0..3000).map(numbered).collect();
    for i in 0..50 {
        all.push(mapping(
            &format!("dup-{i:03}"),
            "2026-03-01T00:00:00Z",
            &format!("service-{:05}", i * 7),
            "dup:1",
        ));
    }
    let mut state = MappingState::new();
    for m in all.iter().rev() {
        state.apply(m);
    }
    for i in (0..3000).step_by(11) {
        state.delete(&format!("m-{i:05}"));
    }
    let remaining: Vec<ServiceMapping> = all
        .iter()
        .filter(|m| {
            let n = m.name_any();
            !(n.starts_with("m-") && n[2..].parse::<usize>().is_ok_and(|i| i % 11 == 0))
        })
        .cloned()
        .collect();
    let published = oldest_of_each_key(&remaining);
    for k in [1, 2, 4, 8, 16] {
        let want = cp_api::mapping::service_mappings_shards(&published, k);
        let got: Vec<String> = state.shards(k).iter().map(|t| t.text.to_string()).collect();
        assert_eq!(got, want, "{k} shards");
    }
    // The ports the egress opens: those of the published mappings, kept as they come and go.
    let mut want_ports: Vec<i32> = published
        .iter()
        .filter_map(|m| cp_api::validation::parse_host_port(&m.spec.internal_address).ok())
        .map(|(_, p)| i32::from(p))
        .collect();
    want_ports.sort_unstable();
    want_ports.dedup();
    assert_eq!(state.channel_ports(), want_ports);
    // A re-listing that no longer has some (as the watch replays one): they are gone.
    let relisted: std::collections::HashSet<String> =
        remaining.iter().skip(100).map(|m| m.name_any()).collect();
    for m in remaining.iter().skip(100) {
        assert_eq!(
            state.apply(m),
            Change::default(),
            "a re-listed mapping changes nothing"
        );
    }
    let change = state.remove_unlisted(&relisted);
    assert_eq!(change.records, 100);
    assert_eq!(state.len(), remaining.len() - 100);
}

#[test]
fn a_shard_knows_its_hash_and_escaped_length() {
    let state = MappingState::of(&[mapping("a", "2026-01-01T00:00:00Z", "x\\\"y", "h:1")]);
    let shard = state.shards(1).remove(0);
    let as_value = serde_json::Value::String(shard.text.to_string()).to_string();
    assert_eq!(shard.escaped_len, as_value.len() - 2, "{as_value}");
    assert_eq!(shard.hash, crate::desired::hash_str(&shard.text));
}

/// The mappings a reconcile writes come from the unsettled set, kept one change at a time: a new
/// mapping adds exactly one name, the echoes of its label and endpoint take it out, a duplicate's
/// winner and loser are both looked at again, and another port unsettles every published mapping.
#[test]
fn the_unsettled_set_holds_exactly_the_mappings_that_need_a_write() {
    let settled = |m: &ServiceMapping, endpoint: Option<&str>| {
        let mut m = m.clone();
        m.metadata.labels = Some([(names::LABEL_MODULE.into(), names::MODULE_VALUE.into())].into());
        m.metadata.annotations = Some(
            [(
                cp_api::keys::ADOPTED_ANNOTATION.into(),
                "connectivity-proxy".into(),
            )]
            .into(),
        );
        m.status = endpoint.map(|e| cp_api::mapping::ServiceMappingStatus {
            endpoint: Some(e.into()),
        });
        m
    };
    let endpoint = |i: usize| format!("tcp://cp.example.com:443/service-{i:05}");
    let mappings: Vec<ServiceMapping> = (0..1000).map(numbered).collect();
    let mut state = MappingState::of(&mappings);
    state.expect_endpoints("cp.example.com", 443);
    assert_eq!(state.unsettled_count(), 1000, "nothing written yet");
    for (i, m) in mappings.iter().enumerate() {
        state.apply(&settled(m, Some(&endpoint(i))));
    }
    assert_eq!(state.unsettled_count(), 0, "every echo settles its mapping");
    let (none, left) = state.unsettled(10);
    assert!(none.is_empty() && !left);

    // One new mapping: exactly it, published.
    let new = numbered(1000);
    state.apply(&new);
    let (one, left) = state.unsettled(10);
    let names: Vec<&str> = one
        .iter()
        .map(|(m, p)| if *p { m.name() } else { "?" })
        .collect();
    assert_eq!((names, left), (vec!["m-01000"], false));
    state.apply(&settled(&new, Some(&endpoint(1000))));
    assert_eq!(state.unsettled_count(), 0);

    // An older twin of m-00007: it wins, the former winner loses and must drop its endpoint.
    let twin = mapping(
        "a-twin",
        "2025-01-01T00:00:00Z",
        "service-00007",
        "twin.apps:443",
    );
    state.apply(&twin);
    let (two, _) = state.unsettled(10);
    let got: Vec<(&str, bool)> = two.iter().map(|(m, p)| (m.name(), *p)).collect();
    assert_eq!(got, vec![("a-twin", true), ("m-00007", false)]);
    state.apply(&settled(
        &twin,
        Some("tcp://cp.example.com:443/service-00007"),
    ));
    state.apply(&settled(&mappings[7], None));
    assert_eq!(
        state.unsettled_count(),
        0,
        "loser without endpoint is settled"
    );
    // The twin deleted: m-00007 is published again and needs its endpoint back.
    state.delete("a-twin");
    let (back, _) = state.unsettled(10);
    let got: Vec<(&str, bool)> = back.iter().map(|(m, p)| (m.name(), *p)).collect();
    assert_eq!(got, vec![("m-00007", true)]);
    state.apply(&settled(&mappings[7], Some(&endpoint(7))));

    // Another port: every published mapping, and in pieces of at most the reconcile's share.
    state.expect_endpoints("cp.example.com", 444);
    assert_eq!(state.unsettled_count(), 1001);
    let (first, left) = state.unsettled(100);
    assert_eq!((first.len(), left), (100, true));
    assert_eq!(state.first_names(3).len(), 3);
    assert_eq!(&*state.first_names(1)[0], "m-00000");
}
