#!/usr/bin/env bash
# Supply-chain checks of the dependency graph with cargo-deny, configured by deny.toml at the root.
#
#   hack/cargo-deny.sh              licenses, bans and sources (`make test` runs this)
#   hack/cargo-deny.sh advisories   RustSec advisories (`make audit`)
#
# cargo-deny is built once from crates.io at a pinned version and cached by version under
# ~/.cache/cp-operator/tools, outside the repository. Licenses, bans and sources need nothing but
# the crates (fetched from crates.io like any build) and never touch any other host. The advisory
# database is a Git repository on GitHub, which this project's machines cannot reach, so the
# advisories check is left out of `make test` and runs separately (`make audit`) wherever GitHub
# is reachable. See docs/supply-chain.md.
set -euo pipefail

version=0.20.2 # needs rustc >= 1.88
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$HOME/.cache/cp-operator/tools/cargo-deny-$version
bin=$tools/bin/cargo-deny

if [ ! -x "$bin" ]; then
  echo ">> building cargo-deny $version once (~3 min), cached in $tools" >&2
  # Not in the workspace's target directory (the Makefile exports one): without CARGO_TARGET_DIR,
  # cargo install builds in a temporary directory and removes it.
  env -u CARGO_TARGET_DIR \
    cargo install --locked --quiet cargo-deny --version "$version" --root "$tools"
fi

case "${1:-}" in
  "") checks=(licenses bans sources) ;;
  advisories) checks=(advisories) ;;
  *)
    echo "usage: $0 [advisories]" >&2
    exit 2
    ;;
esac

cd "$root"
# --locked: check the Cargo.lock that is checked in, never a re-resolved one. --all-features: the
# graph of every optional dependency, not just the default one.
exec "$bin" --locked --all-features check "${checks[@]}"
