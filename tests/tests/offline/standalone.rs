//! A clone stands alone: nothing the two commands use comes from outside the repository, two checkouts
//! never share build output, and a missing prerequisite is one line naming it and the fix.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    cp_tests::workspace_root()
}

/// Every file the tests, `make run` and `make bench` load, and the scripts, name nothing outside the
/// repository.
#[test]
fn nothing_reads_beside_the_repository() {
    let mut offenders = Vec::new();
    let mut stack = vec![
        root().join("tests/src"),
        root().join("tests/tests"),
        root().join("controller/tests"),
        root().join("bench/src"),
        root().join("hack"),
    ];
    stack.push(root().join("Makefile"));
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).expect("dir").flatten() {
                stack.push(e.path());
            }
            continue;
        }
        // The reference checks are the one place allowed to read ../shared (make check-reference).
        if p.starts_with(root().join("tests/tests/reference"))
            || p.ends_with("controller/tests/library/reference.rs")
            || p.ends_with("tests/tests/offline/standalone.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            if line.contains("../shared") || line.contains("reference_dir(") {
                let is_check_reference = p.ends_with("Makefile")
                    && (line.contains("CP_REFERENCE_DIR") || line.starts_with('#'));
                if !is_check_reference {
                    offenders.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "reads beside the repository:\n{}",
        offenders.join("\n")
    );
    // The controller library's reference test reads ../shared: `make test` must never run it.
    let reference = std::fs::read_to_string(root().join("controller/tests/library/reference.rs"))
        .expect("controller/tests/library/reference.rs");
    assert!(
        reference.contains("#[ignore"),
        "controller/tests/library/reference.rs must stay #[ignore] (only make check-reference runs it)"
    );
    for f in [
        cp_tests::fixtures::ISTIO_CRDS,
        cp_tests::fixtures::BTP_CRDS,
        cp_tests::fixtures::GARDENER_CERT_CRD,
        cp_tests::fixtures::CERT_MANAGER_CRD,
    ]
    .iter()
    .chain(cp_tests::fixtures::LEGACY_INSTALL.iter())
    {
        assert!(cp_tests::fixtures::path(f).exists(), "fixture {f} missing");
    }
}

fn make_target_dir(checkout: &Path) -> String {
    let out = Command::new("make")
        .args(["-s", "print-target-dir"])
        .current_dir(checkout)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("MAKEFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .expect("make");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Two checkouts (here: two copies of the Makefile) get two Rust build directories, both outside them.
#[test]
fn two_checkouts_never_share_build_output() {
    let base = std::env::temp_dir().join(format!("cp-two-checkouts-{}", std::process::id()));
    let (a, b) = (base.join("a"), base.join("b"));
    for d in [&a, &b] {
        std::fs::create_dir_all(d).expect("dir");
        std::fs::copy(root().join("Makefile"), d.join("Makefile")).expect("Makefile");
    }
    let (ta, tb) = (make_target_dir(&a), make_target_dir(&b));
    let _ = std::fs::remove_dir_all(&base);
    assert_ne!(ta, tb, "two checkouts share {ta}");
    for t in [&ta, &tb] {
        assert!(t.contains("/.cache/cp-operator/target-"), "{t}");
    }
    assert_eq!(
        make_target_dir(&root()),
        make_target_dir(&root()),
        "stable per checkout"
    );
}

/// A cp-local built from one checkout refuses to run for another, in one line, without a backtrace.
#[test]
fn cp_local_refuses_another_checkout_in_one_line() {
    let bin = cp_tests::own_bin_dir().join("cp-local");
    assert!(
        bin.exists(),
        "{} missing: cargo build --workspace --bins",
        bin.display()
    );
    let other = std::env::temp_dir();
    let out = Command::new(&bin)
        .env("CP_WORKSPACE", &other)
        .env("RUST_BACKTRACE", "0")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("cp-local");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got:\n{err}");
    assert!(
        lines[0].starts_with("cp-local: error: this cp-local was built from"),
        "{err}"
    );
    assert!(lines[0].contains("CARGO_TARGET_DIR"), "{err}");
}

/// Without Go on PATH, `make preflight` (the first step of `make run` and `make test`) says so in
/// one line with the fix.
#[test]
fn missing_go_is_one_clear_line() {
    let path = std::env::var("PATH").unwrap_or_default();
    let without_go: Vec<&str> = path
        .split(':')
        .filter(|d| !Path::new(d).join("go").exists())
        .collect();
    let out = Command::new("make")
        .args(["-s", "--no-print-directory", "preflight"])
        .current_dir(root())
        .env("PATH", without_go.join(":"))
        .env_remove("MAKEFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .expect("make");
    assert!(!out.status.success(), "preflight passed without Go");
    let err = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("preflight:"))
        .collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(
        ours[0].contains("Go is not on PATH") && ours[0].contains("install Go"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}
