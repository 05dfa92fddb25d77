#!/usr/bin/env bash
# The control-plane and node tests on three Kubernetes minors: the newest (tests/k8s-bins/kube, what
# `make test` runs) and the older ones pinned in tests/k8s-bins/skew/v1.N.P (hack/gen-k8s-gomod.sh
# v1.N.P tests/k8s-bins/skew/v1.N.P adds one). Each release's binaries are built from the Go modules into
# the cache keyed by its version (the first build of a release takes 10-15 minutes on two cores).
# SKEW_VERSIONS="v1.34.4 v1.36.3" picks releases (default: every pinned one and the newest); extra
# arguments go to the test executables. Prints one line per release with its result and time.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dirs=()
if [ -n "${SKEW_VERSIONS:-}" ]; then
  for v in $SKEW_VERSIONS; do
    if [ -f "tests/k8s-bins/skew/$v/go.mod" ]; then dirs+=("tests/k8s-bins/skew/$v")
    elif grep -q "k8s.io/kubernetes $v\$" tests/k8s-bins/kube/go.mod; then dirs+=("tests/k8s-bins/kube")
    else echo "test-skew: $v is pinned nowhere (hack/gen-k8s-gomod.sh $v tests/k8s-bins/skew/$v)" >&2; exit 2; fi
  done
else
  for d in tests/k8s-bins/skew/*/; do dirs+=("${d%/}"); done
  dirs+=("tests/k8s-bins/kube")
fi
cargo test -p cp-tests --test control_plane --test node --no-run >/dev/null || exit 1
summary=()
failed=0
for dir in "${dirs[@]}"; do
  version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$dir/go.mod")
  bins=$(CP_K8S_MODULE_DIR="$root/$dir" bash hack/k8s-bins.sh) || { summary+=("$version: the binaries did not build"); failed=1; continue; }
  start=$SECONDS
  echo ">> Kubernetes $version ($bins)"
  if CP_K8S_BIN_DIR="$bins" cargo test -p cp-tests --test control_plane --test node -- "$@"; then
    summary+=("$version: passed in $((SECONDS - start)) s")
  else
    summary+=("$version: FAILED after $((SECONDS - start)) s")
    failed=1
  fi
done
printf '%s\n' "${summary[@]}"
exit "$failed"
