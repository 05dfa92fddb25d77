//! Drift in any managed object is repaired by a watch within seconds, not at the resync: the controller
//! runs with a 10-minute resync, and every kind it manages is deleted or edited behind its back.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use cp_api::kinds::Kind;
use cp_api::names;
use cp_tests::controller::ControllerProcess;
use cp_tests::shared::control_plane;
use cp_tests::support::{self, NS};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::json;

fn api(admin: &kube::Client, kind: Kind, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = kind.api_resource();
    match ns {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    }
}

/// Waits until `check` holds for the live object, or fails after `within`; returns how long it took.
async fn repaired(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&DynamicObject) -> bool,
) -> Duration {
    let start = Instant::now();
    cp_tests::wait::until(what, within, || {
        let api = api.clone();
        let check = &check;
        async move {
            match api.get_opt(name).await.map_err(|e| e.to_string())? {
                Some(o) if check(&o) => Ok(Some(())),
                Some(_) => Err("not repaired yet".into()),
                None => Err("absent".into()),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    start.elapsed()
}

#[tokio::test]
async fn drift_in_every_managed_kind_is_repaired_within_seconds_not_at_the_resync() {
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    support::prepare_cluster(&admin, "drift.kyma.example.com").await;
    let _controller = ControllerProcess::start(&cp, "cp-controller", &["--resync-seconds=600"])
        .await
        .expect("controller");
    support::create_default_cr(&admin, NS, "connectivity-proxy").await;
    support::make_ready(&admin, NS, "connectivity-proxy").await;

    // The resync is 600 s: only a watch event can bring any of these back within the deadline.
    let within = Duration::from_secs(20);
    let tls = names::tls_secret_name("connectivity-proxy", NS);
    let deleted: [(Kind, Option<&str>, String); 9] = [
        (Kind::Gateway, Some(NS), names::GATEWAY.into()),
        (
            Kind::VirtualService,
            Some(NS),
            names::VIRTUAL_SERVICE.into(),
        ),
        (
            Kind::DestinationRule,
            Some(NS),
            names::DESTINATION_RULE.into(),
        ),
        (
            Kind::PeerAuthentication,
            Some(NS),
            names::PEER_AUTHENTICATION.into(),
        ),
        (Kind::PriorityClass, None, names::PRIORITY_CLASS.into()),
        (Kind::Secret, Some(NS), names::SECRET_SERVICE_KEY.into()),
        (
            Kind::Secret,
            Some(names::ISTIO_NAMESPACE),
            names::cacert_secret_name(&tls),
        ),
        (
            Kind::ServiceInstance,
            Some(NS),
            names::service_instance_name("connectivity-proxy", NS),
        ),
        (
            Kind::ConfigMap,
            Some(NS),
            names::CONFIGMAP_SERVICE_MAPPINGS.into(),
        ),
    ];
    for (kind, ns, name) in &deleted {
        let api = api(&admin, *kind, *ns);
        let before = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{kind:?} {name}: {e}"));
        api.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {kind:?} {name}: {e}"));
        let took = repaired(
            &api,
            name,
            &format!("{kind:?} {name} re-created"),
            within,
            |o| o.metadata.uid != before.metadata.uid,
        )
        .await;
        println!("{kind:?} {name} deleted: re-created after {took:?}");
    }
    // An edit of a field the operator owns is put back as well.
    let vs = api(&admin, Kind::VirtualService, Some(NS));
    vs.patch(
        names::VIRTUAL_SERVICE,
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(
            &json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": names::VIRTUAL_SERVICE}, "spec": {"hosts": ["evil.example.com"]}}),
        ),
    )
    .await
    .expect("edit behind the operator's back");
    let took = repaired(
        &vs,
        names::VIRTUAL_SERVICE,
        "VirtualService hosts restored",
        within,
        |o| o.data["spec"]["hosts"] == json!(["cp.drift.kyma.example.com"]),
    )
    .await;
    println!("VirtualService hosts edited: restored after {took:?}");
}
