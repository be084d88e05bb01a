#!/usr/bin/env bash
# expect_usage.sh MPIEXEC W BINARY EXPECTED_SUBSTRING ARGS... — runs
# `MPIEXEC -n W BINARY ARGS...` and passes if it exits 2 and prints exactly
# one stderr line, starting "fsdpcheck: " and containing EXPECTED_SUBSTRING.
set -u
mpiexec=$1 W=$2 bin=$3 want=$4
shift 4
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$mpiexec" -n "$W" "$bin" "$@" >/dev/null 2>"$err"
rc=$?
lines=$(wc -l < "$err")
if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^fsdpcheck: .*$want" "$err"; then
  echo "FAIL: exit $rc, $lines stderr lines (want exit 2, one line with '$want'):"
  cat "$err"
  exit 1
fi
echo "ok: $(cat "$err")"
