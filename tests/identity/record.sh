#!/usr/bin/env bash
# tests/identity/record.sh FSDPCHECK OUTDIR — records the traces, comm logs and
# checkpoints of a fixed set of reference runs, so that a refactor that must not
# change behaviour can be checked byte for byte:
#
#   bash tests/identity/record.sh build/default/oracle/fsdpcheck /tmp/before   # before
#   bash tests/identity/record.sh build/default/oracle/fsdpcheck /tmp/after    # after
#   diff -r /tmp/before /tmp/after && echo identical
#
# The set: every strategy at W=1..4 (gpt2-tiny, mlp-tiny), forward/backward
# prefetch and the limiter, bf16 and fp16 policies, accumulation with and
# without no_sync, clipping with every norm type, cpu_offload, every divide
# mode, FULL and SHARDED save at one W/strategy and load at another, and each
# of the 20 injected faults in a configuration that exercises it.
set -euo pipefail
bin=$(readlink -f "$1"); out=$2
rm -rf "$out"; mkdir -p "$out"
export HWLOC_COMPONENTS=-pci,-x86
n=0
# wall times, RSS and the output directory's name are not behaviour
scrub() { sed -i -E "s/\([0-9.]+ ms\)//; s#$out#OUT#g; /^[0-9]+( +[0-9.]+){4}\$/d; /RSS|bytes read|seconds/d" "$@"; }
run() {  # run NAME W FLAGS...
  local name=$1 W=$2; shift 2
  mpiexec -n "$W" "$bin" run "$@" --trace "$out/$name" --comm-log "$out/$name.jsonl" \
    > "$out/$name.out" 2>&1 || { echo "run $name failed:"; cat "$out/$name.out"; exit 1; }
  # wall times are not behaviour
  scrub "$out/$name.out"
  n=$((n + 1))
}
g="--model gpt2-tiny --steps 2 --seq-len 8"
for W in 1 2 3 4; do
  for s in no_shard full_shard shard_grad_op; do run "$s-W$W" $W $g --strategy $s --global-batch 12; done
  run "mlp-full_shard-W$W" $W --model mlp-tiny --steps 2 --strategy full_shard --global-batch 12
done
run local-W1 1 $g --strategy local --global-batch 12
for W in 2 4; do
  run "hybrid-W$W" $W $g --strategy hybrid_shard --shard-group 2 --global-batch 8
  run "hybrid_zero2-W$W" $W $g --strategy hybrid_shard_zero2 --shard-group 2 --global-batch 8
done
run hybrid-W4-F1 4 $g --strategy hybrid_shard --shard-group 1 --global-batch 8
for p in pre post; do
  run "prefetch-$p" 3 $g --strategy full_shard --backward-prefetch $p --forward-prefetch --global-batch 6
  run "prefetch-$p-limit" 3 $g --strategy full_shard --backward-prefetch $p --forward-prefetch --limit-all-gathers --global-batch 6
done
run bf16 2 $g --strategy full_shard --param-dtype bf16 --reduce-dtype fp32 --global-batch 8
run bf16-reduce 4 $g --strategy hybrid_shard --shard-group 2 --param-dtype bf16 --reduce-dtype bf16 --global-batch 8
run fp16 3 $g --strategy shard_grad_op --param-dtype fp16 --reduce-dtype fp16 --global-batch 6
run fp16-ddp 2 $g --strategy no_shard --param-dtype fp16 --reduce-dtype fp32 --global-batch 8
run accum 2 $g --strategy full_shard --grad-accum 2 --global-batch 8
run accum-nosync 3 $g --strategy full_shard --grad-accum 2 --no-sync --global-batch 12
for t in 1 2 inf; do run "clip-$t" 2 $g --strategy full_shard --clip-grad-norm 0.05 --norm-type $t --global-batch 8; done
run clip-ddp 3 $g --strategy no_shard --clip-grad-norm 0.05 --global-batch 6
run offload 2 $g --strategy full_shard --cpu-offload --global-batch 8
run sgd 3 --model mlp-tiny --steps 3 --strategy full_shard --optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 0.01 --global-batch 6
for d in prepost avg sum-then-divide; do run "divide-$d-W3" 3 $g --strategy full_shard --divide $d --global-batch 6; done
# checkpoints: save at one W and strategy, load at another
for sd in full sharded; do
  mpiexec -n 3 "$bin" run --quiet $g --steps 2 --strategy full_shard --global-batch 12 --save "$out/ckpt-$sd" --state-dict $sd \
    > "$out/ckpt-$sd.save.out" 2>&1
  run "load-$sd-W2" 2 $g --strategy shard_grad_op --global-batch 12 --load "$out/ckpt-$sd"
  run "load-$sd-W4" 4 $g --strategy hybrid_shard --shard-group 2 --global-batch 12 --load "$out/ckpt-$sd"
done
scrub "$out"/ckpt-*.save.out
# the fault catalogue
F="$g --global-batch 8"
run f-no_divide 2 $F --strategy full_shard --inject no_divide
run f-divide_twice 3 $g --global-batch 6 --strategy full_shard --inject divide_twice
run f-shard_offset 2 $F --strategy full_shard --inject shard_offset
run f-padding_leak 3 $g --global-batch 6 --strategy full_shard --clip-grad-norm 0.05 --inject padding_leak
run f-stale_gather 2 $F --strategy full_shard --backward-prefetch pre --forward-prefetch --inject stale_gather
run f-skip_root_reduce 2 $F --strategy full_shard --inject skip_root_reduce
run f-hsdp_no_replicate 4 $F --strategy hybrid_shard --shard-group 2 --inject hsdp_no_replicate
run f-no_sync_overwrite 2 $F --strategy full_shard --grad-accum 2 --no-sync --inject no_sync_overwrite
run f-clip_local_norm 2 $F --strategy full_shard --clip-grad-norm 0.05 --inject clip_local_norm
run f-clip_double_count 2 $F --strategy no_shard --clip-grad-norm 0.05 --inject clip_double_count
run f-clip_double_count-hsdp 4 $F --strategy hybrid_shard --shard-group 2 --clip-grad-norm 0.05 --inject clip_double_count
run f-tied_untied 2 $F --strategy full_shard --inject tied_untied
run f-bf16_truncate 2 $F --strategy full_shard --param-dtype bf16 --reduce-dtype bf16 --inject bf16_truncate
run f-reduce_dtype_ignored 2 $F --strategy full_shard --param-dtype bf16 --reduce-dtype fp32 --inject reduce_dtype_ignored
run f-data_overlap 2 $F --strategy full_shard --inject data_overlap
run f-avg_tail 2 $F --strategy full_shard --inject avg_tail
run f-avg_tail-ddp 2 $F --strategy no_shard --inject avg_tail
run f-clip_eps_per_rank 4 $F --strategy full_shard --clip-grad-norm 0.05 --inject clip_eps_per_rank
run f-clip_hsdp_shard_norm 4 $F --strategy hybrid_shard --shard-group 2 --clip-grad-norm 0.05 --inject clip_hsdp_shard_norm
for f in ckpt_drop_optim ckpt_swap adam_step_reset; do
  for sd in full sharded; do
    mpiexec -n 2 "$bin" run --quiet $F --steps 2 --strategy full_shard --save "$out/ckpt-$f-$sd" --state-dict $sd --inject $f \
      > "$out/ckpt-$f-$sd.save.out" 2>&1
    run "f-$f-$sd" 2 $F --strategy full_shard --load "$out/ckpt-$f-$sd" --inject $f
  done
done
scrub "$out"/ckpt-*.save.out
echo "recorded $n runs, $(find "$out" -type f | wc -l) files in $out"
