"""PyTorch/XLA FSDP via SPMD (FSDPv2) on TPUs: `run --device xla`.

UNVERIFIED: written as the PyTorch/XLA documentation describes FSDPv2
(`torch_xla.experimental.spmd_fully_sharded_data_parallel`), never run here
(no TPU, no torch_xla in the lock). One process drives every device: a 1-D
mesh with the axis named "fsdp" (shape (N, 1), axes ("fsdp", "model")), each
unit (GPT2Block / Linear) and then the root wrapped by
`SpmdFullyShardedDataParallel`, the global batch marked sharded along "fsdp"
on its batch dimension, so device d holds samples [d B/N, (d+1) B/N) exactly
as the reference's rank d. The loss is the mean over the global batch, so its
gradient is the reference's average over ranks; the compiler chooses the
reduction tree (there are no pre/post divide factors to set).

Limits: only full_shard (FSDPv2 shards parameters along "fsdp"); no hybrid,
prefetch, limiter, no_sync or offload settings (XLA schedules collectives);
mixed precision through the fsdp_config's xla_fsdp_settings.compute_dtype is
not applied here (run fp32 first).
"""

import sys

from .config import optim_state_names

# the models this runner was written for (wrapped per GPT2Block / Linear); a
# llama would wrap the same way in principle, but nothing of it was ever run on
# XLA (its RoPE and causal mask under SPMD included), so it is refused
XLA_MODELS = ("gpt2", "fsdpcheck-mlp")


def _unsupported(cfg):
    mtype = cfg["model"].get("model_type")
    if mtype not in XLA_MODELS:
        return f"--device xla: the XLA runner is written for gpt2 and mlp models, not {mtype} (run it on cpu or cuda)"
    if cfg["strategy"] != "full_shard":
        return f"--device xla runs SPMD FSDPv2, which is full_shard only (not {cfg['strategy']})"
    for k, what in (
        ("forward_prefetch", "--forward-prefetch"),
        ("limit_all_gathers", "--limit-all-gathers"),
        ("no_sync", "--no-sync"),
        ("cpu_offload", "--cpu-offload"),
    ):
        if cfg[k]:
            return f"--device xla: {what} has no FSDPv2 equivalent (XLA schedules the collectives)"
    if cfg["backward_prefetch"] != "none":
        return "--device xla: --backward-prefetch has no FSDPv2 equivalent (XLA schedules the collectives)"
    if cfg.get("backward_prefetch_units"):
        return "--device xla: --backward-prefetch-units has no FSDPv2 equivalent (XLA schedules the collectives)"
    if cfg.get("gradient_divide_factor"):
        return "--device xla: --gradient-divide-factor is not wired up in this adapter (XLA's reduction divides by W)"
    if cfg["param_dtype"] != "fp32" or cfg["reduce_dtype"] != "fp32":
        return "--device xla: mixed precision is not wired up in this adapter yet (run fp32)"
    return None


def run(args, cfg, ref):
    why = _unsupported(cfg)
    if why:
        print(f"fsdpcheck-torch: {why}", file=sys.stderr)
        return 2
    if args.api != "fsdp2":
        print("fsdpcheck-torch: --device xla runs SPMD FSDPv2: use --api fsdp2", file=sys.stderr)
        return 2
    try:
        import numpy as np
        import torch
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2
    except ImportError as e:
        print(f"fsdpcheck-torch: --device xla needs torch_xla ({e})", file=sys.stderr)
        return 2
    import functools  # pragma: no cover (xla) from here: torch_xla imported, all that follows needs XLA devices

    from . import model as M
    from . import tracefile
    from .model import clean_name
    from .optimizer import build_optimizer, clip_grad_norm

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    if cfg["global_batch"] % n:
        print(
            f"fsdpcheck-torch: --global-batch {cfg['global_batch']} is not divisible by the {n} XLA devices",
            file=sys.stderr,
        )
        return 2
    mesh = xs.Mesh(np.arange(n), (n, 1), ("fsdp", "model"))
    xs.set_global_mesh(mesh)
    dev = xm.xla_device()
    names, states = ref.names, optim_state_names(cfg)
    init = ref.init()
    model = M.build(cfg["model"])
    M.load_init(model, init, names)
    model = model.to(dev)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={M.unit_class(cfg["model"])})
    model = FSDPv2(model, mesh, auto_wrap_policy=policy)
    opt = build_optimizer(model.parameters(), cfg["optimizer"])
    out = args.trace
    tracefile.write_init(out, {k: init[k] for k in names})
    gpt2 = cfg["model"].get("model_type") == "gpt2"
    K = cfg["grad_accum"]
    for step in range(cfg["steps"]):
        g_inp, g_tgt = ref.batch(step)
        opt.zero_grad(set_to_none=True)
        per = g_inp.shape[0] // n  # device d's share: samples [d per, (d+1) per), in K micro-batches
        total = 0.0
        for k in range(K):
            idx = torch.cat([torch.arange(d * per + k * (per // K), d * per + (k + 1) * (per // K)) for d in range(n)])
            x = g_inp[idx].to(dev)
            y = g_tgt[idx].long().to(dev)
            if gpt2:
                x = x.long()
            xs.mark_sharding(x, mesh, ("fsdp",) + (None,) * (x.dim() - 1))
            xs.mark_sharding(y, mesh, ("fsdp",) + (None,) * (y.dim() - 1))
            loss = M.loss_of(model, cfg["model"], x, y)
            (loss / K).backward()
            total += float(loss.detach().cpu())
        grads = {
            clean_name(k): (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().float()
            for k, p in model.named_parameters()
        }
        grad_norm = clip_grad_norm(model, cfg, False) if cfg["clip_grad_norm"] > 0 else None
        opt.step()
        xm.mark_step()
        params = {clean_name(k): p.detach().cpu().float() for k, p in model.named_parameters()}
        pmap = {clean_name(k): p for k, p in model.named_parameters()}
        st = {s: {nm: opt.state[pmap[nm]][s].detach().cpu().float() for nm in names} for s in states}
        tracefile.write_step(out, step, total / K, g_inp, g_tgt, grads, params, st, names, states, grad_norm)
    c = dict(cfg)
    c.update(impl="torch-xla-fsdpv2", divide="avg", inject="none", init="")
    info = {
        "api": "xla-spmd-fsdpv2",
        "torch_version": torch.__version__,
        "device": "xla",
        "backend": "xla",
        "world_size": n,
        "verified": False,
    }
    tracefile.write_trace_json(out, "torch-xla-fsdpv2", n, cfg["steps"], c, ref.units, info)
    return 0  # pragma: no cover (xla) to here
