#!/usr/bin/env bash
# bench/sensitivity.sh [OUT] — the published sensitivity of `fsdpcheck compare`
# (docs/oracle.md, "Sensitivity"): for fp32, bf16 and fp16, a W=1 run (local for fp32,
# no_shard for 16-bit) against a W=2 full_shard run of the same training, step
# 0, and `fsdpcheck sensitivity` on the pair. gpt2-tiny always;
# FSDPCHECK_SENSITIVITY_124M=1 adds gpt2-124m (B=4, T=64: minutes per run and
# 2.5 GB per trace).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/fsdpcheck-sensitivity}
bin=./build/default/oracle/fsdpcheck
[ -x "$bin" ] || { cmake --preset default >/dev/null && cmake --build --preset default -j "$(nproc)" --target fsdpcheck >/dev/null; }
export HWLOC_COMPONENTS=-pci,-x86
mkdir -p "$out"
models=("gpt2-tiny --seq-len 16 --global-batch 8")
[ "${FSDPCHECK_SENSITIVITY_124M:-0}" = 1 ] && models+=("gpt2-124m --seq-len 64 --global-batch 4")
for mm in "${models[@]}"; do
  set -- $mm; model=$1
  for pol in "fp32 fp32" "bf16 fp32" "bf16 bf16" "fp16 fp16"; do
    set -- $pol; pd=$1 rd=$2
    tag="$model-$pd$rd"
    m="--model $mm --steps 1 --quiet"
    if [ "$pd" = fp32 ]; then
      "$bin" run $m --strategy local --trace "$out/$tag-a"
    else
      "$bin" run $m --strategy no_shard --param-dtype $pd --reduce-dtype $rd --trace "$out/$tag-a"
    fi
    mpiexec -n 2 "$bin" run $m --strategy full_shard --param-dtype $pd --reduce-dtype $rd --trace "$out/$tag-b"
    echo "== $model param $pd reduce $rd: W=1 vs W=2 full_shard"
    "$bin" sensitivity "$out/$tag-a" "$out/$tag-b"
    if [ "$pd" != fp32 ]; then  # P9's comparison: no_shard and full_shard at one W, the same arithmetic
      mpiexec -n 2 "$bin" run $m --strategy no_shard --param-dtype $pd --reduce-dtype $rd --trace "$out/$tag-c"
      echo "== $model param $pd reduce $rd: no_shard vs full_shard at W=2 (--same-compute)"
      "$bin" sensitivity --same-compute "$out/$tag-c" "$out/$tag-b"
      [ "$model" = gpt2-124m ] && rm -rf "$out/$tag-c"
    fi
    [ "$model" = gpt2-124m ] && rm -rf "$out/$tag-a" "$out/$tag-b"
  done
done
