#!/usr/bin/env bash
# bench/ensemble.sh [OUT] — the two designs for 16-bit allowances measured side by
# side (bench/ensemble.c): the magnitude pass `compare` uses, and an ensemble of
# the reference whose reductions round in other orders. gpt2-tiny, T=16, global
# batch 8, bf16 parameters and fp32 reduce, step 0; the ensemble's members are
# the reference at W = 1, 2, 4 under no_shard, full_shard,
# hybrid_shard, two divides and two accumulations (each a different order of
# the 16-bit roundings: what a rank's gradient is produced from, and the sums
# after it). Rows:
#   reference W=2 against W=4 (W=4's member left out of the ensemble);
#   with FSDPCHECK_TABLE_TORCH=DIR: DIR/torch-gpt2-tiny-bf16fp32/{ref,torch}
#   (`fsdpcheck-torch check --api fsdp2 --keep`), PyTorch FSDP2 against the reference.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FSDPCHECK:-$root/build/default/oracle/fsdpcheck}
ens=${FSDPCHECK_ENSEMBLE:-$root/build/default/bench/fsdpcheck_ensemble}
[ -x "$ens" ] || cmake --build --preset default --target fsdpcheck_ensemble >/dev/null
out=${1:-/tmp/fsdpcheck-ensemble}
export HWLOC_COMPONENTS=-pci,-x86
mkdir -p "$out"
tiny="--impl reference --model gpt2-tiny --seq-len 16 --global-batch 8 --param-dtype bf16 --reduce-dtype fp32
      --divide sum-then-divide --steps 1 --quiet"
members=()
member() {  # member TAG W [run flags]
  local tag=$1 w=$2; shift 2
  rm -rf "${out:?}/$tag"
  mpiexec -n "$w" "$bin" run $tiny "$@" --trace "$out/$tag"
  members+=("$out/$tag")
}
member w1-noshard 1 --strategy no_shard
member w1-accum2 1 --strategy no_shard --grad-accum 2
member w2-full 2 --strategy full_shard
member w2-noshard 2 --strategy no_shard
member w2-prepost 2 --strategy full_shard --divide prepost
member w2-accum2 2 --strategy full_shard --grad-accum 2
member w4-full 4 --strategy full_shard
member w4-hybrid 4 --strategy hybrid_shard --shard-group 2
member w4-prepost 4 --strategy full_shard --divide prepost
member w4-accum2 4 --strategy full_shard --grad-accum 2
echo "== reference W=2 against W=4, bf16/fp32, gpt2-tiny"
"$ens" "$out/w2-full" "$out/w4-full" "${members[@]}"
if [ -n "${FSDPCHECK_TABLE_TORCH:-}" ]; then
  t=$FSDPCHECK_TABLE_TORCH/torch-gpt2-tiny-bf16fp32
  echo "== PyTorch FSDP2 against the reference, bf16/fp32, gpt2-tiny"
  "$ens" "$t/ref" "$t/torch" "${members[@]}"
fi
