//! Reads what `cp_api::yaml11::to_string` writes back with a real YAML 1.1 reader, PyYAML's
//! `SafeLoader`, and checks that every document is exactly the JSON value it was written from.

use cp_api::yaml11::{self, testgen};
use std::io::Write as _;
use std::process::Command;

/// Reads JSON lines `[expected JSON text, YAML text]` from `sys.argv[1]`, loads each YAML with
/// PyYAML's SafeLoader and compares it with the expected value, types included (`True == 1` and a
/// timestamp is never JSON). Prints every mismatch and `checked N`; exits 1 on any mismatch.
const SCRIPT: &str = r#"
import json, sys
import yaml

def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

bad = 0
checked = 0
with open(sys.argv[1], encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
        expected_json, text = json.loads(line)
        expected = json.loads(expected_json)
        checked += 1
        try:
            got = yaml.load(text, Loader=yaml.SafeLoader)
        except Exception as e:
            got = "<error: %s>" % e
        if not same(expected, got):
            bad += 1
            print("MISMATCH #%d\n--- yaml:\n%s--- expected: %r\n--- got:      %r" % (number, text, expected, got))
print("checked %d" % checked)
sys.exit(1 if bad else 0)
"#;

#[test]
fn pyyaml_reads_back_every_document() {
    let has_pyyaml = Command::new("python3")
        .args(["-c", "import yaml"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_pyyaml,
        "PyYAML is needed: apt-get install -y python3-yaml (or pip install pyyaml)"
    );

    let cases = testgen::cases(20_000, 0x5eed_2024);
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("yaml11_pyyaml-{}.jsonl", std::process::id()));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    for case in &cases {
        let pair = serde_json::json!([case.to_string(), yaml11::to_string(case)]);
        writeln!(file, "{pair}").expect("write");
    }
    file.flush().expect("flush");
    drop(file);

    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(&path)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: String = stdout.chars().take(20_000).collect();
    assert!(
        out.status.success() && !stdout.contains("MISMATCH"),
        "PyYAML read back something else ({}):\n{report}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains(&format!("checked {}\n", cases.len())),
        "{stdout}\n{stderr}"
    );
    let _ = std::fs::remove_file(&path);
}
