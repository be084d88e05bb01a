#!/usr/bin/env bash
# memcheck_cli.sh VALGRIND_ONE FSDPCHECK — the fsdpcheck binary under valgrind
# (singleton MPI), once per command family: a traced FULL_SHARD run with a
# checkpoint, compare, ckpt verify and a small sweep.
set -u
vg=$1 bin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
run() { echo "== $*"; "$vg" "$bin" "$@" >"$work/out" 2>&1; rc=$?; tail -1 "$work/out"; return $rc; }
run run --model gpt2-tiny --strategy full_shard --steps 2 --trace "$work/t1" --save "$work/ck" --save-at 1 --quiet || fail=1
run run --model gpt2-tiny --strategy local --steps 2 --trace "$work/t2" --quiet || fail=1
run compare "$work/t1" "$work/t2" >/dev/null || fail=1
run ckpt verify "$work/ck" || fail=1
run sweep --cases 3 --quiet || fail=1
exit $fail
