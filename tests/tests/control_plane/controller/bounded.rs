//! What editors outside the module's reach cost the controller, measured on the real process: CRs in
//! other namespaces (metadata only, nothing kept) and Secret names cycled through in the CR (every
//! watch released, their number bounded).

use std::time::Duration;

use cp_api::{ConnectivityProxy, State};
use cp_tests::support::{NS, create_default_cr, scenario, wait_state};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The controller process's resident memory in bytes (`VmRSS` of `/proc/<pid>/status`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("VmRSS")
}

/// The TCP (and Unix) sockets the process holds open: its API server connections among them (the
/// Kubernetes client speaks HTTP/1.1, one connection per watch).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count()
}

const MIB: f64 = 1024.0 * 1024.0;

#[tokio::test]
async fn large_crs_in_other_namespaces_cost_the_controller_no_memory() {
    let env = scenario().await;
    let pid = env.cp.pid("cp-controller").expect("controller pid");
    let ns = env.cp.namespace("big-crs").await.expect("ns");
    let api: Api<ConnectivityProxy> = Api::namespaced(env.admin.clone(), &ns);
    let before = rss(pid);
    // 40 CRs with 200 kB of annotations each (8 MB written), every one different.
    const CRS: usize = 40;
    const BYTES: usize = 200_000;
    for i in 0..CRS {
        let mut cr = cp_tests::fixtures::default_connectivity_proxy(&format!("big-{i}"));
        let filler: String = (0..BYTES)
            .map(|j| char::from(b'a' + ((i * 7 + j * 13) % 26) as u8))
            .collect();
        cr.metadata.annotations = Some([("example.com/filler".to_string(), filler)].into());
        api.create(&PostParams::default(), &cr)
            .await
            .expect("create a large CR");
    }
    // The controller has seen every one of them: each has its Warning.
    for i in 0..CRS {
        wait_state(
            &env.admin,
            &ns,
            &format!("big-{i}"),
            State::Warning,
            Some("OutsideModuleNamespace"),
            Duration::from_secs(30),
        )
        .await;
    }
    let after = rss(pid);
    let written = (CRS * BYTES) as f64;
    let growth = after.saturating_sub(before) as f64;
    println!(
        "controller RSS {:.1} MiB before, {:.1} MiB after {CRS} CRs of {:.1} MiB in all in namespace {ns}: growth {:.1} MiB",
        before as f64 / MIB,
        after as f64 / MIB,
        written / MIB,
        growth / MIB
    );
    // A cache of those CRs would hold at least what was written; the metadata watch keeps only
    // their identities (transient buffers aside).
    assert!(
        growth < written / 4.0,
        "the controller grew by {:.1} MiB for {:.1} MiB of CRs in another namespace",
        growth / MIB,
        written / MIB
    );
    for i in 0..CRS {
        let _ = api.delete(&format!("big-{i}"), &Default::default()).await;
    }
}

#[tokio::test]
async fn cycling_secret_names_leaves_no_watch_and_no_connection_behind() {
    let env = scenario().await;
    let pid = env.cp.pid("cp-controller").expect("controller pid");
    create_default_cr(&env.admin, NS, "connectivity-proxy").await;
    let api: Api<ConnectivityProxy> = Api::namespaced(env.admin.clone(), NS);
    let point_at = |name: &str| json!({"spec": {"secretConfig": {"integration": {"connectivityService": {"secretName": name}}}}});
    let reconciled_with = |name: String| {
        let api = api.clone();
        async move {
            cp_tests::wait::until(
                &format!("the CR reconciled with Secret {name}"),
                Duration::from_secs(20),
                || async {
                    let cr = cp_tests::wait::get(&api, "connectivity-proxy").await?;
                    let d = cr.status.and_then(|s| s.description).unwrap_or_default();
                    Ok(d.contains(&format!("Secret {NS}/{name},")).then_some(()))
                },
            )
            .await
            .expect("reconciled");
        }
    };
    api.patch(
        "connectivity-proxy",
        &PatchParams::default(),
        &Patch::Merge(&point_at("cycle-0")),
    )
    .await
    .expect("name a Secret");
    reconciled_with("cycle-0".into()).await;
    let baseline = sockets(pid);
    let watches = "cp_controller_foreign_secret_watches";
    let mut most = 0.0f64;
    for i in 1..=30 {
        let name = format!("cycle-{i}");
        api.patch(
            "connectivity-proxy",
            &PatchParams::default(),
            &Patch::Merge(&point_at(&name)),
        )
        .await
        .expect("name another Secret");
        reconciled_with(name).await;
        most = most.max(env.controller.metric(watches).await);
    }
    let open = env.controller.metric(watches).await;
    let after = sockets(pid);
    println!(
        "after 30 Secret names: {open} foreign watches open (at most {most} at any step), sockets {baseline} before, {after} after"
    );
    // A reconcile reads at most four foreign Secrets (the service key, the tunnel's TLS Secret, CA
    // and cacert companion while they are not yet the operator's): released names never pile up to
    // the bound, which holds whatever happens.
    assert!(
        most <= 4.0 && (most as usize) < controller_bound(),
        "at most 4 foreign watches (bound {}), saw {most}",
        controller_bound()
    );
    assert!(
        open <= 4.0,
        "only the Secrets the CR names now are watched: {open}"
    );
    assert!(
        after <= baseline + 2,
        "the controller holds {after} sockets after the names were cycled through, {baseline} before"
    );
}

fn controller_bound() -> usize {
    cp_api::names::MAX_FOREIGN_SECRET_WATCHES
}
