//! The FIPS build (docs/fips.md). `make test-fips` runs this group with `CP_BIN_DIR` at the FIPS
//! binaries (cargo profile `fips`, `--no-default-features --features fips`: aws-lc-rs in FIPS mode),
//! beside the webhook's (`e2e::webhook`) and the certificate tests (`certs`) on the same binaries.
//! Ignored in `make test`, whose binaries are the default (ring) build and would rightly fail here. The
//! FIPS controller has a group of its own (`fips_controller`): it manages the webhook configurations'
//! CA bundle, which would no longer trust the test CA of this group's webhook.

use std::sync::Arc;
use std::time::Duration;

use cp_tests::fixtures::{default_cr_object, dynamic_crs};
use cp_tests::shared::{AUTHENTICATED, alice_client, control_plane, webhook};
use kube::api::PostParams;
use rustls::pki_types::ServerName;
use tokio_rustls::rustls;

/// The webhook's or the controller's JSON log says the FIPS provider is installed and on.
pub(crate) fn assert_fips_log(process: &str) {
    let log = control_plane().log_tail(process, 400);
    let line = log
        .lines()
        .find(|l| l.contains("cryptography provider installed"))
        .unwrap_or_else(|| {
            panic!("{process}: no `cryptography provider installed` line in\n{log}")
        });
    assert!(
        line.contains(r#""fips":true"#) && line.contains("AWS-LC FIPS"),
        "{process} is not the FIPS build (is CP_BIN_DIR the `make test-fips` binaries?): {line}"
    );
}

/// `cp_build_info` on `metrics_addr` carries `fips="true"` for `component`.
pub(crate) async fn assert_fips_metric(metrics_addr: &str, component: &str) {
    let (status, body) = cp_tests::webhook::http_get(metrics_addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(status, 200);
    let line = body
        .lines()
        .find(|l| {
            l.starts_with("cp_build_info{") && l.contains(&format!("component=\"{component}\""))
        })
        .unwrap_or_else(|| panic!("no cp_build_info for {component}:\n{body}"));
    assert!(line.contains(r#"fips="true""#), "{line}");
}

/// A TLS client with ring's algorithms restricted to `suites` and `groups`, trusting `ca_pem`.
fn client(
    ca_pem: &str,
    suites: &[rustls::SupportedCipherSuite],
    groups: &[&'static dyn rustls::crypto::SupportedKxGroup],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> tokio_rustls::TlsConnector {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = suites.to_vec();
    provider.kx_groups = groups.to_vec();
    let mut roots = rustls::RootCertStore::empty();
    let der = cp_tests::webhook::pem_to_der(ca_pem).expect("CA PEM");
    roots.add(der.into()).expect("CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The outcome of one handshake with the webhook: the negotiated suite and group, or the error.
async fn handshake(
    addr: &str,
    connector: tokio_rustls::TlsConnector,
) -> Result<(String, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    Ok((
        format!("{:?}", conn.negotiated_cipher_suite().map(|s| s.suite())),
        format!(
            "{:?}",
            conn.negotiated_key_exchange_group().map(|g| g.name())
        ),
    ))
}

#[tokio::test]
#[ignore = "make test-fips: needs the FIPS binaries in CP_BIN_DIR"]
async fn the_fips_webhook_serves_the_api_server_and_refuses_non_approved_algorithms() {
    let wh = webhook().await;
    assert_fips_log("cp-webhook");
    assert_fips_metric(&wh.metrics_addr, "webhook").await;

    // The API server (Go's TLS client) calls the FIPS webhook: a user's CR comes back defaulted.
    let ns = control_plane().namespace("fips").await.expect("ns");
    let api = dynamic_crs(&alice_client(AUTHENTICATED).await, &ns);
    let cr = default_cr_object("fips");
    let stored = api
        .create(&PostParams::default(), &cr)
        .await
        .expect("admitted through the FIPS webhook");
    assert!(
        stored.data["spec"]["deployment"]["image"]["tag"].is_string(),
        "the FIPS webhook injected the deployment defaults: {:?}",
        stored.data["spec"]
    );

    let addr = wh.url.trim_start_matches("https://");
    let ca = &wh
        .ca
        .as_ref()
        .expect("the test CA signed the webhook's cert")
        .cert_pem;
    use rustls::crypto::ring::{cipher_suite as cs, kx_group as kx};
    let tls13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    let tls12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

    // The control: approved algorithms agree, so a refusal below is the algorithm's, not the setup's.
    let ok = handshake(
        addr,
        client(ca, &[cs::TLS13_AES_128_GCM_SHA256], &[kx::SECP256R1], tls13),
    )
    .await;
    assert_eq!(
        ok,
        Ok((
            "Some(TLS13_AES_128_GCM_SHA256)".into(),
            "Some(secp256r1)".into()
        ))
    );
    // A client offering all of ring's defaults (X25519 and ChaCha20 among them) gets approved ones.
    let defaults = rustls::crypto::ring::default_provider();
    let all = handshake(
        addr,
        client(ca, &defaults.cipher_suites, &defaults.kx_groups, tls13),
    )
    .await
    .expect("a client offering everything");
    assert!(
        !all.0.contains("CHACHA20") && !all.1.contains("X25519"),
        "{all:?}"
    );

    let refused: [(&str, tokio_rustls::TlsConnector); 4] = [
        (
            "TLS 1.3 ChaCha20-Poly1305 only",
            client(
                ca,
                &[cs::TLS13_CHACHA20_POLY1305_SHA256],
                &[kx::SECP256R1],
                tls13,
            ),
        ),
        (
            "X25519 key exchange only",
            client(ca, &[cs::TLS13_AES_128_GCM_SHA256], &[kx::X25519], tls13),
        ),
        (
            "TLS 1.2 ECDHE ChaCha20-Poly1305 only",
            client(
                ca,
                &[
                    cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                    cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
                ],
                &[kx::SECP256R1],
                tls12,
            ),
        ),
        (
            "TLS 1.2 with X25519 only",
            client(
                ca,
                &[cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256],
                &[kx::X25519],
                tls12,
            ),
        ),
    ];
    for (what, connector) in refused {
        let outcome = handshake(addr, connector).await;
        let err = outcome.expect_err(&format!(
            "{what}: the FIPS webhook must refuse the handshake"
        ));
        assert!(
            err.contains("HandshakeFailure") || err.contains("handshake"),
            "{what}: refused with a handshake failure, got {err}"
        );
    }
}

#[test]
#[ignore = "make test-fips: needs the FIPS binaries in CP_BIN_DIR"]
fn the_fips_binaries_carry_their_dependency_list_and_compile_in_no_ring() {
    for bin in ["cp-webhook", "cp-controller"] {
        let path = cp_tests::own_bin_dir().join(bin);
        // What scanners read: the list cargo auditable embedded, with the FIPS module in it.
        let packages = cp_tests::provenance::embedded_packages(&path)
            .expect("the dependency list embedded by cargo auditable");
        assert!(
            packages.iter().any(|p| p.name == "aws-lc-fips-sys"),
            "{bin}: aws-lc-fips-sys is not in the embedded list"
        );
        // What was compiled in: the FIPS profile's own deps directory (nothing else builds in it) holds
        // every crate the FIPS build compiled. (The embedded list comes from `cargo metadata`, which
        // over-reports optional crates that resolver 2 leaves out, ring among them: cargo-auditable#182,
        // cargo#10718; docs/fips.md.)
        let deps = path.parent().expect("bin dir").join("deps");
        let compiled: Vec<String> = std::fs::read_dir(&deps)
            .unwrap_or_else(|e| panic!("{}: {e}", deps.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".rlib"))
            .collect();
        assert!(
            compiled
                .iter()
                .any(|n| n.starts_with("libaws_lc_fips_sys-")),
            "{bin}: aws-lc-fips-sys was not compiled in {}",
            deps.display()
        );
        for absent in ["libring-", "librsa-"] {
            assert!(
                !compiled.iter().any(|n| n.starts_with(absent)),
                "{bin}: the FIPS build compiled {absent}*, outside the FIPS boundary"
            );
        }
    }
}
