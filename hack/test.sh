#!/usr/bin/env bash
# The tests of `make test`: every test target of the workspace, in four lanes that run at once.
#
#   lane 1 (foreground):     every test executable but `node` and `monitoring`, in cargo's order (the unit tests, the
#                            `offline` and `library` tests, the PyYAML oracle), then the first half of
#                            the `control_plane` test groups, then the doc tests;
#   control_plane_2 (bg):    the second half of the `control_plane` test groups, a process of its own;
#   node (bg):               the `node` tests (a real node in a network namespace of its own);
#   monitoring (bg):         promtool's rule tests and the fleet dashboard against a backfilled
#                            Prometheus (CPU for half a minute, no API server).
#
# The lanes share nothing: every control plane takes free loopback ports and is its own test group's
# (`tests/src/group.rs`: groups never overlap within one process, and two processes never share a
# control plane), the node lives in its own network namespace, and only the node binary starts a
# node. Most of each lane's time is spent waiting (an API server starting, a controller's next
# reconcile, a kubelet pulling an image), so on two cores they overlap rather than queue. Every test
# executable is built once, by one `cargo test --workspace --no-run`, and run from there as cargo
# runs it (from its package's directory): a second cargo invocation with other targets would resolve
# other features and compile again. A background lane's output is printed whole when it ends (its log
# stays in $CP_TEST_LOGS). The exit code is non-zero when any test of any lane failed.
#
# Extra arguments go to every test executable, e.g. `hack/test.sh --test-threads 1`.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

logs=${CP_TEST_LOGS:-$(mktemp -d -t cp-test-logs.XXXXXX)}
mkdir -p "$logs"

# One build; its JSON names every test executable (package directory, target, path).
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$logs/build.json" || exit 1
python3 - "$logs/build.json" >"$logs/executables.tsv" <<'PY' || exit 1
import json, os, sys
rows = []
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test") or not m.get("executable"):
        continue
    t = m["target"]
    kind = t["kind"][0]
    # cargo's order: package by package, the library's unit tests, the binaries', then the test targets.
    rank = {"lib": 0, "rlib": 0, "proc-macro": 0, "bin": 1, "test": 2}.get(kind, 3)
    pkg_dir = os.path.dirname(m["manifest_path"])
    rows.append((pkg_dir, rank, t["name"], kind, t["src_path"], m["executable"]))
for pkg_dir, _, name, kind, src, exe in sorted(set(rows)):
    print("\t".join([pkg_dir, name, kind, os.path.relpath(src, pkg_dir), exe]))
PY
if ! grep -q $'\tnode\ttest\t' "$logs/executables.tsv"; then
  echo "hack/test.sh: no node test executable in the build" >&2
  exit 1
fi

# Runs one test executable as cargo would, appending to `$1`'s status file when it fails.
run_one() {
  local status=$1 dir=$2 name=$3 kind=$4 src=$5 exe=$6
  shift 6
  if [ "$kind" = test ]; then echo "     Running $src ($exe)"; else echo "     Running unittests $src ($exe)"; fi
  (cd "$dir" && "$exe" "$@") || echo "$name ($src) $*" >>"$status"
}
export -f run_one

# Runs the test target `$2` (its tests filtered by the libtest arguments after it) in a background lane
# `$1`: a process group of its own, stopped with everything it started if this script is stopped.
lanes=()
background() {
  local lane=$1 target=$2
  shift 2
  : >"$logs/$lane.failed"
  setsid bash -c 'status=$0 tsv=$1 target=$2; shift 2
    while IFS=$'"'\t'"' read -r dir name kind src exe; do
      if [ "$name" = "$target" ] && [ "$kind" = test ]; then
        run_one "$status" "$dir" "$name" "$kind" "$src" "$exe" "$@" </dev/null
      fi
    done <"$tsv"' "$logs/$lane.failed" "$logs/executables.tsv" "$target" "$@" >"$logs/$lane.log" 2>&1 &
  lanes+=("$lane:$!")
  echo ">> lane $lane runs beside the others (log: $logs/$lane.log; printed when it ends)"
}
stop_lanes() { for l in "${lanes[@]}"; do kill -- -"${l#*:}" 2>/dev/null; done; }
trap stop_lanes EXIT INT TERM

# The control-plane test groups split in two halves of about equal time (measured: certs 130 s,
# reliability 70 s, restart_migration 30 s against the other eight groups' 225 s); each half is a
# process of its own with its own control planes. A group not named here runs in lane 1.
second_half=(certs:: reliability:: restart_migration::)
skip_second_half=()
for g in "${second_half[@]}"; do skip_second_half+=(--skip "$g"); done

background node node "$@"
background control_plane_2 control_plane "${second_half[@]}" "$@"
background monitoring monitoring "$@"

started=$SECONDS
: >"$logs/lane1.failed"
while IFS=$'\t' read -r dir name kind src exe; do
  case "$name:$kind" in
    node:test | monitoring:test) continue ;;
    control_plane:test) run_one "$logs/lane1.failed" "$dir" "$name" "$kind" "$src" "$exe" "${skip_second_half[@]}" "$@" </dev/null ;;
    *) run_one "$logs/lane1.failed" "$dir" "$name" "$kind" "$src" "$exe" "$@" </dev/null ;;
  esac
done <"$logs/executables.tsv"
cargo test --workspace --no-fail-fast --doc || echo "doc tests" >>"$logs/lane1.failed"
echo ">> lane 1 (everything but the background lanes) took $((SECONDS - started)) s"

for l in "${lanes[@]}"; do
  wait "${l#*:}"
  echo ">> lane ${l%%:*} ended after $((SECONDS - started)) s; its output:"
  cat "$logs/${l%%:*}.log"
done
trap - EXIT INT TERM

failed=$(cat "$logs"/*.failed)
if [ -n "$failed" ]; then
  echo ">> FAILED test executables (logs in $logs):"
  echo "$failed"
  exit 1
fi
