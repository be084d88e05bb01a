#!/usr/bin/env bash
# expect_refusal.sh PROBE MPIEXEC FSDPCHECK LIB — without a usable CUDA device,
# `fsdpcheck check --impl LIB` must exit 2 with exactly one line, saying there
# is no CUDA device. On a machine with one, the refusal cannot be provoked:
# skipped (77).
set -u
probe=$1 mpiexec=$2 bin=$3 lib=$4
if "$probe" >/dev/null 2>&1; then
  echo "SKIP: a CUDA device is present; the no-device refusal is tested where there is none"
  exit 77
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpiexec" -n 1 "$bin" check --impl "$lib" --model gpt2-tiny --strategy full_shard >"$out" 2>&1
rc=$?
lines=$(wc -l < "$out")
if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^fsdpcheck: --impl cuda: no CUDA device (cudaGetDeviceCount: " "$out"; then
  echo "FAIL: exit $rc, $lines line(s) (want exit 2 and one line naming the missing CUDA device):"
  cat "$out"
  exit 1
fi
echo "ok: $(cat "$out")"
