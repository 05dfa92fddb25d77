#!/usr/bin/env bash
# Builds the cp-webhook and cp-controller images offline: static release binaries (glibc, crt-static)
# copied onto an empty base with buildah. Tags each image with the workspace version, locally
# (localhost/cp-webhook:<v>) and as the manifests reference it. Prints the image names and sizes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing buildah, podman and runc from Debian (once)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman runc >&2
  else
    echo "error: buildah, podman and runc are needed: apt-get install -y buildah podman runc (as root)" >&2
    exit 1
  fi
fi
version=$(awk -F'"' '/^\[workspace.package\]/{p=1} p && /^version/{print $2; exit}' Cargo.toml)
registry=$(grep -A1 'pub const IMAGE_REGISTRY' shared/src/bundle.rs | grep -o '"[^"]*"' | head -1 | tr -d '"')
[ -n "$version" ] && [ -n "$registry" ] || { echo "error: cannot read the version (Cargo.toml) or the image registry (shared/src/bundle.rs)" >&2; exit 1; }
target=x86_64-unknown-linux-gnu
target_dir=${CARGO_TARGET_DIR:-$root/target}
echo ">> building static release binaries (the first release build, with whole-program optimisation, takes about 12 minutes on 2 cores)" >&2
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --target "$target" \
  -p cp-webhook -p cp-controller --bin cp-webhook --bin cp-controller >&2
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
for name in webhook controller; do
  bin="$target_dir/$target/release/cp-$name"
  rm -rf "${ctx:?}"/*
  cp "$bin" "$ctx/cp-$name"
  strip "$ctx/cp-$name" 2>/dev/null || true
  if [ "$name" = controller ]; then cp /etc/ssl/certs/ca-certificates.crt "$ctx/"; fi
  local_tag="localhost/cp-$name:$version"
  buildah bud --quiet --layers=false -f "$root/$name/Containerfile" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.title=cp-$name" \
    -t "$local_tag" -t "$registry/$name:$version" "$ctx" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$local_tag")
  echo ">> $local_tag ($registry/$name:$version): $((size / 1024 / 1024)) MiB ($size bytes)" >&2
done
