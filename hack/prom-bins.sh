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
# shellcheck source=hack/go-build.sh
. "$root/hack/go-build.sh"
for cmd in promtool prometheus; do
  go_build "$cache/bin/$cmd" "$cmd (Prometheus $version)" "$mod" -tags remove_all_sd \
    -ldflags="-s -w -X github.com/prometheus/common/version.Version=${version#v0.}" "github.com/prometheus/prometheus/cmd/$cmd"
done
echo "$cache/bin"
