#!/usr/bin/env bash
# Builds the cp-webhook and cp-controller images offline: static release binaries (glibc, crt-static)
# copied onto an empty base with buildah. Tags each image with the workspace version, locally
# (localhost/cp-webhook:<v>) and as the manifests reference it. Prints the image names and sizes.
# Then builds the test-node images (not shipped): the stand-in proxy, a busybox utility image and a
# pause image, for the integration tests' local kubelet + containerd node (see the section below).
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
# CP_IMAGE_PROFILE=test-image (what `make test` uses) links without whole-program optimisation.
profile=${CP_IMAGE_PROFILE:-release}
if [ "$profile" = release ]; then
  echo ">> building static release binaries (the first release build, with whole-program optimisation, takes about 12 minutes on 2 cores)" >&2
else
  echo ">> building static binaries with the $profile profile (not the shipped build: no whole-program optimisation)" >&2
fi
RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile "$profile" --locked --target "$target" \
  -p cp-webhook -p cp-controller -p cp-proxy-standin --bin cp-webhook --bin cp-controller --bin cp-proxy-standin >&2
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
for name in webhook controller; do
  bin="$target_dir/$target/$profile/cp-$name"
  rm -rf "${ctx:?}"/*
  cp "$bin" "$ctx/cp-$name"
  strip "$ctx/cp-$name" 2>/dev/null || true
  if [ "$name" = controller ]; then cp /etc/ssl/certs/ca-certificates.crt "$ctx/"; fi
  local_tag="localhost/cp-$name:$version"
  buildah bud --quiet --layers=false -f "$root/$name/Containerfile" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.title=cp-$name" \
    --label "io.kyma-project.cp-operator.build-profile=$profile" \
    -t "$local_tag" -t "$registry/$name:$version" "$ctx" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$local_tag")
  echo ">> $local_tag ($registry/$name:$version): $((size / 1024 / 1024)) MiB ($size bytes)" >&2
done

# ---------------------------------------------------------------------------------------------------
# Test-node images, NOT shipped: what the integration tests' local node (kubelet + containerd) runs
# when the controller's StatefulSet asks for the default images, which cannot be pulled here. The
# stand-in proxy and busybox are tagged as the references the controller renders by default
# (shared/src/defaults.rs) and under localhost/; the pause image under localhost/ only.
# ---------------------------------------------------------------------------------------------------
default_of() {
  local value
  value=$(grep -E "pub const $1: &str" shared/src/defaults.rs | grep -o '"[^"]*"' | head -1 | tr -d '"')
  [ -n "$value" ] || { echo "error: cannot read $1 from shared/src/defaults.rs" >&2; exit 1; }
  echo "$value"
}
# One command substitution per assignment, so that `set -e` stops on a constant it cannot read.
proxy_registry=$(default_of PROXY_REGISTRY)
proxy_repository=$(default_of PROXY_REPOSITORY)
proxy_tag=$(default_of PROXY_TAG)
utility_registry=$(default_of UTILITY_REGISTRY)
utility_repository=$(default_of UTILITY_REPOSITORY)
utility_tag=$(default_of UTILITY_TAG)
proxy_ref="$proxy_registry/$proxy_repository:$proxy_tag"
utility_ref="$utility_registry/$utility_repository:$utility_tag"
show_size() { # <local tag> <other tags...>
  local size
  size=$(podman image inspect --format '{{.Size}}' "$1")
  echo ">> $1 (${*:2}): $((size / 1024 / 1024)) MiB ($size bytes)" >&2
}

# The stand-in for the SAP Connectivity Proxy (tests/standin-proxy): checks the mounted configuration
# and service key, listens on the proxy's ports only while they read back.
rm -rf "${ctx:?}"/*
cp "$target_dir/$target/$profile/cp-proxy-standin" "$ctx/cp-proxy-standin"
strip "$ctx/cp-proxy-standin" 2>/dev/null || true
buildah bud --quiet --layers=false -f "$root/tests/standin-proxy/Containerfile" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.title=cp-proxy-standin" \
  -t "localhost/cp-proxy-standin:$version" -t "$proxy_ref" "$ctx" >/dev/null
show_size "localhost/cp-proxy-standin:$version" "$proxy_ref"

# The utility image of the StatefulSet's init container (`sh -c "ulimit -n <fd>"`): Debian's static
# busybox on an empty base, an applet symlink for each command in /bin (what `busybox --install -s`
# makes). It is the real busybox (Debian's build, not the 1.37.0 the tag names), so `ulimit -n` fails
# above the container's hard limit exactly as the real image's would.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo ">> installing busybox-static from Debian (once)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >&2
  else
    echo "error: Debian's static busybox is needed: apt-get install -y busybox-static (as root)" >&2
    exit 1
  fi
fi
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
rm -rf "${ctx:?}"/*
mkdir "$ctx/bin"
cp /bin/busybox "$ctx/bin/busybox"
for applet in $("$ctx/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$ctx/bin/$applet"
done
cat >"$ctx/Containerfile" <<'CONTAINERFILE'
FROM scratch
COPY bin/ /bin/
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["sh"]
CONTAINERFILE
buildah bud --quiet --layers=false -f "$ctx/Containerfile" \
  --label "org.opencontainers.image.version=$busybox_version" \
  --label "org.opencontainers.image.title=cp-node-busybox" \
  --label "org.opencontainers.image.description=Debian's static busybox ($busybox_version) for the test node, standing in for $utility_ref" \
  -t "localhost/cp-node-busybox:$version" -t "$utility_ref" "$ctx" >/dev/null
show_size "localhost/cp-node-busybox:$version" "$utility_ref"

# The pod sandbox image containerd starts for every pod (stand-in for registry.k8s.io/pause): the same
# busybox base sleeping forever, as registry.k8s.io/pause's user. As PID 1 without a handler it ignores
# SIGTERM; containerd stops sandboxes with SIGKILL.
cat >"$ctx/Containerfile" <<CONTAINERFILE
FROM localhost/cp-node-busybox:$version
USER 65535:65535
ENTRYPOINT ["/bin/sleep", "2147483647"]
CMD []
CONTAINERFILE
buildah bud --quiet --layers=false --pull=never -f "$ctx/Containerfile" \
  --label "org.opencontainers.image.version=3.10" \
  --label "org.opencontainers.image.title=cp-node-pause" \
  --label "org.opencontainers.image.description=Pod sandbox for the test node: busybox sleep, standing in for registry.k8s.io/pause:3.10" \
  -t "localhost/cp-node-pause:3.10" "$ctx" >/dev/null
show_size "localhost/cp-node-pause:3.10" "pod sandbox"

# Every build leaves the images it replaced untagged; remove ours (they carry the title label) so a
# machine that builds many times does not fill its disk.
podman --runtime=runc image prune -f --filter label=org.opencontainers.image.title >/dev/null 2>&1 || true
