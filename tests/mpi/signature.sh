#!/usr/bin/env bash
# signature.sh MPIEXEC BINARY [IMPL] — the failure signatures (oracle/signature.h)
# tested by the fault catalogue: each fault is injected into IMPL (the
# reference's catalogue by default, or a port built with FC_IMPL_FAULTS) under
# `fsdpcheck check`, on a config where it shows, and the `signature:` line must
# name the shape the fault has, or say "none of the known shapes" for the
# faults whose wrong answer is not one of them. Faults of a checkpoint load
# start from a checkpoint saved here. The expected line is written below, once
# per fault (nccl-tests style: the exact expected result). Faults that `check`
# does not see on one layout (padding_leak, avg_tail, recompute_dtype,
# fsdp2_even_rows, ckpt_swap, dcp_saved_offsets: their properties compare two
# layouts or two runs, docs/contract.md §9) have no row.
set -u
mpiexec=$1 bin=$2 impl=${3:-reference}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 named=0 total=0
G=(--model gpt2-tiny --steps 2)
L=(--model llama-micro --steps 2)
"$mpiexec" -n 2 "$bin" run --impl reference "${G[@]}" --strategy full_shard --fsdp-version 2 --save "$work/ck" \
  --quiet >/dev/null 2>"$work/save.err" || { echo "FAIL: run --save"; cat "$work/save.err"; exit 1; }
# expect W FAULT 'EXPECTED SIGNATURE (an extended regex)' FLAGS...
expect() {
  local W=$1 fault=$2 want=$3
  shift 3
  total=$((total + 1))
  local out="$work/$fault.out"
  "$mpiexec" -n "$W" "$bin" check --impl "$impl" --inject "$fault" "$@" >"$out" 2>&1
  local rc=$? line
  line=$(grep -E '^signature: ' "$out" | head -n 1)
  if [ "$rc" -ne 1 ] || ! printf '%s\n' "$line" | grep -qE "^signature: ($want)"; then
    echo "FAIL: $fault (W=$W $*): exit $rc, want 1 and 'signature: $want'"
    grep -E '^(first divergence|signature|fsdpcheck check)|rror' "$out" | head -n 8
    fails=$((fails + 1))
    return
  fi
  case $want in none*) ;; *) named=$((named + 1)) ;; esac
  echo "$fault: $line"
}
NONE='none of the known shapes'
expect 2 no_divide 'B = W x A' "${G[@]}" --strategy full_shard
# FSDP1's pre/post factors at W = 4 are 2 and 2: the post factor applied twice halves the mean
expect 4 divide_twice 'B = A / 2' "${G[@]}" --strategy full_shard
expect 2 fsdp2_avg_twice 'B = A / W' "${G[@]}" --strategy full_shard --fsdp-version 2 --divide avg
expect 2 skip_root_reduce "B = each shard's owner's local gradient, never reduced, divided by W" "${G[@]}" --strategy full_shard
expect 2 skip_root_reduce "B = rank 0's local gradient .*, never reduced, divided by W" "${G[@]}" --strategy no_shard
expect 4 hsdp_no_replicate 'B reduced over shard group 0 \(ranks 0..1\) only, divided by W, never all-reduced' \
  "${G[@]}" --strategy hybrid_shard --shard-group 2
expect 2 no_sync_overwrite 'B = A without micro-batch 0 of 2: the accumulation kept only the last' \
  "${G[@]}" --strategy full_shard --grad-accum 2 --no-sync
expect 2 clip_local_norm "B clipped each shard by its own rank's norm" "${G[@]}" --strategy full_shard --clip-grad-norm 0.05
expect 2 clip_double_count "B's total norm is .*\(x 1.41421.*\), and B clipped by it" "${G[@]}" --strategy no_shard \
  --clip-grad-norm 0.05
expect 2 clip_eps_per_rank "B's total norm is .*, and B clipped by it" "${G[@]}" --strategy full_shard --clip-grad-norm 0.05
expect 4 clip_hsdp_shard_norm "B's total norm is .*, and B clipped by it" "${G[@]}" --strategy hybrid_shard --shard-group 2 \
  --clip-grad-norm 0.05
expect 2 fsdp2_padding_norm "B's total norm is .*, and B clipped by it" "${G[@]}" --strategy full_shard --fsdp-version 2 \
  --clip-grad-norm 0.05
expect 2 frozen_in_norm "B's total norm is .*, and B clipped by it" "${G[@]}" --strategy full_shard --clip-grad-norm 0.05 \
  --freeze wpe
expect 2 reduce_dtype_ignored 'B.s gradients lie on the bf16 grid: reduced in bf16' "${G[@]}" --strategy full_shard \
  --param-dtype bf16 --reduce-dtype fp32 --bitwise
expect 2 ckpt_drop_optim "B's optimizer state restarted from zero" "${G[@]}" --strategy full_shard --fsdp-version 2 \
  --load "$work/ck"
expect 2 shard_offset "$NONE" "${G[@]}" --strategy full_shard
expect 4 data_overlap "every rank r > 0 trained on rank r - 1's samples" "${G[@]}" --strategy full_shard --grad-accum 2
expect 2 tied_untied "$NONE" "${G[@]}" --strategy full_shard
expect 2 bf16_truncate "$NONE" "${G[@]}" --strategy full_shard --param-dtype bf16 --reduce-dtype fp32
expect 2 rope_half "$NONE" "${L[@]}" --strategy full_shard
expect 2 frozen_stepped "$NONE" "${G[@]}" --strategy full_shard --freeze wpe
expect 2 frozen_decay "$NONE" "${G[@]}" --strategy full_shard --freeze wpe --weight-decay 0.1
expect 2 stale_gather "$NONE" "${G[@]}" --strategy full_shard --backward-prefetch pre --forward-prefetch
expect 4 fsdp2_post_forward_group "$NONE" "${G[@]}" --strategy full_shard --fsdp-version 2 --reshard-after-forward 2
expect 2 lora_alpha "$NONE" "${L[@]}" --strategy full_shard --lora 4:8:q_proj
# the catalogue's step count restarts with the data position (the step number is both, docs/contract.md §6): B
# trains on step 0's batch, which no shape of the step's own pieces is (the bias correction alone: test_signature.c)
expect 2 adam_step_reset "$NONE" "${G[@]}" --strategy full_shard --fsdp-version 2 --load "$work/ck"
echo "named $named of $total faults with a shape; $((total - named - fails)) with none of the known shapes, as expected"
if [ "$fails" -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; exit 1; fi
