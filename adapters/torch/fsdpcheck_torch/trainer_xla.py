"""The Hugging Face Trainer on PyTorch/XLA (`trainer --device xla`): one process drives every XLA
device, as on a TPU host; the fsdp_config's `xla` (classic XlaFullyShardedDataParallel) or
`xla: true, xla_fsdp_v2: true` (SPMD FSDPv2 on the Trainer's (N, 1) mesh, axes ("fsdp", "tensor"))
picks the wrapper, which the Trainer applies itself (integrations/tpu.py).

What the Trainer cannot do there by itself, each recorded in the trace's `workarounds`:
  - it defers creating the optimizer when XLA FSDP wraps the model and then never creates it
    (its accelerator only prepares a None optimizer): XlaTrainer creates it over the wrapped model;
  - FSDPv2's shard_output it passes knows CausalLMOutputWithPast, not GPT-2's output type, and
    raises: the root's shard_output takes the logits of any ModelOutput instead.
The data: the Trainer reads the global micro-batch of B/K samples in order (one process, so no
Accelerate sharding); its dataloader shards it along "fsdp", device d taking rows [d m, (d+1) m),
which are the reference's rank d's micro-batch k (m = B/(N K)).
"""

import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import Trainer

from . import env, tracefile
from .config import optim_state_names, validate
from .errors import UsageError
from .model import clean_name
from .trainer_trace import Replay, TraceCallback, collate
from .xla import _full  # classic XLA FSDP's shards cut back to their shapes, FSDPv2's read whole

OPTIMIZER = "optimizer created after wrapping (transformers defers it under XLA FSDP and never creates it)"
SHARD_OUTPUT = "root shard_output shards the logits of GPT-2's output (transformers' knows CausalLMOutputWithPast only)"


def refusal(cfg, extras):
    """Why the Trainer on XLA cannot replay cfg with this fsdp_config, or None: it needs the file's
    `xla`, and refuses what the XLA runner refuses (xla.py), its API the file's."""
    from .xla import _unsupported

    if not extras.get("xla"):
        return 'trainer --device xla: the fsdp_config must say "xla": true (the Trainer\'s XLA FSDP switch)'
    return _unsupported("fsdp2" if extras.get("xla_fsdp_v2") else "fsdp1", cfg, extras)


def train(a):
    """Trains a (trainer.TrainerArgs) with the Trainer on every XLA device; writes the trace."""
    try:
        import torch_xla.runtime as xr
    except ImportError as e:
        raise UsageError(f"trainer --device xla needs torch_xla ({e}): adapters/torch/requirements-xla.lock has it")
    # pragma: no cover (xla) from here: all that follows needs XLA devices

    from . import model as M
    from .trainer_args import training_arguments
    from .xla import classic_refusal

    v2 = bool(a.extras.get("xla_fsdp_v2"))
    if v2:
        xr.use_spmd()  # before the Trainer touches a device: it builds its mesh at construction
    n = xr.global_runtime_device_count()
    world = 1 if not v2 else n
    why = (None if v2 else classic_refusal(n)) or _world_refusal(a.ref, n if v2 else 1)
    if why:
        raise UsageError(why)
    validate(a.cfg, world)
    torch.set_num_threads(env.threads())
    cfg, ref = a.cfg, a.ref
    init = ref.init()
    model = M.build(cfg["model"])
    M.load_init(model, init, ref.names)
    ac = cfg.get("activation_checkpointing", "none")
    forwards = M.count_block_forwards(model, cfg["model"]) if ac != "none" else None
    cb = XlaTraceCallback(model, cfg, ref.names, optim_state_names(cfg), init, a.trace, 0, world)
    tmp = tempfile.mkdtemp(prefix="fsdpcheck-trainer-")
    # checkpointing the fsdp_config's xla_fsdp_grad_ckpt does not turn on is the Trainer's own
    hf_ckpt = ac == "inside" and not a.extras.get("xla_fsdp_grad_ckpt")
    targs = training_arguments(a, cfg["global_batch"] // cfg["grad_accum"], tmp, hf_ckpt)
    samples = spmd_samples(ref, cfg, world)
    trainer = XlaTrainer(model=model, args=targs, train_dataset=Replay(samples), data_collator=collate, callbacks=[cb])
    cb.trainer = trainer
    try:
        trainer.train()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    by = "trainer" if hf_ckpt else "xla_fsdp_grad_ckpt"
    evidence = None if ac == "none" else {"placement": ac, "by": by, "block_forwards": forwards[0]}
    _write_trace_json(a, world, trainer, cb.wrapped_as, evidence)
    if trainer.tied and trainer.tied["before_wrap"] and not trainer.tied["after_wrap"]:
        print(
            "fsdpcheck-torch: the Trainer's XLA FSDP untied the LM head from the token embedding (the wrapper "
            "moved the model to the device, the Trainer did not tie it again): the run trained them apart",
            file=sys.stderr,
        )
    return 0  # pragma: no cover (xla) to here


def _world_refusal(ref, world):
    """Why a reference planned at its W cannot be replayed on `world` XLA devices, or None."""
    w = ref.meta.get("world_size")
    if w != world:
        return (
            f"trainer --device xla: the reference trace ran W = {w}, the Trainer's XLA FSDP runs on {world} "
            "(XLA's CPU client: CPU_NUM_DEVICES; classic XLA FSDP: one device)"
        )
    return None


def _write_trace_json(a, world, trainer, wrapped_as, checkpointing):  # pragma: no cover (xla)
    """trace.json: the config as run, how the Trainer wrapped the model, on what mesh, and the
    workarounds applied."""
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from .trainer_args import trainer_info
    from .xla import _wrapper_info

    mesh = xs.get_global_mesh() if a.extras.get("xla_fsdp_v2") else None
    m = trainer.model_wrapped
    c = dict(a.cfg, impl="hf-trainer", inject="none", init="")
    info = {
        **trainer_info(a, world, wrapped_as),
        "pjrt_device": xr.device_type(),
        "fsdp_applied": wrapped_as in ("SpmdFullyShardedDataParallel", "XlaFullyShardedDataParallel"),
        "mesh": None if mesh is None else {"shape": list(mesh.mesh_shape), "axes": list(mesh.axis_names)},
        "sharding": {clean_name(k): torch_xla._XLAC._get_xla_sharding_spec(p) for k, p in m.named_parameters()}
        if mesh is not None
        else None,
        "wrapper": _wrapper_info(m, mesh),
        "workarounds": list(trainer.workarounds),
        # FSDPv2 moves the model to the device itself, which makes each parameter anew: a tied head
        # comes apart unless someone ties it again (the Trainer re-ties only where it moves the model)
        "tied_weights": trainer.tied,
        "activation_checkpointing": checkpointing,
    }
    tracefile.write_trace_json(a.trace, "hf-trainer", world, a.cfg["steps"], c, a.ref.units, info)


def spmd_samples(ref, cfg, n):
    """The trace's samples in the order the Trainer reads them: step t, micro-batch k, then device d's
    rows, which are the reference's rank d's k-th micro-batch."""
    B, K = cfg["global_batch"], cfg["grad_accum"]
    per, m = B // n, B // n // K
    out = []
    for t in range(cfg["steps"]):
        inp, tgt = ref.batch(t)
        for k in range(K):
            for d in range(n):
                out += [(inp[i].long(), tgt[i].long()) for i in range(d * per + k * m, d * per + (k + 1) * m)]
    return out


class XlaTrainer(Trainer):  # pragma: no cover (xla)
    """The Trainer with the two workarounds of the module docstring, each recorded as it is applied."""

    workarounds = ()
    tied = None  # whether the LM head is the embedding before and after the Trainer wraps the model

    def _wrap_model(self, model, training=True, dataloader=None):
        before = _head_is_embedding(model)
        wrapped = super()._wrap_model(model, training, dataloader)
        if wrapped is model or not training:
            return wrapped
        self.tied = {"before_wrap": before, "after_wrap": _head_is_embedding(model)}
        if getattr(wrapped, "_shard_output", None) is not None and not _knows_output(model):
            import torch_xla.distributed.spmd as xs

            def shard_logits(output, mesh):
                t = output.logits
                xs.mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

            wrapped._shard_output = shard_logits
            self.workarounds += (SHARD_OUTPUT,)
        if self.optimizer is None:
            self.create_optimizer(wrapped)
            self.workarounds += (OPTIMIZER,)
        return wrapped


def _head_is_embedding(model):  # pragma: no cover (xla)
    """Whether the model's LM head weight is its token embedding's (a tied model's, as built)."""
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _knows_output(model):  # pragma: no cover (xla)
    """Whether the Trainer's FSDPv2 shard_output handles this model's output type: Llama's is
    CausalLMOutputWithPast, GPT-2's CausalLMOutputWithCrossAttentions (no subclass of it here)."""
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions, CausalLMOutputWithPast

    if model.config.model_type == "gpt2":
        return issubclass(CausalLMOutputWithCrossAttentions, CausalLMOutputWithPast)
    return True


class XlaTraceCallback(TraceCallback):  # pragma: no cover (xla)
    """TraceCallback for one process over N XLA devices: the micro-batch losses are global means,
    kept as device tensors until the step ends (reading one mid-step would cut XLA's graph); the
    gradients, parameters and optimizer state read back whole from the devices."""

    def on_train_begin(self, args, state, control, **kw):
        def hook(module, a, kwargs, output):
            y = kwargs["shift_labels"]
            lg = output.logits.float()
            self.losses.append(F.cross_entropy(lg.view(-1, lg.shape[-1]), y.view(-1)).detach())
            self.inputs.append((kwargs["input_ids"].detach(), y.detach()))

        self.model.register_forward_hook(hook, with_kwargs=True)
        tracefile.write_init(self.out, {n: self.init[n] for n in self.names})

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        from .optimizer import clip_grad_norm

        self.wrapped_as = type(self.trainer.model_wrapped).__name__
        self.grads = _full(model, lambda p: p.grad if p.grad is not None else torch.zeros_like(p))
        classic = type(model).__name__ == "XlaFullyShardedDataParallel"  # its own clip_grad_norm_, as FSDP1
        self.grad_norm = clip_grad_norm(model, self.cfg, classic) if self.cfg["clip_grad_norm"] > 0 else None

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kw):
        import torch_xla.core.xla_model as xm

        xm.mark_step()
        opt = getattr(optimizer, "optimizer", optimizer)
        params = _full(model, lambda p: p)
        states = {s: _full(model, lambda p, s=s: opt.state[p][s]) for s in self.state_names}
        loss = float(torch.stack([x.cpu() for x in self.losses]).double().mean())
        n, K = self.world, len(self.inputs)
        # micro-batch k holds each device's rows in turn; the reference's batch is rank-major
        inp, tgt = (torch.stack([io[j].cpu() for io in self.inputs]) for j in (0, 1))
        inp, tgt = (t.view(K, n, -1, t.shape[-1]).transpose(0, 1).reshape(-1, t.shape[-1]) for t in (inp, tgt))
        step = state.global_step  # steps done before this one
        tracefile.write_step(
            self.out,
            step,
            loss,
            inp.to(torch.int32),
            tgt.to(torch.int32),
            self.grads,
            params,
            states,
            self.names,
            self.state_names,
            self.grad_norm,
        )
        print(f"step {step}: loss {loss:.6f}", flush=True)
        self.losses, self.inputs = [], []
