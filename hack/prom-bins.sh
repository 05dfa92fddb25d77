#!/usr/bin/env bash
# Builds prometheus and promtool from the Go module pinned in tests/k8s-bins/prometheus/go.mod into a cache
# outside the repository, keyed by version (service discovery other than static, file and HTTP left out with
# Prometheus' own build tag). Prints the bin directory on stdout. The monitoring tests judge the alert rules
# and dashboards with these programs, never with a copy of their rules.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tests/k8s-bins/prometheus"
version=$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3; exit} $1 == "github.com/prometheus/prometheus" {print $2; exit}' "$mod/go.mod")
[ -n "$version" ] || { echo "cannot read the pinned Prometheus version from tests/k8s-bins/prometheus/go.mod" >&2; exit 1; }
command -v go >/dev/null || { echo "error: Go is not on PATH: install Go and add it to PATH" >&2; exit 1; }
cache=${CP_PROM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cp-operator/prometheus-${version}-$(go env GOVERSION)}
mkdir -p "$cache/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
for cmd in promtool prometheus; do
  out="$cache/bin/$cmd"
  [ -x "$out" ] && continue
  echo ">> building $cmd (Prometheus $version) into $cache/bin; the first build takes a few minutes" >&2
  start=$SECONDS
  ( while sleep 30; do echo ">> still building $cmd: $((SECONDS - start)) s so far" >&2; done ) &
  ticker=$!
  rc=0
  (cd "$mod" && go build -trimpath -tags remove_all_sd -ldflags="-s -w -X github.com/prometheus/common/version.Version=${version#v0.}" \
    -o "$out.tmp" "github.com/prometheus/prometheus/cmd/$cmd") || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  [ "$rc" = 0 ] || { echo "error: building $cmd failed (go build exit $rc); the output above says why" >&2; exit "$rc"; }
  mv "$out.tmp" "$out"
  echo ">> built $cmd in $((SECONDS - start))s" >&2
done
echo "$cache/bin"
