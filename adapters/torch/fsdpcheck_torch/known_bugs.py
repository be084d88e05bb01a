"""Known upstream PyTorch bugs `check` names when a failure has their signature.

Kept small and sourced: each entry is a bug fsdpcheck itself reproduced, with
its upstream issue, the torch versions it was seen on and where it is gone,
its signature as `check` sees it, and the workaround. A signature names the
bug only when everything in it holds; the verdict (exit 1) stands either way,
since a known bug is still a wrong result.
"""

import re
from dataclasses import dataclass


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
        the last, False from the first clean version on, None between (not
        measured: either verdict may come)."""
        seen, clean = _versions(self.seen_on), _versions(self.clean_on)
        if min(seen) <= version <= max(seen):
            return True
        if version >= min(clean):
            return False
        return None

    def line(self):
        return (
            f"known PyTorch bug {self.issue}: {self.title} (seen on torch {self.seen_on}; "
            f"clean on {self.clean_on}). Workaround: {self.workaround}"
        )


GLOO_AVG = KnownBug(
    issue="pytorch#162338",
    title="FSDP2 on gloo computes the reduce-scatter AVG as a SUM, every gradient W x too large",
    seen_on="2.7.1, 2.8.0",
    clean_on="2.11.0, 2.15.0",
    signature="FSDP2, gloo, AVG reduction, W > 1: every step-0 gradient is exactly W x the reference's",
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
    clean_on="2.11.0, 2.15.0 (AVG added to gloo by pytorch#149781)",
    signature='FSDP2 with a replicate mesh dimension on gloo: "Cannot use ReduceOp.AVG with Gloo"',
    workaround="a torch with pytorch#149781, or --reduce-dtype fp16 (pre/post divide with SUM)",
)

CATALOGUE = (GLOO_AVG, FSDP1_OFFLOAD_SEGV, GLOO_NO_AVG)


def match_crash(api, device, ckpt_at, failures):
    """The known bug a crashed run's failures (failure.Failure) show, or None."""
    for f in failures:
        if api == "fsdp2" and f.kind == "error" and "Cannot use ReduceOp.AVG with Gloo" in f.what:
            return GLOO_NO_AVG
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


def match_gloo_avg(api, backend, world, force_sum, ratios, tol=1e-3):
    """ratios: per gradient tensor of step 0, <B, A> / <A, A> and the relative
    residual |B - rA| / |B| (the torch gradient B against the reference's A).
    The signature of pytorch#162338: every tensor B = W A, to rounding."""
    if api != "fsdp2" or backend != "gloo" or world < 2 or force_sum or not ratios:
        return None
    for r, resid in ratios:
        if abs(r - world) > tol * world or resid > tol:
            return None
    return GLOO_AVG
