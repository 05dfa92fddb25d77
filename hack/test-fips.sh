#!/usr/bin/env bash
# `make test-fips`: the FIPS build (docs/fips.md) built and tested.
#   1. the webhook and the controller with `--no-default-features --features fips` (aws-lc-rs on the
#      AWS-LC FIPS module; cargo profile `fips`, static like the images, built with cargo auditable);
#   2. the cp-certs and cp-webhook unit tests in that build (FIPS provider, key generation in the module);
#   3. on a real control plane with those binaries (CP_BIN_DIR): the `fips` group (the API server calls
#      the FIPS webhook, non-approved suites and groups refused, the embedded dependency list), the
#      `fips_controller` group (the controller's keys), the webhook's admission tests (`e2e::webhook`) and the certificate tests
#      (`certs`: issuance and rotation by the FIPS controller, served by the FIPS webhook).
# The first run builds the AWS-LC FIPS module (cmake, a C compiler and Go; about 4 minutes on 2 cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash "$root/hack/preflight.sh" fips >/dev/null
target=x86_64-unknown-linux-gnu
target_dir=${CARGO_TARGET_DIR:-$root/target}
tools=$(bash hack/auditable-tools.sh)
static=(env RUSTFLAGS="-C target-feature=+crt-static" PATH="$tools:$PATH")

echo ">> 1/3 the FIPS binaries (profile fips)" >&2
"${static[@]}" cargo auditable build --profile fips --locked --target "$target" \
  -p cp-webhook -p cp-controller --bin cp-webhook --bin cp-controller \
  --no-default-features --features cp-webhook/fips,cp-controller/fips

echo ">> 2/3 cp-certs and cp-webhook unit tests on the FIPS provider" >&2
"${static[@]}" cargo auditable test --profile fips --locked --target "$target" -p cp-certs -p cp-webhook --lib \
  --no-default-features --features cp-certs/fips,cp-webhook/fips

echo ">> 3/3 the fips, fips_controller, e2e::webhook and certs groups on a local control plane with the FIPS binaries" >&2
# The test executable itself is the default build's (`--workspace`: the features `make test` resolves,
# so nothing recompiles); only the binaries it starts are the FIPS ones.
CP_BIN_DIR="$target_dir/$target/fips" cargo test --workspace --locked --test control_plane -- \
  --include-ignored fips:: fips_controller:: e2e::webhook:: certs::
