#!/usr/bin/env bash
# bench/xla_hlo.sh [MODEL] [W] [OUT] — XLA's compiled collectives against the reference's theory:
# runs `fsdpcheck-torch check --api fsdp2 --device xla` (SPMD FSDPv2 on W virtual XLA:CPU devices,
# 2 steps) with XLA dumping its HLO text, writes the reference's FSDP2 comm log for the same model
# and W (`fsdpcheck run --strategy full_shard --fsdp-version 2 --comm-log`, the theory), and prints
# `python -m fsdpcheck_torch.xla_layout`'s report. Defaults: gpt2-tiny, W=4, /tmp/fsdpcheck-xla-hlo.
# Needs .venv-torch-xla (adapters/torch/requirements-xla.lock) and $FSDPCHECK or build/lead/oracle/fsdpcheck.
set -euo pipefail
usage="usage: bench/xla_hlo.sh [MODEL] [W (1..4)] [OUT]"
[ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
model=${1:-gpt2-tiny}
W=${2:-4}
out=${3:-/tmp/fsdpcheck-xla-hlo}
[[ "$W" =~ ^[1-4]$ ]] || { echo "$usage" >&2; exit 2; }
[[ "$model" =~ ^[A-Za-z0-9._/-]+$ ]] || { echo "$usage" >&2; exit 2; }
cd "$(dirname "$0")/.."
root=$PWD
py=$root/.venv-torch-xla/bin/python
bin=${FSDPCHECK:-$root/build/lead/oracle/fsdpcheck}
[ -x "$py" ] || { echo "bench/xla_hlo.sh: no $py (a venv with torch_xla)" >&2; exit 2; }
[ -x "$bin" ] || { echo "bench/xla_hlo.sh: no fsdpcheck binary at $bin (set FSDPCHECK)" >&2; exit 2; }
export HWLOC_COMPONENTS=-pci,-x86 OMP_NUM_THREADS=1 FSDPCHECK=$bin PYTHONPATH=$root/adapters/torch
rm -rf "$out"; mkdir -p "$out"
# a failed check still leaves its trace and dump (a layout finding fails it): the report is printed
# all the same, and the script exits with the check's code
rc=0
XLA_FLAGS="--xla_dump_to=$out/hlo --xla_dump_hlo_as_text" \
  "$py" -m fsdpcheck_torch check --api fsdp2 --device xla -n "$W" --model "$model" --steps 2 --keep "$out/keep" \
  > "$out/check.log" 2>&1 || rc=$?
grep -E "^(FAIL|fsdpcheck-torch)" "$out/check.log" || tail -5 "$out/check.log"
[ -f "$out/keep/torch/trace.json" ] || { echo "bench/xla_hlo.sh: the check wrote no trace ($out/check.log)" >&2; exit 1; }
mpiexec -n "$W" "$bin" run --quiet --strategy full_shard --fsdp-version 2 --model "$model" --steps 1 \
  --comm-log "$out/commlog.jsonl"
"$py" -m fsdpcheck_torch.xla_layout "$out/hlo" "$out/keep" "$out/commlog.jsonl"
exit "$rc"
