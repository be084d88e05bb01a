#!/usr/bin/env bash
# bench/xla_check.sh [MODEL] [W] [STEPS] — the time of one `fsdpcheck-torch check --device xla` (SPMD
# FSDPv2 on XLA's CPU client, default gpt2-tiny at 4 devices, 2 steps) and its split: the whole check's
# wall time, the torch side as check reports it, and inside that one process (trace.json's
# torch.seconds) the XLA runtime coming up, the model's build and wrap, each step (the first compiles
# its graphs); what is left of the torch side is Python starting and importing torch, transformers
# and torch_xla. Needs the XLA
# lock's venv (FSDPCHECK_TORCH_VENV, default .venv-torch-xla) and fsdpcheck ($FSDPCHECK, else
# build/default's). Exits with the check's code.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-gpt2-tiny}
W=${2:-4}
STEPS=${3:-2}
PY=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch-xla}/bin/python
export FSDPCHECK=${FSDPCHECK:-$ROOT/build/default/oracle/fsdpcheck}
export HWLOC_COMPONENTS=-pci,-x86 OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error
[ -x "$PY" ] || { echo "bench/xla_check.sh: no venv python at $PY (make it: see adapters/torch/requirements-xla.lock)"; exit 2; }
KEEP=$(mktemp -d)
trap 'rm -rf "$KEEP"' EXIT
t0=$(date +%s.%N)
"$PY" -m fsdpcheck_torch check --api fsdp2 --device xla -n "$W" --model "$MODEL" --steps "$STEPS" --keep "$KEEP/c" \
  >"$KEEP/out.txt" 2>&1
rc=$?
t1=$(date +%s.%N)
grep -E "^fsdpcheck-torch check:" "$KEEP/out.txt" || tail -5 "$KEEP/out.txt"
"$PY" - "$KEEP/c/torch/trace.json" "$KEEP/out.txt" "$t0" "$t1" "$MODEL" "$W" "$STEPS" <<'PY'
import json, re, sys

trace, out, t0, t1, model, W, steps = sys.argv[1:]
wall = float(t1) - float(t0)
m = re.search(r"torch ([\d.]+) s from its start", open(out).read())
torch_s = float(m[1]) if m else float("nan")
try:
    s = json.load(open(trace))["torch"]["seconds"]
except (OSError, KeyError, ValueError):
    sys.exit(f"no torch.seconds in {trace}")
inside = s["runtime"] + s["build"] + sum(s["steps"])
print(f"{model} at {W} XLA:CPU devices, {steps} steps")
print(f"  check, wall            {wall:7.1f} s")
print(f"  torch side             {torch_s:7.1f} s")
print(f"    start: python, torch, transformers, torch_xla imported  {torch_s - inside:7.1f} s")
print(f"    XLA runtime up (use_spmd, devices)  {s['runtime']:7.1f} s")
print(f"    build and wrap       {s['build']:7.1f} s")
for i, t in enumerate(s["steps"]):
    print(f"    step {i}               {t:7.1f} s")
print(f"  the rest (plan beside torch, compare)  {wall - torch_s:7.1f} s")
PY
exit $rc
