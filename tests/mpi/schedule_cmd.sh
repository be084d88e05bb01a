#!/usr/bin/env bash
# tests/mpi/schedule_cmd.sh MPIEXEC FSDPCHECK — `fsdpcheck schedule` (P10 on
# a comm log written elsewhere) with exact expectations:
#   - the reference's own comm log, W = 2 and 4, every strategy family, prefetch
#     pre/post/forward, the limiter, accumulation with no_sync, hybrid, offload:
#     PASS under the flags that wrote it;
#   - the same log judged as another strategy, or with every backward all-gather
#     removed, or one event's bytes changed: FAIL (exit 1) naming the violation;
#   - the same log judged as real FSDP2 (--api torch-fsdp2): FAIL, naming
#     FSDP2's layout and its root freed after forward;
#   - bad input (no --world, an unknown --api, a malformed line, a rank outside W, a missing
#     file): exit 2 with one line.
# Each failure is counted; the script exits 1 if any (MPICH test style).
set -u
mpiexec=$1 bin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
expect() {  # expect RC LABEL CMD...: the command's exit code must be RC
  local want=$1 label=$2
  shift 2
  "$@" </dev/null >"$work/out" 2>&1
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL $label: exit $got, expected $want"
    tail -n 8 "$work/out"
    fails=$((fails + 1))
  else
    echo "ok   $label (exit $got)"
  fi
}
log() { rm -f "$work/log.jsonl"; "$mpiexec" -n "$1" "$bin" run "${@:2}" --comm-log "$work/log.jsonl" --quiet </dev/null >/dev/null 2>&1; }
while read -r W cfg; do
  # shellcheck disable=SC2086
  log "$W" $cfg || { echo "FAIL the reference's run at W=$W: $cfg"; fails=$((fails + 1)); continue; }
  # shellcheck disable=SC2086
  expect 0 "W=$W $cfg: the reference's own log passes" "$bin" schedule "$work/log.jsonl" --world "$W" $cfg
done <<'CONFIGS'
2 --model gpt2-tiny --strategy full_shard --backward-prefetch pre --forward-prefetch
2 --model gpt2-tiny --strategy shard_grad_op --backward-prefetch post --limit-all-gathers
4 --model gpt2-tiny --strategy hybrid_shard --shard-group 2 --grad-accum 2 --no-sync --global-batch 16
4 --model mlp-tiny --strategy hybrid_shard_zero2 --shard-group 2 --backward-prefetch pre --cpu-offload
4 --model mlp-tiny --strategy no_shard --grad-accum 2
CONFIGS
cfg="--model gpt2-tiny --strategy full_shard --backward-prefetch pre"
log 2 $cfg
expect 1 "a full_shard log judged as shard_grad_op" "$bin" schedule "$work/log.jsonl" --world 2 --model gpt2-tiny \
  --strategy shard_grad_op --backward-prefetch pre
grep -q "expected 0 backward all_gather, got 1" "$work/out" || { echo "FAIL: the violation is not named"; fails=$((fails + 1)); }
grep -v '"op":"all_gather".*"phase":"backward"' "$work/log.jsonl" >"$work/nobwd.jsonl"
expect 1 "a full_shard log without its backward all-gathers" "$bin" schedule "$work/nobwd.jsonl" --world 2 $cfg
# one reduce-scatter's bytes off by one element of fp32
awk 'BEGIN { done = 0 } !done && /"op":"reduce_scatter"/ { match($0, /"bytes":[0-9]+/); b = substr($0, RSTART + 8, RLENGTH - 8);
     sub(/"bytes":[0-9]+/, "\"bytes\":" (b + 4)); done = 1 } { print }' "$work/log.jsonl" >"$work/bytes.jsonl"
expect 1 "one reduce_scatter 4 bytes too long" "$bin" schedule "$work/bytes.jsonl" --world 2 $cfg
# the divergences real FSDP is allowed are its API's alone: the reference's own
# log judged as torch FSDP2 fails on its flat layout and its kept root
expect 1 "the reference's log judged as torch-fsdp2" "$bin" schedule "$work/log.jsonl" --world 2 --api torch-fsdp2 $cfg
grep -q "expected 8448 bytes" "$work/out" && grep -q "(root): expected 1 forward free, got 0" "$work/out" ||
  { echo "FAIL: the FSDP2 divergences are not named"; fails=$((fails + 1)); }
expect 2 "--api of no API" "$bin" schedule "$work/log.jsonl" --world 2 --api torch-fsdp3 $cfg
expect 2 "no --world" "$bin" schedule "$work/log.jsonl" $cfg
expect 2 "a rank outside --world" "$bin" schedule "$work/log.jsonl" --world 1 $cfg
echo '{"rank":0,"step":0}' >"$work/bad.jsonl"
expect 2 "a line without its fields" "$bin" schedule "$work/bad.jsonl" --world 2 $cfg
expect 2 "a missing file" "$bin" schedule "$work/none.jsonl" --world 2 $cfg
expect 2 "--strategy local" "$bin" schedule "$work/log.jsonl" --world 2 --model gpt2-tiny --strategy local
if [ "$fails" -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; fi
[ "$fails" -eq 0 ]
