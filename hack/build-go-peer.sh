#!/usr/bin/env bash
# Builds the Go controller-runtime benchmark peer of the admission webhook (bench/peers/go-webhook)
# into ~/.cache/cp-operator/bench/go-webhook; skips the build when the binary is newer than every
# source file. Prints the binary's path.
set -euo pipefail
src=$(cd "$(dirname "$0")/../bench/peers/go-webhook" && pwd)
out=${HOME}/.cache/cp-operator/bench/go-webhook
mkdir -p "$(dirname "$out")"
if [[ -x "$out" ]] && [[ -z "$(find "$src" \( -name '*.go' -o -name go.mod -o -name go.sum \) -newer "$out" -print -quit)" ]]; then
  echo "$out"
  exit 0
fi
cd "$src"
GOTOOLCHAIN=local go build -mod=mod -buildvcs=false -trimpath -o "$out.tmp" .
mv -f "$out.tmp" "$out"
echo "$out"
