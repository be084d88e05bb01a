"""The model of one torch run, built and wrapped as a user wraps it, and what
the wrapped modules were found to do, read back from them.

build: the reference's model (model.py) with the given weights, --freeze's
parameters set requires_grad=False before wrapping (LoRA: PEFT freezes the
base itself), then FSDP1 (`FullyShardedDataParallel`, `use_orig_params=True`)
or FSDP2 (`fully_shard` on every unit, then the root) by the run config:
strategy (hybrid through a 2-D device mesh, (replicate, shard), shard groups
of consecutive ranks as in the reference), prefetch and the limiter where the
API has them, mixed precision, CPU offload, activation checkpointing inside
or outside the unit; --comm-log's recorder installed around it.
read_back: the reduction the modules apply, the parameters frozen after
wrapping, PEFT's adapters, the checkpoint wrappers (trace.json's "torch").
"""

import torch

from . import env
from . import model as M
from .config import UsageError, forward_prefetch_units

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Wrapping:
    def __init__(self, ctx):
        self.ctx = ctx
        self.forwards = []  # activation checkpointing's evidence: each built model's block forwards
        self.commlog = None  # --comm-log: the step's schedule (commlog.py), once built

    # ------------------------------------------------------------------ build
    def build(self, init):
        x = self.ctx
        model = M.build_loaded(x.mcfg, init, x.names, x.lora)
        # frozen as a user freezes: on the model's own parameters, by their names before any
        # wrapper renames them (a tied LM head is the embedding, frozen with it). LoRA: by
        # get_peft_model alone, so that what read_back reads is PEFT's doing
        for n, p in model.named_parameters():
            if M.clean_name(n) in x.frozen and not x.lora:
                p.requires_grad_(False)
        if x.fault == "lora_alpha":
            # the bug: PEFT's scaling taken as lora_alpha, not lora_alpha / r (read at every forward)
            for layer in M.lora_layers(model).values():
                layer.scaling["default"] = float(x.lora.lora_alpha)
        model.to(x.device)
        if x.cfg.get("activation_checkpointing", "none") != "none":
            # evidence that checkpointing ran, trace.json's "torch" (a rebuild keeps counting)
            self.forwards.append(M.count_block_forwards(model, x.mcfg))
        record = getattr(x.args, "comm_log", False)
        if record:  # the units and stages as the reference numbers them, before FSDP1 wraps them
            units, stages = [model, *M.unit_modules(model, x.mcfg)], M.stage_modules(model, x.mcfg)
        model = self.fsdp1(model) if x.api == "fsdp1" else self.fsdp2(model)
        if record:
            from .commlog import CommLog

            self.commlog = CommLog(x.rank, x.W, x.F, units, stages, x.cfg.get("reshard_after_forward", 0))
            self.commlog.install(x.api)
        return model

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        x = self.ctx
        s = x.cfg["strategy"]
        dt = x.device.type
        if s.startswith("hybrid"):
            return init_device_mesh(dt, (x.R, x.F), mesh_dim_names=("replicate", "shard"))
        if s == "no_shard" and x.api == "fsdp2":
            # FSDP2 has no NO_SHARD: a (W, 1) mesh replicates every parameter (DDP)
            return init_device_mesh(dt, (x.W, 1), mesh_dim_names=("replicate", "shard"))
        return init_device_mesh(dt, (x.W,), mesh_dim_names=("shard",))

    def fsdp1(self, model):
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        c = self.ctx.cfg
        strat = {
            "no_shard": ShardingStrategy.NO_SHARD,
            "full_shard": ShardingStrategy.FULL_SHARD,
            "shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
            "hybrid_shard": ShardingStrategy.HYBRID_SHARD,
            "hybrid_shard_zero2": ShardingStrategy._HYBRID_SHARD_ZERO2,
        }[c["strategy"]]
        bp = {"none": None, "pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST}[
            c["backward_prefetch"]
        ]
        kw = {
            "sharding_strategy": strat,
            "auto_wrap_policy": ModuleWrapPolicy({M.unit_class(self.ctx.mcfg)}),
            "backward_prefetch": bp,
            "forward_prefetch": c["forward_prefetch"],
            "limit_all_gathers": c["limit_all_gathers"],
            "use_orig_params": True,
            "cpu_offload": CPUOffload(offload_params=c["cpu_offload"]),
        }
        if c["param_dtype"] != "fp32" or c["reduce_dtype"] != "fp32":
            kw["mixed_precision"] = MixedPrecision(
                param_dtype=DT[c["param_dtype"]] if c["param_dtype"] != "fp32" else None,
                reduce_dtype=DT[c["reduce_dtype"]],
            )
        # FSDP1 picks the accelerator unless told: device_id=cpu is its CPU path
        kw["device_id"] = self.ctx.device
        if c["strategy"].startswith("hybrid"):
            kw["device_mesh"] = self.mesh()
        units = {id(u) for u in M.unit_modules(model, self.ctx.mcfg)}
        model = FSDP(model, **kw)
        ac = c.get("activation_checkpointing", "none")
        if ac == "inside":  # FSDP(checkpoint(block)), as Accelerate applies it after wrapping
            checkpoint_units(model, lambda m: id(m) in units)
        elif ac == "outside":  # checkpoint(FSDP(block)): the recompute gathers the unit again
            checkpoint_units(model, lambda m: isinstance(m, FSDP) and id(m.module) in units)
        if self.ctx.fault == "no_divide":
            # gradients summed, not averaged: FSDP1's pre/post divide factors set to 1
            for m in FSDP.fsdp_modules(model):
                m._gradient_predivide_factor = 1.0
                m._gradient_postdivide_factor = 1.0
        return model

    def fsdp2(self, model):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        c = self.ctx.cfg
        mesh = self.mesh()
        # True, False, or FSDP2's integer R: a 1/R slice kept after forward
        raf = c.get("reshard_after_forward") or c["strategy"] in ("full_shard", "hybrid_shard")
        mp = MixedPrecisionPolicy(
            param_dtype=DT[c["param_dtype"]] if c["param_dtype"] != "fp32" else None,
            reduce_dtype=DT[c["reduce_dtype"]] if c["reduce_dtype"] != "fp32" else None,
        )
        off = CPUOffloadPolicy() if c["cpu_offload"] else OffloadPolicy()
        ac = c.get("activation_checkpointing", "none")
        if ac == "inside":  # fully_shard(checkpoint(block)): the unit is the wrapper
            blocks = {id(u) for u in M.unit_modules(model, self.ctx.mcfg)}
            checkpoint_units(model, lambda m: id(m) in blocks)
        units = M.unit_modules(model, self.ctx.mcfg)
        for u in units:
            fully_shard(u, mesh=mesh, reshard_after_forward=raf, mp_policy=mp, offload_policy=off)
        fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp, offload_policy=off)
        if ac == "outside":  # checkpoint(fully_shard(block))
            ids = {id(u) for u in units}
            checkpoint_units(model, lambda m: id(m) in ids)
        set_prefetch_lists(model, units, c)
        self.fsdp2_reduction(model)
        return model

    def fsdp2_reduction(self, model):
        """FSDP2's reduction setters, on every unit, the root included (each acts on
        the module it is called on only): --gradient-divide-factor,
        --force-sum-reduction, and --inject no_divide's sum without a divide."""
        from torch.distributed.fsdp import FSDPModule

        fsdp_mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
        F = self.ctx.cfg.get("gradient_divide_factor")
        if F:
            require(FSDPModule, "set_gradient_divide_factor", "--gradient-divide-factor")
            for m in fsdp_mods:
                m.set_gradient_divide_factor(float(F))
        if self.ctx.args.force_sum_reduction:
            # the workaround for pytorch/pytorch#162338: SUM collectives, FSDP divides itself
            require(FSDPModule, "set_force_sum_reduction_for_comms", "--force-sum-reduction")
            for m in fsdp_mods:
                m.set_force_sum_reduction_for_comms(True)
        if self.ctx.fault == "no_divide":
            # gradients summed, not averaged: SUM collectives with a divide factor of 1
            require(FSDPModule, "set_force_sum_reduction_for_comms", "--inject no_divide")
            require(FSDPModule, "set_gradient_divide_factor", "--inject no_divide")
            for m in fsdp_mods:
                m.set_force_sum_reduction_for_comms(True)
                m.set_gradient_divide_factor(1.0)

    # -------------------------------------------------------------- read back
    def read_back(self, model, optim):
        """What the wrapped model and the optimizer were found to do (trace.json's
        "torch"), checked against what the run asked for: the reduction
        (applied_reduction), the frozen parameters, PEFT's adapters, the
        parameters the optimizer steps and the checkpoint wrappers."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        x = self.ctx
        applied = self.applied_reduction(model)
        self.check_divide_factor(applied)
        # --freeze, read back from the wrapped model and the optimizer
        frozen = sorted({M.clean_name(n) for n, p in model.named_parameters() if not p.requires_grad})
        if set(frozen) != x.frozen:
            why = "LoRA's base" if x.lora else "--freeze matched"
            raise RuntimeError(f"frozen after wrapping: {frozen}, {why} {sorted(x.frozen)}")
        # LoRA, read back from the wrapped model: the layers PEFT adapted and the scaling they apply
        lora = None
        if x.lora:
            lora = {
                "peft_version": env.installed_version("peft"),
                "modules": list(M.lora_layers(model)),
                "scaling": M.lora_scalings(model),
            }
        return {
            "reduction": applied,
            "frozen": frozen,
            "lora": lora,
            "optimizer_parameters": sum(len(g["params"]) for g in optim.param_groups),
            "wrappers": sum(isinstance(m, CheckpointWrapper) for m in model.modules()),
        }

    def applied_reduction(self, model):
        """How the wrapped modules reduce gradients, read back from them (not
        from the flags): FSDP1's pre/post divide factors; FSDP2's
        force_sum_reduction_for_comms and gradient_divide_factor of every
        parameter group (a torch without them: False and None, since nothing
        set them). A value the modules disagree on is a list."""

        def one(vals):
            vals = sorted(set(vals), key=repr)
            return vals[0] if len(vals) == 1 else vals

        if self.ctx.api == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            mods = FSDP.fsdp_modules(model)
            return {
                "gradient_predivide_factor": one(float(m._gradient_predivide_factor) for m in mods),
                "gradient_postdivide_factor": one(float(m._gradient_postdivide_factor) for m in mods),
            }
        groups = []
        for m in model.modules():
            if hasattr(m, "_get_fsdp_state"):
                st = m._get_fsdp_state()
                gs = getattr(st, "_fsdp_param_groups", None)
                if gs is None:  # torch < 2.10: one group per module
                    gs = [st._fsdp_param_group] if getattr(st, "_fsdp_param_group", None) is not None else []
                groups += gs
        return {
            "force_sum_reduction_for_comms": one(
                bool(getattr(g, "force_sum_reduction_for_comms", False)) for g in groups
            ),
            "gradient_divide_factor": one(getattr(g, "gradient_divide_factor", None) for g in groups),
        }

    def check_divide_factor(self, applied):
        """FSDP2's gradient divide factor as the modules hold it (applied_reduction) is the
        config's F (--gradient-divide-factor, the reference's) on every unit: the trace's
        config says F, so a run whose modules divide otherwise would be judged on a factor
        it never applied (--inject no_divide sets 1 on purpose)."""
        F = self.ctx.cfg.get("gradient_divide_factor")
        if self.ctx.api != "fsdp2" or not F or self.ctx.fault == "no_divide":
            return
        if applied["gradient_divide_factor"] != float(F):
            raise RuntimeError(
                f"FSDP2's gradient_divide_factor read back from the modules is {applied['gradient_divide_factor']!r}, "
                f"the run set {float(F)!r} on every unit"
            )

    def divide_mode(self, applied):
        """How this run divides gradients, in the reference's --divide names,
        from what the modules were found to do (applied_reduction)."""
        x = self.ctx
        if x.api == "fsdp1" or x.W == 1:
            return "prepost"
        if x.cfg["reduce_dtype"] == "fp16":
            return "prepost"
        return "sum-then-divide" if applied["force_sum_reduction_for_comms"] is True else "avg"

    def checkpointing_evidence(self, wrappers):
        """What activation checkpointing did: its placement, the checkpoint
        wrappers in the model, and the blocks' forward calls (twice the
        steps x micro-batches x blocks when every block recomputed)."""
        ac = self.ctx.cfg.get("activation_checkpointing", "none")
        if ac == "none":
            return None
        return {"placement": ac, "wrappers": wrappers, "block_forwards": sum(c[0] for c in self.forwards)}


def set_prefetch_lists(model, units, c):
    """FSDP2's explicit prefetch lists: each unit names the next N units of the pass, in
    the order the reference's units run (forward: the root, whose embedding runs first,
    then the blocks; backward: the root, whose head runs first, then the blocks from the
    last). A root that holds no parameter of its own (mlp) is no unit of the reference's
    and lists nothing. The last unit of a pass lists nothing: in backward, torch's
    implicit default there prefetches nothing either."""
    chain = [model] if _owns_parameters(model, units) else []
    nf = forward_prefetch_units(c)
    nb = c.get("backward_prefetch_units") or (1 if c["backward_prefetch"] == "pre" else 0)
    for a, targets in prefetch_lists([*chain, *units], nf):
        a.set_modules_to_forward_prefetch(targets)
    for a, targets in prefetch_lists([*chain, *reversed(units)], nb):
        a.set_modules_to_backward_prefetch(targets)


def checkpoint_units(model, check_fn):
    """torch's activation checkpointing (non-reentrant checkpoint_wrapper) on
    every module check_fn picks, as Accelerate and torchtitan apply it."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=check_fn)


def prefetch_lists(order, n):
    """(unit, the next n units of order after it) for every unit of order that has any;
    none with n = 0."""
    if n < 1:
        return []
    return [(a, order[i + 1 : i + 1 + n]) for i, a in enumerate(order) if order[i + 1 : i + 1 + n]]


def _owns_parameters(model, units):
    """Whether the root holds parameters outside every unit (gpt2's, llama's embedding and head)."""
    inside = {id(p) for u in units for p in u.parameters()}
    return any(id(p) not in inside for p in model.parameters())


def require(cls, method, flag):
    """Refuses (exit 2) a flag this torch cannot honour, naming what it lacks."""
    if not hasattr(cls, method):
        raise UsageError(f"{flag}: torch {torch.__version__} has no {cls.__name__}.{method} (added by pytorch#155915)")
