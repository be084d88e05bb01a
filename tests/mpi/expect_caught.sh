#!/usr/bin/env bash
# expect_caught.sh MPIEXEC W BINARY FAULT [SWEEP ARGS...] — the fault-catalogue
# test: runs the default sweep with FAULT injected and passes only if the sweep
# fails (exit 1) and names the property that caught it ("caught by Pn").
set -u
mpiexec=$1 W=$2 bin=$3 fault=$4
shift 4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpiexec" -n "$W" "$bin" sweep --inject "$fault" --quiet "$@" >"$out" 2>&1
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "^caught by P[0-9]" "$out"; then
  echo "FAIL: fault $fault: exit $rc (want 1) and no 'caught by' line:"
  cat "$out"
  exit 1
fi
grep -E "^(caught by|minimal failing case|reproduce)" "$out"
