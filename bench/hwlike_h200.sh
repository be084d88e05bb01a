#!/usr/bin/env bash
# bench/hwlike_h200.sh [OUT] — the H200 bf16 P9 failure (docs/measurements/gpu-first-run.md:
# the CUDA port's full_shard against its own no_shard, step 0's loss 1.6e-4 to
# 1.3e-3 apart on mlp-micro and mlp-tiny) reproduced with the hardware-like port.
# For mlp-micro and mlp-tiny at W = 1..4 (and hybrid at W = 4), bf16 params with
# fp32 reduce, one step: the port's no_shard against its full_shard, the two
# with knob sets A and B and other plan seeds (FSDPCHECK_HWLIKE_SEED 0 and 1:
# what another cuBLASLt algorithm for the same product does). Prints step 0's
# loss difference relative to the loss, the verdict of the tight P9 the H200 ran
# (both sides one arithmetic: fp32's loss row, 1.2e-6), and `fsdpcheck compare`'s
# verdict of the pair under today's policy. Then the sweep's own P9 of each case
# (`sweep --replay`, the port against the reference's no_shard).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FSDPCHECK:-$root/build/default/oracle/fsdpcheck}
port=${FSDPCHECK_HWLIKE_LIB:-$(dirname "$(dirname "$bin")")/ports/libfsdpcheck_hwlike.so}
out=${1:-/tmp/fsdpcheck-hwlike-h200}
export HWLOC_COMPONENTS=-pci,-x86
mkdir -p "$out"
loss() { sed -nE 's/^step 0: loss ([0-9.e+-]+).*/\1/p' "$1"; }
# pair TAG W KNOBS_A KNOBS_B STRATEGY...: the port's no_shard (A, plan seed 0) and STRATEGY (B, seed 1)
pair() {
  local tag=$1 W=$2 knobs=$3 knobs_b=$4 a b rel tight now
  shift 4
  local flags=(--model "$model" --param-dtype bf16 --reduce-dtype fp32 --steps 1 --global-batch $((W * 4)) --seed 11)
  rm -rf "${out:?}/$tag-ns" "$out/$tag-fs"
  FSDPCHECK_HWLIKE=$knobs FSDPCHECK_HWLIKE_SEED=0 mpiexec -n "$W" "$bin" run --impl "$port" "${flags[@]}" \
    --strategy no_shard --trace "$out/$tag-ns" >"$out/$tag-ns.log" 2>&1
  FSDPCHECK_HWLIKE=$knobs_b FSDPCHECK_HWLIKE_SEED=1 mpiexec -n "$W" "$bin" run --impl "$port" "${flags[@]}" \
    --strategy "$@" --trace "$out/$tag-fs" >"$out/$tag-fs.log" 2>&1
  a=$(loss "$out/$tag-ns.log") b=$(loss "$out/$tag-fs.log")
  rel=$(awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3g", d / a }')
  tight=$(awk -v r="$rel" 'BEGIN { print (r > 1.2e-6 ? "FAIL" : "pass") }')
  now=$("$bin" compare "$out/$tag-ns" "$out/$tag-fs" 2>&1 | tail -n 1 | cut -d: -f1)
  printf '%-10s %-2s %-13s %-28s %10s  %-9s %s\n' "$model" "$W" "$1" "$knobs | $knobs_b" "$rel" "$tight" "$now"
}
printf '%-10s %-2s %-13s %-28s %10s  %-9s %s\n' model W strategy "knobs A | B" "rel. loss" "tight P9" "compare now"
for model in mlp-micro mlp-tiny; do
  for W in 1 2 3 4; do
    for ab in none:none matmul:matmul default:default compute16,matmul:compute16,matmul none:compute16; do
      pair "$model-$W-fs-${ab/:/-}" "$W" "${ab%%:*}" "${ab#*:}" full_shard
      [ "$W" = 4 ] && pair "$model-$W-hy-${ab/:/-}" "$W" "${ab%%:*}" "${ab#*:}" hybrid_shard --shard-group 2
    done
  done
done
echo "== the sweep's P9 (the port against the reference's no_shard), default knobs"
for model in mlp-micro mlp-tiny; do
  for W in 1 2 3 4; do
    printf '%-10s W=%s: ' "$model" "$W"
    mpiexec -n "$W" "$bin" sweep --impl "$port" --replay "--model $model --strategy full_shard --param-dtype bf16 \
--reduce-dtype fp32 --steps 1 --global-batch $((W * 4)) --seed 11" 2>&1 | grep -E "^P9 " || echo "no P9 line"
  done
done
