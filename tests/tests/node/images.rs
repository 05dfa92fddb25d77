//! The images `make images` builds, run with podman the way their Deployments run them: the webhook
//! image serves admission for a real API server, the controller image reconciles the default CR to
//! Ready, both answer `--help`/`--version`, the controller resolves names without NSS libraries, and
//! neither image has a shell.
#![forbid(unsafe_code)]

use std::net::UdpSocket;
use std::time::Duration;

use cp_api::{ConnectivityProxy, names};
use cp_tests::cluster::{Identity, ensure_namespace, free_port};
use cp_tests::container::{self, Container, ContainerSpec, image, podman};
use cp_tests::webhook::{Webhook, http_get};
use cp_tests::{ControlPlane, fixtures, manifest};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn out_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_image(image: &str, extra: &[&str]) -> std::process::Output {
    container::require_image(image).expect("image");
    // No network of its own: podman's default bridge would put a private-range address in the root
    // network namespace.
    let mut args = vec!["run", "--rm", "--label", container::LABEL, "--network=none"];
    args.extend(container::ULIMITS);
    args.push(image);
    args.extend(extra);
    podman(&args).expect("podman run")
}

#[test]
fn images_answer_help_and_version_and_have_no_shell() {
    for name in ["webhook", "controller"] {
        let img = image(name);
        let v = run_image(&img, &["--version"]);
        assert!(v.status.success(), "{img} --version: {}", out_text(&v));
        assert_eq!(
            String::from_utf8_lossy(&v.stdout).trim(),
            format!("cp-{name} {}", cp_api::defaults::RELEASE),
            "{img} --version"
        );
        let h = run_image(&img, &["--help"]);
        assert!(h.status.success(), "{img} --help: {}", out_text(&h));
        assert!(
            String::from_utf8_lossy(&h.stdout).contains("--metrics-addr"),
            "{img} --help"
        );

        let user =
            podman(&["image", "inspect", "--format", "{{.Config.User}}", &img]).expect("inspect");
        assert_eq!(
            String::from_utf8_lossy(&user.stdout).trim(),
            "65532:65532",
            "{img} user"
        );
        let mut args = vec![
            "run",
            "--rm",
            "--label",
            container::LABEL,
            "--entrypoint",
            "/bin/sh",
        ];
        args.extend(container::ULIMITS);
        args.extend([img.as_str(), "-c", "true"]);
        let sh = podman(&args).expect("podman run");
        assert!(!sh.status.success(), "{img} has a shell: {}", out_text(&sh));
    }
}

/// Answers every A query on `addr` with `answer` (a DNS server of a few lines, for the lookup test).
fn serve_dns(sock: UdpSocket, answer: [u8; 4]) {
    let mut buf = [0u8; 512];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
        if n < 12 {
            continue;
        }
        // Header: same id, response + recursion available, one question, one answer for A queries.
        let q = &buf[12..n];
        let Some(end) = q.iter().position(|&b| b == 0) else {
            continue;
        };
        let qtype = u16::from_be_bytes([
            q.get(end + 1).copied().unwrap_or(0),
            q.get(end + 2).copied().unwrap_or(0),
        ]);
        let question = &q[..(end + 5).min(q.len())];
        let mut resp = Vec::with_capacity(64);
        resp.extend_from_slice(&buf[0..2]);
        resp.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(qtype == 1), 0, 0, 0, 0]);
        resp.extend_from_slice(question);
        if qtype == 1 {
            resp.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            resp.extend_from_slice(&answer);
        }
        let _ = sock.send_to(&resp, peer);
    }
}

#[test]
fn controller_image_resolves_names_without_nss_libraries() {
    // A DNS server on a loopback address of its own, named in a resolv.conf mounted into the container
    // (the image has no NSS libraries; the controller resolves in-process).
    let sock = UdpSocket::bind("127.0.53.53:53").expect("bind 127.0.53.53:53 (needs root)");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    std::thread::spawn(move || serve_dns(sock, [127, 0, 0, 77]));
    let dir = std::env::temp_dir().join(format!("cp-images-dns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let resolv = dir.join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.53.53\noptions timeout:2 attempts:2\n",
    )
    .expect("resolv.conf");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts");
    let mount = format!("--volume={}:/etc/resolv.conf:ro", resolv.display());
    let mount_hosts = format!("--volume={}:/etc/hosts:ro", hosts.display());
    let img = image("controller");
    let mut args = vec![
        "run",
        "--rm",
        "--label",
        container::LABEL,
        "--network=host",
        &mount,
        &mount_hosts,
    ];
    args.extend(container::ULIMITS);
    args.extend([img.as_str(), "--check-dns", "connectivity.cp-test.example"]);
    let out = podman(&args).expect("podman run");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "lookup failed: {}", out_text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "127.0.0.77",
        "{}",
        out_text(&out)
    );
}

#[tokio::test]
async fn images_run_the_module_against_the_api_server() {
    container::remove_leftovers().expect("podman");
    let cp = ControlPlane::shared().expect("control plane");
    let admin = cp.admin().await.expect("admin");
    for dir in ["manifests/crds"] {
        let path = cp_tests::workspace_root().join(dir);
        for entry in std::fs::read_dir(&path).expect("crds") {
            manifest::apply_file(&admin, &entry.expect("entry").path(), None)
                .await
                .expect("our CRDs");
        }
    }
    fixtures::apply(&admin, &[fixtures::ISTIO_CRDS, fixtures::BTP_CRDS], None)
        .await
        .expect("CRDs");
    for ns in [names::KYMA_SYSTEM, names::ISTIO_NAMESPACE] {
        ensure_namespace(&admin, ns).await.expect("namespace");
    }
    let shoot_info = fixtures::shoot_info(Some("images.kyma.example.com"));
    manifest::apply_json(&admin, shoot_info, None)
        .await
        .expect("shoot-info");
    manifest::apply_controller_rbac(&admin)
        .await
        .expect("controller RBAC");
    manifest::apply_file(
        &admin,
        &cp_tests::workspace_root().join("manifests/rbac/webhook.yaml"),
        None,
    )
    .await
    .expect("webhook RBAC");
    let sa = |name: &str| Identity::ServiceAccount {
        namespace: names::KYMA_SYSTEM.into(),
        name: name.into(),
    };

    // The controller image, as its Deployment runs it.
    let mut spec =
        ContainerSpec::from_deployment("manifests/controller/deployment.yaml", "controller")
            .expect("spec");
    assert!(
        spec.read_only && spec.drop_all_caps && spec.no_new_privileges,
        "{spec:?}"
    );
    let metrics = format!("127.0.0.1:{}", free_port().expect("port"));
    spec.set_arg("--metrics-addr", &metrics).expect("arg");
    let kc = cp
        .write_kubeconfig(
            "image-controller.kubeconfig",
            &sa("connectivity-proxy-controller"),
        )
        .await
        .expect("kubeconfig");
    let _controller = Container::start(
        &cp,
        "image-controller",
        &image("controller"),
        &spec,
        &kc,
        &["--webhook-ips=127.0.0.1"],
    )
    .expect("controller container");
    wait_ready(&cp, "image-controller", &metrics).await;

    // The webhook image, serving the certificate the controller issues.
    let mut spec = ContainerSpec::from_deployment("manifests/webhook/deployment.yaml", "webhook")
        .expect("spec");
    assert!(
        spec.read_only && spec.drop_all_caps && spec.no_new_privileges,
        "{spec:?}"
    );
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let wmetrics = format!("127.0.0.1:{}", free_port().expect("port"));
    spec.set_arg("--addr", &addr).expect("arg");
    spec.set_arg("--metrics-addr", &wmetrics).expect("arg");
    let kc = cp
        .write_kubeconfig(
            "image-webhook.kubeconfig",
            &sa("connectivity-proxy-webhook"),
        )
        .await
        .expect("kubeconfig");
    let _webhook = Container::start(&cp, "image-webhook", &image("webhook"), &spec, &kc, &[])
        .expect("webhook container");
    wait_ready(&cp, "image-webhook", &wmetrics).await;
    let wh = Webhook {
        url: format!("https://{addr}"),
        metrics_addr: wmetrics.clone(),
        ca: None,
        cert_file: cp.dir.join("unused.crt"),
        key_file: cp.dir.join("unused.key"),
    };
    wh.register(&admin).await.expect("register");

    // The default CR, admitted through the webhook image (the first tries can precede the CA bundle).
    let cr_path = fixtures::default_cr_path();
    let what = "the default CR admitted through the webhook image";
    cp_tests::wait::until(what, Duration::from_secs(60), || async {
        manifest::apply_file(&admin, &cr_path, Some(names::KYMA_SYSTEM))
            .await
            .map(|_| Some(()))
            .map_err(|e| format!("{e:#}"))
    })
    .await
    .unwrap_or_else(cp.panic_with_log("image-webhook", 20));
    let api: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), names::KYMA_SYSTEM);
    let cr = api.get("connectivity-proxy").await.expect("CR");
    assert!(
        cr.spec.deployment.is_some(),
        "the webhook image injected spec.deployment"
    );

    cp_tests::fakes::play_until_ready(
        &admin,
        names::KYMA_SYSTEM,
        "connectivity-proxy",
        Some(("11111111-2222-4333-8444-555555555555", "images-subdomain")),
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(cp.panic_with_log("image-controller", 30));

    // A protected edit by a user is refused by the webhook image, naming the field.
    let err = api
        .patch(
            "connectivity-proxy",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"deployment": {"replicaCount": 5}}})),
        )
        .await
        .expect_err("protected edit refused");
    assert!(
        err.to_string().contains("spec.deployment.replicaCount"),
        "{err}"
    );
    let (code, body) = http_get(&wmetrics, "/metrics").await.expect("metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains("cp_build_info") || body.contains("build_info"),
        "metrics: {body:.200}"
    );
}

async fn wait_ready(cp: &ControlPlane, name: &str, addr: &str) {
    cp_tests::wait::until(
        &format!("{name} /readyz"),
        Duration::from_secs(60),
        || async move {
            match http_get(addr, "/readyz").await {
                Ok((200, _)) => Ok(Some(())),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .unwrap_or_else(cp.panic_with_log(name, 30));
}

/// The test-node images `make images` also builds (not shipped; hack/images.sh, second section): the
/// stand-in proxy under the controller's default proxy image reference, Debian's static busybox under
/// the default utility image reference (its `ulimit -n` refuses more than the hard limit, as the real
/// one does), and the pause image; the stand-in runs as the pod's user and starts listening on the
/// configuration it is given.
#[test]
fn test_node_images_stand_in_under_the_default_references() {
    use cp_api::defaults::{
        PROXY_REGISTRY, PROXY_REPOSITORY, PROXY_TAG, UTILITY_REGISTRY, UTILITY_REPOSITORY,
        UTILITY_TAG,
    };
    let standin = format!("{PROXY_REGISTRY}/{PROXY_REPOSITORY}:{PROXY_TAG}");
    let utility = format!("{UTILITY_REGISTRY}/{UTILITY_REPOSITORY}:{UTILITY_TAG}");
    let pause = "localhost/cp-node-pause:3.10";
    let inspect = |img: &str, format: &str| {
        container::require_image(img).expect("image");
        let out = podman(&["image", "inspect", "--format", format, img]).expect("inspect");
        assert!(out.status.success(), "inspect {img}: {}", out_text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        inspect(&standin, "{{.Id}}"),
        inspect(&image("proxy-standin"), "{{.Id}}"),
        "{standin} is the stand-in"
    );
    assert_eq!(
        inspect(&utility, "{{.Id}}"),
        inspect(&image("node-busybox"), "{{.Id}}"),
        "{utility} is the test node's busybox"
    );
    assert_eq!(inspect(&standin, "{{.Config.User}}"), "1000:3000");
    let title = "{{index .Config.Labels \"org.opencontainers.image.title\"}}";
    let description = "{{index .Config.Labels \"org.opencontainers.image.description\"}}";
    assert_eq!(inspect(&standin, title), "cp-proxy-standin");
    assert!(
        inspect(&standin, description).contains("Stand-in"),
        "{standin} description"
    );
    assert_eq!(inspect(&utility, title), "cp-node-busybox");
    assert_eq!(inspect(pause, title), "cp-node-pause");
    assert_eq!(
        inspect(pause, "{{.Config.Entrypoint}}"),
        "[/bin/sleep 2147483647]"
    );

    let v = run_image(&standin, &["--version"]);
    assert!(v.status.success(), "{standin} --version: {}", out_text(&v));
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        format!("cp-proxy-standin {}", cp_api::defaults::RELEASE)
    );
    // The init container's command, under the limits the tests run containers with (1024).
    let ok = run_image(&utility, &["sh", "-c", "ulimit -n 1000 && ulimit -n"]);
    assert!(ok.status.success(), "ulimit -n 1000: {}", out_text(&ok));
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "1000");
    let over = run_image(&utility, &["sh", "-c", "ulimit -n 64000"]);
    assert!(
        !over.status.success(),
        "ulimit -n 64000 above the hard limit succeeded: {}",
        out_text(&over)
    );

    // The stand-in on a configuration like the controller's and a service key of its subaccount.
    let dir = std::env::temp_dir().join(format!("cp-images-standin-{}", std::process::id()));
    let (config_dir, secrets_dir) = (dir.join("user-provided"), dir.join("secrets"));
    for d in [&config_dir, &secrets_dir] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let proxy =
        |port: i32| json!({"enableProxyAuthorization": false, "enabled": true, "port": port});
    let config = json!({
        "highAvailabilityMode": "off",
        "integration": {"auditlog": {"mode": "console"}, "connectivityService": {"serviceCredentialsKey": "service_key"}},
        "multiRegionMode": {"enabled": false},
        "serviceChannels": {"enabled": true},
        "servers": {
            "businessDataTunnel": {"externalHost": "cp.images.kyma.example.com", "externalPort": 443},
            "proxy": {"http": proxy(20003), "rfcAndLdap": proxy(20001), "socks5": proxy(20004)}
        },
        "subaccountId": "11111111-2222-4333-8444-555555555555",
        "subaccountSubdomain": "images-subdomain",
        "tenantMode": "dedicated"
    });
    std::fs::write(
        config_dir.join(names::CONFIGMAP_CONFIG_KEY),
        cp_api::yaml11::to_string(&config),
    )
    .expect("config");
    std::fs::write(
        secrets_dir.join(names::SECRET_SERVICE_KEY_KEY),
        json!({"clientid": "cid", "clientsecret": "s", "subaccount_id": "11111111-2222-4333-8444-555555555555"}).to_string(),
    )
    .expect("key");
    let mounts = [
        format!(
            "--volume={}:/etc/connectivity/properties/user-provided:ro",
            config_dir.display()
        ),
        format!(
            "--volume={}:/etc/connectivity/secrets:ro",
            secrets_dir.display()
        ),
    ];
    let name = format!("cp-images-standin-{}", std::process::id());
    let mut args = vec![
        "run",
        "-d",
        "--name",
        &name,
        "--label",
        container::LABEL,
        "--network=none",
        "--read-only",
        "--cap-drop=ALL",
        &mounts[0],
        &mounts[1],
    ];
    args.extend(container::ULIMITS);
    args.push(&standin);
    let started = podman(&args).expect("podman run");
    assert!(started.status.success(), "{}", out_text(&started));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let log = loop {
        let logs = podman(&["logs", &name]).expect("podman logs");
        let text = String::from_utf8_lossy(&logs.stdout).to_string();
        if text.contains("\"event\":\"listening\"") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stop = podman(&["stop", "-t", "10", &name]).expect("podman stop");
    let code = podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]).expect("inspect");
    let _ = podman(&["rm", "-f", &name]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(stop.status.success(), "{}", out_text(&stop));
    assert_eq!(
        String::from_utf8_lossy(&code.stdout).trim(),
        "0",
        "exit code after SIGTERM\n{log}"
    );
    let logged: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l.get("config").is_some())
        .unwrap_or_else(|| panic!("no config line in the stand-in's log:\n{log}"));
    assert_eq!(logged["standin"], "connectivity-proxy");
    assert_eq!(logged["config"], config, "{log}");
    assert_eq!(
        logged["serviceKeySubaccount"],
        "11111111-2222-4333-8444-555555555555"
    );
    assert!(log.contains("\"ports\":[8042,20003,20001,20004]"), "{log}");
}

/// Provenance (docs/fips.md, README "Images"): the operator images carry the OCI labels of the checkout
/// they were built from, their binaries carry the dependency list cargo auditable embeds, and the
/// CycloneDX SBOM beside each image names the same crates.
#[test]
fn images_carry_their_source_revision_and_dependency_list() {
    let root = cp_tests::workspace_root();
    let module_config =
        std::fs::read_to_string(root.join("manifests/module-config.yaml")).expect("module-config");
    let repository = module_config
        .lines()
        .find_map(|l| l.strip_prefix("repository: "))
        .expect("repository in module-config.yaml")
        .trim()
        .to_string();
    let head = std::process::Command::new("git")
        .args(["-C", &root.to_string_lossy(), "rev-parse", "HEAD"])
        .output()
        .expect("git");
    let revision = String::from_utf8_lossy(&head.stdout).trim().to_string();
    for name in ["webhook", "controller"] {
        let img = image(name);
        container::require_image(&img).expect("image");
        let inspect =
            podman(&["image", "inspect", "--format", "{{json .Labels}}", &img]).expect("inspect");
        let labels: serde_json::Value =
            serde_json::from_slice(&inspect.stdout).unwrap_or_else(|e| panic!("{img} labels: {e}"));
        let label = |k: &str| labels[k].as_str().unwrap_or_default().to_string();
        assert_eq!(
            label("org.opencontainers.image.source"),
            repository,
            "{img}"
        );
        assert_eq!(
            label("org.opencontainers.image.version"),
            cp_api::defaults::RELEASE,
            "{img}"
        );
        if head.status.success() {
            assert_eq!(
                label("org.opencontainers.image.revision"),
                revision,
                "{img}: built from another commit"
            );
        }
        assert!(
            label("org.opencontainers.image.created").ends_with('Z'),
            "{img}: {labels}"
        );
        assert_eq!(label("io.kyma-project.cp-operator.fips"), "false", "{img}");

        // The binary inside the image, copied out of a container that never runs.
        let created =
            podman(&["create", "--label", container::LABEL, &img]).expect("podman create");
        let id = String::from_utf8_lossy(&created.stdout).trim().to_string();
        assert!(
            created.status.success() && !id.is_empty(),
            "{img}: {}",
            out_text(&created)
        );
        let dir = std::env::temp_dir().join(format!("cp-provenance-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let bin = dir.join(format!("cp-{name}"));
        let copied = podman(&["cp", &format!("{id}:/cp-{name}"), &bin.to_string_lossy()])
            .expect("podman cp");
        let _ = podman(&["rm", "-f", &id]);
        assert!(copied.status.success(), "{img}: {}", out_text(&copied));
        let packages =
            cp_tests::provenance::embedded_packages(&bin).expect("embedded dependency list");
        let _ = std::fs::remove_dir_all(&dir);
        for expected in [
            format!("cp-{name}"),
            "kube-client".into(),
            "rustls".into(),
            "ring".into(),
        ] {
            assert!(
                packages.iter().any(|p| p.name == expected),
                "{img}: {expected} is not in the embedded list"
            );
        }
        assert!(
            !packages.iter().any(|p| p.name == "aws-lc-fips-sys"),
            "{img}: the default build names the FIPS module"
        );

        // The SBOM hack/images.sh wrote beside the image: the same crates.
        let sbom_path = root.join(format!(
            "dist/sbom/{name}-{}.cdx.json",
            cp_api::defaults::RELEASE
        ));
        let sbom: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&sbom_path)
                .unwrap_or_else(|e| panic!("{}: {e}", sbom_path.display())),
        )
        .expect("SBOM JSON");
        let components: std::collections::BTreeSet<&str> = sbom["components"]
            .as_array()
            .expect("components")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        // Every crate linked at run time (build-time crates, kind "build", are not in the image).
        for p in packages.iter().filter(|p| p.kind == "runtime") {
            assert!(
                components.contains(p.name.as_str()),
                "{}: {} missing",
                sbom_path.display(),
                p.name
            );
        }
    }
}
