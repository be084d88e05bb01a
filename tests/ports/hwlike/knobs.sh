#!/usr/bin/env bash
# knobs.sh MPIEXEC FSDPCHECK PORT.so — each knob of the hardware-like port
# alone, on a run where it applies: its trace must differ from the
# reference's in some bit (a knob that changes nothing is a defect), and
# `fsdpcheck check` against the reference must pass. With atomics, two runs of
# the same case must differ from each other. Then bad input: an unknown knob,
# a bad seed and --inject into the port without the catalogue are one line
# and exit 2.
set -u
mpiexec=$1 bin=$2 port=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
# trace DIR W IMPL FLAGS...: one run's trace in DIR
trace() {
  local dir=$1 W=$2 impl=$3
  shift 3
  "$mpiexec" -n "$W" "$bin" run --impl "$impl" "$@" --trace "$dir" >"$dir.log" 2>&1 || {
    fail "run --impl $impl $*: exit $?"
    cat "$dir.log"
  }
}
# same_bits A B: every step file of trace A equals B's byte for byte
same_bits() {
  local f
  for f in "$1"/step-*.safetensors; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
}
# knob NAME W FLAGS...: the knob alone differs from the reference and passes check
knob() {
  local name=$1 W=$2
  shift 2
  export FSDPCHECK_HWLIKE=$name
  trace "$work/$name.hw" "$W" "$port" "$@"
  trace "$work/$name.ref" "$W" reference "$@"
  same_bits "$work/$name.hw" "$work/$name.ref" && fail "$name: the port's trace is the reference's bit for bit ($*)"
  "$mpiexec" -n "$W" "$bin" check --impl "$port" "$@" >"$work/$name.check" 2>&1 ||
    { fail "$name: check against the reference failed ($*)"; cat "$work/$name.check"; }
  unset FSDPCHECK_HWLIKE
}
gpt2=(--model gpt2-tiny --strategy full_shard --steps 2)
knob matmul 2 "${gpt2[@]}"
knob fma 2 "${gpt2[@]}"
knob compute16 2 "${gpt2[@]}" --param-dtype bf16
knob compute16 1 "${gpt2[@]}" --param-dtype fp16 --reduce-dtype fp16
knob attention 1 "${gpt2[@]}"
knob norms 1 "${gpt2[@]}"
knob norms 1 --model llama-micro --strategy full_shard --steps 2
# a ring differs from rank order from three ranks on, a tree from four
knob ring 3 --model mlp-tiny --strategy full_shard --steps 2 --global-batch 12
knob tree 4 --model mlp-micro --strategy no_shard --steps 2 --global-batch 8
knob avg 3 --model mlp-tiny --strategy full_shard --steps 2 --global-batch 12
# atomics: two runs of one case differ, and each passes
export FSDPCHECK_HWLIKE=atomics
trace "$work/at1" 1 "$port" "${gpt2[@]}"
trace "$work/at2" 1 "$port" "${gpt2[@]}"
same_bits "$work/at1" "$work/at2" && fail "atomics: two runs are the same bit for bit"
"$mpiexec" -n 1 "$bin" check --impl "$port" "${gpt2[@]}" >"$work/at.check" 2>&1 ||
  { fail "atomics: check failed"; cat "$work/at.check"; }
# bad input: one line on stderr, exit 2
for bad in "FSDPCHECK_HWLIKE=matmul,bogus" "FSDPCHECK_HWLIKE_SEED=x1"; do
  env "$bad" "$mpiexec" -n 1 "$bin" run --impl "$port" --model mlp-micro >"$work/bad.out" 2>"$work/bad.err"
  rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$work/bad.err")" -eq 1 ] ||
    { fail "$bad: exit $rc with $(wc -l <"$work/bad.err") lines, want exit 2 and one line"; cat "$work/bad.err"; }
done
# --inject into the port without the catalogue built in: refused, one line, exit 2
"$mpiexec" -n 1 "$bin" sweep --impl "$port" --inject no_divide --cases 1 >"$work/inj.out" 2>"$work/inj.err"
rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$work/inj.err")" -eq 1 ] && grep -q FC_IMPL_FAULTS "$work/inj.err" ||
  { fail "sweep --inject into the plain port: exit $rc, want 2 and one line naming FC_IMPL_FAULTS"; cat "$work/inj.err"; }
if [ "$fails" -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; exit 1; fi
