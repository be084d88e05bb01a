"""PyTorch/XLA FSDP: `run --device xla`, one process driving every XLA device (`check` starts it so,
with CPU_NUM_DEVICES=W on XLA's CPU client).

--api fsdp2 is SPMD FSDPv2: the mesh is (N, 1) with the axes ("fsdp", "model"); each unit (the
model's block class, or Linear for the mlp) and then the root are wrapped by
`SpmdFullyShardedDataParallel`, which shards every parameter along "fsdp". The global batch is
marked sharded along "fsdp" on its batch dimension, device d holding samples [d B/N, (d+1) B/N)
exactly as the reference's rank d; the loss is the mean over the global batch, so its gradient is
the reference's average over ranks, the compiler choosing the reduction (no divide factors to set).
--api fsdp1 is classic `XlaFullyShardedDataParallel`, run at one device: its collectives hang on the
CPU client at more (pytorch/xla#9089).

--xla-mesh NAME:SIZE,... gives FSDPv2 another mesh; classic XLA FSDP takes an fsdp_config's
xla_fsdp_settings and computes in bf16 where cfg's param_dtype says so (its compute_dtype).

Run on XLA:CPU (FSDPv2 at 2 and 4 devices, classic at 1); a TPU is unverified. Limits (each refused
by name, exit 2): full_shard only; no hybrid, prefetch, limiter, no_sync or offload settings (XLA
schedules the collectives); no divide factor; FSDPv2 in fp32 only; no --freeze or LoRA.
"""

import os
import time

from .config import optim_state_names, validate
from .errors import UsageError

# the models run on XLA:CPU (wrapped per block / Linear)
XLA_MODELS = ("gpt2", "llama", "fsdpcheck-mlp")
NO_EQUIVALENT = (
    ("forward_prefetch", "--forward-prefetch"),
    ("limit_all_gathers", "--limit-all-gathers"),
    ("no_sync", "--no-sync"),
    ("cpu_offload", "--cpu-offload"),
    ("backward_prefetch_units", "--backward-prefetch-units"),
    ("forward_prefetch_units", "--forward-prefetch-units"),
)


def classic_refusal(n):
    """Why classic XLA FSDP cannot run at n devices here, or None: it needs a process per device
    (xmp.spawn), which this adapter does not start, and on XLA's CPU client its collectives across
    them hang anyway."""
    if n <= 1:
        return None
    return (
        f"--api fsdp1 --device xla at {n} devices: classic XLA FSDP runs here in one process, one device "
        "(on XLA's CPU client its collectives hang at 2 or more: pytorch/xla#9089): run -n 1, or --api fsdp2"
    )


def flag_refusal(args):
    """Why the XLA runner cannot honour a run flag beyond the config, or None."""
    for on, what in (
        (args.inject != "none", f"--inject {args.inject}: the XLA runner injects no fault"),
        (args.ckpt_at or args.load, "checkpoints (--ckpt-at, --load) are not wired into the XLA runner"),
        (args.comm_log, "--comm-log records torch FSDP's collectives, not XLA's"),
        (args.optim_state_offload, "--optim-state-offload is torch FSDP's, not XLA's"),
        (args.force_sum_reduction, "--force-sum-reduction is FSDP2's setter, not XLA's (the compiler reduces)"),
    ):
        if on:
            return f"--device xla: {what}"
    return None


def _unsupported(api, cfg, extras):
    """Why the XLA runner cannot run cfg (and an fsdp_config's XLA keys, extras), or None."""
    if extras.get("xla_fsdp_v2") and not extras.get("xla"):
        return '--device xla: the fsdp_config sets xla_fsdp_v2 without "xla": true, which the Trainer reads first'
    if extras.get("xla") and bool(extras.get("xla_fsdp_v2")) != (api == "fsdp2"):
        return f"--device xla --api {api}: the fsdp_config asks for " + (
            "SPMD FSDPv2 (xla_fsdp_v2): use --api fsdp2" if api == "fsdp1" else "classic XLA FSDP: use --api fsdp1"
        )
    why = settings_refusal(api, extras.get("xla_fsdp_settings"))
    if why:
        return why
    mtype = cfg["model"].get("model_type")
    if mtype not in XLA_MODELS:
        return f"--device xla: the XLA runner runs gpt2, llama and mlp models, not {mtype}"
    if cfg["strategy"] != "full_shard":
        return f"--device xla runs XLA's FSDP as full_shard only (not {cfg['strategy']})"
    for k, what in NO_EQUIVALENT:
        if cfg.get(k):
            return f"--device xla: {what} has no XLA FSDP equivalent (XLA schedules the collectives)"
    if cfg["backward_prefetch"] != "none":
        return "--device xla: --backward-prefetch has no XLA FSDP equivalent (XLA schedules the collectives)"
    if cfg.get("reshard_after_forward"):
        return "--device xla: --reshard-after-forward R has no XLA FSDP equivalent (XLA schedules the collectives)"
    if cfg.get("gradient_divide_factor"):
        return "--device xla: XLA's FSDP has no gradient divide factor (the loss's mean over the global batch divides)"
    why = precision_refusal(api, cfg)
    if why:
        return why
    ac = cfg.get("activation_checkpointing", "none")
    if ac == "outside":
        return "--device xla: checkpointing is applied inside each XLA FSDP unit (xla_fsdp_grad_ckpt), not outside"
    if ac == "inside" and mtype == "fsdpcheck-mlp":
        return "--device xla: checkpointing is applied per transformer block (xla_fsdp_grad_ckpt), not to an mlp"
    return None


# classic XLA FSDP's arguments an fsdp_config's xla_fsdp_settings may give, as the Trainer passes them
SETTINGS = ("compute_dtype", "fp32_reduce_scatter", "shard_param_on_dim_0", "pin_layout_in_collective_ops")
TORCH_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}


def settings_refusal(api, settings):
    """Why xla_fsdp_settings cannot be applied as written, or None. The Trainer passes them to classic
    XLA FSDP only (under xla_fsdp_v2 it drops them unread)."""
    if not settings:
        return None
    if api == "fsdp2":
        return (
            "--device xla --api fsdp2: xla_fsdp_settings are classic XLA FSDP's arguments, which SPMD FSDPv2 "
            "does not take (the Trainer drops them under xla_fsdp_v2)"
        )
    other = sorted(set(settings) - set(SETTINGS))
    if other:
        return f"--device xla: xla_fsdp_settings {', '.join(other)}: not applied by this adapter (it applies {', '.join(SETTINGS)})"
    return None


def precision_refusal(api, cfg):
    """Why the XLA runner cannot compute in cfg's dtypes, or None: classic XLA FSDP's compute_dtype is
    the reference's param_dtype (every parameter cast for compute), its fp32_reduce_scatter a reduce
    dtype of fp32; FSDPv2 has neither (its parameters are the model's)."""
    p, r = cfg["param_dtype"], cfg["reduce_dtype"]
    if p == "fp32" and r == "fp32":
        return None
    if api == "fsdp2":
        return "--device xla --api fsdp2: SPMD FSDPv2 has no compute dtype (its parameters are the model's): run fp32"
    if p not in TORCH_DTYPE or r not in (p, "fp32"):
        return (
            f"--device xla --api fsdp1: param_dtype {p}, reduce_dtype {r}: classic XLA FSDP computes in bf16 "
            "(compute_dtype) and reduces in it or in fp32 (fp32_reduce_scatter)"
        )
    return None


def classic_kwargs(cfg, settings):  # pragma: no cover (xla)
    """XlaFullyShardedDataParallel's arguments for cfg: the settings as written, the dtypes as cfg
    says (an fsdp_config's compute_dtype is cfg's param_dtype by now), each parameter its own shard."""
    import torch

    kw = {k: v for k, v in (settings or {}).items() if k in ("shard_param_on_dim_0", "pin_layout_in_collective_ops")}
    kw["compute_dtype"] = getattr(torch, TORCH_DTYPE[cfg["param_dtype"]])
    kw["fp32_reduce_scatter"] = cfg["param_dtype"] != "fp32" and cfg["reduce_dtype"] == "fp32"
    kw["flatten_parameters"] = False
    return kw


def parse_mesh(spec, n):
    """--xla-mesh "fsdp:2,model:2" -> ((2, 2), ("fsdp", "model")); None -> (n, 1) ("fsdp", "model").
    Raises UsageError for a spec FSDPv2 cannot take or whose sizes do not multiply to n devices."""
    if spec is None:
        return (n, 1), ("fsdp", "model")
    shape, axes = [], []
    for part in spec.split(","):
        name, _, size = part.partition(":")
        if not name.isidentifier() or not size.isdigit() or int(size) < 1 or name in axes:
            raise UsageError(f"--xla-mesh {spec!r}: expected NAME:SIZE,... with distinct names (e.g. fsdp:2,model:2)")
        axes.append(name)
        shape.append(int(size))
    if "fsdp" not in axes:
        raise UsageError(f"--xla-mesh {spec!r}: SPMD FSDPv2 shards along an axis named fsdp, which it lacks")
    import math

    if math.prod(shape) != n:
        raise UsageError(f"--xla-mesh {spec!r}: {math.prod(shape)} devices, the run has {n}")
    return tuple(shape), tuple(axes)


def reference_flags(flags, cfg):
    """The run flags the reference plans an XLA run with: an fsdp_config file's XLA keys are the
    adapter's to read (the reference refuses "xla": true), so each file gives way to the settings it
    made, which are all that an XLA run leaves unrefused beside full_shard."""
    out, skip = [], False
    for f in flags:
        if not skip and f == "--fsdp-config":
            skip = True
            continue
        if not skip:
            out.append(f)
        skip = False
    if len(out) == len(flags):
        return list(flags)
    return out + [
        "--strategy",
        cfg["strategy"],
        "--param-dtype",
        cfg["param_dtype"],
        "--reduce-dtype",
        cfg["reduce_dtype"],
        "--activation-checkpointing",
        cfg.get("activation_checkpointing", "none"),
    ]


def mesh_flag(opts, api, device, world=None):
    """--xla-mesh's spec, checked against world (the check's W) where it is known; None without it."""
    spec = opts.get("--xla-mesh")
    if spec is None:
        return None
    if device != "xla" or api != "fsdp2":
        raise UsageError("--xla-mesh is SPMD FSDPv2's device mesh: it takes --api fsdp2 --device xla")
    if world is not None:
        parse_mesh(spec, world)
    return spec


def device_count_refusal(n, cfg, classic=False):
    """Why N XLA devices cannot run cfg as its check asked, or None (validate's refusals raise)."""
    want = os.environ.get("FSDPCHECK_TORCH_XLA_WORLD")
    if classic and classic_refusal(n):
        return classic_refusal(n)
    if want is not None and int(want) != n:
        return (
            f"--device xla: the XLA runtime has {n} devices, the check asked for W = {want} "
            "(XLA's CPU client: CPU_NUM_DEVICES; a TPU host: its chips)"
        )
    validate(cfg, n)
    return None


def _shard_output(xs):
    """FSDPv2's shard_output: the output's batch dimension along "fsdp". Its default takes a tensor
    or a tuple's first element and refuses Hugging Face's ModelOutput, whose first element with
    labels given is the scalar loss: the logits are the batched tensor."""

    def shard(output, mesh):  # pragma: no cover (xla)
        t = output.logits if hasattr(output, "logits") else output[0] if isinstance(output, tuple) else output
        xs.mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

    return shard


def run(args, cfg, ref):
    t0 = time.time()
    why = _unsupported(args.api, cfg, args.extras) or flag_refusal(args)
    if why:
        raise UsageError(why)
    try:
        import torch_xla.runtime as xr
    except ImportError as e:
        raise UsageError(f"--device xla needs torch_xla ({e}): adapters/torch/requirements-xla.lock has it")
    classic = args.api == "fsdp1"  # pragma: no cover (xla) from here: all that follows needs XLA devices
    if not classic:
        xr.use_spmd()
    n = xr.global_runtime_device_count()
    why = device_count_refusal(n, cfg, classic)
    if why:
        raise UsageError(why)
    shape = parse_mesh(args.xla_mesh, n)
    seconds = {"runtime": time.time() - t0}
    settings = args.extras.get("xla_fsdp_settings")
    model, opt, mesh, forwards = _build_classic(cfg, ref, settings) if classic else _build(cfg, ref, shape)
    seconds["build"] = time.time() - t0 - seconds["runtime"]
    seconds["steps"] = _train(args, cfg, ref, model, opt, mesh, n)
    _write_trace_json(args, cfg, ref, n, model, mesh, forwards, seconds)
    return 0  # pragma: no cover (xla) to here


def _build(cfg, ref, shape):  # pragma: no cover (xla)
    """The reference's initial model on the devices of a mesh of shape (sizes, axis names), wrapped by
    SPMD FSDPv2 per unit and at the root; its optimizer."""
    import numpy as np
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    from .optimizer import build_optimizer

    mesh = xs.Mesh(np.arange(int(np.prod(shape[0]))), shape[0], shape[1])
    xs.set_global_mesh(mesh)
    model, forwards, policy, ckpt = _on_device(cfg, ref)
    # as the Trainer's xla_fsdp_grad_ckpt: each unit's forward checkpointed, then wrapped
    unit = (lambda m, *a, **k: FSDPv2(checkpoint_module(m), *a, **k)) if ckpt else None
    model = FSDPv2(
        model, mesh=mesh, auto_wrap_policy=policy, auto_wrapper_callable=unit, shard_output=_shard_output(xs)
    )
    _mutate(model, mesh, xs)
    return model, build_optimizer(model.parameters(), cfg["optimizer"]), mesh, forwards


# a test's mutant (docs/testing.md): the named parameter re-sharded along a dimension FSDPv2's rule
# does not pick, which the check's layout judgement must catch
MUTANT = "FSDPCHECK_TORCH_XLA_WRONG_SHARD_DIM"


def _mutate(model, mesh, xs):  # pragma: no cover (xla)
    from .model import clean_name

    want = os.environ.get(MUTANT)
    if not want:
        return
    for k, p in model.named_parameters():
        if clean_name(k) == want and p.dim() == 2:
            rule = list(p.shape).index(max(p.shape))
            xs.clear_sharding(p)
            xs.mark_sharding(p, mesh, tuple("fsdp" if d != rule else None for d in range(2)))
            return
    raise UsageError(f"{MUTANT}={want}: no 2-d parameter of that name")


def _build_classic(cfg, ref, settings):  # pragma: no cover (xla)
    """The same model wrapped by classic XLA FSDP, per unit and at the root, with an fsdp_config's
    xla_fsdp_settings and cfg's dtypes (classic_kwargs), each parameter its own shard
    (flatten_parameters=False, as its checkpoint tools read them); the optimizer over the shards."""
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    from torch_xla.distributed.fsdp import checkpoint_module

    from .optimizer import build_optimizer

    model, forwards, policy, ckpt = _on_device(cfg, ref)
    unit = (lambda m, *a, **k: FSDP(checkpoint_module(m), *a, **k)) if ckpt else None
    model = FSDP(model, auto_wrap_policy=policy, auto_wrapper_callable=unit, **classic_kwargs(cfg, settings))
    return model, build_optimizer(model.parameters(), cfg["optimizer"]), None, forwards


def _on_device(cfg, ref):  # pragma: no cover (xla)
    """The reference's initial model on the XLA device; the checkpointing counter (or None), the unit
    wrap policy, and whether checkpointing is on."""
    import functools

    import torch_xla.core.xla_model as xm
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from . import model as M

    model = M.build(cfg["model"])
    M.load_init(model, ref.init(), ref.names)
    model = model.to(xm.xla_device())
    # Module.to makes a new Parameter per module for an XLA tensor (no shallow copy from a CPU one):
    # a tied head comes apart from its embedding unless tied again on the device
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    ckpt = cfg.get("activation_checkpointing", "none") == "inside"
    # the evidence that checkpointing ran: each block's attention runs again in its backward
    forwards = M.count_block_forwards(model, cfg["model"]) if ckpt else None
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={M.unit_class(cfg["model"])})
    return model, forwards, policy, ckpt


def _classic_params(model):  # pragma: no cover (xla)
    """(trace name, flat shard) of each parameter under classic XLA FSDP; nothing under FSDPv2."""
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

    from .model import clean_name

    for mn, m in model.named_modules():
        if isinstance(m, FSDP):
            for p in m.sharded_params:
                yield clean_name(f"{mn}.{p._orig_name}".lstrip(".").replace("_fpw_module.", "")), p


def _full(model, get):  # pragma: no cover (xla)
    """Trace name -> the whole fp32 CPU tensor get(p) gives for each parameter p. FSDPv2's parameters
    read back whole; classic XLA FSDP's are flat shards padded past their elements (at one device, the
    whole tensor first), cut back to their original shape."""
    import math

    from .model import clean_name

    classic = {
        n: get(p).detach().cpu().float()[: math.prod(p._orig_size)].view(p._orig_size)
        for n, p in _classic_params(model)
    }
    return classic or {clean_name(k): get(p).detach().cpu().float() for k, p in model.named_parameters()}


def _train(args, cfg, ref, model, opt, mesh, n):  # pragma: no cover (xla)
    """The steps, each written to the trace as the reference writes its own; each one's seconds
    (the first compiles its graphs)."""
    import torch
    import torch_xla.core.xla_model as xm

    from . import tracefile
    from .optimizer import clip_grad_norm

    names, states = ref.names, optim_state_names(cfg)
    init = ref.init()
    tracefile.write_init(args.trace, {k: init[k] for k in names})
    seconds = []
    for step in range(cfg["steps"]):
        t0 = time.time()
        g_inp, g_tgt = ref.batch(step)
        opt.zero_grad(set_to_none=True)
        total = _forward_backward(cfg, model, mesh, n, g_inp, g_tgt)
        grads = _full(model, lambda p: p.grad if p.grad is not None else torch.zeros_like(p))
        # classic XLA FSDP clips with its own clip_grad_norm_, as FSDP1 does
        grad_norm = clip_grad_norm(model, cfg, mesh is None) if cfg["clip_grad_norm"] > 0 else None
        opt.step()
        xm.mark_step()
        params = _full(model, lambda p: p)
        st = {s: _full(model, lambda p, s=s: opt.state[p][s]) for s in states}
        K = cfg["grad_accum"]
        tracefile.write_step(args.trace, step, total / K, g_inp, g_tgt, grads, params, st, names, states, grad_norm)
        seconds.append(time.time() - t0)
    return seconds


def _forward_backward(cfg, model, mesh, n, g_inp, g_tgt):  # pragma: no cover (xla)
    """The K micro-batches of a step over the global batch; the sum of their losses. Micro-batch k
    takes from each device's share [d per, (d+1) per) its k-th slice, as the reference's rank d."""
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    from . import model as M

    K = cfg["grad_accum"]
    per = g_inp.shape[0] // n
    total = 0.0
    for k in range(K):
        idx = torch.cat([torch.arange(d * per + k * (per // K), d * per + (k + 1) * (per // K)) for d in range(n)])
        x, y = g_inp[idx].to(xm.xla_device()), g_tgt[idx].long().to(xm.xla_device())
        if M.takes_token_ids(cfg["model"]):
            x = x.long()
        if mesh is not None:  # SPMD: the batch along "fsdp"
            xs.mark_sharding(x, mesh, ("fsdp",) + (None,) * (x.dim() - 1))
            xs.mark_sharding(y, mesh, ("fsdp",) + (None,) * (y.dim() - 1))
        loss = M.loss_of(model, cfg["model"], x, y)
        (loss / K).backward()
        xm.mark_step()  # one graph per micro-batch: reading the loss and gradients then runs no graph of its own
        total += float(loss.detach().cpu())
    return total


def _wrapper_info(model, mesh):  # pragma: no cover (xla)  # pragma: no cover (xla)
    """Classic XLA FSDP's settings as its root wrapper holds them; FSDPv2's mesh axis it shards along
    and its parameters' dtype (it has no compute dtype of its own)."""
    if mesh is not None:
        return {"shard_axis": "fsdp", "compute_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    return {
        "compute_dtype": str(model.compute_dtype).removeprefix("torch."),
        "fp32_reduce_scatter": model.fp32_reduce_scatter,
        "shard_param_on_dim_0": model._shard_param_on_dim_0,
        "pin_layout_in_collective_ops": model.all_gather_op.keywords["pin_layout"],
        "flatten_parameters": model.flatten_parameters,
    }


def _write_trace_json(args, cfg, ref, n, model, mesh, forwards, seconds):  # pragma: no cover (xla)
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    from . import tracefile
    from .model import clean_name

    impl = "torch-xla-fsdp" if mesh is None else "torch-xla-fsdpv2"
    c = dict(cfg)
    c.update(impl=impl, divide="avg", inject="none", init="")
    info = {
        "api": "xla-fsdp" if mesh is None else "xla-spmd-fsdpv2",
        "torch_version": torch.__version__,
        "device": "xla",
        "backend": "xla",
        "world_size": n,
        "mesh": None if mesh is None else {"shape": list(mesh.mesh_shape), "axes": list(mesh.axis_names)},
        "pjrt_device": xr.device_type(),
        # read back from the wrapped parameters: how XLA really holds each one (classic XLA FSDP: each
        # one's flat shard, padded, and the shape it came from)
        "sharding": {clean_name(k): torch_xla._XLAC._get_xla_sharding_spec(p) for k, p in model.named_parameters()}
        if mesh is not None
        else {name: {"shard": p.numel(), "of": list(p._orig_size)} for name, p in _classic_params(model)},
        # read back from the wrappers: what each was built with
        "wrapper": _wrapper_info(model, mesh),
        "seconds": seconds,  # the XLA runtime up, the model built and wrapped, each step
        "activation_checkpointing": None
        if forwards is None
        else {"placement": "inside", "by": "torch_xla checkpoint_module", "block_forwards": forwards[0]},
    }
    tracefile.write_trace_json(args.trace, impl, n, cfg["steps"], c, ref.units, info)
