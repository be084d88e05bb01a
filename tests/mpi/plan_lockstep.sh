#!/usr/bin/env bash
# plan_lockstep.sh MPIEXEC BINARY — `fsdpcheck plan` and compare's re-run of a
# run's first step (oracle/plan.c, rerun.h fc_rerun_first_step):
#   1. a plan's init.safetensors is the run's byte for byte, and compare judges
#      every step of the run against the plan in lockstep, step 0 included, and
#      passes (the reference at W against itself re-run in one process), over
#      models, optimizers, strategies, FSDP1/2, bf16, clipping, frozen, LoRA;
#   2. a fault (no_divide, ckpt-free, at step 0) fails at step 0;
#   3. a run that started from other weights than the plan's fails, naming the
#      first element that differs;
#   4. `sensitivity PLAN RUN --step 0` re-runs the first step as compare does;
#   5. compare --trajectory refuses a plan (it holds no tensor), exit 2.
# Each failure names what it expected; the count of failures is the exit code.
set -u
mpiexec=$1 bin=$2
export HWLOC_COMPONENTS=-pci,-x86
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pair() {  # pair NAME W FLAGS...: the plan and the run of the same flags
  local name=$1 W=$2; shift 2
  "$bin" plan --world "$W" "$@" --trace "$tmp/$name-plan" --quiet >"$tmp/$name.plan.out" 2>&1 ||
    { fail "plan $name: $(tail -n 1 "$tmp/$name.plan.out")"; return 1; }
  "$mpiexec" -n "$W" "$bin" run "$@" --trace "$tmp/$name-run" --quiet >"$tmp/$name.run.out" 2>&1 ||
    { fail "run $name: $(tail -n 1 "$tmp/$name.run.out")"; return 1; }
}
judged() {  # judged NAME STEPS: compare PLAN RUN passes with every step re-run, step 0 too
  local name=$1 steps=$2
  "$bin" compare "$tmp/$name-plan" "$tmp/$name-run" >"$tmp/$name.cmp" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { fail "$name: compare exit $rc, want 0: $(grep -m1 -E '^first divergence|^fsdpcheck:' "$tmp/$name.cmp")"; return; }
  grep -q "^steps judged in lockstep: each step re-run by the reference from B's recorded state, the first from" \
    "$tmp/$name.cmp" || fail "$name: compare does not say it re-runs the first step"
  grep -q "^  A: .*(reference's plan, no step run, " "$tmp/$name.cmp" || fail "$name: compare does not name A a plan"
  local rows
  rows=$(grep -cE '^ +[0-9]+ +lock +[^ ]+ +grad ' "$tmp/$name.cmp")
  [ "$rows" -eq "$steps" ] || fail "$name: $rows lockstep grad rows, want $steps (one a step, step 0 included)"
  echo "ok: $name ($rows steps in lockstep)"
}
g="--model gpt2-tiny --global-batch 8 --seq-len 8"
cases=(
  "gpt2-adamw 2 3 $g --steps 3 --strategy full_shard"
  "gpt2-fsdp2-bf16 2 2 $g --steps 2 --strategy full_shard --fsdp-version 2 --param-dtype bf16 --reduce-dtype fp32"
  "gpt2-clip-frozen 4 2 $g --steps 2 --strategy shard_grad_op --clip-grad-norm 0.05 --freeze transformer.wte.weight"
  "gpt2-hybrid-accum 4 2 $g --steps 2 --strategy hybrid_shard --shard-group 2 --grad-accum 2"
  "mlp-sgd-momentum 2 3 --model mlp-tiny --steps 3 --optimizer sgd --momentum 0.9 --strategy full_shard"
  "llama-lora 2 2 --model llama-micro --global-batch 4 --seq-len 8 --steps 2 --strategy full_shard --lora 4:8:q_proj"
)
for c in "${cases[@]}"; do
  set -- $c
  name=$1 W=$2 steps=$3
  shift 3
  pair "$name" "$W" "$@" || continue
  cmp -s "$tmp/$name-plan/init.safetensors" "$tmp/$name-run/init.safetensors" ||
    fail "$name: the plan's init.safetensors is not the run's, byte for byte"
  judged "$name" "$steps"
done

# 2. and 3.: runs of the gpt2-adamw flags that must fail against its plan (exit 1), at WANT
f="$g --steps 2 --strategy full_shard"
against_plan() {  # against_plan NAME WANT RUN_FLAGS...
  local name=$1 want=$2
  shift 2
  "$mpiexec" -n 2 "$bin" run $f "$@" --trace "$tmp/$name" --quiet >"$tmp/$name.out" 2>&1 ||
    { fail "run $name: $(tail -n 1 "$tmp/$name.out")"; return; }
  "$bin" compare "$tmp/gpt2-adamw-plan" "$tmp/$name" >"$tmp/$name.cmp" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || fail "$name against the plan: compare exit $rc, want 1"
  grep -q "$want" "$tmp/$name.cmp" ||
    fail "$name: no '$want' but: $(grep -m1 -E '^first divergence|FAIL' "$tmp/$name.cmp")"
}
# 2. a fault in the first step
against_plan nodiv '^first divergence: step 0, tensor grad\.' --inject no_divide
# 3. another start: the plan's weights with the last element changed (the file's
# last byte is its high byte: 0x41 makes it another number, whatever it was)
cp "$tmp/gpt2-adamw-plan/init.safetensors" "$tmp/other.safetensors"
size=$(stat -c %s "$tmp/other.safetensors")
last=$(od -An -tx1 -j $((size - 1)) -N1 "$tmp/other.safetensors" | tr -d ' ')
byte='\x41'
[ "$last" = 41 ] && byte='\x42'
printf "$byte" | dd of="$tmp/other.safetensors" bs=1 seek=$((size - 1)) conv=notrunc 2>/dev/null
against_plan other '^first divergence: the initial weights, tensor transformer.h.1.mlp.c_proj.bias, element 15: ' \
  --init "$tmp/other.safetensors"

# 4. sensitivity at step 0 re-runs it
"$bin" sensitivity "$tmp/gpt2-adamw-plan" "$tmp/gpt2-adamw-run" --step 0 >"$tmp/sens.out" 2>&1 ||
  fail "sensitivity --step 0 against a plan: $(tail -n 1 "$tmp/sens.out")"
grep -q 'step 0 (A re-run from B.s state)' "$tmp/sens.out" || fail "sensitivity: step 0 not re-run: $(head -n 3 "$tmp/sens.out")"

# 5. a plan holds no tensors to read along a trajectory
"$bin" compare "$tmp/gpt2-adamw-plan" "$tmp/gpt2-adamw-run" --trajectory >"$tmp/traj.out" 2>"$tmp/traj.err"
rc=$?
[ $rc -eq 2 ] && grep -q "a plan (fsdpcheck plan) ran no step and holds no tensors" "$tmp/traj.err" ||
  fail "compare --trajectory of a plan: exit $rc, want 2: $(cat "$tmp/traj.err")"

[ $fails -eq 0 ] && echo " No Errors"
exit $fails
