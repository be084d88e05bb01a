#!/usr/bin/env bash
# bench/oracle_cost.sh BEFORE AFTER [CASES] — what judging costs, two fsdpcheck
# binaries side by side in one run (each measurement interleaved, best of 3):
# `check --impl reference` of gpt2-tiny at W=2, 3 steps, in fp32 and in bf16
# parameters with fp32 and bf16 reduce, and a sweep of CASES (default 300)
# cases over W = 1..4; prints both times and AFTER / BEFORE.
# Why: lockstep re-runs and the magnitude pass cost reference steps; the issue
# asks for the cost before and after.
set -euo pipefail
before=$1 after=$2 cases=${3:-300}
export HWLOC_COMPONENTS=-pci,-x86
tiny="--model gpt2-tiny --seq-len 16 --global-batch 8 --strategy full_shard --steps 3 --quiet"
best() {  # best BIN CMD...: the best wall time of 3 runs, in seconds
  local t b=1e9
  shift
  for _ in 1 2 3; do
    t=$(wall "$@")
    b=$(python3 -c "print(min($b, $t))")
  done
  echo "$b"
}
wall() {  # wall CMD...: its wall time in seconds (its output discarded; a failure stops the script)
  local f
  f=$(mktemp)
  /usr/bin/time -f %e -o "$f" "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
  cat "$f"
  rm -f "$f"
}
row() {  # row LABEL CMD-with-BIN...
  local label=$1; shift
  local tb ta
  tb=$(best "$before" "${@//BIN/$before}")
  ta=$(best "$after" "${@//BIN/$after}")
  python3 -c "print(f'{\"$label\":44s} before {$tb:7.2f} s  after {$ta:7.2f} s  after/before {$ta / $tb:5.2f}')"
}
row "check fp32, W=2, 3 steps" mpiexec -n 2 BIN check --impl reference $tiny
row "check bf16/fp32, W=2, 3 steps" mpiexec -n 2 BIN check --impl reference $tiny --param-dtype bf16 --reduce-dtype fp32
row "check bf16/bf16, W=2, 3 steps" mpiexec -n 2 BIN check --impl reference $tiny --param-dtype bf16 --reduce-dtype bf16
tb=$(wall mpiexec -n 4 "$before" sweep --cases "$cases")
ta=$(wall mpiexec -n 4 "$after" sweep --cases "$cases")
python3 -c "print(f'{\"sweep, $cases cases, W=1..4\":44s} before {$tb:7.2f} s  after {$ta:7.2f} s  after/before {$ta / $tb:5.2f}')"
