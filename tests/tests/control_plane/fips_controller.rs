//! The FIPS controller (docs/fips.md) on a control plane of its own: `make test-fips` runs it with
//! `CP_BIN_DIR` at the FIPS binaries. It talks to the API server through the FIPS provider, says so, and
//! issues keys of approved types inside the module. Ignored in `make test` (default binaries).

use std::time::Duration;

use cp_api::names;
use cp_tests::controller::ControllerProcess;
use cp_tests::shared::control_plane;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::fips::{assert_fips_log, assert_fips_metric};

#[tokio::test]
#[ignore = "make test-fips: needs the FIPS binaries in CP_BIN_DIR"]
async fn the_fips_controller_issues_approved_keys_and_says_so() {
    let cp = control_plane();
    let admin = cp.admin().await.expect("admin");
    cp_tests::fixtures::install_our_crds(&admin).await;
    let controller = ControllerProcess::start(
        &cp,
        "cp-controller",
        &["--leader-elect=false", "--webhook-ips=127.0.0.1"],
    )
    .await
    .expect("the FIPS controller starts and talks to the API server");
    assert_fips_log("cp-controller");
    assert_fips_metric(&controller.metrics_addr, "controller").await;

    let secrets: Api<Secret> = Api::namespaced(admin, "kyma-system");
    for (name, key) in [
        (names::WEBHOOK_CA_SECRET, "ca.key"),
        (names::WEBHOOK_CERT_SECRET, "tls.key"),
    ] {
        let what = "the FIPS controller to issue the webhook's certificates";
        let pem = cp_tests::wait::until_object(
            &secrets,
            name,
            what,
            Duration::from_secs(30),
            |s: Secret| {
                Ok(s.data
                    .and_then(|d| d.get(key).cloned())
                    .map(|k| String::from_utf8_lossy(&k.0).to_string()))
            },
        )
        .await
        .expect("issued");
        let pair = rcgen::KeyPair::from_pem(&pem).expect("a PKCS#8 key");
        let alg = pair.algorithm();
        assert!(
            alg == &rcgen::PKCS_ECDSA_P256_SHA256
                || alg == &rcgen::PKCS_ECDSA_P384_SHA384
                || alg == &rcgen::PKCS_RSA_SHA256,
            "{name}: the key is not an approved type: {alg:?}"
        );
    }
}
