#!/usr/bin/env bash
# expect_caught.sh MPIEXEC W BINARY FAULT [SWEEP ARGS...] — the fault-catalogue
# test: runs the default sweep with FAULT injected and passes only if the sweep
# fails (exit 1) and the property that caught it is the one the fault
# catalogue expects for FAULT. The expectation is not written here: the sweep
# prints it ("failed properties: ... ; the fault catalogue expects Pk for
# FAULT", from core/config.c fc_fault_property, the one table), and the
# verdict must be "caught by Pk (...)".
set -u
mpiexec=$1 W=$2 bin=$3 fault=$4
shift 4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpiexec" -n "$W" "$bin" sweep --inject "$fault" --quiet "$@" >"$out" 2>&1
rc=$?
fail() {
  echo "FAIL: fault $fault: $*"
  cat "$out"
  exit 1
}
[ "$rc" -eq 1 ] || fail "exit $rc, want 1 (the sweep must fail on an injected fault)"
line=$(grep -E "^failed properties:.*; the fault catalogue expects P[0-9]+ for " "$out" | head -n 1)
[ -n "$line" ] || fail "no 'the fault catalogue expects Pk for $fault' line"
expect=$(printf '%s\n' "$line" | sed -E 's/.*the fault catalogue expects P([0-9]+) for ([A-Za-z0-9_]+).*/\1 \2/')
want=${expect% *} named=${expect#* }
[ "$named" = "$fault" ] || fail "the catalogue line names '$named', not $fault"
if ! grep -qE "^caught by P$want( |\$)" "$out"; then
  got=$(grep -oE '^caught by P[0-9]+' "$out" | head -n 1 | cut -d' ' -f3)
  fail "caught by ${got:-no property}, the catalogue expects P$want"
fi
grep -E "^(caught by|failed properties|minimal failing case|signature|reproduce)" "$out"
