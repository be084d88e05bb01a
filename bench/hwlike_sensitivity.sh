#!/usr/bin/env bash
# bench/hwlike_sensitivity.sh [OUT] — what `compare` can miss when it judges the
# hardware-like port (tests/ports/hwlike) against the reference: `fsdpcheck
# sensitivity REF PORT --step N` for gpt2-tiny (T=16, B=8, AdamW, full_shard
# W=2, 6 steps) at steps 0, 1 and 5, fp32 and bf16 params with fp32 reduce,
# the port with its default knobs. Beside it, the same for PyTorch FSDP2
# (`fsdpcheck-torch check --keep`) when FSDPCHECK_SENS_TORCH=1 and the adapter
# is installed: the rows README's sensitivity is quoted from.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FSDPCHECK:-$root/build/default/oracle/fsdpcheck}
port=${FSDPCHECK_HWLIKE_LIB:-$(dirname "$(dirname "$bin")")/ports/libfsdpcheck_hwlike.so}
out=${1:-/tmp/fsdpcheck-hwlike-sens}
export HWLOC_COMPONENTS=-pci,-x86
mkdir -p "$out"
tiny=(--model gpt2-tiny --seq-len 16 --global-batch 8 --strategy full_shard --steps 6 --quiet)
for pol in "fp32 fp32" "bf16 fp32"; do
  set -- $pol
  for impl in reference "$port"; do
    tag=$1$2-$([ "$impl" = reference ] && echo ref || echo hwlike)
    rm -rf "${out:?}/$tag"
    mpiexec -n 2 "$bin" run --impl "$impl" "${tiny[@]}" --param-dtype "$1" --reduce-dtype "$2" --trace "$out/$tag"
  done
  for s in 0 1 5; do
    echo "== param $1 reduce $2, reference vs hwlike, step $s"
    "$bin" sensitivity "$out/$1$2-ref" "$out/$1$2-hwlike" --step "$s"
  done
  if [ "${FSDPCHECK_SENS_TORCH:-0}" = 1 ]; then
    rm -rf "${out:?}/torch-$1$2"
    FSDPCHECK=$bin fsdpcheck-torch check --api fsdp2 -n 2 "${tiny[@]}" --param-dtype "$1" --reduce-dtype "$2" \
      --keep "$out/torch-$1$2" >/dev/null || true
    for s in 0 1 5; do
      echo "== param $1 reduce $2, reference vs PyTorch FSDP2, step $s"
      "$bin" sensitivity "$out/torch-$1$2/ref" "$out/torch-$1$2/torch" --step "$s"
    done
  fi
done
