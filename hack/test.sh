#!/usr/bin/env bash
# The tests of `make test`: every test target of the workspace, in two lanes that run at once.
#
#   lane 1 (foreground): every test target of the workspace but `node` (the `control_plane` tests: a
#                        control plane per test group, on loopback), then the doc tests;
#   lane 2 (background): cp-tests' `node` tests (a real node in a network namespace of its own).
#
# The two lanes share nothing: every control plane takes free loopback ports, the node lives in its
# own network namespace, and only the node binary starts a node. Most of either lane's time is spent
# waiting (an API server starting, a controller's next reconcile, a kubelet pulling an image), so on
# two cores the lanes overlap rather than queue. The node lane's output is printed, whole, when it
# ends (its log stays in $CP_TEST_LOGS). Every target is built first, so the lanes never wait on each
# other's build. The exit code is non-zero when any test of either lane failed.
#
# Extra arguments go to every test binary (after `--`), e.g. `hack/test.sh --test-threads 1`.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

cargo test --workspace --no-run || exit 1

logs=${CP_TEST_LOGS:-$(mktemp -d -t cp-test-logs.XXXXXX)}
mkdir -p "$logs"
# Every integration test target of the workspace but `node`, read from cargo so that a new one is never
# skipped (`reference` has `test = false`: `make check-reference` runs it). Always `--workspace`: the
# features of the dependencies stay those of the build above, so nothing is compiled again.
others=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
names = set()
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and t.get("test", True) and t["name"] != "node":
            names.add(t["name"])
print(" ".join("--test " + n for n in sorted(names)))
')

# Lane 2 in a process group of its own, stopped with everything it started if this script is stopped.
setsid bash -c 'cargo test -p cp-tests --no-fail-fast --test node -- "$@" >"'"$logs"'/node.log" 2>&1; echo $? >"'"$logs"'/node.rc"' node "$@" &
node_lane=$!
trap 'kill -- -"$node_lane" 2>/dev/null' EXIT INT TERM
echo ">> the node tests run beside the others (log: $logs/node.log; printed when they end)"

rc=0
started=$SECONDS
# shellcheck disable=SC2086 # $others is a list of `--test NAME` pairs
cargo test --workspace --no-fail-fast --lib --bins --examples $others -- "$@" || rc=1
cargo test --workspace --no-fail-fast --doc -- "$@" || rc=1
echo ">> lane 1 (everything but the node tests) took $((SECONDS - started)) s"

wait "$node_lane"
trap - EXIT INT TERM
echo ">> lane 2 (the node tests) ended after $((SECONDS - started)) s; its output:"
cat "$logs/node.log"
[ "$(cat "$logs/node.rc" 2>/dev/null)" = 0 ] || { echo ">> the node tests FAILED (log: $logs/node.log)"; rc=1; }
exit "$rc"
