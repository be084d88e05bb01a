"""The trace of one torch run, recorded as it trains (tracefile.StepFile).

Each step's file is laid out first, on every rank, and every set goes into it
as soon as it is final: the full gradients before clipping, then after the
optimizer step the full parameters and the optimizer state by model name.
FSDP1: `summon_full_params(with_grads=True)` and torch.distributed.checkpoint's
full optimizer state dict, rank 0 writes. FSDP2: every rank writes its own
shards where the ranks share this host, or rank 0 gathers and writes
(gather.py); the optimizer state straight from `optim.state`, or with
--optim-state-offload through the full state dict. Rank 0 then writes the mean
loss and the batch the ranks really trained on (gathered from them), so a data
bug shows in `batch.input` itself. timing holds rank 0's time gathering and
writing (check prints the split).
"""

import os
import time

import torch
import torch.distributed as dist

from . import env, tracefile
from .gather import gather_full, shares_host, write_shards
from .model import clean_name, embed_name


class Recorder:
    def __init__(self, ctx):
        self.ctx = ctx
        self.timing = {"gather": 0.0, "trace_write": 0.0}
        self.shard_write = False

    def begin(self, out, init):
        """init.safetensors (rank 0), and how FSDP2's sets reach the step files: each
        rank writes its own shards where the ranks share this host (gather.py);
        FSDPCHECK_GATHER=shm or =collective gathers every set to rank 0 instead."""
        t0 = time.perf_counter()
        if self.ctx.rank == 0:
            tracefile.write_init(out, {n: init[n] for n in self.ctx.names})
        self.timing["trace_write"] += time.perf_counter() - t0
        self.shard_write = self.ctx.api == "fsdp2" and env.gather_mode() == "auto" and shares_host()

    # ----------------------------------------------------------------- step
    def open_step_file(self, out, step, g_inp, g_tgt, clips):
        """Step `step`'s file, laid out on every rank (rank 0 creates it, the
        others open it after)."""
        x = self.ctx
        t0 = time.perf_counter()
        entries = tracefile.step_entries(x.names, x.ref.shapes, x.state_names, g_inp, g_tgt, clips)
        f = tracefile.step_file(out, step, entries)
        if x.rank == 0:
            f.create()
        dist.barrier()
        if x.rank != 0:
            f.open()
        self.timing["trace_write"] += time.perf_counter() - t0
        return f

    def grads(self, f, model):
        """The gradients before clipping scales them."""
        if self.ctx.api == "fsdp2":
            self.record(f, "grad", self.fsdp2_grads(model))
        else:
            self.record_full(f, "grad", self.full_grads, model)

    def after_step(self, f, model, optim):
        """The parameters and the optimizer state after the optimizer's step."""
        if self.ctx.api == "fsdp2":
            self.record(f, "param", self.fsdp2_params(model))
        else:
            self.record_full(f, "param", self.full_params, model)
        if self.ctx.api == "fsdp2" and not self.ctx.args.optim_state_offload:
            for s, named in self.fsdp2_state_sets(model, optim).items():
                self.record(f, f"optim.{s}", named)
        else:
            self.record_full(f, None, self.full_optim_state, model, optim)

    def commit(self, f, step, loss_sum, K, inp, tgt, g_inp, g_tgt, grad_norm):
        """The step's mean loss and the batch every rank trained on into the file,
        which rank 0 then commits once every rank's part is in."""
        x = self.ctx
        lt = torch.tensor([loss_sum / K], dtype=torch.float64, device=x.device if x.device.type != "cpu" else "cpu")
        dist.all_reduce(lt)
        used_inp = self.gather_batch(inp.to(x.device)).cpu()
        used_tgt = self.gather_batch(tgt.to(x.device)).cpu()
        t0 = time.perf_counter()
        mean_loss = float(lt.item()) / x.W
        if x.rank == 0:
            tracefile.write_scalars(f, mean_loss, used_inp.to(g_inp.dtype), used_tgt.to(g_tgt.dtype), grad_norm)
        dist.barrier()  # every rank's part is in
        if x.rank == 0:
            f.commit()
            print(f"step {step}: loss {mean_loss:.6f}", flush=True)
        self.timing["trace_write"] += time.perf_counter() - t0

    def gather_batch(self, t):
        parts = [torch.empty_like(t) for _ in range(self.ctx.W)]
        dist.all_gather(parts, t)
        return torch.cat(parts)

    def record(self, f, prefix, named):
        """An FSDP2 set ([(name, DTensor)]) into the step file: every rank
        writes its own rows where the ranks share this host (gather.py), else
        rank 0 gathers the set and writes it."""
        t0 = time.perf_counter()
        if self.shard_write and write_shards(f, prefix, named, self.ctx.F, self.ctx.rank):
            self.timing["trace_write"] += time.perf_counter() - t0
            return
        self.record_full(f, prefix, gather_full, named, self.ctx.F, self.ctx.rank)

    def record_full(self, f, prefix, full, *args):
        """A set gathered whole by full(*args) ({name: tensor} on rank 0; prefix
        None: {state: {name: tensor}}, the optimizer's), written by rank 0."""
        x = self.ctx
        t0 = time.perf_counter()
        got = full(*args)
        t1 = time.perf_counter()
        self.timing["gather"] += t1 - t0
        if x.rank == 0:
            sets = {prefix: got} if prefix else {f"optim.{s}": got[s] for s in x.state_names}
            for p, tensors in sets.items():
                for n in x.names:
                    f.write(f"{p}.{n}", tensors[n])
        self.timing["trace_write"] += time.perf_counter() - t1

    # ------------------------------------------------------------ gathers
    def frozen_given_grads(self, model):
        """The frozen parameters that have a gradient (`.grad` not None) on
        some rank, as training sees them: none, unless torch gave them one."""
        x = self.ctx
        if not x.frozen:
            return set()
        order = sorted(x.frozen)
        mine = {clean_name(n) for n, p in model.named_parameters() if p.grad is not None}
        flags = torch.tensor([int(n in mine) for n in order], dtype=torch.int32, device=x.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return {n for n, f in zip(order, flags.tolist()) if f}

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
                none = p.grad is None or (n in self.ctx.frozen and n not in given)
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
        if self.ctx.api == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with FSDP.summon_full_params(model, writeback=False):
                for n, p in model.named_parameters():
                    out[clean_name(n)] = p.detach().float().cpu().clone()
        else:
            out = gather_full(self.fsdp2_params(model), self.ctx.F, self.ctx.rank)
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

        x = self.ctx
        # FSDP1 on a CPU device: with cpu_offload=True its full optimizer state
        # dict aliases every state of a parameter to one reused all-gather
        # buffer (`.cpu()` of a CPU tensor does not copy), so exp_avg comes out
        # equal to exp_avg_sq. cpu_offload=False clones instead. The bug is kept
        # reachable with --optim-state-offload, so `check` shows it.
        offload = x.device.type != "cpu" or x.args.optim_state_offload
        osd = get_optimizer_state_dict(
            model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=offload)
        )
        out = {s: {} for s in x.state_names}
        if x.rank != 0:
            return out, osd
        # keyed by the model's names: under PEFT its own (base_model.model. ...)
        state = {clean_name(k): v for k, v in osd.get("state", {}).items()}
        # the LM head is the embedding (model.py: gpt2 always, llama as its config says); an
        # untied head's state is its own, never the embedding's (frozen: none)
        tied = x.mcfg.get("model_type") == "gpt2" or x.mcfg.get("tie_word_embeddings") is True
        for n in x.names:
            st = state.get(n)
            if st is None and n in x.frozen:  # not in the optimizer: no state (zeros in the trace)
                st = {s: torch.zeros(x.ref.shapes[n]) for s in x.state_names}
            if st is None and tied and n == embed_name(x.mcfg):  # a tied head's state may be keyed by its name
                st = state.get("lm_head.weight")
            for s in x.state_names:
                if st is None or s not in st:
                    raise RuntimeError(f"optimizer state {s} of {n} missing from the full optimizer state dict")
                out[s][n] = st[s].detach().float().cpu().clone()
        return out, osd

    def fsdp2_state_sets(self, model, optim):
        """FSDP2's optimizer states as they are: {state: [(name, DTensor)]}."""
        x = self.ctx
        named, seen = {s: [] for s in x.state_names}, set()
        for n, p in model.named_parameters():
            n = clean_name(n)
            st = optim.state.get(p, {})
            if not st and n in x.frozen:  # not in the optimizer: no state (zeros in the trace)
                st = {s: torch.zeros_like(p) for s in x.state_names}
            for s in x.state_names:
                if s not in st:
                    raise RuntimeError(f"optimizer state {s} of {n} missing from the optimizer")
                named[s].append((n, st[s]))
            seen.add(n)
        missing = [n for n in x.names if n not in seen]
        if missing:
            raise RuntimeError(f"parameters {missing} missing from the model's named parameters")
        return named

    # ------------------------------------------------------------ the end
    def peak_rss_mib(self):
        """Every rank's peak resident set so far (Linux: KiB), for check's memory line."""
        import resource

        rss = [None] * self.ctx.W
        dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        return rss

    def write_commlog(self, rec, out):
        """--comm-log: every rank's schedule, then rank 0 joins them into commlog.jsonl."""
        x = self.ctx
        rec.uninstall()
        rec.write(os.path.join(out, f"commlog.rank{x.rank}.jsonl"))
        dist.barrier()
        if x.rank == 0:
            from .commlog import gather_to

            parts = [os.path.join(out, f"commlog.rank{r}.jsonl") for r in range(x.W)]
            gather_to(os.path.join(out, "commlog.jsonl"), parts)
