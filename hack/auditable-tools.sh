#!/usr/bin/env bash
# The provenance tools, built once from crates.io at pinned versions and cached by version under
# ~/.cache/cp-operator/tools (outside the repository), like cargo-deny:
#   cargo-auditable  builds the shipped binaries with their dependency list embedded (a `.dep-v0`
#                    section: every crate, version and source, compressed JSON), which `cargo audit
#                    bin`, Trivy, Grype and Syft read out of the binary;
#   rust-audit-info  reads that list back without any network (what the tests use: `cargo audit bin`
#                    needs the RustSec database from GitHub, which these machines cannot reach; it
#                    reads the same section with the same `auditable-info` crate).
# Prints the directory holding both binaries.
set -euo pipefail
auditable_version=0.7.7
info_version=0.5.4
tools=$HOME/.cache/cp-operator/tools/auditable-$auditable_version-info-$info_version
if [ ! -x "$tools/bin/cargo-auditable" ] || [ ! -x "$tools/bin/rust-audit-info" ]; then
  echo ">> building cargo-auditable $auditable_version and rust-audit-info $info_version once (~1 min), cached in $tools" >&2
  env -u CARGO_TARGET_DIR cargo install --locked --quiet cargo-auditable --version "$auditable_version" --root "$tools" >&2
  env -u CARGO_TARGET_DIR cargo install --locked --quiet rust-audit-info --version "$info_version" --root "$tools" >&2
fi
echo "$tools/bin"
