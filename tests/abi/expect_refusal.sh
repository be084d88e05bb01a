#!/usr/bin/env bash
# expect_refusal.sh MPIEXEC FSDPCHECK PLUGIN.so EXPECTED_SUBSTRING — loads a
# plugin that breaks the implementation contract's ABI with
# `mpiexec -n 2 fsdpcheck check --impl PLUGIN.so` and passes only if fsdpcheck
# refuses it: exit 2 and exactly one line of output (stdout and stderr
# together), starting "fsdpcheck: " and containing EXPECTED_SUBSTRING.
set -u
mpiexec=$1 bin=$2 so=$3 want=$4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci,-x86} "$mpiexec" -n 2 "$bin" check --impl "$so" --strategy full_shard --steps 1 >"$out" 2>&1
rc=$?
lines=$(wc -l < "$out")
if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^fsdpcheck: .*$want" "$out"; then
  echo "FAIL: exit $rc, $lines lines of output (want exit 2 and one line with '$want'):"
  cat "$out"
  exit 1
fi
echo "ok (exit 2): $(cat "$out")"
