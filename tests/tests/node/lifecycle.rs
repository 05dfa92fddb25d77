//! lifecycle-manager's steps on the real node ([`cp_tests::lifecycle`], each step naming the source it
//! follows): the raw manifest applied as it applies it, with the images localized to another registry as
//! its rewrite does, the default CR created in a later pass, the module state read from the manager
//! Deployment; an upgrade to a second bundle (a changed default image, one object fewer) with pruning and
//! the user's configuration kept; removal in its order, blocked while a ServiceMapping exists.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cp_api::{ConnectivityProxy, ServiceMapping, State, names};
use cp_tests::lifecycle::{self, Manifest, ModuleState, Outcome};
use cp_tests::node::Cluster;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The registry the images are "transferred" to (a restricted market's), as OCM's transfer would
/// rewrite the component descriptor's image references before lifecycle-manager reads them.
const LOCAL: &str = "registry.localized.test/kyma";
/// The proxy image of the second bundle: a release that changed the default.
const V2_PROXY: &str = "docker.io/sapse/connectivity-proxy:2.11.1";
const CR: &str = "connectivity-proxy";
const DASHBOARD: &str = "connectivity-proxy-operator-dashboard";

fn yaml_docs(rel: &str) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(cp_tests::workspace_root().join(rel))?;
    let mut out = Vec::new();
    for doc in text.split("\n---") {
        let v: Value = serde_norway::from_str(doc).with_context(|| rel.to_string())?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// `LOCAL/<last segment>:<tag>`: the name OCM's transfer gives an image in the local registry.
fn localized(image: &str) -> String {
    let r = lifecycle::DockerRef::parse(image).unwrap_or_else(|| panic!("{image}"));
    format!("{LOCAL}/{}", r.name_and_tag)
}

/// The second bundle: the proxy image default moved to [`V2_PROXY`] and the Grafana dashboard left out.
fn bundle_v2(v1: &[Value]) -> Vec<Value> {
    let mut v2: Vec<Value> = v1
        .iter()
        .filter(|d| !(d["kind"] == "ConfigMap" && d["metadata"]["name"] == DASHBOARD))
        .cloned()
        .collect();
    for d in v2.iter_mut().filter(|d| d["kind"] == "Deployment") {
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for e in c["env"].as_array_mut().into_iter().flatten() {
                if e["name"] == cp_api::images::PROXY_IMAGE_ENV {
                    e["value"] = json!(V2_PROXY);
                }
            }
        }
    }
    v2
}

/// Reconciles (as lifecycle-manager requeues) until `done` holds for an outcome; every pass is kept.
async fn reconcile_until(
    what: &str,
    timeout: Duration,
    passes: &mut Vec<(Duration, Outcome)>,
    start: Instant,
    mut pass: impl AsyncFnMut() -> anyhow::Result<Option<Outcome>>,
    done: impl Fn(&Option<Outcome>) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let o = pass().await?;
        if let Some(o) = &o {
            passes.push((start.elapsed(), o.clone()));
        }
        if done(&o) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: not reached after {timeout:?}; last passes: {:#?}",
                &passes[passes.len().saturating_sub(5)..]
            );
        }
        // lifecycle-manager's requeue after a pass that did not finish.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Prints every pass of a phase, as the Manifest's (and the Kyma CR's) state went.
fn print_passes(phase: &str, passes: &[(Duration, Outcome)]) {
    println!("lifecycle-manager's {phase}, pass by pass:");
    for (at, o) in passes {
        println!(
            "  {:>7.2?}  {:?}  {}",
            at,
            o.state,
            o.operation.chars().take(160).collect::<String>()
        );
    }
}

/// The images the pods of `selector` run: `(container, spec image, image the kubelet reports)`.
async fn pod_images(pods: &Api<Pod>, selector: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for p in pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
    {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let spec = p.spec.unwrap_or_default();
        for c in spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers)
        {
            out.push((c.name, c.image.unwrap_or_default()));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_managers_steps_install_localize_upgrade_and_remove_the_module()
-> anyhow::Result<()> {
    let cluster = Cluster::shared()?;
    cluster
        .prepare_kyma()
        .await
        .context("step: prepare the cluster")?;
    let before = crate::node::inventory(&cluster)?;
    let admin = cluster.cp.admin().await?;
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);

    // The images, transferred to the local registry: every image modulectl finds in either bundle.
    let v1 = yaml_docs(&format!("manifests/{}", cp_api::bundle::BUNDLE))?;
    let v2 = bundle_v2(&v1);
    let default_cr = yaml_docs("manifests/default-cr.yaml")?.remove(0);
    let mut images = lifecycle::modulectl_images(&v1);
    images.extend(lifecycle::modulectl_images(&v2));
    assert_eq!(
        images.len(),
        5,
        "operator ×2, proxy ×2 releases, utility: {images:?}"
    );
    for image in &images {
        // The v2 proxy is the stand-in under a new tag.
        let source = if image == V2_PROXY {
            cp_api::defaults::release_proxy_image()
        } else {
            image.clone()
        };
        cluster.tag_image(&source, &localized(image))?;
    }
    let targets: Vec<String> = images.iter().map(|i| localized(i)).collect();
    let render = |bundle: &[Value]| -> anyhow::Result<Vec<Value>> {
        let mut objs = bundle.to_vec();
        lifecycle::localize_images(&mut objs, &targets)?;
        lifecycle::stamp(&mut objs, "kcp-system", "connectivity-proxy-manifest");
        Ok(objs)
    };
    let target_v1 = render(&v1)?;
    let target_v2 = render(&v2)?;
    assert!(
        lifecycle::modulectl_images(&target_v1)
            .iter()
            .all(|i| i.starts_with(LOCAL)),
        "every image the bundle names is rewritten: {:?}",
        lifecycle::modulectl_images(&target_v1)
    );

    // Install: passes until Ready with the default CR created.
    let mut m = Manifest::new(admin.clone(), "kcp-system", "connectivity-proxy-manifest");
    let mut passes = Vec::new();
    let start = Instant::now();
    reconcile_until(
        "lifecycle-manager's install: Ready with the default CR",
        Duration::from_secs(180),
        &mut passes,
        start,
        async || m.reconcile(&target_v1, Some(&default_cr)).await.map(Some),
        |o| matches!(o, Some(o) if o.state == ModuleState::Ready),
    )
    .await
    .context("step: install")?;
    assert!(m.default_cr_synced);
    // The first-install window: every pass until Ready, as the Kyma CR would have shown it.
    print_passes("install", &passes);
    let errors: Vec<&(Duration, Outcome)> = passes
        .iter()
        .filter(|(_, o)| o.state == ModuleState::Error)
        .collect();
    println!(
        "first install: {} passes, {} in Error, Ready after {:.1?}",
        passes.len(),
        errors.len(),
        passes.last().map(|p| p.0).unwrap_or_default()
    );
    for (_, o) in &errors {
        // Only the waits of a first install: the manager Deployment not progressing yet, or the default
        // CR refused while the webhook it needs is not serving.
        assert!(
            o.operation.contains("waiting for resources")
                || (o.operation.starts_with("failed to create resource")
                    && (o.operation.contains("failed calling webhook")
                        || o.operation.contains("no endpoints available"))),
            "an Error pass that is not a first-install wait: {}",
            o.operation
        );
    }

    // The webhook injected the localized images (its env values, rewritten) into the default CR.
    let cr = crs.get(CR).await?;
    let image = cr
        .spec
        .deployment
        .as_ref()
        .and_then(|d| d.image.clone())
        .context("image")?;
    assert_eq!(
        (
            image.registry.as_str(),
            image.repository.as_str(),
            image.tag.as_str()
        ),
        (
            "registry.localized.test",
            "kyma/connectivity-proxy",
            "2.11.0"
        ),
        "spec.deployment.image"
    );
    cluster.fit_fd_limit_to_node(CR).await?;
    crate::node::wait_cr_ready(&cluster, Duration::from_secs(180))
        .await
        .context("step: CR Ready")?;
    let proxy_images = pod_images(&pods, "app=connectivity-proxy").await?;
    assert_eq!(
        proxy_images,
        vec![
            (
                "connectivity-proxy".to_string(),
                format!("{LOCAL}/connectivity-proxy:2.11.0")
            ),
            (
                "init-fd-limit".to_string(),
                format!("{LOCAL}/busybox:1.37.0")
            ),
        ],
        "the proxy's pods run the localized images"
    );
    for (selector, image) in [
        (
            "app.kubernetes.io/name=connectivity-proxy-operator-controller",
            "controller",
        ),
        (
            "app.kubernetes.io/name=connectivity-proxy-operator-webhook",
            "webhook",
        ),
    ] {
        let got = pod_images(&pods, selector).await?;
        assert!(
            got.iter()
                .all(|(_, i)| i == &format!("{LOCAL}/{image}:{}", cp_api::defaults::RELEASE)),
            "{selector}: {got:?}"
        );
    }
    // lifecycle-manager's marks and field manager on what it applied.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let d = deployments
        .get("connectivity-proxy-operator-controller")
        .await?;
    let labels = d.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("operator.kyma-project.io/managed-by")
            .map(String::as_str),
        Some("kyma")
    );
    assert!(
        d.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|f| f.manager.as_deref() == Some(lifecycle::APPLIER)),
        "applied by {}",
        lifecycle::APPLIER
    );

    // The user's configuration and a ServiceMapping of theirs.
    crs.patch(
        CR,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": 20011}}}}}}),
        ),
    )
    .await
    .context("the user's edit")?;
    let mappings: Api<ServiceMapping> = Api::all(admin.clone());
    let mapping = cp_api::testing::tcp_mapping("lm-mapping", "lm-subaccount", "lm-service");
    mappings
        .create(&PostParams::default(), &mapping)
        .await
        .context("the user's ServiceMapping")?;

    // lifecycle-manager re-applies the manifest, forced, on every reconcile: three rounds, a user and an
    // SRE acting between them. What they set (the privileged groups in the SRE's ConfigMap, the user's
    // port, the SRE's `spec.deployment` change, admitted only through that ConfigMap) survives each.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let sre_config = cp_tests::fixtures::OPERATOR_CONFIG;
    for round in 1..=3i64 {
        let group = format!("cp-sre-team-{round}");
        cms.patch(
            sre_config,
            &PatchParams::apply(cp_tests::node::SRE_USER),
            &Patch::Apply(cp_tests::fixtures::operator_config(
                json!({"privilegedUsers": cp_tests::node::SRE_USER, "privilegedGroups": group}),
            )),
        )
        .await
        .context("the SRE names a privileged group")?;
        crs.patch(
            CR,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": 20010 + round}}}}}}),
            ),
        )
        .await
        .context("the user's edit")?;
        // A member of that group only (not a privileged user; the group may edit in kyma-system)
        // changes spec.deployment: admitted once the webhook has read the ConfigMap.
        let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
            Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
        bindings
            .patch(
                &group,
                &PatchParams::apply(cp_tests::node::SRE_USER),
                &Patch::Apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": group, "namespace": names::KYMA_SYSTEM},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})),
            )
            .await
            .context("the group may edit in kyma-system")?;
        let member = cluster
            .cp
            .client(&cp_tests::cluster::Identity::User {
                name: "cp-sre-team-member".into(),
                groups: vec![group.clone()],
            })
            .await?;
        let as_member: Api<ConnectivityProxy> = Api::namespaced(member, names::KYMA_SYSTEM);
        let fd = cp_tests::node::NODE_FD_LIMIT - round;
        let fd_patch =
            json!({"spec": {"deployment": {"resources": {"maxFileDescriptorCount": fd}}}});
        let what = "the privileged group's spec.deployment change admitted";
        cp_tests::wait::until(what, Duration::from_secs(30), || async {
            let patch = Patch::Merge(&fd_patch);
            let patched = as_member.patch(CR, &PatchParams::default(), &patch).await;
            patched.map(|_| Some(())).map_err(|e| e.to_string())
        })
        .await
        .with_context(|| format!("round {round}: the SRE's change"))?;
        let mut passes = Vec::new();
        reconcile_until(
            &format!("lifecycle-manager's re-apply {round}: Ready"),
            Duration::from_secs(180),
            &mut passes,
            Instant::now(),
            async || m.reconcile(&target_v1, Some(&default_cr)).await.map(Some),
            |o| matches!(o, Some(o) if o.state == ModuleState::Ready),
        )
        .await
        .with_context(|| format!("step: re-apply {round}"))?;
        let data = cms.get(sre_config).await?.data.unwrap_or_default();
        assert_eq!(
            (data.get("privilegedUsers"), data.get("privilegedGroups")),
            (Some(&cp_tests::node::SRE_USER.to_string()), Some(&group)),
            "round {round}: the SRE's ConfigMap after the forced re-apply"
        );
        let cr = crs.get(CR).await?;
        let spec = serde_json::to_value(&cr.spec)?;
        assert_eq!(
            (
                spec["config"]["servers"]["proxy"]["http"]["port"].clone(),
                spec["deployment"]["resources"]["maxFileDescriptorCount"].clone()
            ),
            (json!(20010 + round), json!(fd)),
            "round {round}: the user's port and the SRE's open-files limit after the forced re-apply"
        );
        bindings.delete(&group, &DeleteParams::default()).await?;
    }
    crate::node::wait_cr_ready(&cluster, Duration::from_secs(180))
        .await
        .context("step: CR Ready after the re-applies")?;
    let sre_fd = cp_tests::node::NODE_FD_LIMIT - 3;

    // Upgrade to the second bundle: the Dashboard is pruned, the new default image reaches the CR and
    // the pods, the user's port and the SRE's open-files limit stay.
    let mut passes = Vec::new();
    let start = Instant::now();
    reconcile_until(
        "lifecycle-manager's upgrade: Ready",
        Duration::from_secs(180),
        &mut passes,
        start,
        async || m.reconcile(&target_v2, Some(&default_cr)).await.map(Some),
        |o| matches!(o, Some(o) if o.state == ModuleState::Ready),
    )
    .await
    .context("step: upgrade")?;
    assert!(
        cms.get_opt(DASHBOARD).await?.is_none(),
        "the object the second bundle lacks is pruned"
    );
    cp_tests::wait::until_object(
        &crs,
        CR,
        "the controller moved spec.deployment to the new defaults",
        Duration::from_secs(60),
        |c| {
            let tag = c
                .spec
                .deployment
                .as_ref()
                .and_then(|d| d.image.as_ref())
                .map(|i| (i.registry.clone(), i.tag.clone()));
            match tag {
                Some((r, t)) if r == "registry.localized.test" && t == "2.11.1" => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let cr = crs.get(CR).await?;
    let port = serde_json::to_value(&cr.spec.config)?["servers"]["proxy"]["http"]["port"].clone();
    assert_eq!(port, json!(20013), "the user's configuration kept");
    // The upgrade moved the untouched defaults (the image) and kept the field the SRE changed; the
    // status names it.
    let deployment = serde_json::to_value(&cr.spec.deployment)?;
    assert_eq!(
        deployment["resources"]["maxFileDescriptorCount"],
        json!(sre_fd),
        "the SRE's open-files limit kept over the new release's default"
    );
    cp_tests::support::wait_kept_deployment_fields(
        &crs,
        CR,
        &["spec.deployment.resources.maxFileDescriptorCount"],
    )
    .await?;
    crate::node::wait_cr_ready(&cluster, Duration::from_secs(180))
        .await
        .context("step: CR Ready after the upgrade")?;
    cp_tests::wait::until(
        "the proxy's pods on the new default image",
        Duration::from_secs(120),
        || async {
            let got = pod_images(&pods, "app=connectivity-proxy")
                .await
                .map_err(|e| e.to_string())?;
            if got.iter().any(|(c, i)| {
                c == "connectivity-proxy" && *i == format!("{LOCAL}/connectivity-proxy:2.11.1")
            }) && got.len() == 2
            {
                Ok(Some(()))
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await?;

    // Removal: the default CR is deleted and waited for; the operator keeps it (Warning) while the
    // ServiceMapping exists; then everything lifecycle-manager applied is pruned.
    let mut passes = Vec::new();
    let start = Instant::now();
    let first = m
        .remove(&target_v2, &default_cr)
        .await?
        .context("the module is not gone yet")?;
    assert_eq!(first.state, ModuleState::Deleting, "{}", first.operation);
    passes.push((start.elapsed(), first));
    let held = cp_tests::wait::until_object(
        &crs,
        CR,
        "the CR in Warning, held by the ServiceMapping",
        Duration::from_secs(60),
        |c| {
            let st = c.status.clone().unwrap_or_default();
            match (c.metadata.deletion_timestamp.is_some(), st.state) {
                (true, Some(State::Warning)) => Ok(Some(st.description.unwrap_or_default())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    assert!(held.contains("ServiceMapping"), "{held}");
    // lifecycle-manager keeps waiting for the default CR meanwhile; nothing is pruned.
    let waiting = m
        .remove(&target_v2, &default_cr)
        .await?
        .context("the module is not gone yet")?;
    assert_eq!(
        waiting.state,
        ModuleState::Deleting,
        "{}",
        waiting.operation
    );
    passes.push((start.elapsed(), waiting));
    assert!(
        cms.get_opt("connectivity-proxy-operator-config")
            .await?
            .is_some()
    );
    mappings
        .delete("lm-mapping", &DeleteParams::default())
        .await?;
    reconcile_until(
        "lifecycle-manager's removal: everything gone",
        Duration::from_secs(180),
        &mut passes,
        start,
        async || m.remove(&target_v2, &default_cr).await,
        |o| o.is_none(),
    )
    .await
    .context("step: removal")?;
    print_passes("removal", &passes);
    // The SRE's ConfigMap is not the module's: it outlives the removal, and the SRE removes it.
    assert!(cms.get_opt(sre_config).await?.is_some());
    cluster.remove_sre_config().await?;
    crate::node::wait_inventory_as_before(&cluster, &before).await
}
