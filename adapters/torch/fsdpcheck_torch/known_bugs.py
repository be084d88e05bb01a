"""Known upstream PyTorch bugs `check` names when a failure has their signature.

Kept small and sourced: each entry is a bug fsdpcheck itself reproduced, with
its upstream issue, the torch versions it was seen on and where it is gone,
its signature as `check` sees it, and the workaround. A signature names the
bug only when everything in it holds; the verdict (exit 1) stands either way,
since a known bug is still a wrong result.
"""

import os
import re
from dataclasses import dataclass

from .lora import has_lora


def _versions(text):
    """The (major, minor, patch) versions a seen_on / clean_on text names."""
    return [tuple(int(x) for x in m.groups()) for m in re.finditer(r"(?<![#\d.])(\d+)\.(\d+)\.(\d+)", text)]


@dataclass(frozen=True)
class KnownBug:
    issue: str
    title: str
    seen_on: str  # torch versions fsdpcheck reproduced it on
    clean_on: str  # versions where the same check passes
    signature: str
    workaround: str

    def present_on(self, version):
        """Whether this bug is in torch `version` ((major, minor, patch)), as far
        as fsdpcheck measured: True from the first version it was seen on through
        the last, False from the first clean version after them on (and, for a
        regression, through the clean versions before them), None elsewhere (not
        measured: either verdict may come)."""
        seen, clean = _versions(self.seen_on), _versions(self.clean_on)
        if min(seen) <= version <= max(seen):
            return True
        fixed = [v for v in clean if v > max(seen)]  # an open bug has none
        if fixed and version >= min(fixed):
            return False
        before = [v for v in clean if v < min(seen)]  # a regression's clean versions come first
        if before and min(before) <= version <= max(before):
            return False
        return None

    def line(self):
        return (
            f"known PyTorch bug {self.issue}: {self.title} (seen on torch {self.seen_on}; "
            f"clean on {self.clean_on}). Workaround: {self.workaround}"
        )


GLOO_AVG = KnownBug(
    issue="pytorch#162338",
    title="FSDP2 on gloo computes the reduce-scatter AVG as a SUM, every gradient W x too large "
    "(under HSDP, the shard group's size x)",
    seen_on="2.7.1, 2.8.0",
    clean_on="2.9.0, 2.11.0, 2.15.0",
    signature="FSDP2, gloo, AVG reduction, a shard group of S > 1 ranks: every step-0 gradient is exactly "
    "S x the reference's (S = W but under HSDP)",
    workaround="--force-sum-reduction (FSDP2 sums, then divides itself) on a torch that has "
    "set_force_sum_reduction_for_comms, or a newer torch",
)

FSDP1_OFFLOAD_SEGV = KnownBug(
    issue="pytorch#188989",
    title="FSDP1's full state dict with offload_to_cpu frees a flat parameter already on the CPU "
    "(FlatParamHandle.to_cpu in _full_post_state_dict_hook), SIGSEGV",
    seen_on="2.7.1, 2.8.0, 2.11.0",
    clean_on="2.15.0 (fixed by pytorch#188990)",
    signature="FSDP1 on --device cpu, a checkpoint (--ckpt-at), a rank dies of SIGSEGV in the state-dict code",
    workaround="a FULL_STATE_DICT with offload_to_cpu=False on a CPU device, or a torch with pytorch#188990",
)

GLOO_NO_AVG = KnownBug(
    issue="pytorch#149781",
    title="ProcessGroupGloo has no ReduceOp.AVG for all_reduce, which FSDP2 uses across replicas "
    "(HSDP's replicate dimension, or no_shard's (W, 1) mesh): RuntimeError at the first backward",
    seen_on="2.7.1",
    clean_on="2.8.0, 2.9.0, 2.11.0, 2.15.0 (AVG added to gloo by pytorch#149781)",
    signature='FSDP2 with a replicate mesh dimension on gloo: "Cannot use ReduceOp.AVG with Gloo"',
    workaround="a torch with pytorch#149781, or --reduce-dtype fp16 (pre/post divide with SUM)",
)

FSDP1_HSDP_NO_REPLICATE = KnownBug(
    issue="pytorch#154888",
    title="FSDP1's HYBRID_SHARD on a (W, 1) mesh (a shard group of one rank) falls back to NO_SHARD "
    "over that one-rank group and never all-reduces across the replicas: each rank steps on its own "
    "gradient and the replicas drift apart",
    seen_on="2.7.1, 2.8.0, 2.9.0, 2.11.0, 2.15.0",
    clean_on="none measured (not fixed upstream: closed as not planned; FSDP2 on the same mesh is right)",
    signature="FSDP1, hybrid_shard or hybrid_shard_zero2 with --shard-group 1, W > 1: every step-0 "
    "gradient is the reference's with HSDP's replicate all-reduce skipped (--inject hsdp_no_replicate), "
    "to rounding",
    workaround="--strategy no_shard (FSDP1 all-reduces over the world), a shard group of 2 or more ranks, or FSDP2",
)

FSDP2_DIVIDE_FACTOR_SHARD1 = KnownBug(
    issue="pytorch#167178",
    title="FSDP2 with set_gradient_divide_factor(F) on a one-rank shard group (W = 1, or HSDP with a "
    "shard group of 1) still runs a one-rank reduce-scatter with PREMUL_SUM(1/F), which gloo gets wrong: "
    "2.8's gloo runs it as a plain copy (the divide never happens, every gradient F x too large), 2.9's "
    "refuses it (RuntimeError at the first backward)",
    seen_on="2.8.0, 2.9.0",
    clean_on="2.11.0, 2.15.0 (FSDP2 skips a one-rank reduce-scatter, pytorch#162021, and divides by F "
    "itself, pytorch#167178)",
    signature="FSDP2, --gradient-divide-factor F (not the data-parallel size), a shard group of one rank, "
    "no --force-sum-reduction, fp32/bf16 reduce: every step-0 gradient is exactly F x the reference's "
    '(2.8), or "Cannot use ReduceOp.PREMUL_SUM with Gloo" (2.9)',
    workaround="--force-sum-reduction (SUM collectives; FSDP2 post-divides by F itself), or a newer torch",
)

FSDP2_DIVIDE_FACTOR_TWICE = KnownBug(
    issue="unreported upstream (a regression of pytorch#167178's one-rank divide)",
    title="FSDP2 with set_gradient_divide_factor(F) on a one-rank shard group divides by F twice when "
    "the factor is applied outside the collective (--force-sum-reduction, or an fp16 reduce): once in "
    "the one-rank copy, once more as the post-divide; every gradient 1/F of the right one",
    seen_on="2.11.0, 2.15.0",
    clean_on="2.8.0, 2.9.0 (before the one-rank copy divided by F)",
    signature="FSDP2, --gradient-divide-factor F != 1, a shard group of one rank, --force-sum-reduction "
    "or --reduce-dtype fp16: every step-0 gradient is exactly 1/F x the reference's",
    workaround="no --force-sum-reduction with an fp32/bf16 reduce (the one-rank copy then divides once), "
    "or a shard group of 2 or more ranks",
)

FSDP2_CLIP_INF_EMPTY_SHARD = KnownBug(
    issue="unreported upstream (docs/repro/fsdp2-clip-inf-empty-shard.md)",
    title="clip_grad_norm_(norm_type=inf) on FSDP2's parameters raises on a rank whose shard of a "
    "parameter is empty (fewer rows than ranks): the maximum of an empty local tensor has no identity; "
    "the other ranks wait in the norm's all-reduce",
    seen_on="2.7.1, 2.8.0, 2.9.0, 2.11.0, 2.15.0",
    clean_on="none measured",
    signature='FSDP2, --norm-type inf, a parameter with fewer rows than W: a rank dies of "cannot compute '
    'the inf(inity) norm on an empty tensor" in clip_grad_norm_',
    workaround="--norm-type 2 (or 1), or a world size that gives every rank rows of every parameter",
)

FSDP2_RAF_INT_FROZEN_ACCUM = KnownBug(
    issue="unreported upstream (docs/repro/fsdp2-raf-int-frozen-accum.md)",
    title="FSDP2 with an integer reshard_after_forward R: a unit whose parameters are all frozen and that "
    "no backward runs through is all-gathered in the next forward with the R-rank post-forward shards' "
    "split sizes after a backward under set_is_last_backward(False); every rank raises in the copy-out",
    seen_on="2.7.1, 2.8.0, 2.9.0, 2.11.0, 2.15.0",
    clean_on="none measured",
    signature="FSDP2, --reshard-after-forward R (an integer), a whole unit frozen that no backward runs through "
    "(--freeze layers.0 on an mlp; the matcher asks for --freeze or LoRA), "
    '--grad-accum >= 2: the ranks die of "split_with_sizes expects split_sizes to sum exactly to" in '
    "FSDP2's all-gather copy-out (_fsdp_collectives.py)",
    workaround="--reshard-after-forward true (or false), or gradient accumulation with every backward "
    "the last (set_is_last_backward(True) on each micro-batch)",
)

CATALOGUE = (
    GLOO_AVG,
    FSDP1_OFFLOAD_SEGV,
    GLOO_NO_AVG,
    FSDP1_HSDP_NO_REPLICATE,
    FSDP2_DIVIDE_FACTOR_SHARD1,
    FSDP2_DIVIDE_FACTOR_TWICE,
    FSDP2_CLIP_INF_EMPTY_SHARD,
    FSDP2_RAF_INT_FROZEN_ACCUM,
)


def torch_version():
    """The installed torch's (major, minor, patch), or None."""
    from .env import installed_version

    v = _versions(installed_version("torch") or "")
    return v[0] if v else None


def gone_from_this_torch(line):
    """Whether the bug a naming line names is one fsdpcheck measured absent from the installed torch."""
    v = torch_version()
    bug = next((b for b in CATALOGUE if line.startswith(f"known PyTorch bug {b.issue}:")), None)
    return bool(v and bug and bug.present_on(v) is False)


def match_crash(api, device, ckpt_at, failures, cfg=None):
    """The known bug a crashed run's failures (failure.Failure) show, or None;
    cfg, the run config, where a signature needs more than the crash."""
    cfg = cfg or {}
    for f in failures:
        if api == "fsdp2" and f.kind == "error" and "Cannot use ReduceOp.AVG with Gloo" in f.what:
            return GLOO_NO_AVG
        if api == "fsdp2" and f.kind == "error" and "Cannot use ReduceOp.PREMUL_SUM with Gloo" in f.what:
            return FSDP2_DIVIDE_FACTOR_SHARD1  # only a one-rank shard group gets here: check refuses the rest
        # 2.8, 2.9: linalg.vector_norm's "inf norm"; from 2.11 _foreach_norm's "infinity norm"
        if (
            api == "fsdp2"
            and f.kind == "error"
            and re.search(r"cannot compute the inf(inity)? norm on an empty", f.what)
        ):
            return FSDP2_CLIP_INF_EMPTY_SHARD
        if (
            api == "fsdp2"
            and f.kind == "error"
            and "split_with_sizes expects split_sizes to sum exactly to" in f.what
            and "_fsdp_collectives.py" in f.where
            and type(cfg.get("reshard_after_forward")) is int
            and cfg.get("grad_accum", 1) >= 2
            and (cfg.get("freeze") or has_lora(cfg))
        ):
            return FSDP2_RAF_INT_FROZEN_ACCUM
        if (
            api == "fsdp1"
            and device == "cpu"
            and ckpt_at
            and f.kind == "signal"
            and f.what == "SIGSEGV"
            and "_state_dict_utils.py" in f.text  # FSDP1's state-dict hooks
        ):
            return FSDP1_OFFLOAD_SEGV
    return None


def match_gloo_avg(api, backend, world, force_sum, ratios, tol=1e-3, shard=None):
    """ratios: per gradient tensor of step 0, <B, A> / <A, A> and the relative
    residual |B - rA| / |B| (the torch gradient B against the reference's A).
    The signature of pytorch#162338: every tensor B = S A, to rounding, S the
    reduce-scatter's group (shard, default world: HSDP's replicate all-reduce
    averages right)."""
    S = shard or world
    if api != "fsdp2" or backend != "gloo" or S < 2 or force_sum:
        return None
    return GLOO_AVG if _all_times(ratios, S, tol) else None


def _all_times(ratios, k, tol):
    """Whether every tensor's ratio (see match_gloo_avg) is B = k A, to rounding."""
    return bool(ratios) and all(abs(r - k) <= tol * k and resid <= tol for r, resid in ratios)


def match_hsdp_no_replicate(api, strategy, shard_group, world, ratios, tol=1e-3):
    """ratios as match_gloo_avg's, but of torch's gradients against the reference
    run with --inject hsdp_no_replicate (each rank keeps its shard group's
    gradient). The signature of pytorch#154888: every tensor B = 1 x that, to
    rounding, where FSDP1's shard group has one rank."""
    if api != "fsdp1" or not strategy.startswith("hybrid") or shard_group != 1 or world < 2:
        return None
    return FSDP1_HSDP_NO_REPLICATE if _all_times(ratios, 1.0, tol) else None


def match_divide_factor_shard1(api, shard_ranks, factor, dp_size, force_sum, reduce_dtype, ratios, tol=1e-3):
    """ratios as match_gloo_avg's. The signature of pytorch#167178: FSDP2 with a
    gradient divide factor F other than the data-parallel size dp_size on a
    one-rank shard group gives every tensor B = F A, to rounding (the divide
    never happens; fp16 and force-sum take the pre/post divide path instead)."""
    if api != "fsdp2" or shard_ranks != 1 or not factor or factor in (1, dp_size) or force_sum:
        return None
    if reduce_dtype == "fp16":
        return None
    return FSDP2_DIVIDE_FACTOR_SHARD1 if _all_times(ratios, float(factor), tol) else None


def match_divide_factor_twice(api, shard_ranks, factor, force_sum, reduce_dtype, ratios, tol=1e-3):
    """ratios as match_gloo_avg's. FSDP2 with a gradient divide factor F != 1 on a
    one-rank shard group, the factor applied outside the collective (force-sum,
    or fp16's pre/post divide): every tensor B = A / F, to rounding."""
    if api != "fsdp2" or shard_ranks != 1 or not factor or factor == 1:
        return None
    if not force_sum and reduce_dtype != "fp16":
        return None
    return FSDP2_DIVIDE_FACTOR_TWICE if _all_times(ratios, 1.0 / factor, tol) else None


def step0_ratios(ref_dir, torch_dir):
    """Per gradient tensor of step 0 (all-zero ones left out): <B, A> / <A, A>
    and the relative residual |B - rA| / |B|, torch's B in torch_dir against
    the reference's A in ref_dir; None where either file cannot be read."""
    import torch
    from safetensors import safe_open

    name = "step-000000.safetensors"
    ratios = []
    try:
        with (
            safe_open(os.path.join(ref_dir, name), "pt") as fa,
            safe_open(os.path.join(torch_dir, name), "pt") as fb,
        ):
            for k in fa.keys():  # noqa: SIM118 (safe_open is not a dict)
                if not k.startswith("grad."):
                    continue
                a, b = fa.get_tensor(k).double(), fb.get_tensor(k).double()
                aa = float(torch.dot(a.flatten(), a.flatten()))
                if aa == 0.0:
                    continue
                r = float(torch.dot(b.flatten(), a.flatten())) / aa
                nb = float(b.norm())
                ratios.append((r, float((b - r * a).norm()) / nb if nb else 0.0))
    except Exception:  # noqa: BLE001 (a trace compare already judged; no signature then)
        return None
    return ratios


def measured(ratios, what):
    lo, hi = min(r for r, _ in ratios), max(r for r, _ in ratios)
    return f"  measured: all {len(ratios)} gradients of step 0 are B = {lo:.4f} .. {hi:.4f} x {what}"
