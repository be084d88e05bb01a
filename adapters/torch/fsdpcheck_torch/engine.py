"""One torch FSDP run on a reference trace: the worker `torchrun` starts.

Each rank:
  1. builds the reference's model (model.py), loads the trace's initial
     weights, and wraps it with FSDP1 (`FullyShardedDataParallel`,
     `use_orig_params=True`) or FSDP2 (`fully_shard` on every unit, then the
     root) by the run config: strategy (hybrid through a 2-D device mesh,
     (replicate, shard), shard groups of consecutive ranks as in the
     reference), prefetch and the limiter where the API has them, mixed
     precision, CPU offload; a --freeze pattern sets requires_grad=False on the
     parameters it matches by their Hugging Face names, before wrapping, and
     the optimizer takes the rest; a LoRA trace's model is PEFT's
     (get_peft_model, model.py), which freezes the base itself, and is
     wrapped whole (FSDP's root is the PeftModel);
  2. per step replays the trace's global batch: rank r takes samples
     [r B/W, (r+1) B/W) in K micro-batches of B/(W K), each loss scaled by 1/K,
     communicating only on the last with no_sync (FSDP1 `no_sync()`, FSDP2
     `set_requires_gradient_sync(False)`);
  3. records the full gradients before clipping into the step file, laid out
     first (tracefile.StepFile) (FSDP1: `summon_full_params(with_grads=True)`,
     rank 0 writes; FSDP2: every rank writes its own shards, or rank 0 gathers
     and writes, gather.py),
     clips (FSDP1 `clip_grad_norm_`, FSDP2 torch's `clip_grad_norm_` over
     DTensors), steps torch.optim.AdamW or SGD, records the full parameters and
     the optimizer state by model name the same way (FSDP1, and FSDP2 with
     --optim-state-offload: torch.distributed.checkpoint's full state dict;
     FSDP2: `optim.state`), and rank 0 writes the loss and batch.
The batch written is the samples the ranks really trained on (gathered from
them), so a data bug shows in `batch.input` itself.
"""

import os
import time

import torch
import torch.distributed as dist

from . import model as M
from . import tracefile
from .config import UsageError, forward_prefetch_units, frozen_of, gather_mode, lora_of, optim_state_names
from .gather import gather_full, shares_host, write_shards

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NORM = {"1": 1.0, "2": 2.0, "inf": float("inf")}


from .config import unsupported  # noqa: F401  (what each API lacks; no torch needed)


def clean_name(n):
    """A wrapped model's parameter name as the trace writes it: without FSDP's and
    checkpointing's wrappers, and PEFT's names mapped (model.trace_name)."""
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_module.", "_orig_mod."):
        n = n.replace(wrapper, "")
    return M.trace_name(n)


def clip_grad_norm(model, c, fsdp1):
    """Clips as a training loop does (FSDP1's own clip_grad_norm_, else torch's
    over the parameters: DTensors under FSDP2) and returns the total norm it
    returned, as the trace records it: a Python float (a DTensor's full value)."""
    if fsdp1:
        total = model.clip_grad_norm_(c["clip_grad_norm"], norm_type=NORM[c["norm_type"]])
    else:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip_grad_norm"], norm_type=NORM[c["norm_type"]])
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return float(total.item())


def build_optimizer(params, o):
    """The config's optimizer (o: its "optimizer" object) over params, as the reference runs it."""
    if o["kind"] == "adamw":
        # floats: a trace may say 0 for a beta, and torch refuses betas of mixed types
        betas = (float(o["beta1"]), float(o["beta2"]))
        return torch.optim.AdamW(params, lr=o["lr"], betas=betas, eps=o["eps"], weight_decay=o["weight_decay"])
    return torch.optim.SGD(
        params,
        lr=o["lr"],
        momentum=o["momentum"],
        dampening=o["dampening"],
        weight_decay=o["weight_decay"],
        nesterov=o["nesterov"],
    )


class Run:
    def __init__(self, args, cfg, ref):
        self.args, self.cfg, self.ref = args, cfg, ref
        self.api = args.api
        self.rank = dist.get_rank()
        self.W = dist.get_world_size()
        self.names = ref.names
        self.state_names = optim_state_names(cfg)
        self.device = _device(args.device)
        self.mcfg = cfg["model"]
        s = cfg["strategy"]
        self.F = (cfg["shard_group"] or self.W) if s.startswith("hybrid") else self.W
        self.R = self.W // self.F
        self.force_sum = args.force_sum_reduction
        self.fault = args.inject
        self.clean = clean_name
        self.first_step = 0  # the step a --load checkpoint resumes at
        # --freeze: the trace's names (Hugging Face's, the reference's registry) the pattern matches;
        # LoRA: every name but the adapters'
        self.lora = lora_of(cfg)
        self.frozen = set(frozen_of(cfg, ref.names))
        self.shapes = {}  # name -> full shape, for a frozen parameter's zero gradient and state
        self.forwards = []  # activation checkpointing's evidence: each built model's block forwards

    # ------------------------------------------------------------------ wrap
    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        s = self.cfg["strategy"]
        dt = self.device.type
        if s.startswith("hybrid"):
            return init_device_mesh(dt, (self.R, self.F), mesh_dim_names=("replicate", "shard"))
        if s == "no_shard" and self.api == "fsdp2":
            # FSDP2 has no NO_SHARD: a (W, 1) mesh replicates every parameter (DDP)
            return init_device_mesh(dt, (self.W, 1), mesh_dim_names=("replicate", "shard"))
        return init_device_mesh(dt, (self.W,), mesh_dim_names=("shard",))

    def build(self, init):
        model = M.build_loaded(self.mcfg, init, self.names)
        # frozen as a user freezes: on the model's own parameters, by their names before any
        # wrapper renames them (a tied LM head is the embedding, frozen with it). LoRA: by
        # get_peft_model alone, so that what train() reads back is PEFT's doing
        for n, p in model.named_parameters():
            n = clean_name(n)
            self.shapes[n] = tuple(p.shape)
            if n in self.frozen and not self.lora:
                p.requires_grad_(False)
        if self.fault == "lora_alpha":
            # the bug: PEFT's scaling taken as lora_alpha, not lora_alpha / r (read at every forward)
            for layer in M.lora_layers(model).values():
                layer.scaling["default"] = float(self.lora["lora_alpha"])
        model.to(self.device)
        if self.cfg.get("activation_checkpointing", "none") != "none":
            # evidence that checkpointing ran, trace.json's "torch" (a rebuild keeps counting)
            self.forwards.append(M.count_block_forwards(model, self.mcfg))
        record = getattr(self.args, "comm_log", False)
        if record:  # the units and stages as the reference numbers them, before FSDP1 wraps them
            units, stages = [model, *M.unit_modules(model, self.mcfg)], M.stage_modules(model, self.mcfg)
        model = self.wrap_fsdp1(model) if self.api == "fsdp1" else self.wrap_fsdp2(model)
        if record:
            from .commlog import CommLog

            self.commlog = CommLog(self.rank, self.W, self.F, units, stages, self.cfg.get("reshard_after_forward", 0))
            self.commlog.install(self.api)
        return model

    def wrap_fsdp1(self, model):
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        c = self.cfg
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
            "auto_wrap_policy": ModuleWrapPolicy({M.unit_class(self.mcfg)}),
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
        kw["device_id"] = self.device
        if c["strategy"].startswith("hybrid"):
            kw["device_mesh"] = self.mesh()
        units = {id(u) for u in M.unit_modules(model, self.mcfg)}
        model = FSDP(model, **kw)
        ac = c.get("activation_checkpointing", "none")
        if ac == "inside":  # FSDP(checkpoint(block)), as Accelerate applies it after wrapping
            checkpoint_units(model, lambda m: id(m) in units)
        elif ac == "outside":  # checkpoint(FSDP(block)): the recompute gathers the unit again
            checkpoint_units(model, lambda m: isinstance(m, FSDP) and id(m.module) in units)
        if self.fault == "no_divide":
            # gradients summed, not averaged: FSDP1's pre/post divide factors set to 1
            for m in FSDP.fsdp_modules(model):
                m._gradient_predivide_factor = 1.0
                m._gradient_postdivide_factor = 1.0
        return model

    def wrap_fsdp2(self, model):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        c = self.cfg
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
            blocks = {id(u) for u in M.unit_modules(model, self.mcfg)}
            checkpoint_units(model, lambda m: id(m) in blocks)
        units = M.unit_modules(model, self.mcfg)
        for u in units:
            fully_shard(u, mesh=mesh, reshard_after_forward=raf, mp_policy=mp, offload_policy=off)
        fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp, offload_policy=off)
        if ac == "outside":  # checkpoint(fully_shard(block))
            ids = {id(u) for u in units}
            checkpoint_units(model, lambda m: id(m) in ids)
        # the explicit prefetch lists: each unit names the next N units of the pass, in the
        # order the reference's units run (forward: the root, whose embedding runs first,
        # then the blocks; backward: the root, whose head runs first, then the blocks from
        # the last). A root that holds no parameter of its own (mlp) is no unit of the
        # reference's and lists nothing. The last unit of a pass lists nothing: in backward,
        # torch's implicit default there prefetches nothing either
        chain = [model] if _owns_parameters(model, units) else []
        nf = forward_prefetch_units(c)
        nb = c.get("backward_prefetch_units") or (1 if c["backward_prefetch"] == "pre" else 0)
        for a, targets in prefetch_lists([*chain, *units], nf):
            a.set_modules_to_forward_prefetch(targets)
        for a, targets in prefetch_lists([*chain, *reversed(units)], nb):
            a.set_modules_to_backward_prefetch(targets)
        from torch.distributed.fsdp import FSDPModule

        fsdp_mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
        F = c.get("gradient_divide_factor")
        if F:
            # the setter acts on the module it is called on only: every unit, the root included
            require(FSDPModule, "set_gradient_divide_factor", "--gradient-divide-factor")
            for m in fsdp_mods:
                m.set_gradient_divide_factor(float(F))
        if self.force_sum:
            # the workaround for pytorch/pytorch#162338: SUM collectives, FSDP divides itself
            require(FSDPModule, "set_force_sum_reduction_for_comms", "--force-sum-reduction")
            for m in fsdp_mods:
                m.set_force_sum_reduction_for_comms(True)
        if self.fault == "no_divide":
            # gradients summed, not averaged: SUM collectives with a divide factor of 1
            require(FSDPModule, "set_force_sum_reduction_for_comms", "--inject no_divide")
            require(FSDPModule, "set_gradient_divide_factor", "--inject no_divide")
            for m in fsdp_mods:
                m.set_force_sum_reduction_for_comms(True)
                m.set_gradient_divide_factor(1.0)
        return model

    def applied_reduction(self, model):
        """How the wrapped modules reduce gradients, read back from them (not
        from the flags): FSDP1's pre/post divide factors; FSDP2's
        force_sum_reduction_for_comms and gradient_divide_factor of every
        parameter group (a torch without them: False and None, since nothing
        set them). A value the modules disagree on is a list."""

        def one(vals):
            vals = sorted(set(vals), key=repr)
            return vals[0] if len(vals) == 1 else vals

        if self.api == "fsdp1":
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
        F = self.cfg.get("gradient_divide_factor")
        if self.api != "fsdp2" or not F or self.fault == "no_divide":
            return
        if applied["gradient_divide_factor"] != float(F):
            raise RuntimeError(
                f"FSDP2's gradient_divide_factor read back from the modules is {applied['gradient_divide_factor']!r}, "
                f"the run set {float(F)!r} on every unit"
            )

    def optimizer(self, model):
        # over the parameters that train, as a user builds it (torch.optim refuses an empty list)
        return build_optimizer([p for p in model.parameters() if p.requires_grad], self.cfg["optimizer"])

    def frozen_given_grads(self, model):
        """The frozen parameters that have a gradient (`.grad` not None) on
        some rank, as training sees them: none, unless torch gave them one."""
        if not self.frozen:
            return set()
        order = sorted(self.frozen)
        mine = {clean_name(n) for n, p in model.named_parameters() if p.grad is not None}
        flags = torch.tensor([int(n in mine) for n in order], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return {n for n, f in zip(order, flags.tolist()) if f}

    # --------------------------------------------------------------- capture
    def full_grads(self, model):
        """FSDP1's full gradients by model name, on every rank (FSDP2's: fsdp2_grads)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        out = {}
        # FSDP1 computes and reduces a frozen parameter's gradient with the rest of its
        # unit's FlatParameter, and summon_full_params(with_grads=True) shows that internal
        # buffer; training sees the parameter's own .grad, None outside it (no gradient:
        # zeros), unless torch gave it one, which is then what the trace shows
        given = self.frozen_given_grads(model)
        with FSDP.summon_full_params(model, writeback=False, with_grads=True):
            for n, p in model.named_parameters():
                n = clean_name(n)
                none = p.grad is None or (n in self.frozen and n not in given)
                g = torch.zeros_like(p) if none else p.grad
                out[n] = g.detach().float().cpu().clone()
        return out

    def fsdp2_grads(self, model):
        """FSDP2's gradients as they are, [(name, DTensor)]: a frozen one zeros."""
        return [
            (clean_name(n), p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
        ]

    def full_params(self, model):
        out = {}
        if self.api == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with FSDP.summon_full_params(model, writeback=False):
                for n, p in model.named_parameters():
                    out[clean_name(n)] = p.detach().float().cpu().clone()
        else:
            out = gather_full(self.fsdp2_params(model), self.F, self.rank)
        return out

    def fsdp2_params(self, model):
        """FSDP2's parameters as they are, [(name, DTensor)]."""
        return [(clean_name(n), p) for n, p in model.named_parameters()]

    def full_optim_state(self, model, optim):
        """Optimizer state by model name (on rank 0) through torch.distributed.checkpoint's
        full state dict: FSDP1's, and FSDP2's with --optim-state-offload (FSDP2's
        own, straight from `optim.state`: fsdp2_state_sets)."""
        return self.dcp_optim_state(model, optim)[0]

    def dcp_optim_state(self, model, optim):
        """(state by model name on rank 0, the full optimizer state dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        # FSDP1 on a CPU device: with cpu_offload=True its full optimizer state
        # dict aliases every state of a parameter to one reused all-gather
        # buffer (`.cpu()` of a CPU tensor does not copy), so exp_avg comes out
        # equal to exp_avg_sq. cpu_offload=False clones instead. The bug is kept
        # reachable with --optim-state-offload, so `check` shows it.
        offload = self.device.type != "cpu" or self.args.optim_state_offload
        osd = get_optimizer_state_dict(
            model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=offload)
        )
        out = {s: {} for s in self.state_names}
        if self.rank != 0:
            return out, osd
        # keyed by the model's names: under PEFT its own (base_model.model. ...)
        state = {clean_name(k): v for k, v in osd.get("state", {}).items()}
        # the LM head is the embedding (model.py: gpt2 always, llama as its config says); an
        # untied head's state is its own, never the embedding's (frozen: none)
        tied = self.mcfg.get("model_type") == "gpt2" or self.mcfg.get("tie_word_embeddings") is True
        for n in self.names:
            st = state.get(n)
            if st is None and n in self.frozen:  # not in the optimizer: no state (zeros in the trace)
                st = {s: torch.zeros(self.shapes[n]) for s in self.state_names}
            if st is None and tied and n == M.embed_name(self.mcfg):  # a tied head's state may be keyed by its name
                st = state.get("lm_head.weight")
            for s in self.state_names:
                if st is None or s not in st:
                    raise RuntimeError(f"optimizer state {s} of {n} missing from the full optimizer state dict")
                out[s][n] = st[s].detach().float().cpu().clone()
        return out, osd

    def fsdp2_state_sets(self, model, optim):
        """FSDP2's optimizer states as they are: {state: [(name, DTensor)]}."""
        named, seen = {s: [] for s in self.state_names}, set()
        for n, p in model.named_parameters():
            n = clean_name(n)
            st = optim.state.get(p, {})
            if not st and n in self.frozen:  # not in the optimizer: no state (zeros in the trace)
                st = {s: torch.zeros_like(p) for s in self.state_names}
            for s in self.state_names:
                if s not in st:
                    raise RuntimeError(f"optimizer state {s} of {n} missing from the optimizer")
                named[s].append((n, st[s]))
            seen.add(n)
        missing = [n for n in self.names if n not in seen]
        if missing:
            raise RuntimeError(f"parameters {missing} missing from the model's named parameters")
        return named

    # ------------------------------------------------------------ checkpoint
    def round_trip(self, model, optim, directory, step):
        """--ckpt-at: saves (FULL, or FSDP2's sharded one: DCP's, dcp.py) and
        returns a fresh model and optimizer loaded from it."""
        if self.args.ckpt_state_dict != "sharded":
            self.save_checkpoint(model, optim, directory, step)
            del model, optim
            return self.load_checkpoint(directory)
        from . import dcp

        dcp.save(self, model, optim, directory, step)
        del model, optim
        model = self.build(self.ref.init())  # every tensor is overwritten by the load
        optim = self.optimizer(model)
        dcp.load(self, model, optim, directory, self.fault)
        return model, optim

    def resume(self, directory):
        """--load: a model and optimizer from a fsdpcheck checkpoint (FULL, or
        "dcp" through torch's reader), and the step it resumes at."""
        from . import dcp

        man = dcp.manifest_of(directory) or {}
        kind = man.get("state_dict")
        if kind == "dcp":
            model = self.build(self.ref.init())
            optim = self.optimizer(model)
            return model, optim, dcp.load(self, model, optim, directory, self.fault)
        if kind != "full":
            raise UsageError(f"--load {directory}: a {kind!r} checkpoint (this adapter loads full and dcp ones)")
        model, optim = self.load_checkpoint(directory)
        return model, optim, man["step"]

    def save_checkpoint(self, model, optim, directory, step):
        """FULL_STATE_DICT checkpoint through torch.distributed.checkpoint's
        full state dicts: rank 0 writes model.safetensors (model names) and
        optimizer.safetensors (<state>.<name>, step)."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=opts)
        states, _osd = self.dcp_optim_state(model, optim)
        if self.rank == 0:
            os.makedirs(directory, exist_ok=True)
            save_file(
                {n: msd[n].float().contiguous() for n in self.names},
                os.path.join(directory, "model.safetensors"),
                metadata={"format": "pt"},
            )
            t = {f"{s}.{n}": states[s][n].contiguous() for s in self.state_names for n in self.names}
            t["step"] = torch.tensor(step, dtype=torch.int64)
            save_file(t, os.path.join(directory, "optimizer.safetensors"))
        dist.barrier()

    def load_checkpoint(self, directory):
        """A fresh model and optimizer, loaded from the checkpoint (every rank
        reads the full files; set_*_state_dict shards them)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        msd = load_file(os.path.join(directory, "model.safetensors"))
        model = self.build(msd)
        optim = self.optimizer(model)
        if self.fault == "ckpt_drop_optim":
            return model, optim  # the bug: the optimizer state is never restored
        o = load_file(os.path.join(directory, "optimizer.safetensors"))
        step = float(o["step"].item())
        state = {n: dict({s: o[f"{s}.{n}"] for s in self.state_names}, step=torch.tensor(step)) for n in self.names}
        if self.cfg["optimizer"]["kind"] == "sgd":
            for n in self.names:
                state[n].pop("step")
        groups = [
            dict({k: v for k, v in g.items() if k != "params"}, params=list(self.names)) for g in optim.param_groups
        ]
        set_optimizer_state_dict(
            model, optim, {"state": state, "param_groups": groups}, options=StateDictOptions(full_state_dict=True)
        )
        return model, optim

    # ------------------------------------------------------------------ step
    def local_batch(self, inp, tgt):
        n = self.cfg["global_batch"] // self.W
        r = self.rank
        if self.fault == "data_overlap" and r > 0:
            r -= 1  # the bug: a rank reads its neighbour's samples
        return inp[r * n : (r + 1) * n], tgt[r * n : (r + 1) * n]

    def gather_batch(self, x):
        parts = [torch.empty_like(x) for _ in range(self.W)]
        dist.all_gather(parts, x)
        return torch.cat(parts)

    # ----------------------------------------------------------------- trace
    def open_step_file(self, out, step, g_inp, g_tgt, clips):
        """Step `step`'s file, laid out on every rank (rank 0 creates it, the
        others open it after)."""
        t0 = time.perf_counter()
        entries = tracefile.step_entries(self.names, self.ref.shapes, self.state_names, g_inp, g_tgt, clips)
        f = tracefile.step_file(out, step, entries)
        if self.rank == 0:
            f.create()
        dist.barrier()
        if self.rank != 0:
            f.open()
        self.timing["trace_write"] += time.perf_counter() - t0
        return f

    def record(self, f, prefix, named):
        """An FSDP2 set ([(name, DTensor)]) into the step file: every rank
        writes its own rows where the ranks share this host (gather.py), else
        rank 0 gathers the set and writes it."""
        t0 = time.perf_counter()
        if self.shard_write and write_shards(f, prefix, named, self.F, self.rank):
            self.timing["trace_write"] += time.perf_counter() - t0
            return
        self.record_full(f, prefix, gather_full, named, self.F, self.rank)

    def record_full(self, f, prefix, full, *args):
        """A set gathered whole by full(*args) ({name: tensor} on rank 0; prefix
        None: {state: {name: tensor}}, the optimizer's), written by rank 0."""
        t0 = time.perf_counter()
        got = full(*args)
        t1 = time.perf_counter()
        self.timing["gather"] += t1 - t0
        if self.rank == 0:
            sets = {prefix: got} if prefix else {f"optim.{s}": got[s] for s in self.state_names}
            for p, tensors in sets.items():
                for n in self.names:
                    f.write(f"{p}.{n}", tensors[n])
        self.timing["trace_write"] += time.perf_counter() - t1

    def train(self):
        c = self.cfg
        K = c["grad_accum"]
        if self.args.load:
            model, optim, self.first_step = self.resume(self.args.load)
            init = self.full_params(model)  # a resumed trace starts from the loaded weights
        else:
            init = self.ref.init()
            model = self.build(init)
            optim = self.optimizer(model)
        self.applied = self.applied_reduction(model)
        self.check_divide_factor(self.applied)
        # --freeze, read back from the wrapped model and the optimizer (trace.json's "torch")
        self.frozen_applied = sorted({clean_name(n) for n, p in model.named_parameters() if not p.requires_grad})
        if set(self.frozen_applied) != self.frozen:
            why = "LoRA's base" if self.lora else "--freeze matched"
            raise RuntimeError(f"frozen after wrapping: {self.frozen_applied}, {why} {sorted(self.frozen)}")
        # LoRA, read back from the wrapped model: the layers PEFT adapted and the scaling they apply
        self.lora_applied = None
        if self.lora:
            self.lora_applied = {
                "peft_version": _version("peft"),
                "modules": list(M.lora_layers(model)),
                "scaling": M.lora_scalings(model),
            }
        self.optimized = sum(len(g["params"]) for g in optim.param_groups)
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        self.wrappers = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
        out = self.args.trace
        # rank 0's time gathering full tensors for the trace and writing it (check prints the split)
        self.timing = {"gather": 0.0, "trace_write": 0.0}
        t0 = time.perf_counter()
        if self.rank == 0:
            tracefile.write_init(out, {n: init[n] for n in self.names})
        # every rank read the whole initial model; FSDP holds its own shards now, and
        # no rank keeps a full copy beyond them (gpt2-124m: 500 MB a rank)
        del init
        self.timing["trace_write"] += time.perf_counter() - t0
        # FSDP2's ranks write their own shards into the step files where they share this host
        # (gather.py); FSDPCHECK_GATHER=shm or =collective gathers every set to rank 0 instead
        self.shard_write = self.api == "fsdp2" and gather_mode() == "auto" and shares_host()
        token_ids = M.takes_token_ids(self.mcfg)  # gpt2, llama: the input is token ids (long)
        rec = getattr(self, "commlog", None)  # --comm-log: the step's schedule (commlog.py)
        phase = rec.set_phase if rec else (lambda p: None)
        for step in range(self.first_step, self.first_step + c["steps"]):
            if self.args.ckpt_at and step == self.args.ckpt_at:
                model, optim = self.round_trip(model, optim, os.path.join(out, "ckpt"), step)
            g_inp, g_tgt = self.ref.batch(step)
            inp, tgt = self.local_batch(g_inp, g_tgt)
            optim.zero_grad(set_to_none=True)
            mb = inp.shape[0] // K
            loss_sum = 0.0
            if rec:
                rec.begin_step(step)
            for k in range(K):
                if rec:
                    rec.begin_micro(k)
                x = inp[k * mb : (k + 1) * mb].to(self.device)
                y = tgt[k * mb : (k + 1) * mb].long().to(self.device)
                if token_ids:
                    x = x.long()
                sync = not c["no_sync"] or k == K - 1
                if self.api == "fsdp1":
                    import contextlib

                    ctx = model.no_sync() if not sync else contextlib.nullcontext()
                else:
                    model.set_requires_gradient_sync(sync)
                    model.set_is_last_backward(k == K - 1)
                    ctx = _null()
                with ctx:
                    phase("forward")
                    loss = M.loss_of(model, self.mcfg, x, y)
                    if self.fault == "hang" and step == 0 and self.rank == self.W - 1:
                        time.sleep(1e6)  # the others wait for it in the first collective
                    if self.fault == "segv" and step == min(1, c["steps"] - 1) and self.rank == self.W - 1:
                        import ctypes

                        ctypes.string_at(0)  # reads address 0: SIGSEGV
                    phase("backward")
                    (loss / K).backward() if K > 1 else loss.backward()
                    phase(None)
                loss_sum += float(loss.detach().float().cpu())
            # the step file is laid out now (tracefile.StepFile), and every set goes into it as
            # soon as it is final: the gradients before clipping scales them, the rest after the step
            clips = c["clip_grad_norm"] > 0
            f = self.open_step_file(out, step, g_inp, g_tgt, clips)
            try:
                if self.api == "fsdp2":
                    self.record(f, "grad", self.fsdp2_grads(model))
                else:
                    self.record_full(f, "grad", self.full_grads, model)
                phase("clip")
                grad_norm = clip_grad_norm(model, c, self.api == "fsdp1") if clips else None
                phase("optim")
                optim.step()
                if self.fault == "frozen_decay":
                    decay_frozen(model, self.frozen, c["optimizer"])
                if rec:
                    rec.optimizer_stepped()
                phase(None)
                if self.api == "fsdp2":
                    self.record(f, "param", self.fsdp2_params(model))
                else:
                    self.record_full(f, "param", self.full_params, model)
                if self.api == "fsdp2" and not self.args.optim_state_offload:
                    for s, named in self.fsdp2_state_sets(model, optim).items():
                        self.record(f, f"optim.{s}", named)
                else:
                    self.record_full(f, None, self.full_optim_state, model, optim)
                lt = torch.tensor(
                    [loss_sum / K], dtype=torch.float64, device=self.device if self.device.type != "cpu" else "cpu"
                )
                dist.all_reduce(lt)
                used_inp = self.gather_batch(inp.to(self.device)).cpu()
                used_tgt = self.gather_batch(tgt.to(self.device)).cpu()
                t0 = time.perf_counter()
                mean_loss = float(lt.item()) / self.W
                if self.rank == 0:
                    tracefile.write_scalars(f, mean_loss, used_inp.to(g_inp.dtype), used_tgt.to(g_tgt.dtype), grad_norm)
                dist.barrier()  # every rank's part is in
                if self.rank == 0:
                    f.commit()
                    print(f"step {step}: loss {mean_loss:.6f}", flush=True)
                self.timing["trace_write"] += time.perf_counter() - t0
            finally:
                f.close()
        # every rank's peak resident set so far (Linux: KiB), for check's memory line
        import resource

        rss = [None] * self.W
        dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        self.peak_rss_mib = rss
        if rec:
            rec.uninstall()
            rec.write(os.path.join(out, f"commlog.rank{self.rank}.jsonl"))
            dist.barrier()
            if self.rank == 0:
                from .commlog import gather_to

                parts = [os.path.join(out, f"commlog.rank{r}.jsonl") for r in range(self.W)]
                gather_to(os.path.join(out, "commlog.jsonl"), parts)
        if self.rank == 0:
            self.finish(out, c["steps"])
        if self.fault == "abort_at_exit":
            dist.barrier()  # trace.json is written
            if self.rank == self.W - 1:
                os.abort()

    def finish(self, out, steps):
        c = dict(self.cfg)
        impl = f"torch-{self.api}"
        c["impl"] = impl
        c["divide"] = self.divide_mode(self.applied)
        c["inject"] = self.fault
        c["init"] = ""
        try:
            from importlib.metadata import PackageNotFoundError, version

            tv = version("transformers")
        except PackageNotFoundError:
            tv = None
        info = {
            "api": self.api,
            "torch_version": torch.__version__,
            "transformers_version": tv,
            "device": self.args.device,
            "backend": self.args.backend,
            "world_size": self.W,
            "shard_group": self.F,
            # read back from the wrapped modules (applied_reduction), not the flags
            "reduction": self.applied,
            "gradient_divide": c["divide"],
            "checkpoint_at": self.args.ckpt_at or None,
            "checkpoint_state_dict": self.args.ckpt_state_dict if self.args.ckpt_at else None,
            "loaded_from": os.path.abspath(self.args.load) if self.args.load else None,
            "activation_checkpointing": self.checkpointing_evidence(),
            "frozen": self.frozen_applied,
            "lora": self.lora_applied,
            "optimizer_parameters": self.optimized,
            "like": os.path.abspath(self.ref.dir),
            "timing_s": dict(self.timing),
            "peak_rss_mib": [round(x, 1) for x in self.peak_rss_mib],
        }
        tracefile.write_trace_json(out, impl, self.W, steps, c, self.ref.units, info, self.first_step)

    def checkpointing_evidence(self):
        """What activation checkpointing did: its placement, the checkpoint
        wrappers in the model, and the blocks' forward calls (twice the
        steps x micro-batches x blocks when every block recomputed)."""
        ac = self.cfg.get("activation_checkpointing", "none")
        if ac == "none":
            return None
        return {"placement": ac, "wrappers": self.wrappers, "block_forwards": sum(c[0] for c in self.forwards)}

    def divide_mode(self, applied):
        """How this run divides gradients, in the reference's --divide names,
        from what the modules were found to do (applied_reduction)."""
        if self.api == "fsdp1" or self.W == 1:
            return "prepost"
        if self.cfg["reduce_dtype"] == "fp16":
            return "prepost"
        return "sum-then-divide" if applied["force_sum_reduction_for_comms"] is True else "avg"


def _version(dist_name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None


def decay_frozen(model, frozen, o):
    """--inject frozen_decay: AdamW's decoupled weight decay, p *= 1 - lr wd,
    applied to the frozen parameters as well (an optimizer loop that decays
    every parameter it was given, frozen or not); on each rank's shard."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if clean_name(n) in frozen:
                p.mul_(1.0 - o["lr"] * o["weight_decay"])


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


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _device(name):
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":  # pragma: no cover (cuda)
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if name == "hpu":  # pragma: no cover (hpu)
        return torch.device("hpu")
    raise UsageError(f"--device {name}: not handled here")
