#!/usr/bin/env bash
# Builds kube-router (its NetworkPolicy controller is what the test node runs to enforce the module's
# NetworkPolicies with iptables and ipset) from the Go module pinned in tests/k8s-bins/kube-router/go.mod
# into a cache outside the repository, keyed by version; installs Debian's ipset when missing (root).
# Prints the bin directory on stdout. Only v2.1.0 is served by the Go module proxy here; it runs only inside
# the test node's network namespace, against the test's own API server.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tests/k8s-bins/kube-router"
version=$(awk '$1 == "require" && $2 == "github.com/cloudnativelabs/kube-router/v2" {print $3; exit} $1 == "github.com/cloudnativelabs/kube-router/v2" {print $2; exit}' "$mod/go.mod")
[ -n "$version" ] || { echo "cannot read the pinned kube-router version from tests/k8s-bins/kube-router/go.mod" >&2; exit 1; }
command -v go >/dev/null || { echo "error: Go is not on PATH: install Go and add it to PATH" >&2; exit 1; }
if ! command -v ipset >/dev/null && [ ! -x /usr/sbin/ipset ] && [ ! -x /sbin/ipset ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing ipset (Debian) for the test node's NetworkPolicy engine" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q ipset >&2 || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ipset >&2; }
  else
    echo "error: ipset is missing: install it (Debian: apt-get install ipset) or run as root" >&2
    exit 1
  fi
fi
cache=${CP_NPC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cp-operator/kube-router-${version}-$(go env GOVERSION)}
mkdir -p "$cache/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# shellcheck source=hack/go-build.sh
. "$root/hack/go-build.sh"
go_build "$cache/bin/kube-router" "kube-router $version" "$mod" -ldflags="-s -w" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
echo "$cache/bin"
