#!/usr/bin/env bash
# Coverage-guided fuzzing of the admission webhook and the legacy-install import (fuzz/, cargo-fuzz).
#
# Builds a seed corpus from the default CR and the project's legacy fixtures, then runs every target
# for FUZZ_SECONDS (default 120). The corpus lives outside the repository and keeps what the fuzzer
# found between runs. Exits non-zero, naming the artifact, when a target crashes.
#
#   FUZZ_SECONDS   seconds per target (default 120)
#   FUZZ_TARGETS   targets to run (default: every target in fuzz/Cargo.toml)
#   FUZZ_MAX_LEN   largest input in bytes (default 65536)
#   FUZZ_SANITIZER cargo-fuzz sanitizer (default address; `none` runs faster)
#   CP_FIXTURES_DIR  the legacy fixtures (default tests/fixtures)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=$HOME/.cache/cp-operator
seconds=${FUZZ_SECONDS:-120}
max_len=${FUZZ_MAX_LEN:-65536}
sanitizer=${FUZZ_SANITIZER:-address}
reference=${CP_FIXTURES_DIR:-$root/tests/fixtures}
corpus_root=$cache/fuzz/corpus
artifacts_root=$cache/fuzz/artifacts
logs=$cache/fuzz/logs
# Not the workspace's target directory (the Makefile exports that one): fuzz builds use other flags.
export CARGO_TARGET_DIR=$cache/fuzz-target

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo ">> installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
  exit 1
fi
targets=${FUZZ_TARGETS:-$(cargo +nightly fuzz list --fuzz-dir "$root/fuzz")}

# Seed corpus, rebuilt on every run (same file names, so it is overwritten, never duplicated).
for f in "$root/manifests/default-cr.yaml" "$reference/legacy-install/configmap.yaml" "$reference/legacy-install/configmap-info.yaml"; do
  [ -f "$f" ] || { echo "fixture $f not found (set CP_REFERENCE_DIR)" >&2; exit 1; }
done
mkdir -p "$corpus_root" "$artifacts_root" "$logs"
python3 - "$root" "$reference" "$corpus_root" <<'PY'
import json, os, sys
try:
    import yaml
except ImportError:
    sys.exit("hack/fuzz.sh needs PyYAML to build the seed corpus: pip install pyyaml")

root, reference, corpus = sys.argv[1:4]
load = lambda p: yaml.safe_load(open(p))

def write(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

OPERATOR = "system:serviceaccount:kyma-system:connectivity-proxy-controller"

def review(kind, op, user, obj, old=None):
    resource = "servicemappings" if kind == "ServiceMapping" else "connectivityproxies"
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "connectivityproxy.sap.com", "version": "v1", "kind": kind},
        "resource": {"group": "connectivityproxy.sap.com", "version": "v1", "resource": resource},
        "name": obj["metadata"]["name"],
        "operation": op,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    if "namespace" in obj["metadata"]:
        request["namespace"] = obj["metadata"]["namespace"]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}, indent=1)

# admission_review: the default CR on every path, and ServiceMappings.
crs = {"default": load(os.path.join(root, "manifests/default-cr.yaml"))}
for name, cr in crs.items():
    changed = json.loads(json.dumps(cr))
    changed["spec"]["deployment"] = {"replicaCount": 2, "image": {"tag": "2.11.0"}, "nodeSelector": {"pool": "a"}}
    write("admission_review", f"cp-{name}-create", review("ConnectivityProxy", "CREATE", "alice", cr))
    write("admission_review", f"cp-{name}-update", review("ConnectivityProxy", "UPDATE", "alice", cr, cr))
    write("admission_review", f"cp-{name}-update-deployment-user", review("ConnectivityProxy", "UPDATE", "alice", changed, cr))
    write("admission_review", f"cp-{name}-update-deployment-operator", review("ConnectivityProxy", "UPDATE", OPERATOR, changed, cr))
    write("admission_review", f"cp-{name}-delete", review("ConnectivityProxy", "DELETE", "alice", cr))
sm = {
    "apiVersion": "connectivityproxy.sap.com/v1",
    "kind": "ServiceMapping",
    "metadata": {"name": "erp-copy"},
    "spec": {"type": "RFC", "serviceId": "erp.internal", "subaccountId": "00000000-0000-0000-0000-000000000000",
             "internalAddress": "erp.default.svc.cluster.local:3300", "locationIds": ["loc1"]},
}
sm_tcp = json.loads(json.dumps(sm))
sm_tcp["spec"].update({"type": "TCP", "serviceId": "db.internal", "internalAddress": "[::1]:5432"})
write("admission_review", "sm-create", review("ServiceMapping", "CREATE", "alice", sm))
write("admission_review", "sm-update", review("ServiceMapping", "UPDATE", "alice", sm_tcp, sm))

# legacy_import: <connectivity-proxy-config.yml> NUL <info key=value lines> NUL <spec.config JSON>.
legacy = load(os.path.join(reference, "legacy-install/configmap.yaml"))["data"]["connectivity-proxy-config.yml"]
info = load(os.path.join(reference, "legacy-install/configmap-info.yaml"))["data"]
info_lines = "".join(f"{k}={v}\n" for k, v in info.items())
config = json.dumps(crs["default"]["spec"]["config"])
write("legacy_import", "config-only", legacy)
write("legacy_import", "config-info", legacy + "\0" + info_lines)
write("legacy_import", "config-info-cr", legacy + "\0" + info_lines + "\0" + config)
# The same configuration in flow style (YAML accepts JSON): one-byte mutations change its structure.
write("legacy_import", "flow-config-info-cr", json.dumps(yaml.safe_load(legacy)) + "\0" + info_lines + "\0" + config)
write("legacy_import", "shared-tenant", legacy.replace("tenantMode: dedicated", "tenantMode: shared") + "\0\0" + config)
PY

echo ">> building the fuzz targets into $CARGO_TARGET_DIR" >&2
cargo +nightly fuzz build --fuzz-dir "$root/fuzz" -s "$sanitizer"

failed=()
for t in $targets; do
  mkdir -p "$corpus_root/$t" "$artifacts_root/$t"
  dict=()
  [ -f "$root/fuzz/dict/$t.dict" ] && dict=("-dict=$root/fuzz/dict/$t.dict")
  log=$logs/$t.log
  echo ">> fuzzing $t for ${seconds}s (corpus $corpus_root/$t, log $log)" >&2
  status=0
  cargo +nightly fuzz run --fuzz-dir "$root/fuzz" -s "$sanitizer" "$t" "$corpus_root/$t" -- \
    -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts_root/$t/" -print_final_stats=1 "${dict[@]}" >"$log" 2>&1 || status=$?
  summary=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  echo "   $t: ${execs:-?} executions; last status: ${summary:-none}" >&2
  if [ "$status" -ne 0 ]; then
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    grep -E "panicked at|ERROR: (libFuzzer|AddressSanitizer)" "$log" | head -n 5 >&2 || true
    echo "!! $t failed (exit $status); artifact: ${artifact:-none, see $log}" >&2
    [ -n "$artifact" ] && echo "   reproduce: cargo +nightly fuzz run --fuzz-dir fuzz $t $artifact" >&2
    failed+=("$t")
  fi
done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "!! crashes in: ${failed[*]}" >&2
  exit 1
fi
echo ">> no crashes" >&2
