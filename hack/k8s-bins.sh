#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, etcd, kubectl, kubelet and kube-proxy from the Go modules pinned in tests/k8s-bins/
# into a cache outside the repository, keyed by version. Prints the bin directory on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version_of() { awk -v m="$1" '$1 == m || ($1 == "require" && $2 == m) {print $NF; exit}' "$2"; }
# CP_K8S_MODULE_DIR: another module directory pinning another Kubernetes release (the skew lanes,
# tests/k8s-bins/skew/v1.N.P); the cache is keyed by the version it pins.
kube_dir=${CP_K8S_MODULE_DIR:-$root/tests/k8s-bins/kube}
kube_version=$(version_of k8s.io/kubernetes "$kube_dir/go.mod")
etcd_version=$(version_of go.etcd.io/etcd/server/v3 "$root/tests/k8s-bins/etcd/go.mod")
[ -n "$kube_version" ] && [ -n "$etcd_version" ] || { echo "cannot read pinned versions from tests/k8s-bins/*/go.mod" >&2; exit 1; }
cache=${CP_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cp-operator/k8s-${kube_version}-etcd-${etcd_version}}
mkdir -p "$cache/bin"
command -v go >/dev/null || { echo "error: Go is not on PATH: install Go (see tests/k8s-bins/kube/go.mod for the version) and add it to PATH" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

minor=${kube_version#v1.}; minor=${minor%%.*}
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${kube_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"

module_dir() { if [ "$1" = kube ]; then echo "$kube_dir"; else echo "$root/tests/k8s-bins/$1"; fi; }
# shellcheck source=hack/go-build.sh
. "$root/hack/go-build.sh"
build() { # dir package output [ldflags]
  go_build "$cache/bin/$3" "$3 ($kube_version / etcd $etcd_version)" "$(module_dir "$1")" -ldflags="${4:--s -w}" "$2"
}
build etcd go.etcd.io/etcd/server/v3 etcd
build kube k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kubectl kubectl "$kube_ldflags"
# The node of the cluster tests (hack/node-bins.sh adds its container runtime).
build kube k8s.io/kubernetes/cmd/kubelet kubelet "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kube-proxy kube-proxy "$kube_ldflags"
build kube k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler "$kube_ldflags"
echo "$cache/bin"
