"""The schedule real PyTorch FSDP issues, written as a comm log (the JSON lines
of `fsdpcheck run --comm-log`) for `fsdpcheck schedule` to judge against the
oracle's own statement of FSDP's rules (P10, oracle/rules.c).

How it records, and why:
  - Collectives: by wrapping torch.distributed's functions for the steps'
    duration (all_gather_single / all_gather_into_tensor / _all_gather_base,
    the reduce_scatter equivalents, all_reduce, and the functional all_reduce
    DTensor uses for FSDP2's total norm). Kind, bytes, dtype and group are
    read off the call FSDP really made, so nothing of our model of FSDP goes
    into them. Not the profiler: its CPU (gloo) events carry neither the
    group nor reliable byte counts across the torch versions we support, and
    it reports after the run, with no order against FSDP's hooks.
  - What a collective's arguments do not say (which unit it serves, when FSDP
    waits on it, frees the unit, or runs a stage) comes from FSDP's own entry
    points, wrapped the same way: FSDP2's FSDPParamGroup (unshard,
    wait_for_unshard, reshard, post_backward, _prefetch_unshard) and
    FSDPState._pre_backward, FSDP1's
    _runtime_utils (_unshard, _reshard, _pre/_post_backward_hook,
    _prefetch_handle), and the checkpoint wrapper's CheckpointWrapper and its
    _checkpoint_wrapped_module. A torch without one of them is refused (exit
    2, the name), never recorded half.
  - Compute: forward of a stage when its module's forward starts (a forward
    pre-hook registered after FSDP's, so FSDP has gathered by then); backward
    of a stage when FSDP's pre-backward hook of its unit returns (FSDP has
    gathered for it and issued its prefetch; autograd computes it next), and the embedding's backward (the root
    unit's first stage, whose backward ends the pass) at the root's
    post-backward, before that frees and reduces.
  - Waits: a synchronous collective (every one FSDP issues on CPU and by
    default) completes in its call: its wait follows it. FSDP2's all-gather is
    waited where FSDP2 waits for it (wait_for_unshard: on a GPU the stream
    wait), so a prefetch shows as issued early and waited at need. An
    asynchronous collective with no such wait point is left unwaited, and the
    theory says so.
  - Activation checkpointing (torch's checkpoint_wrapper, inside or outside
    the unit): the recompute is the wrapped module's forward called again in
    backward, when autograd first needs one of its saved activations. Hooks on
    that module (its pre-hook ahead of FSDP's own) put whatever runs inside it
    in phase recompute: the stages' forward events (the same stage hooks) and
    any all-gather or free FSDP issues for it, read off the wrapped calls as
    above. A checkpointed unit's backward compute is logged once both its
    pre-backward returned and its recompute ended, the later of the two
    (autograd computes it next). On torch 2.15 the recompute issues no
    collective in either placement, as recorded: the unit's pre-backward has
    gathered it; inside, the recompute does not pass FSDP's forward; outside,
    FSDP1's _pre_forward and FSDP2's skip a unit in pre-backward.
  - The optimizer: optimizer.step() updates every unit's shard at once; one
    optim event per unit follows it (bytes 0: not measured).
Only the training step is recorded: the adapter's own gathers for the trace,
the loss all_reduce and saving or loading a checkpoint are outside it.
"""

import contextlib
import functools
import inspect
import json
import os

import torch
import torch.distributed as dist

from .errors import UsageError

DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# torch.distributed's names across versions: 2.7 has *_into_tensor / *_tensor
# (and the deprecated _base forms); later ones add *_single. FSDP1 gathers a
# CPU flat parameter with the list form, all_gather.
GATHERS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather")
SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")


def _arg(bound, *names):
    for n in names:
        if n in bound.arguments:
            return bound.arguments[n]
    return None


# The oldest torch whose FSDP2 schedule the theory states (oracle/rules.h,
# measured on 2.15.0): torch 2.7.1's FSDP2 keeps the root gathered after
# forward and all-reduces the norm twice, which no rule says. FSDP1 passed the
# same cases on both.
FSDP2_MODELLED = (2, 15)


def refusal(api):
    """Why this torch's schedule of api cannot be judged, or None."""
    v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if api == "fsdp2" and v < FSDP2_MODELLED:
        return (
            f"--comm-log: FSDP2's schedule is modelled as torch {'.'.join(map(str, FSDP2_MODELLED))} runs it; "
            f'torch {torch.__version__} schedules differently (README, "Real FSDP\'s schedule")'
        )
    return None


class CommLog:
    """One rank's recorder. units: the FSDP modules in unit order (the
    reference's: the root first, then the blocks); stages: (module, unit) in
    stage order."""

    def __init__(self, rank, world, shard, units, stages, post_forward=0):
        self.rank, self.W, self.F = rank, world, shard
        self.PF = post_forward  # FSDP2's integer reshard_after_forward R, 0 if none
        self.ag_group = {}  # unit -> the group of its all-gather in flight
        self.unit_of = {id(m): u for u, m in enumerate(units)}
        self.root, self.n_units = units[0], len(units)
        self.stages = stages
        self.first_bwd_stage = {}  # unit -> the stage its backward starts with
        self.last_stage = {}  # unit -> its first stage in forward order (its last in backward)
        for s, (_, u) in enumerate(stages):
            self.first_bwd_stage[u] = s
            self.last_stage.setdefault(u, s)
        self.events = []
        self.on = False
        self.step = self.micro = self.order = 0
        self.phase = "forward"
        self.unit = -1  # the unit the current FSDP entry point serves
        self.prefetch = False
        self.depth = 0  # a wrapped collective calling another is one collective
        self.gathered = set()  # units gathered (an all-gather issued, not freed)
        self.unwaited_ag = set()  # FSDP2: units whose all-gather is not yet waited
        self.bwd_done = set()  # (unit, stage) whose backward compute is logged this micro-batch
        self.checkpointed = set()  # units activation checkpointing recomputes in backward
        self.recomputing = None  # the unit whose recompute runs now
        self.recomputed = set()  # checkpointed units recomputed this micro-batch
        self.bwd_pending = set()  # checkpointed units past their pre-backward, not yet recomputed
        self.undo = []

    # -- events ---------------------------------------------------------------

    def event(self, op, unit=-1, stage=-1, group="none", nbytes=0, dtype="fp32", of=None, prefetch=False):
        e = {"rank": self.rank, "step": self.step, "micro": self.micro, "order": self.order, "op": op}
        if of is not None:
            e["of"] = of
        e.update(unit=unit, stage=stage, group=group, bytes=int(nbytes), dtype=dtype, phase=self.phase)
        e["prefetch"] = bool(prefetch)
        self.events.append(e)
        self.order += 1

    def begin_step(self, step):
        self.step, self.micro, self.order = step, 0, 0

    def begin_micro(self, k):
        self.micro = k
        self.bwd_done.clear()
        self.recomputed.clear()
        self.bwd_pending.clear()

    def set_phase(self, phase):
        self.phase = phase
        self.on = phase is not None

    def optimizer_stepped(self):
        for u in range(self.n_units):
            self.event("optim", unit=u)

    def group_name(self, group):
        """world, shard, replicate or post_forward, from the group's ranks (a
        shard group is F consecutive ranks, a replica group the ranks F apart,
        docs/contract.md §2; a post-forward group R consecutive ranks, torch's
        mesh.view(-1, R))."""
        if isinstance(group, tuple):  # the functional collectives' (mesh, dim)
            mesh, d = group
            group = mesh.get_group(d)
        ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else list(range(self.W))
        if len(ranks) == self.W:
            return "world"
        base = self.rank // self.F * self.F
        if ranks == list(range(base, base + self.F)):
            return "shard"
        if ranks == list(range(self.rank % self.F, self.W, self.F)):
            return "replicate"
        pf = self.rank // self.PF * self.PF if self.PF else 0
        if self.PF and ranks == list(range(pf, pf + self.PF)):
            return "post_forward"
        return f"ranks {ranks}"  # the reader refuses it: a group FSDP should not use

    def collective(self, op, tensor, nbytes, group, sync):
        unit = self.unit if not (op == "all_reduce" and self.phase == "clip") else -1
        self.event(
            op,
            unit=unit,
            group=self.group_name(group),
            nbytes=nbytes,
            dtype=DTYPE.get(tensor.dtype, "fp32"),
            prefetch=self.prefetch and op == "all_gather",
        )
        if op == "all_gather":
            self.gathered.add(unit)
            self.ag_group[unit] = self.group_name(group)
            if not sync:
                self.unwaited_ag.add(unit)
                return
        if sync:
            self.event("wait", unit=unit, group=self.group_name(group), of=op)

    def waited_all_gather(self, unit):
        if unit in self.unwaited_ag:
            self.unwaited_ag.discard(unit)
            default = "shard" if self.F < self.W else "world"
            self.event("wait", unit=unit, group=self.ag_group.get(unit, default), of="all_gather")

    def freed(self, unit):
        if unit in self.gathered:
            self.gathered.discard(unit)
            self.event("free", unit=unit)

    def backward_of(self, unit, stage=None):
        """The backward compute of unit's first backward stage (or of stage),
        once per micro-batch; of a checkpointed unit, once it is past its
        pre-backward and its recompute both (autograd computes it next)."""
        if unit in self.checkpointed and unit not in self.recomputed:
            self.bwd_pending.add(unit)
            return
        s = self.first_bwd_stage[unit] if stage is None else stage
        if (unit, s) in self.bwd_done:
            return
        self.bwd_done.add((unit, s))
        self.event("backward", unit=unit, stage=s)

    def ends_backward(self, unit):
        """At unit's post-backward: the root's embedding stage computes last
        (its first forward stage), after the stage its pre-backward logged."""
        if self.on and (unit, self.first_bwd_stage[unit]) in self.bwd_done:
            self.backward_of(unit, self.last_stage[unit])

    # -- wrapping ---------------------------------------------------------------

    def patch(self, owner, name, make):
        orig = getattr(owner, name)
        setattr(owner, name, functools.wraps(orig)(make(orig)))
        self.undo.append((owner, name, orig))

    def wrap_collective(self, owner, name, op, fsdp2_gather):
        """owner.name records op when called while recording. fsdp2_gather: the
        all-gather's wait is FSDP2's wait_for_unshard, not its return."""
        sig = inspect.signature(getattr(owner, name))

        def make(orig):
            def f(*a, **kw):
                if not self.on or self.depth:
                    return orig(*a, **kw)
                b = sig.bind(*a, **kw)
                b.apply_defaults()
                tensors = _arg(b, "tensor_list")
                if tensors is not None:  # the list form: the gathered bytes are the list's
                    t = tensors[0]
                elif op == "all_gather":
                    t = _arg(b, "output_tensor", "output")
                elif op == "reduce_scatter":
                    t = _arg(b, "input", "input_tensor")
                else:
                    t = _arg(b, "tensor", "self")
                group = _arg(b, "group")
                sync = not _arg(b, "async_op")
                self.depth += 1
                try:
                    out = orig(*a, **kw)
                finally:
                    self.depth -= 1
                nbytes = sum(x.numel() * x.element_size() for x in (tensors if tensors is not None else [t]))
                self.collective(op, t, nbytes, group, sync and not (fsdp2_gather and op == "all_gather"))
                return out

            return f

        self.patch(owner, name, make)

    def install(self, api):
        for names, op in ((GATHERS, "all_gather"), (SCATTERS, "reduce_scatter"), (("all_reduce",), "all_reduce")):
            for n in names:
                if hasattr(dist, n):
                    self.wrap_collective(dist, n, op, api == "fsdp2")
        from torch.distributed import _functional_collectives as funcol

        self.wrap_collective(funcol, "all_reduce", "all_reduce", False)
        for m, u in self.stages:
            # after FSDP's own pre-hooks (theirs gather), before the module computes
            m.register_forward_pre_hook(functools.partial(self._forward_hook, u, self.stages.index((m, u))))
        (self._install_fsdp2 if api == "fsdp2" else self._install_fsdp1)()
        self._install_recompute()

    def uninstall(self):
        for owner, name, orig in reversed(self.undo):
            setattr(owner, name, orig)
        self.undo.clear()

    def _forward_hook(self, unit, stage, module, args):
        if self.on and self.phase in ("forward", "recompute"):
            self.event("forward", unit=unit, stage=stage)

    def _install_recompute(self):
        """Activation checkpointing: torch's checkpoint_wrapper runs the module
        it wraps again (its __call__, hooks and all) when autograd first needs
        a saved activation of it. That module's forward, called in backward, is
        the recompute: a pre-hook ahead of FSDP's own (FSDP2's pre-forward
        outside the unit) opens phase recompute, a hook that runs even when the
        recompute stops early (torch's early stop raises out of it) closes it.
        Whatever FSDP issues in between is the recompute's."""
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw

        self._need(cw, ["CheckpointWrapper"])
        for w in self.root.modules():
            if not isinstance(w, cw.CheckpointWrapper):
                continue
            inner = w._modules.get("_checkpoint_wrapped_module")  # not getattr: the wrapper forwards it
            if inner is None:
                raise UsageError(
                    "--comm-log: this torch's CheckpointWrapper lacks _checkpoint_wrapped_module: the recompute "
                    "cannot be recorded on it"
                )
            # the unit it recomputes: the wrapped module, or the unit inside it (FSDP1's wrapper outside)
            u = next((self.unit_of[id(m)] for m in inner.modules() if id(m) in self.unit_of), None)
            if u is None:
                raise UsageError("--comm-log: a checkpoint wrapper around no FSDP unit: its recompute has no unit")
            self.unit_of.setdefault(id(w), u)  # FSDP2 inside: the wrapper is the unit's module
            self.checkpointed.add(u)
            inner.register_forward_pre_hook(functools.partial(self._recompute_begins, u), prepend=True)
            inner.register_forward_hook(functools.partial(self._recompute_ends, u), always_call=True)

    def _recompute_begins(self, unit, module, args):
        if self.on and self.phase == "backward":
            self.phase, self.recomputing = "recompute", unit

    def _recompute_ends(self, unit, module, args, out):
        if self.phase == "recompute" and self.recomputing == unit:
            self.phase, self.recomputing = "backward", None
            self.recomputed.add(unit)
            if unit in self.bwd_pending:
                self.bwd_pending.discard(unit)
                self.backward_of(unit)

    @contextlib.contextmanager
    def _context(self, unit, prefetch=None):
        """Runs an FSDP entry point with the unit it serves as the context."""
        saved = self.unit, self.prefetch
        self.unit = unit
        if prefetch is not None:
            self.prefetch = prefetch
        try:
            yield
        finally:
            self.unit, self.prefetch = saved

    def _within(self, unit_of_call, prefetch=None, first=None):
        """A wrapper maker: the entry point runs with the unit it serves
        (unit_of_call of its arguments; None: as it is) as the context, after
        first(unit)."""

        def make(orig):
            def f(*a, **kw):
                u = unit_of_call(*a, **kw)
                if u is None:
                    return orig(*a, **kw)
                if first:
                    first(u)
                with self._context(u, prefetch):
                    return orig(*a, **kw)

            return f

        return make

    def _after(self, act):
        """A wrapper maker: act(its arguments) once the entry point returned, while recording."""

        def make(orig):
            def f(*a, **kw):
                out = orig(*a, **kw)
                if self.on:
                    act(*a, **kw)
                return out

            return f

        return make

    def _need(self, owner, names):
        missing = [n for n in names if not hasattr(owner, n)]
        if missing:
            raise UsageError(
                f"--comm-log: this torch's {owner.__name__} lacks {', '.join(missing)}: FSDP's schedule "
                "cannot be recorded on it"
            )

    def _install_fsdp2(self):
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        self._need(FSDPParamGroup, ["unshard", "wait_for_unshard", "reshard", "post_backward", "_prefetch_unshard"])
        self._need(FSDPState, ["_pre_backward"])

        def unit_of(group, *a, **kw):
            mods = getattr(group, "modules", None) or (group.module,)
            return self.unit_of[id(mods[0])]

        def waited(group, *a, **kw):
            self.waited_all_gather(unit_of(group))

        def resharded(group, *a, **kw):
            # freed to its shard, or (an integer reshard_after_forward) to its post-forward slice
            if group.is_sharded or getattr(group, "is_sharded_post_forward", False):
                self.freed(unit_of(group))

        def pre_backward(state, *a, **kw):
            # the state's, not the group's: the state prefetches after its
            # groups' pre_backward (explicit backward prefetch), still before
            # autograd computes the unit
            self.backward_of(self.unit_of[id(state._modules[0])])

        for name, make in (
            ("unshard", self._within(unit_of)),
            ("wait_for_unshard", self._after(waited)),
            ("reshard", self._after(resharded)),
            ("post_backward", self._within(unit_of, first=self.ends_backward)),
        ):
            self.patch(FSDPParamGroup, name, make)
        self.patch(FSDPState, "_pre_backward", self._after(pre_backward))
        # a staticmethod: patched as one
        orig = FSDPParamGroup.__dict__["_prefetch_unshard"]
        fn = orig.__func__ if isinstance(orig, staticmethod) else orig
        prefetch = self._within(unit_of, prefetch=True)
        FSDPParamGroup._prefetch_unshard = staticmethod(functools.wraps(fn)(prefetch(fn)))
        self.undo.append((FSDPParamGroup, "_prefetch_unshard", orig))

    def _install_fsdp1(self):
        from torch.distributed.fsdp import _runtime_utils as R

        self._need(R, ["_unshard", "_reshard", "_pre_backward_hook", "_post_backward_hook", "_prefetch_handle"])

        def unit_of(state, handle, *a, **kw):
            return None if handle is None else self.unit_of[id(handle._fully_sharded_module)]

        def resharded(state, handle, free_unsharded_flat_param, *a, **kw):
            if free_unsharded_flat_param:
                self.freed(unit_of(state, handle))

        def pre_backward(state, module, handle, *a, **kw):
            if handle is not None:
                self.backward_of(unit_of(state, handle))

        for name, make in (
            ("_unshard", self._within(unit_of)),
            ("_reshard", self._after(resharded)),
            ("_pre_backward_hook", self._after(pre_backward)),
            ("_post_backward_hook", self._within(unit_of, first=self.ends_backward)),
            # the prefetch's own _unshard names the unit; this flags it
            ("_prefetch_handle", self._within(lambda *a, **kw: self.unit, prefetch=True)),
        ):
            self.patch(R, name, make)

    # -- output -----------------------------------------------------------------

    def write(self, path):
        with open(path, "w") as f:
            f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in self.events)


def gather_to(path, parts):
    """Rank 0: the ranks' logs, one after another, into path (each rank's
    events stay in its issue order, which is all the reader asks)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        for p in parts:
            with open(p) as f:
                out.write(f.read())
            os.remove(p)
    os.replace(tmp, path)
