#!/usr/bin/env bash
# check_cmd.sh MPIEXEC BINARY [IMPL] — `fsdpcheck check --impl IMPL` at W=2, as a
# port team runs it (IMPL: reference by default, or a port's PATH.so), in every
# build, the sanitizer builds included:
#   1. --bitwise, gpt2-tiny FULL_SHARD, 3 steps: every step passes bit for bit;
#   2. llama-micro FSDP2 in bf16 with LoRA: passes under the 16-bit policy;
#   3. --inject no_divide: exit 1 at step 0, naming the first divergent gradient;
#   4. --load of a checkpoint saved at step 2: both implementations start there,
#      and the steps judged are 2 and 3 (with the fault: the first divergence
#      is at step 2);
#   5. --quiet: one line for a pass;
#   6. bad input, exit 2 with one line on stderr and nothing written: run's
#      output flags (--trace, --save, --comm-log), a missing checkpoint, no
#      --impl, an unknown --against.
set -u
mpiexec=$1 bin=$2 impl=${3:-reference}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
# chk NAME WANT_RC ARGS...: check at W=2, its output in $work/NAME.{out,err}
chk() {
  local name=$1 want=$2
  shift 2
  "$mpiexec" -n 2 "$bin" check --impl "$impl" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit $rc, want $want"
    cat "$work/$name.out" "$work/$name.err"
    return 1
  fi
}
has() { grep -qE "$2" "$work/$1.out" || { fail "$1: no line matching '$2'"; cat "$work/$1.out"; }; }
gpt2=(--model gpt2-tiny --strategy full_shard)

chk bitwise 0 "${gpt2[@]}" --bitwise --steps 3 &&
  { [ "$(grep -cE '^step [0-2]: loss .* pass$' "$work/bitwise.out")" = 3 ] || fail "bitwise: not 3 passing steps"; } &&
  has bitwise '^fsdpcheck check: pass$'

chk bf16_lora 0 --model llama-micro --strategy full_shard --fsdp-version 2 --param-dtype bf16 --lora 2:4:q_proj --steps 2 &&
  has bf16_lora '^fsdpcheck check: pass$'

chk fault 1 "${gpt2[@]}" --steps 2 --inject no_divide &&
  has fault '^first divergence: step 0, tensor grad\.' && has fault '^fsdpcheck check: FAIL'

"$mpiexec" -n 2 "$bin" run --impl "$impl" "${gpt2[@]}" --steps 2 --save "$work/ck" --quiet >/dev/null 2>"$work/save.err" ||
  { fail "run --save"; cat "$work/save.err"; }
chk load 0 "${gpt2[@]}" --steps 2 --load "$work/ck" &&
  has load '^step 2: .* pass$' && has load '^step 3: .* pass$' && has load '^fsdpcheck check: pass$' &&
  { ! grep -q '^step [01]:' "$work/load.out" || fail "load: judged a step before the checkpoint"; }
chk load_fault 1 "${gpt2[@]}" --steps 2 --load "$work/ck" --inject no_divide &&
  has load_fault '^first divergence: step 2, tensor grad\.'

chk quiet 0 "${gpt2[@]}" --steps 2 --quiet &&
  { [ "$(cat "$work/quiet.out")" = "fsdpcheck check: pass" ] || { fail "quiet: more than the verdict"; cat "$work/quiet.out"; }; }

# bad input: exit 2, one "fsdpcheck: " line on stderr naming the problem, nothing on stdout, no file
bad() {
  local name=$1 needle=$2
  shift 2
  chk "$name" 2 "$@" || return
  [ -s "$work/$name.out" ] && { fail "$name: wrote to stdout"; cat "$work/$name.out"; }
  [ "$(wc -l <"$work/$name.err")" = 1 ] && grep -q "^fsdpcheck: .*$needle" "$work/$name.err" ||
    { fail "$name: stderr is not one line naming '$needle'"; cat "$work/$name.err"; }
}
bad trace "--trace is run's" "${gpt2[@]}" --steps 1 --trace "$work/t"
bad save "--save is run's" "${gpt2[@]}" --steps 1 --save "$work/s"
bad comm_log "--comm-log is run's" "${gpt2[@]}" --steps 1 --comm-log "$work/c.jsonl"
for f in t s c.jsonl; do [ -e "$work/$f" ] && fail "a refused check wrote $f"; done
bad no_ckpt "--load: .*no such checkpoint" "${gpt2[@]}" --steps 1 --load "$work/nonexistent"
"$mpiexec" -n 2 "$bin" check "${gpt2[@]}" --steps 1 >"$work/no_impl.out" 2>"$work/no_impl.err"
[ $? = 2 ] && grep -q '^fsdpcheck: check: --impl X is required' "$work/no_impl.err" || { fail "no --impl"; cat "$work/no_impl.err"; }
bad against "--impl nosuch" "${gpt2[@]}" --steps 1 --against nosuch

if [ "$fails" -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; exit 1; fi
