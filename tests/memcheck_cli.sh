#!/usr/bin/env bash
# memcheck_cli.sh VALGRIND_ONE FSDPCHECK — the fsdpcheck binary under valgrind
# (singleton MPI), once per command family: a traced FULL_SHARD run with a
# checkpoint, compare, sensitivity, ckpt verify, check (lockstep beside the
# reference), a llama FSDP2 run with LoRA and activation checkpointing, a
# frozen-parameter run, and a small sweep. The unit binaries whose every test
# spawns this binary (test_cli, test_cli_compare) are not run under valgrind:
# it skips what they spawn, so it would only check their harness; this script
# checks the binary itself.
set -u
vg=$1 bin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
run() { echo "== $*"; "$vg" "$bin" "$@" >"$work/out" 2>&1; rc=$?; tail -1 "$work/out"; return $rc; }
run run --model gpt2-tiny --strategy full_shard --steps 2 --trace "$work/t1" --save "$work/ck" --save-at 1 --quiet || fail=1
run run --model gpt2-tiny --strategy local --steps 2 --trace "$work/t2" --quiet || fail=1
run compare "$work/t1" "$work/t2" >/dev/null || fail=1
run sensitivity "$work/t1" "$work/t2" --step 1 >/dev/null || fail=1
run ckpt verify "$work/ck" || fail=1
run check --impl reference --model gpt2-tiny --strategy shard_grad_op --steps 2 --quiet || fail=1
run run --model llama-micro --strategy full_shard --fsdp-version 2 --lora 2:4:'q_proj|v_proj' --activation-checkpointing inside \
  --steps 2 --trace "$work/t3" --quiet || fail=1
run run --model gpt2-tiny --freeze 'wte|ln_f' --steps 2 --trace "$work/t4" --quiet || fail=1
run sweep --cases 3 --quiet || fail=1
exit $fail
