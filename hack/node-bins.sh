#!/usr/bin/env bash
# The container runtime of the cluster tests' node: containerd 2.x, its runc shim and ctr, built from the Go
# module pinned in tests/k8s-bins/containerd/ into a version-keyed cache (kubelet 1.37 needs containerd 2;
# Debian's is 1.6), plus runc, the CNI plugins, iptables and busybox-static from Debian (installed once, as
# root, when missing). Prints the containerd bin directory on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v go >/dev/null || { echo "error: Go is not on PATH" >&2; exit 1; }
version=$(awk '$1 == "require" && $2 == "github.com/containerd/containerd/v2" {print $3; exit}' "$root/tests/k8s-bins/containerd/go.mod")
[ -n "$version" ] || { echo "cannot read the containerd version from tests/k8s-bins/containerd/go.mod" >&2; exit 1; }
# Keyed by the containerd version and the Go toolchain that builds it.
gover=$(go env GOVERSION 2>/dev/null || echo unknown)
cache=${CP_NODE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/cp-operator/containerd-${version}-${gover}}
mkdir -p "$cache/bin"

missing=()
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
# static: ldd refuses it
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null && command -v unshare >/dev/null || missing+=(util-linux)
command -v ps >/dev/null || missing+=(procps)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing ${missing[*]} from Debian (once)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  else
    echo "error: the node needs ${missing[*]}: apt-get install -y ${missing[*]} (as root)" >&2
    exit 1
  fi
fi


export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# No cgo: btrfs and devmapper snapshotters are left out (the node uses overlayfs).
tags="no_btrfs no_devmapper no_zfs"
for cmd in containerd containerd-shim-runc-v2 ctr; do
  out="$cache/bin/$cmd"
  [ -x "$out" ] && continue
  echo ">> building $cmd ($version) into $cache/bin; the first build takes a few minutes" >&2
  start=$SECONDS
  (cd "$root/tests/k8s-bins/containerd" && go build -trimpath -tags "$tags" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$version" \
    -o "$out.tmp" "github.com/containerd/containerd/v2/cmd/$cmd") || {
    echo "error: building $cmd from tests/k8s-bins/containerd failed; the output above says why" >&2; exit 1; }
  mv "$out.tmp" "$out"
  echo ">> built $cmd in $((SECONDS - start))s" >&2
done
echo "$cache/bin"
