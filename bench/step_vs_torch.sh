#!/usr/bin/env bash
# bench/step_vs_torch.sh [ROUNDS] — the reference's training step against PyTorch eager's on the same
# cores, side by side: gpt2-124m and SmolLM2-135M (examples/models), B=4, T=64, AdamW, at 1 and 2
# threads. Each round runs fsdpcheck_bench (median of 3 steps after a warm-up) and then the same
# models in torch eager (transformers' GPT2LMHeadModel / LlamaForCausalLM, torch.optim.AdamW, median
# of 3 steps after a warm-up), alternating so drift hits both; the last lines are the medians over
# the rounds and the ratio reference / torch per model and thread count (issue 52's target: <= 1.25).
# Needs build/default (or $FSDPCHECK_BUILD) with fsdpcheck_bench and the adapter's venv
# (.venv-torch or $FSDPCHECK_TORCH_VENV).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-2}
[[ "$ROUNDS" =~ ^[1-9]$ ]] || { echo "usage: bench/step_vs_torch.sh [ROUNDS 1..9]" >&2; exit 2; }
BUILD=${FSDPCHECK_BUILD:-$ROOT/build/default}
BENCH=$BUILD/bench/fsdpcheck_bench
PY=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch}/bin/python
SMOL=$ROOT/examples/models/llama.smollm2-135m.config.json
[ -x "$BENCH" ] || { echo "bench/step_vs_torch.sh: no $BENCH (cmake --build --preset default)" >&2; exit 2; }
[ -x "$PY" ] || { echo "bench/step_vs_torch.sh: no venv python at $PY (bash ci/torch.sh makes it)" >&2; exit 2; }
export HWLOC_COMPONENTS=-pci,-x86 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

torch_step() {  # torch_step THREADS: "torch MODEL THREADS SECONDS" per model
  OMP_NUM_THREADS=$1 "$PY" - "$1" "$SMOL" <<'PY'
import json, statistics, sys, time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

threads, smol = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(threads)
torch.manual_seed(0)
gpt2 = GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
cfg = json.load(open(smol))
llama = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
for name, model in (("gpt2-124m", GPT2LMHeadModel(gpt2)), ("smollm2-135m", LlamaForCausalLM(llama))):
    model.config._attn_implementation = "eager"  # the reference's attention: softmax of the full scores
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    x = torch.randint(0, model.config.vocab_size, (4, 64))
    times = []
    for k in range(4):  # a warm-up, then three timed steps
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        if k:
            times.append(time.perf_counter() - t0)
    print(f"torch {name} {threads} {statistics.median(times):.4f}", flush=True)
PY
}

for round in $(seq "$ROUNDS"); do
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$BENCH" 3 "$t" gpt2-124m "$SMOL" |
      awk -v t="$t" '$1 == "gpt2-124m" || $1 == "llama.smollm2-135m.config.json" {
        n = $1 == "gpt2-124m" ? "gpt2-124m" : "smollm2-135m"; printf "reference %s %s %.4f\n", n, t, $5 / 1000 }' |
      tee -a "$out"
    torch_step "$t" | tee -a "$out"
  done
done
echo "== medians over $ROUNDS round(s): seconds per step, reference / torch"
python3 - "$out" <<'PY'
import statistics, sys
from collections import defaultdict

t = defaultdict(list)
for line in open(sys.argv[1]):
    side, model, threads, s = line.split()
    t[(side, model, int(threads))].append(float(s))
print(f"{'model':14} {'threads':>7} {'reference':>10} {'torch':>8} {'ratio':>6}")
for model in ("gpt2-124m", "smollm2-135m"):
    for th in (1, 2):
        if not t[("reference", model, th)] or not t[("torch", model, th)]:
            continue  # an older fsdpcheck_bench runs its presets only (no SmolLM2)
        r, p = statistics.median(t[("reference", model, th)]), statistics.median(t[("torch", model, th)])
        print(f"{model:14} {th:>7} {r:>9.2f}s {p:>7.2f}s {r / p:>5.2f}x")
PY
