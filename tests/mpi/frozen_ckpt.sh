#!/usr/bin/env bash
# frozen_ckpt.sh MPIEXEC BINARY — checkpoints of frozen parameters and LoRA
# (docs/contract.md, "Frozen parameters"): a LoRA run saved as FULL and as DCP holds
# optimizer state for the adapters only (the file lists no state of a base
# parameter) and loads back at another world size; a gpt2 run with frozen
# parameters loads into the same freeze and is refused (exit 2, one line) by
# a run that trains a parameter it saved frozen.
set -u
mpiexec=$1 bin=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
lora=(--model llama-tiny --lora '2:4:[qv]_proj' --global-batch 4 --seq-len 8)
for sd in full sharded; do
  for v in 1 2; do
    d=$work/lora-$sd-v$v
    "$mpiexec" -n 2 "$bin" run "${lora[@]}" --strategy full_shard --fsdp-version "$v" --steps 2 --save "$d" \
      --state-dict "$sd" --quiet >/dev/null 2>"$work/err" || { cat "$work/err"; fail "save $sd FSDP$v"; }
    # the optimizer's tensors: adapters only (FULL: optimizer.safetensors; DCP: state.* in the shards)
    names=$("$bin" ckpt inspect "$d" 2>&1) || { echo "$names"; fail "inspect $sd FSDP$v"; }
    if [ "$sd" = full ] || [ "$v" = 2 ]; then
      if printf '%s\n' "$names" | grep -E '(exp_avg|state)[^ ]*model\.(embed_tokens|norm|layers\.[0-9]+\.(self_attn\.[a-z]_proj|mlp\.[a-z]+_proj|[a-z_]*layernorm))\.weight' |
        grep -v lora_ >/dev/null; then
        printf '%s\n' "$names" | head -40
        fail "$sd FSDP$v: optimizer state of a frozen base parameter"
      fi
      printf '%s\n' "$names" | grep -q 'lora_B' || { printf '%s\n' "$names" | head -40; fail "$sd FSDP$v: no adapter listed"; }
    fi
    "$mpiexec" -n 1 "$bin" run "${lora[@]}" --strategy full_shard --fsdp-version "$v" --steps 1 --load "$d" --quiet \
      >/dev/null 2>"$work/err" || { cat "$work/err"; fail "load $sd FSDP$v at W=1"; }
  done
done
d=$work/frozen
"$mpiexec" -n 2 "$bin" run --model gpt2-tiny --strategy full_shard --freeze 'wte|ln_1' --steps 2 --global-batch 4 \
  --seq-len 8 --save "$d" --quiet >/dev/null 2>"$work/err" || { cat "$work/err"; fail "save with --freeze"; }
"$mpiexec" -n 2 "$bin" run --model gpt2-tiny --strategy shard_grad_op --freeze 'wte|ln_1' --steps 1 --global-batch 4 \
  --seq-len 8 --load "$d" --quiet >/dev/null 2>"$work/err" || { cat "$work/err"; fail "load with the same --freeze"; }
"$here/expect_usage.sh" "$mpiexec" 2 "$bin" "was frozen when saved" run --model gpt2-tiny --strategy full_shard \
  --freeze wte --steps 1 --global-batch 4 --seq-len 8 --load "$d" || fail "a run training a parameter saved frozen"
echo "ok: frozen and LoRA checkpoints"
