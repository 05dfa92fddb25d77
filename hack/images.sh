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
# CP_IMAGE_FIPS=1: the FIPS build (docs/fips.md) of the webhook and the controller only, aws-lc-rs in FIPS
# mode (--no-default-features --features fips), tagged <version>-fips, in profiles of its own so that it
# never replaces the default build's binaries: release-fips (`make images-fips`) or fips (`make test-fips`).
fips=${CP_IMAGE_FIPS:-0}
# CP_IMAGE_PROFILE=test-image (what `make test` uses) links without whole-program optimisation.
if [ "$fips" = 1 ]; then
  bash "$root/hack/preflight.sh" fips >/dev/null
  profile=${CP_IMAGE_PROFILE:-release-fips}
  suffix=-fips
  crates=(-p cp-webhook -p cp-controller --bin cp-webhook --bin cp-controller
    --no-default-features --features cp-webhook/fips,cp-controller/fips)
else
  profile=${CP_IMAGE_PROFILE:-release}
  suffix=
  crates=(-p cp-webhook -p cp-controller -p cp-proxy-standin --bin cp-webhook --bin cp-controller --bin cp-proxy-standin)
fi
case "$profile" in
  release | release-fips)
    echo ">> building static $profile binaries (the first build, with whole-program optimisation, takes about 12 minutes on 2 cores; the FIPS module about 4 more)" >&2 ;;
  *) echo ">> building static binaries with the $profile profile (not the shipped build: no whole-program optimisation)" >&2 ;;
esac
# Built with cargo auditable: every binary carries its dependency list (`.dep-v0`), which `cargo audit
# bin`, image scanners and rust-audit-info read (hack/auditable-tools.sh builds the tools once).
tools=$(bash "$root/hack/auditable-tools.sh")
RUSTFLAGS="-C target-feature=+crt-static" PATH="$tools:$PATH" cargo auditable build --profile "$profile" --locked \
  --target "$target" "${crates[@]}" >&2
# OCI labels from the checkout: where it comes from, which commit (a dirty tree says so in its own
# label, never in the revision), which version.
source_url=$(awk '/^repository:/{print $2; exit}' manifests/module-config.yaml)
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]; then tree=dirty; else tree=clean; fi
created=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}" +%Y-%m-%dT%H:%M:%SZ)
oci_labels=(
  --label "org.opencontainers.image.source=$source_url"
  --label "org.opencontainers.image.revision=$revision"
  --label "org.opencontainers.image.version=$version$suffix"
  --label "org.opencontainers.image.created=$created"
  --label "org.opencontainers.image.licenses=Apache-2.0"
  --label "io.kyma-project.cp-operator.tree=$tree"
  --label "io.kyma-project.cp-operator.build-profile=$profile"
  --label "io.kyma-project.cp-operator.fips=$([ "$fips" = 1 ] && echo true || echo false)"
)
mkdir -p "$root/dist/sbom"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
for name in webhook controller; do
  bin="$target_dir/$target/$profile/cp-$name"
  # The CycloneDX SBOM beside the image, from the dependency list embedded in this very binary.
  python3 "$root/hack/sbom.py" --out-dir "$root/dist/sbom" --from-binary "$bin" --suffix="$suffix" "$name" >&2
  rm -rf "${ctx:?}"/*
  cp "$bin" "$ctx/cp-$name"
  strip "$ctx/cp-$name" 2>/dev/null || true
  if [ "$name" = controller ]; then cp /etc/ssl/certs/ca-certificates.crt "$ctx/"; fi
  local_tag="localhost/cp-$name:$version$suffix"
  buildah bud --quiet --layers=false -f "$root/$name/Containerfile" "${oci_labels[@]}" \
    --label "org.opencontainers.image.title=cp-$name" \
    -t "$local_tag" -t "$registry/$name:$version$suffix" "$ctx" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$local_tag")
  echo ">> $local_tag ($registry/$name:$version$suffix): $((size / 1024 / 1024)) MiB ($size bytes)" >&2
done
if [ "$fips" = 1 ]; then
  podman --runtime=runc image prune -f --filter label=org.opencontainers.image.title >/dev/null 2>&1 || true
  exit 0
fi

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
buildah bud --quiet --layers=false -f "$root/tests/standin-proxy/Containerfile" "${oci_labels[@]}" \
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
