#!/usr/bin/env bash
# `make release VERSION=x.y.z`: sets the one version source (`[workspace.package] version` in Cargo.toml),
# refreshes Cargo.lock (and fuzz/Cargo.lock), re-renders the manifests (`make manifests` stamps image tags,
# module-config.yaml and sec-scanners-config.yaml), prepends a CHANGELOG.md section with the commits since
# the last tag, builds the images with that tag (`make images`) and writes one CycloneDX SBOM per image to
# dist/sbom/. It neither commits, tags nor pushes: it prints those steps.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() { echo "error: $*" >&2; exit 1; }
# Whether semantic version $1 is above $2 (pre-release identifiers compared with sort -V).
above() {
  local a=${1%%-*} b=${2%%-*} ap="" bp=""
  [[ $1 == *-* ]] && ap=${1#*-}
  [[ $2 == *-* ]] && bp=${2#*-}
  if [ "$a" != "$b" ]; then
    [ "$(printf '%s\n%s\n' "$a" "$b" | sort -V | tail -1)" = "$a" ]
    return
  fi
  [ -n "$bp" ] || return 1 # $2 is the release itself: none of its pre-releases is above it
  [ -n "$ap" ] || return 0 # the release is above its pre-releases
  [ "$ap" != "$bp" ] && [ "$(printf '%s\n%s\n' "$ap" "$bp" | sort -V | tail -1)" = "$ap" ]
}

[ $# -eq 1 ] || fail "usage: hack/release.sh VERSION (e.g. 0.2.0)"
version=$1
# Semantic Versioning 2.0 without build metadata: a '+' is not allowed in an image tag.
semver='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
[[ $version =~ $semver ]] || fail "VERSION '$version' is not a semantic version x.y.z (optionally -prerelease, no 'v', no '+build')"

current=$(awk -F'"' '/^\[/{p=($0=="[workspace.package]")} p && /^version *=/{print $2; exit}' Cargo.toml)
[ -n "$current" ] || fail "no version in the [workspace.package] section of Cargo.toml"
above "$version" "$current" || fail "VERSION $version is not above the workspace's current version $current"
[ -z "$(git status --porcelain)" ] || fail "the working tree has uncommitted changes (git status --porcelain); commit or stash them first"
! git rev-parse -q --verify "refs/tags/v$version" >/dev/null || fail "tag v$version exists already"

last_tag=$(git describe --tags --abbrev=0 2>/dev/null || true)
if [ -n "$last_tag" ]; then range="$last_tag..HEAD"; else range=HEAD; fi
changes=$(git log --no-merges --format='- %s (%h)' "$range")
[ -n "$changes" ] || changes="- No changes since $last_tag."

echo ">> version $current -> $version (commits since ${last_tag:-the first commit})" >&2
# Only the version line of [workspace.package]; every crate inherits it (version.workspace = true).
awk -v v="$version" '
  /^\[/ { p = ($0 == "[workspace.package]") }
  p && !done && /^version *=/ { print "version = \"" v "\""; done = 1; next }
  { print }
' Cargo.toml >Cargo.toml.release && mv Cargo.toml.release Cargo.toml
cargo update --workspace --offline --quiet
# fuzz/ is a workspace of its own (nightly, libfuzzer-sys possibly not downloaded): its lock names the
# operator's crates by path, so their version lines are set directly.
if [ -f fuzz/Cargo.lock ]; then
  awk -v v="$version" '
    /^name = "cp-(api|certs|webhook|controller)"$/ { pkg = 1; print; next }
    pkg && /^version = / { print "version = \"" v "\""; pkg = 0; next }
    { pkg = 0; print }
  ' fuzz/Cargo.lock >fuzz/Cargo.lock.release && mv fuzz/Cargo.lock.release fuzz/Cargo.lock
fi

make --no-print-directory manifests

header="# Changelog"
{
  if [ -f CHANGELOG.md ]; then
    # Keep everything above the first release section (the header), then the new section, then the rest.
    awk '/^## /{exit} {print}' CHANGELOG.md
  else
    echo "$header"
    echo
  fi
  echo "## $version ($(date -u +%F))"
  echo
  echo "$changes"
  echo
  if [ -f CHANGELOG.md ]; then awk 'f || /^## /{f=1; print}' CHANGELOG.md; fi
} >CHANGELOG.md.release
mv CHANGELOG.md.release CHANGELOG.md

make --no-print-directory images
python3 hack/sbom.py --out-dir dist/sbom webhook controller

registry=$(grep -A1 'pub const IMAGE_REGISTRY' shared/src/bundle.rs | grep -o '"[^"]*"' | head -1 | tr -d '"')
cat <<EOF

Release $version prepared (nothing committed, tagged or pushed). Review \`git diff\` and CHANGELOG.md, then:

  git add CHANGELOG.md && git commit -am "Release $version"
  git tag -a v$version -m "Release $version"
  podman push $registry/webhook:$version
  podman push $registry/controller:$version
  git push origin HEAD v$version

SBOMs to publish with the images: dist/sbom/webhook-$version.cdx.json, dist/sbom/controller-$version.cdx.json
EOF
