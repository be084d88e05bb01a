#!/usr/bin/env python3
"""Who is closer to the exact gradient: the reference or torch?

  f64_truth.py REF_DIR OTHER_DIR [REF_DIR OTHER_DIR ...]

Recomputes step 0's gradients in float64 with torch (the same model code,
from the trace's initial weights, on the whole global batch in one process:
mathematically the data-parallel average) and prints, per tensor class, the
max error relative to the tensor's scale (max|x - exact| / max|exact|) of the
reference, of the other trace, and between them. Step 0 only: later steps
start from parameters that already differ.
"""

import collections
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fsdpcheck_torch import model as M
from fsdpcheck_torch.tracefile import RefTrace


def tensor_class(n):
    if n.endswith("attn.c_attn.bias"):
        return "c_attn.bias"
    if ".ln_" in n or n.endswith("layernorm.weight") or n == "model.norm.weight":
        return "layernorm"  # gpt2's LayerNorm, llama's RMSNorm
    if "wte" in n or "wpe" in n or "embed_tokens" in n:
        return "embedding"
    if n == "lm_head.weight":  # llama's untied head
        return "lm head"
    if n.endswith("bias"):
        return "linear bias"
    return "linear weight"


def exact_grads(ref):
    cfg = ref.config
    model = M.build(cfg["model"], ref.lora)
    M.load_init(model, ref.init(), ref.names)
    model = model.double()
    x, y = ref.batch(0)
    x = x.long() if M.takes_token_ids(cfg["model"]) else x.double()
    loss = M.loss_of(model, cfg["model"], x, y.long())
    loss.backward()
    return {n: p.grad.detach().numpy() for n, p in model.named_parameters()}


def main(dirs):
    if len(dirs) < 2 or len(dirs) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for i in range(0, len(dirs), 2):
        ref = RefTrace(dirs[i])
        exact = exact_grads(ref)
        a = load_file(os.path.join(dirs[i], "step-000000.safetensors"))
        b = load_file(os.path.join(dirs[i + 1], "step-000000.safetensors"))
        rows = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        for n, g in exact.items():
            ra, rb = a[f"grad.{n}"].astype(np.float64), b[f"grad.{n}"].astype(np.float64)
            s = np.abs(g).max()
            if s == 0:
                continue
            r = rows[tensor_class(n)]
            r[0] = max(r[0], np.abs(ra - g).max() / s)
            r[1] = max(r[1], np.abs(rb - g).max() / s)
            r[2] = max(r[2], np.abs(ra - rb).max() / s)
        print(f"{dirs[i + 1]} (step 0 gradients, error / max|exact|)")
        print(f"  {'class':<15} {'reference':>10} {'other':>10} {'ref-other':>10}")
        for k in sorted(rows):
            r = rows[k]
            print(f"  {k:<15} {r[0]:10.3g} {r[1]:10.3g} {r[2]:10.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
