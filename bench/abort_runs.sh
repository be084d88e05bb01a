#!/usr/bin/env bash
# bench/abort_runs.sh [N_PER_CELL] — counts the adapter's torch runs that do not end cleanly.
#
# Runs `torchrun --nproc-per-node W -m fsdpcheck_torch run --api A ... --trace OUT` as a user
# would (gpt2-tiny, full_shard, 2 steps, global batch 12, --like a reference trace), N times
# for each API at W = 2 and W = 4 (default N = 50: 100 runs per API, 200 in all), and counts
# every run whose exit code is not 0, whose trace is incomplete, or whose output shows an
# abort ("terminate called", a signal, a faulthandler dump). Prints one line per cell and the
# total; exits 1 if any run failed. FSDPCHECK_TORCH_VENV picks the venv (default .venv-torch).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-50}
PY=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch}/bin/python
FC=${FSDPCHECK:-$ROOT/build/default/oracle/fsdpcheck}
export HWLOC_COMPONENTS=-pci,-x86 OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error
work=$(mktemp -d "${TMPDIR:-/tmp}/fc_abort.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$PY" -c 'import torch; print("torch", torch.__version__)'
bad_total=0 runs=0 t0=$SECONDS
for W in 2 4; do
  ref="$work/ref-W$W"
  mpiexec -n "$W" "$FC" run --model gpt2-tiny --strategy full_shard --steps 2 --global-batch 12 \
    --trace "$ref" --quiet </dev/null || { echo "cannot write the reference trace (W=$W)"; exit 2; }
  for api in fsdp1 fsdp2; do
    bad=0
    for i in $(seq 1 "$N"); do
      out="$work/out"; rm -rf "$out"
      log=$("$PY" -m torch.distributed.run --standalone --nproc-per-node "$W" --log-dir "$work/log" -m fsdpcheck_torch run \
        --api "$api" --device cpu --backend gloo --model gpt2-tiny --strategy full_shard --steps 2 \
        --global-batch 12 --like "$ref" --trace "$out" 2>&1 </dev/null)
      rc=$?
      runs=$((runs + 1))
      if [ $rc -ne 0 ] || [ ! -f "$out/trace.json" ] || [ ! -f "$out/step-000001.safetensors" ] ||
        grep -qE "terminate called|Fatal Python error|Signal [0-9]+|SIGABRT|SIGSEGV" <<<"$log"; then
        bad=$((bad + 1))
        echo "  run $i ($api, W=$W): exit $rc: $(grep -m1 -E 'terminate called|Fatal|Signal|Error' <<<"$log")"
      fi
    done
    echo "$api W=$W: $bad of $N runs did not end cleanly"
    bad_total=$((bad_total + bad))
  done
done
echo "abort_runs: $bad_total of $runs runs did not end cleanly ($((SECONDS - t0)) s)"
[ "$bad_total" -eq 0 ]
