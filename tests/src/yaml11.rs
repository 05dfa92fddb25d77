//! Reading YAML as the Connectivity Proxy (a Java program, YAML 1.1) does, through PyYAML, whose
//! SafeLoader implements YAML 1.1's scalar resolution: the oracle for "the proxy reads what the CR says".

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

const SCRIPT: &str = r#"
import json, sys, yaml
out = []
for line in sys.stdin:
    legacy, rendered = json.loads(line)
    a = yaml.load(legacy, Loader=yaml.SafeLoader)
    b = yaml.load(rendered, Loader=yaml.SafeLoader)
    def walk(x, y, path):
        if isinstance(x, dict):
            if not isinstance(y, dict):
                out.append("%s: legacy has a mapping, rendered %r" % (path, y)); return
            for k, v in x.items():
                if k not in y:
                    out.append("%s.%s: missing in the rendered file" % (path, k))
                else:
                    walk(v, y[k], "%s.%s" % (path, k))
        elif type(x) is not type(y) or x != y:
            out.append("%s: legacy reads %r (%s), rendered reads %r (%s)" % (path, x, type(x).__name__, y, type(y).__name__))
    walk(a, b, "")
print(json.dumps(out))
"#;

/// For each (legacy file, rendered file), every key of the legacy file read as YAML 1.1 must read back
/// to the same value and type from the rendered file; returns the differences.
pub fn mismatches(pairs: &[(String, String)]) -> anyhow::Result<Vec<String>> {
    let check = Command::new("python3").args(["-c", "import yaml"]).output();
    if !check.is_ok_and(|o| o.status.success()) {
        bail!("PyYAML is needed: apt-get install -y python3-yaml (or pip install pyyaml)");
    }
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting python3")?;
    {
        let mut stdin = child.stdin.take().context("python3 stdin")?;
        for p in pairs {
            writeln!(stdin, "{}", serde_json::to_string(p)?)?;
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("python3 output")
}
