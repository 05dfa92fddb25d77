#!/usr/bin/env bash
# Checks what `make run` / `make test` need before the first build, one line per missing thing with its
# fix, and says how long the first builds take. Usage: preflight.sh [images|test|fips]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fail=0
missing() { echo "preflight: $1" >&2; fail=1; }
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

command -v make >/dev/null || missing "make is not installed: apt-get install -y make"
if ! command -v go >/dev/null; then
  missing "Go is not on PATH: install Go $(awk '/^go /{print $2; exit}' "$root/tests/k8s-bins/kube/go.mod") or newer (https://go.dev/dl) and add its bin directory to PATH"
else
  need=$(awk '/^go /{print $2; exit}' "$root/tests/k8s-bins/kube/go.mod")
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  version_ge "$have" "$need" || missing "Go $have is too old: the pinned Kubernetes needs Go $need or newer"
fi
need_rust=$(awk -F'"' '/^rust-version/{print $2; exit}' "$root/Cargo.toml")
for tool in cargo rustc; do
  command -v "$tool" >/dev/null || missing "$tool is not on PATH: install Rust $need_rust or newer with rustup (https://rustup.rs) and add ~/.cargo/bin to PATH"
done
if command -v rustc >/dev/null; then
  have=$(rustc --version | awk '{print $2}')
  version_ge "$have" "$need_rust" || missing "rustc $have is too old: this workspace needs Rust $need_rust or newer (rustup update)"
fi
if [ "${1:-}" = test ] && ! python3 -c 'import yaml' 2>/dev/null; then
  missing "PyYAML is needed by the tests (the YAML 1.1 oracle): apt-get install -y python3-yaml (or pip install pyyaml)"
fi
if [ "${1:-}" = images ]; then
  if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    missing "buildah, podman and runc are needed for the images: apt-get install -y buildah podman runc (make images installs them when run as root)"
  fi
fi
if [ "${1:-}" = fips ]; then
  # The AWS-LC FIPS module (aws-lc-fips-sys) is built from source with CMake, a C compiler and Go (above).
  for tool in cmake cc; do
    command -v "$tool" >/dev/null || missing "$tool is needed to build the AWS-LC FIPS module (make images-fips, make test-fips): apt-get install -y cmake build-essential"
  done
fi
[ "$fail" = 0 ] || exit 1

cache=${XDG_CACHE_HOME:-$HOME/.cache}/cp-operator
# Build directories are kept per checkout: remember whose each is, drop those of checkouts that are gone,
# and keep the three used most recently, so clones that come and go do not fill the disk.
if [ -n "${CARGO_TARGET_DIR:-}" ] && [[ "$CARGO_TARGET_DIR" == "$cache"/target-* ]]; then
  mkdir -p "$CARGO_TARGET_DIR"
  echo "$root" > "$CARGO_TARGET_DIR/.checkout"
  touch "$CARGO_TARGET_DIR"
  for d in "$cache"/target-*; do
    [ -d "$d" ] && [ "$d" != "$CARGO_TARGET_DIR" ] || continue
    owner=$(cat "$d/.checkout" 2>/dev/null || true)
    if [ -n "$owner" ] && [ ! -d "$owner" ]; then
      echo ">> removing the build directory of $owner (checkout gone): $d"
      rm -rf "$d"
    fi
  done
  ls -dt "$cache"/target-* 2>/dev/null | tail -n +4 | while read -r d; do
    echo ">> removing the least recently used build directory $d"
    rm -rf "$d"
  done
fi
version_of() { awk -v m="$1" '$1 == m || ($1 == "require" && $2 == m) {print $NF; exit}' "$2"; }
kube=$(version_of k8s.io/kubernetes "$root/tests/k8s-bins/kube/go.mod")
etcd=$(version_of go.etcd.io/etcd/server/v3 "$root/tests/k8s-bins/etcd/go.mod")
if [ ! -x "$cache/k8s-$kube-etcd-$etcd/bin/kubectl" ]; then
  echo ">> first run: building etcd, kube-apiserver, kube-controller-manager and kubectl from their Go modules (about 12 minutes on 2 cores, cached in $cache afterwards)"
fi
if [ ! -d "${CARGO_TARGET_DIR:-$root/target}/debug" ]; then
  echo ">> first run: building the Rust workspace (about 5 minutes on 2 cores, cached in ${CARGO_TARGET_DIR:-$root/target})"
fi
