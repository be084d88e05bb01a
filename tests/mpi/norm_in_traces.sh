#!/usr/bin/env bash
# norm_in_traces.sh MPIEXEC BINARY — the total gradient norm judged from
# traces (issue: clip_grad_norm_'s return is judged, not only the clipped
# parameters). Three checks, each on traces written by `fsdpcheck run` and
# judged by `fsdpcheck compare` as a port's would be:
#   1. the reference at W=4 against itself at W=2 (clipping, every norm type):
#      the norm passes (no false alarm from another reduction order);
#   2. clip_eps_per_rank (pytorch#149768's class: the eps counted once per
#      rank, 3e-6 at W=4): compare fails at step 0, first divergence grad_norm;
#   3. clip_hsdp_shard_norm (the HSDP norm over the shard group's gradient
#      only): the same.
# Each failure names what it expected; the count of failures is the exit code.
set -u
mpiexec=$1 bin=$2
export HWLOC_COMPONENTS=-pci,-x86
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
g="--model gpt2-tiny --steps 2 --global-batch 8 --seq-len 8 --clip-grad-norm 0.05 --quiet"
run() {  # run NAME W FLAGS...
  local name=$1 W=$2; shift 2
  "$mpiexec" -n "$W" "$bin" run "$@" --trace "$tmp/$name" >"$tmp/$name.out" 2>&1 ||
    { fail "run $name: $(tail -n 1 "$tmp/$name.out")"; return 1; }
}
for nt in 1 2 inf; do
  run "ref-W2-$nt" 2 $g --strategy full_shard --norm-type $nt && run "ref-W4-$nt" 4 $g --strategy full_shard --norm-type $nt || continue
  "$bin" compare "$tmp/ref-W2-$nt" "$tmp/ref-W4-$nt" >"$tmp/cmp-$nt.out" 2>&1 ||
    fail "the reference at W=4 against W=2 (norm type $nt): $(grep -m1 -E 'first divergence|fsdpcheck' "$tmp/cmp-$nt.out")"
  grep -qE '^ +0 +lock +[^ ]+ +norm +1 .* pass$' "$tmp/cmp-$nt.out" || fail "norm type $nt: no norm row judged at step 0"
done
caught() {  # caught FAULT W FLAGS...: the faulty run against the reference, the same flags
  local fault=$1 W=$2; shift 2
  run "ok-$fault" "$W" $g "$@" && run "bad-$fault" "$W" $g "$@" --inject "$fault" || return
  "$bin" compare "$tmp/ok-$fault" "$tmp/bad-$fault" >"$tmp/cmp-$fault.out" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || { fail "$fault: compare exit $rc, want 1"; return; }
  grep -q '^first divergence: step 0, tensor grad_norm' "$tmp/cmp-$fault.out" ||
    fail "$fault: the first divergence is not step 0's grad_norm: $(grep -m1 '^first divergence' "$tmp/cmp-$fault.out")"
  grep -A3 '^first divergence' "$tmp/cmp-$fault.out"
}
caught clip_eps_per_rank 4 --strategy full_shard
caught clip_hsdp_shard_norm 4 --strategy hybrid_shard --shard-group 2
[ $fails -eq 0 ] && echo "norm_in_traces: PASS"
exit $((fails > 0))
