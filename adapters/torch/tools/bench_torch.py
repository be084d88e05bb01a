#!/usr/bin/env python3
"""The PyTorch rows of bench/gpu/run.sh bench, and its report.

  bench_torch.py --device cuda|cpu --model gpt2-124m|gpt2-tiny --batch B --seq-len T
      --steps N --warmup K --tsv FILE
  bench_torch.py --report FILE --model M --batch B --seq-len T --peak-tflops P

Rows (W = 1, AdamW, HF GPT2LMHeadModel with fsdpcheck's shapes and SDPA
attention, the shapes users train): FSDP2 `fully_shard` on every block and the
root, eager and under torch.compile, and the model with no wrapper; each in
bf16 params with fp32 reduce (FSDP2's MixedPrecisionPolicy; for the unwrapped
model, torch.autocast to bf16) and in fp32. Each row trains N steps on random
tokens and appends "name<TAB>median step ms<TAB>timed steps<TAB>peak MiB" to
FILE: the median of the steps after the K warm-up steps (CUDA-synchronized),
peak memory from torch.cuda.max_memory_allocated (0 on the CPU).

--report reads FILE (these rows and fsdpcheck's) and prints one markdown
table: tokens/s, median step, peak memory, MFU (6 N tokens + attention FLOPs
per step, over the measured bf16 peak P), and tokens/s as a ratio of FSDP2
eager bf16.
"""

import os
import statistics
import sys
import time

PRESETS = {  # fsdpcheck's presets (core/config.c): vocab, positions, embd, layers, heads
    "gpt2-124m": (50257, 1024, 768, 12, 12),
    "gpt2-tiny": (64, 16, 32, 2, 2),
}


def args_of(argv):
    out, it = {}, iter(argv)
    for a in it:
        if not a.startswith("--"):
            raise SystemExit(f"bench_torch.py: unexpected {a!r}")
        out[a[2:]] = next(it, None)
    return out


def step_flops(model, B, T):
    """Training FLOPs of one step: 6 per parameter per token (forward 2,
    backward 4) plus causal attention's two products, 3x their forward."""
    V, _, C, L, _ = PRESETS[model]
    n = L * 12 * C * C + V * C  # the matmul weights (the tied head counted once, as a product)
    attn = L * 2 * C * (T + 1) / 2 * T  # q.k and att.v over one sequence, multiply-adds
    return 6 * n * B * T + 3 * 2 * attn * B


def bench(a):
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    device = a["device"]
    B, T, steps, warm = int(a["batch"]), int(a["seq-len"]), int(a["steps"]), int(a["warmup"])
    V, P, C, L, H = PRESETS[a["model"]]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    if device == "cuda":
        torch.cuda.set_device(0)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device, (1,))
    cfg = GPT2Config(
        vocab_size=V,
        n_positions=P,
        n_embd=C,
        n_layer=L,
        n_head=H,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (B, T), generator=g).to(device)
    rows = []
    for dt in ("bf16", "fp32"):
        for kind in ("FSDP2 eager", "FSDP2 compiled", "no wrapper"):
            torch.manual_seed(0)
            model = GPT2LMHeadModel(cfg).to(device)
            autocast = False
            if kind.startswith("FSDP2"):
                mp = MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16 if dt == "bf16" else torch.float32, reduce_dtype=torch.float32
                )
                for blk in model.transformer.h:
                    fully_shard(blk, mesh=mesh, mp_policy=mp)
                fully_shard(model, mesh=mesh, mp_policy=mp)
            else:
                autocast = dt == "bf16"
            fwd = torch.compile(model) if kind.endswith("compiled") else model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for s in range(steps):
                t0 = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                    loss = fwd(input_ids=x, labels=x).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                if s >= warm:
                    times.append((time.perf_counter() - t0) * 1e3)
            peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0
            rows.append(f"torch {kind} {dt}\t{statistics.median(times):.3f}\t{len(times)}\t{peak:.0f}")
            print(rows[-1], flush=True)
            del model, fwd, opt, loss
            if device == "cuda":
                torch.cuda.empty_cache()
    with open(a["tsv"], "a") as f:
        f.write("".join(r + "\n" for r in rows))
    dist.destroy_process_group()


def report(a):
    B, T, peak = int(a["batch"]), int(a["seq-len"]), float(a["peak-tflops"])
    flops = step_flops(a["model"], B, T)
    rows = []
    with open(a["report"]) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            rows.append((p[0], float(p[1]), int(p[2]), p[3] if len(p) > 3 else "n/a"))
    base = {dt: next((r[1] for r in rows if r[0] == f"torch FSDP2 eager {dt}"), None) for dt in ("bf16", "fp32")}
    print(
        f"bench: {a['model']}, W=1, B={B}, T={T} ({B * T} tokens/step), {flops / 1e12:.3f} TFLOP/step, "
        f"peak {peak:g} TFLOP/s (bf16 cuBLASLt, measured)"
    )
    print("| row | median step ms | steps | tokens/s | peak MiB | MFU | tokens/s vs FSDP2 eager (same dtype) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ms, n, mib in rows:
        dt = "fp32" if name.endswith("fp32") else "bf16"
        ratio = f"{base[dt] / ms:.2f}x" if base.get(dt) else "n/a"
        mfu = flops / (ms * 1e-3) / (peak * 1e12)
        print(f"| {name} | {ms:.1f} | {n} | {B * T / (ms * 1e-3):,.0f} | {mib} | {100 * mfu:.1f}% | {ratio} |")


def main(argv):
    a = args_of(argv)
    if "report" in a:
        report(a)
    else:
        bench(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
