#!/usr/bin/env bash
# bench/floor_calibration.sh [OUT] — the 16-bit model's floor (oracle/compare_model.c,
# FC_CMP_MODEL.act_scale, few_scale, few_tokens) against the arithmetic it must
# allow: for each tiny model of the sweep, global batch 1 and 4 of 8-token
# sequences, seeds 1..6, bf16 params with fp32 reduce, 2 steps, the
# hardware-like port with only its compute16 knob (PyTorch's mixed
# precision) against the reference, and, with FSDPCHECK_FLOOR_TORCH=1 and
# the adapter installed, PyTorch FSDP2 at W=1 (`fsdpcheck-torch check --keep`).
# Prints `compare`'s largest "of tol" over kinds and steps per pair: the
# fraction of its allowance the honest arithmetic used (below 1 passes).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FSDPCHECK:-$root/build/default/oracle/fsdpcheck}
port=${FSDPCHECK_HWLIKE_LIB:-$(dirname "$(dirname "$bin")")/ports/libfsdpcheck_hwlike.so}
out=${1:-/tmp/fsdpcheck-floor}
export HWLOC_COMPONENTS=-pci,-x86
mkdir -p "$out"
used() { "$bin" compare "$1" "$2" 2>&1 | awk '$2 ~ /^(lock|div)/ && $NF ~ /pass|FAIL/ && $(NF-1) ~ /^[0-9.e+-]+$/ {
  if ($(NF-1) + 0 > m) m = $(NF-1) + 0 } END { printf "%.3g", m }'; }
printf '%-12s %-3s %-5s %-12s %s\n' model gb seed side "of tol (max)"
for model in mlp-micro mlp-tiny gpt2-micro gpt2-tiny llama-micro llama-tiny; do
  for gb in 1 4; do
    for seed in 1 2 3 4 5 6; do
      d=$out/$model-$gb-$seed
      rm -rf "$d" && mkdir -p "$d"
      flags=(--model "$model" --strategy full_shard --param-dtype bf16 --reduce-dtype fp32 --optimizer adamw --lr 0.001
        --weight-decay 0.01 --steps 2 --global-batch "$gb" --seed "$seed")
      case $model in mlp*) ;; *) flags+=(--seq-len 8) ;; esac
      FSDPCHECK_HWLIKE=compute16 mpiexec -n 1 "$bin" run --impl "$port" "${flags[@]}" --trace "$d/hw" >/dev/null 2>&1
      mpiexec -n 1 "$bin" run "${flags[@]}" --trace "$d/ref" >/dev/null 2>&1
      printf '%-12s %-3s %-5s %-12s %s\n' "$model" "$gb" "$seed" hwlike "$(used "$d/ref" "$d/hw")"
      if [ "${FSDPCHECK_FLOOR_TORCH:-0}" = 1 ]; then
        FSDPCHECK=$bin fsdpcheck-torch check --api fsdp2 -n 1 "${flags[@]}" --keep "$d/torch" >/dev/null 2>&1
        printf '%-12s %-3s %-5s %-12s %s\n' "$model" "$gb" "$seed" "torch fsdp2" "$(used "$d/torch/ref" "$d/torch/torch")"
      fi
    done
  done
done
