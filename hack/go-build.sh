# Sourced by the scripts that build pinned Go programs into a cache (k8s-bins.sh, npc-bins.sh,
# prom-bins.sh). go_build OUT WHAT DIR GO-BUILD-ARGS...: unless OUT is already built, runs
# `go build -trimpath -o OUT.tmp GO-BUILD-ARGS` in module DIR, printing a line every 30 s so a long first
# build never looks hung, and moves the result to OUT; exits with go build's status on a failure.
go_build() {
  local out=$1 what=$2 dir=$3
  shift 3
  if [ -x "$out" ]; then return 0; fi
  echo ">> building $what into $(dirname "$out"); the first build takes a few minutes" >&2
  local start=$SECONDS
  ( while sleep 30; do echo ">> still building $what: $((SECONDS - start)) s so far" >&2; done ) &
  local ticker=$!
  local rc=0
  (cd "$dir" && go build -trimpath -o "$out.tmp" "$@") || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    echo "error: building $what from $dir failed (go build exit $rc); the output above says why" >&2
    exit "$rc"
  fi
  mv "$out.tmp" "$out"
  echo ">> built $what in $((SECONDS - start))s" >&2
}
