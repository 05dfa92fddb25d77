//! The release path, no cluster and no image build: one version source (`[workspace.package] version`)
//! that every version string in the repository agrees with, the per-image SBOM of `hack/sbom.py`, and
//! `hack/release.sh` refusing bad input before it touches anything.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use cp_api::bundle::IMAGE_REGISTRY;
use serde_json::Value;

fn root() -> PathBuf {
    cp_tests::workspace_root()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// 1-based number of the first line of `text` satisfying `pred` (0 if none).
fn line_where(text: &str, pred: impl Fn(&str) -> bool) -> usize {
    text.lines().position(pred).map_or(0, |i| i + 1)
}

/// The lines of one `[section]` of a TOML file, with their 1-based numbers.
fn toml_section<'a>(text: &'a str, section: &str) -> Vec<(usize, &'a str)> {
    let mut inside = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            inside = trimmed == format!("[{section}]");
            continue;
        }
        if inside {
            lines.push((i + 1, trimmed));
        }
    }
    lines
}

/// The quoted value of `key = "value"`.
fn toml_string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line
        .strip_prefix(key)?
        .trim_start()
        .strip_prefix('=')?
        .trim();
    rest.strip_prefix('"')?.split('"').next()
}

/// The workspace version and its line in Cargo.toml: the one version source.
fn workspace_version() -> (String, usize) {
    let text = read("Cargo.toml");
    toml_section(&text, "workspace.package")
        .into_iter()
        .find_map(|(n, l)| toml_string(l, "version").map(|v| (v.to_string(), n)))
        .expect("Cargo.toml has no [workspace.package] version")
}

/// The workspace members' directories, from `members = [...]` in Cargo.toml.
fn members() -> Vec<String> {
    let text = read("Cargo.toml");
    let start = text.find("members").expect("members");
    let list = &text[start..];
    let list = &list[list.find('[').expect("[")..=list.find(']').expect("]")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `(name, version, line)` of every `[[package]]` of a Cargo.lock.
fn lock_packages(rel: &str) -> Vec<(String, String, usize)> {
    let text = read(rel);
    let mut out = Vec::new();
    let mut name = None;
    for (i, line) in text.lines().enumerate() {
        if line == "[[package]]" {
            name = None;
        } else if let Some(n) = toml_string(line, "name") {
            name = Some(n.to_string());
        } else if let (Some(v), Some(n)) = (toml_string(line, "version"), name.take()) {
            out.push((n, v.to_string(), i + 1));
        }
    }
    out
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `[workspace.package] version` is the one version source: `cp_api::defaults::RELEASE`, every crate,
/// the operator's image tags in the manifests (and in the docs where they name one), the module and
/// security-scanner configurations, both lock files and the newest CHANGELOG.md section agree with it.
/// BENCHMARKS.md is left out on purpose: it records the version that was measured.
#[test]
fn every_version_string_in_the_repository_agrees() {
    let (version, version_line) = workspace_version();
    let mut mismatches = Vec::new();

    if cp_api::defaults::RELEASE != version {
        mismatches.push(format!(
            "shared/src/defaults.rs: RELEASE is {} (built before the version changed?)",
            cp_api::defaults::RELEASE
        ));
    }

    // Every workspace crate inherits the version.
    let mut crates = BTreeSet::new();
    for member in members() {
        let rel = format!("{member}/Cargo.toml");
        let text = read(&rel);
        let package = toml_section(&text, "package");
        if let Some(name) = package.iter().find_map(|(_, l)| toml_string(l, "name")) {
            crates.insert(name.to_string());
        }
        let inherits = package.iter().any(|(_, l)| {
            l.replace(' ', "") == "version.workspace=true"
                || l.replace(' ', "") == "version={workspace=true}"
        });
        if !inherits {
            let n = package
                .iter()
                .find(|(_, l)| l.starts_with("version"))
                .map_or(0, |(n, _)| *n);
            mismatches.push(format!("{rel}:{n}: not `version.workspace = true`"));
        }
    }
    assert!(crates.len() >= 5, "workspace crates: {crates:?}");

    // The operator's image references carry the release as their tag.
    let image = regex_lite::Regex::new(&format!(
        r"{}/([A-Za-z0-9._-]+)(?::([A-Za-z0-9._+-]+))?",
        regex_lite::escape(IMAGE_REGISTRY)
    ))
    .expect("regex");
    let mut files = Vec::new();
    yaml_files(&root().join("manifests"), &mut files);
    files.sort();
    let mut seen = BTreeMap::<String, usize>::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("manifest");
        for (i, line) in text.lines().enumerate() {
            for c in image.captures_iter(line) {
                *seen.entry(c[1].to_string()).or_default() += 1;
                let tag = c.get(2).map_or("", |t| t.as_str());
                if tag != version {
                    mismatches.push(format!(
                        "{}:{}: {} has tag {tag:?}",
                        relative(path),
                        i + 1,
                        &c[0]
                    ));
                }
            }
        }
    }
    for name in ["webhook", "controller"] {
        assert!(
            seen.get(name).copied().unwrap_or(0) >= 2,
            "manifests reference {IMAGE_REGISTRY}/{name} fewer than twice (Deployment, scanners): {seen:?}"
        );
    }
    // The docs, where they name a concrete release of the images.
    let mut docs = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs"))
        .expect("docs")
        .flatten()
    {
        docs.push(entry.path());
    }
    for path in docs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        let text = std::fs::read_to_string(path).expect("doc");
        for (i, line) in text.lines().enumerate() {
            for c in image.captures_iter(line) {
                let tag = c.get(2).map_or("", |t| t.as_str());
                if tag.starts_with(|ch: char| ch.is_ascii_digit()) && tag != version {
                    mismatches.push(format!("{}:{}: {}", relative(path), i + 1, &c[0]));
                }
            }
        }
    }

    // module-config.yaml's version.
    let text = read("manifests/module-config.yaml");
    let cfg: Value = serde_norway::from_str(&text).expect("module-config.yaml");
    if cfg["version"].as_str() != Some(&version) {
        let n = line_where(&text, |l| l.starts_with("version:"));
        mismatches.push(format!(
            "manifests/module-config.yaml:{n}: version {}",
            cfg["version"]
        ));
    }

    // The images the security scanners scan: the operator's two at this release, and the proxy's two.
    let text = read("manifests/sec-scanners-config.yaml");
    let sec: Value = serde_norway::from_str(&text).expect("sec-scanners-config.yaml");
    let mut scanned = BTreeSet::new();
    let runs = [
        cp_api::defaults::release_proxy_image(),
        cp_api::defaults::release_utility_image(),
    ];
    for entry in sec["bdba"].as_array().expect("bdba list") {
        let entry = entry.as_str().expect("bdba entry");
        if runs.iter().any(|r| r == entry) {
            // The proxy and utility images the operator runs: pinned by the release's defaults.
            continue;
        }
        let n = line_where(&text, |l| l.contains(entry));
        let Some((name, tag)) = entry
            .strip_prefix(IMAGE_REGISTRY)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| r.split_once(':'))
        else {
            mismatches.push(format!(
                "manifests/sec-scanners-config.yaml:{n}: {entry} is not {IMAGE_REGISTRY}/<image>:<tag>"
            ));
            continue;
        };
        scanned.insert(name.to_string());
        if tag != version {
            mismatches.push(format!("manifests/sec-scanners-config.yaml:{n}: {entry}"));
        }
    }
    assert_eq!(
        scanned,
        BTreeSet::from(["controller".to_string(), "webhook".to_string()]),
        "bdba scans the operator's two images"
    );

    // Both lock files: every workspace crate at this version (fuzz/ is a workspace of its own that
    // depends on some of them by path; its own crate cp-fuzz is not released).
    for lock in ["Cargo.lock", "fuzz/Cargo.lock"] {
        if !root().join(lock).exists() {
            continue;
        }
        let packages = lock_packages(lock);
        for krate in &crates {
            let entries: Vec<_> = packages.iter().filter(|(n, _, _)| n == krate).collect();
            if entries.is_empty() && lock == "Cargo.lock" {
                mismatches.push(format!("Cargo.lock: no entry for {krate}"));
            }
            for (_, v, n) in entries {
                if *v != version {
                    mismatches.push(format!("{lock}:{n}: {krate} {v}"));
                }
            }
        }
    }

    // The newest CHANGELOG.md section is this release.
    if root().join("CHANGELOG.md").exists() {
        let text = read("CHANGELOG.md");
        let section =
            regex_lite::Regex::new(r"^## (\S+)(?: \(\d{4}-\d{2}-\d{2}\))?$").expect("regex");
        let newest = text.lines().enumerate().find(|(_, l)| l.starts_with("## "));
        match newest {
            Some((i, line)) => match section.captures(line) {
                Some(c) if c[1] == version => {}
                _ => mismatches.push(format!(
                    "CHANGELOG.md:{}: newest section {line:?}, not \"## {version} (YYYY-MM-DD)\"",
                    i + 1
                )),
            },
            None => mismatches.push("CHANGELOG.md: no \"## <version>\" section".into()),
        }
    }

    assert!(
        mismatches.is_empty(),
        "version {version} (Cargo.toml:{version_line}, the one version source) disagrees with:\n{}",
        mismatches.join("\n")
    );
}

/// `hack/sbom.py` lists the webhook image's normal dependency closure as `Cargo.lock` pins it, and
/// nothing only the tests or benchmarks use.
#[test]
fn sbom_lists_the_image_dependencies() {
    let out_dir = std::env::temp_dir().join(format!(
        "cp-sbom-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let run = Command::new("python3")
        .arg("hack/sbom.py")
        .arg("--out-dir")
        .arg(&out_dir)
        .arg("cp-webhook")
        .current_dir(root())
        .output()
        .expect("python3");
    assert!(
        run.status.success(),
        "hack/sbom.py: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let path = out_dir.join(format!("webhook-{}.cdx.json", cp_api::defaults::RELEASE));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let bom: Value = serde_json::from_str(&text).expect("SBOM JSON");

    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    let image = &bom["metadata"]["component"];
    assert_eq!(image["type"], "container");
    assert_eq!(image["name"], format!("{IMAGE_REGISTRY}/webhook"));
    assert_eq!(image["version"], cp_api::defaults::RELEASE);

    let mut locked = BTreeMap::<String, BTreeSet<String>>::new();
    for (name, version, _) in lock_packages("Cargo.lock") {
        locked.entry(name).or_default().insert(version);
    }
    let components = bom["components"].as_array().expect("components");
    let mut listed = BTreeMap::<String, BTreeSet<String>>::new();
    for c in components {
        let name = c["name"].as_str().expect("name");
        let version = c["version"].as_str().expect("version");
        assert!(
            locked.get(name).is_some_and(|v| v.contains(version)),
            "{name} {version} is not in Cargo.lock"
        );
        assert_eq!(
            c["purl"].as_str(),
            Some(format!("pkg:cargo/{name}@{version}").as_str()),
            "{name}: purl"
        );
        let licenses = c["licenses"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(
            licenses.iter().any(|l| {
                [&l["expression"], &l["license"]["id"], &l["license"]["name"]]
                    .iter()
                    .any(|s| s.as_str().is_some_and(|s| !s.trim().is_empty()))
            }),
            "{name} {version}: no license"
        );
        listed
            .entry(name.to_string())
            .or_default()
            .insert(version.to_string());
    }

    for name in [
        "cp-webhook",
        "cp-api",
        "cp-certs",
        "rustls",
        "tokio",
        "hyper",
        "axum",
        "kube",
    ] {
        let versions = listed
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from the webhook SBOM"));
        assert!(
            versions.is_subset(&locked[name]),
            "{name}: SBOM {versions:?}, Cargo.lock {:?}",
            locked[name]
        );
    }
    // Dev-dependencies (jsonschema of cp-tests, criterion of cp-bench), a build-dependency (cc, of ring
    // and others) and crates not in the webhook's closure are left out.
    for name in [
        "jsonschema",
        "criterion",
        "cc",
        "cp-tests",
        "cp-bench",
        "cp-controller",
    ] {
        assert!(
            locked.contains_key(name),
            "{name} not in Cargo.lock: pick another"
        );
        assert!(
            !listed.contains_key(name),
            "{name} is not in the webhook image"
        );
    }
    assert!(
        components.len() >= 100,
        "only {} components",
        components.len()
    );
}

/// `hack/release.sh` refuses a missing or non-semver version, and one not above the current version, with
/// one line and changes nothing (a real release is never run here: it needs a clean tree and builds
/// images).
#[test]
fn release_script_refuses_bad_input() {
    let before = workspace_version();
    for args in [
        &[][..],
        &["not-a-version"][..],
        &["1.2"][..],
        &["v1.2.3"][..],
        &["01.2.3"][..],
        &["1.2.3+build.5"][..],
        &["1.2.3", "extra"][..],
        &[cp_api::defaults::RELEASE][..],
    ] {
        let out = Command::new("bash")
            .arg("hack/release.sh")
            .args(args)
            .current_dir(root())
            .output()
            .expect("bash");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: not one line:\n{stderr}"
        );
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        if let [version] = args {
            assert!(stderr.contains(version), "{args:?}: {stderr}");
        }
        assert!(out.stdout.is_empty(), "{args:?}: wrote to stdout");
    }
    assert_eq!(workspace_version(), before, "the workspace version changed");
}

/// The shipped images keep whole-program optimisation: `make images`/`make release` build with the
/// release profile (fat LTO, one codegen unit, stripped); `make test`'s images use the test-image
/// profile, which inherits it and only links faster. A test image is labelled with its profile.
#[test]
fn release_profile_is_the_shipped_build_and_test_images_only_link_faster() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let section = |name: &str| -> String {
        let start = cargo
            .find(&format!("[profile.{name}]\n"))
            .unwrap_or_else(|| panic!("Cargo.toml has no [profile.{name}]"));
        let body = &cargo[start..];
        let body = &body[body.find('\n').map_or(0, |i| i + 1)..];
        body.split("\n[").next().unwrap_or_default().to_string()
    };
    let release = section("release");
    for line in ["lto = \"fat\"", "codegen-units = 1", "strip = true"] {
        assert!(release.contains(line), "[profile.release] lost `{line}`");
    }
    let test_image = section("test-image");
    assert!(
        test_image.contains("inherits = \"release\""),
        "[profile.test-image] must inherit the release profile"
    );
    let images = std::fs::read_to_string(root().join("hack/images.sh")).expect("hack/images.sh");
    assert!(
        images.contains("profile=${CP_IMAGE_PROFILE:-release}"),
        "hack/images.sh must default to the release profile"
    );
    assert!(
        images.contains("build-profile=$profile"),
        "images carry their build profile as a label"
    );
    let makefile = std::fs::read_to_string(root().join("Makefile")).expect("Makefile");
    let rule = |target: &str| -> String {
        let start = makefile
            .find(&format!("\n{target}:"))
            .unwrap_or_else(|| panic!("Makefile has no {target} rule"));
        makefile[start + 1..]
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        !rule("images").contains("CP_IMAGE_PROFILE"),
        "make images builds the release"
    );
    assert!(rule("test-images").contains("CP_IMAGE_PROFILE=test-image"));
}

/// The FIPS build's claim (docs/fips.md) rests on one place naming the cryptography backend: every other
/// production source hashes, signs and speaks TLS through `cp_certs::crypto`, so that `--features fips`
/// moves all of it into the FIPS module.
#[test]
fn only_cp_certs_crypto_names_a_cryptography_backend() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["shared/src", "certs/src", "webhook/src", "controller/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 20, "found the sources: {}", files.len());
    let mut offenders = Vec::new();
    for file in &files {
        let rel = relative(file);
        if rel == "certs/src/crypto.rs" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // A path that starts with the backend's name (not `String::`, not `Ordering::`).
            let names_backend = ["ring::", "aws_lc_rs", "rsa::", "default_provider()"]
                .iter()
                .any(|b| {
                    code.match_indices(b).any(|(i, _)| {
                        !code[..i]
                            .chars()
                            .next_back()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
                })
                || code.contains("rustls::crypto::ring");
            if names_backend
                && !code.contains("cp_certs::crypto")
                && !code.contains("crate::crypto")
            {
                offenders.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "name the backend only in certs/src/crypto.rs (use cp_certs::crypto):\n{}",
        offenders.join("\n")
    );
}

/// The README matches the tree (issue #49 item 6): every `make <target>` it names is a Makefile target,
/// every Makefile target has its row in the README's command table, and every test group (a module of
/// the `control_plane` and `node` test binaries) is named in the README's test list.
#[test]
fn the_readme_names_the_makefile_targets_and_the_test_groups_that_exist() {
    let readme = read("README.md");
    let makefile = read("Makefile");
    let targets: BTreeSet<String> = makefile
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !rest.starts_with('=');
            ok.then(|| name.to_string())
        })
        .collect();
    assert!(
        targets.len() > 20 && targets.contains("test"),
        "Makefile targets: {targets:?}"
    );
    let named: BTreeSet<String> = readme
        .match_indices("make ")
        .filter(|(i, _)| {
            readme[..*i].ends_with('`')
                || readme[..*i].ends_with(' ')
                || readme[..*i].ends_with('(')
        })
        .map(|(i, m)| {
            readme[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect::<String>()
        })
        .filter(|t| !t.is_empty())
        .collect();
    let unknown: Vec<&String> = named.iter().filter(|t| !targets.contains(*t)).collect();
    assert!(
        unknown.is_empty(),
        "README names make targets the Makefile lacks: {unknown:?}"
    );
    let unlisted: Vec<&String> = targets
        .iter()
        .filter(|t| *t != "all" && !readme.contains(&format!("| `make {t}")))
        .collect();
    assert!(
        unlisted.is_empty(),
        "Makefile targets without a row in README's table: {unlisted:?}"
    );
    for binary in ["control_plane", "node"] {
        let main = read(&format!("tests/tests/{binary}/main.rs"));
        let groups: Vec<&str> = main
            .lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        assert!(groups.len() >= 4, "{binary}: {groups:?}");
        let missing: Vec<&&str> = groups
            .iter()
            .filter(|g| !readme.contains(&format!("`{g}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "README's test list lacks the {binary} groups {missing:?}"
        );
    }
}
