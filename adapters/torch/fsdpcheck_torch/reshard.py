"""FSDP2's DCP checkpoint saved at one world size and loaded at another (the
sweep's --reload-world W2), judged against the reference.

A check at W with `--ckpt-at K --ckpt-state-dict sharded --keep DIR` leaves
DIR/ref (the reference's plan), DIR/torch (torch's run, judged step by step
against the reference) and DIR/torch/ckpt (DCP's files, saved before step K).
Torch at W2 then resumes that checkpoint (`run --load DIR/torch/ckpt`) for the
steps after K, into DIR/reload-W2, and `fsdpcheck compare DIR/torch
DIR/reload-W2` judges the resumed run: step K along the recorded trajectories
against the saving run's step K (itself judged in lockstep against the
reference), every later step in lockstep, the reference re-running it from
the resumed run's own state. A checkpoint that loads wrong (rows resharded to
the wrong ranks, a state dropped) diverges at step K.
"""

import os

from . import check
from .errors import UsageError


class Reload:
    """One resumed run: duck-types check.Job where check.run_torch,
    check.torch_failure and check.compare read it."""

    def __init__(self, argv, world):
        self.opts, flags, self.cfg, _, self.api = check.parse(argv)
        if self.api != "fsdp2" or self.opts.get("--ckpt-state-dict") != "sharded" or "--keep" not in self.opts:
            raise UsageError("a reload needs a check of --api fsdp2 with --ckpt-state-dict sharded and --keep DIR")
        keep = self.opts["--keep"]
        self.world, self.timeout = world, self.opts["--timeout"]
        self.ref_dir = os.path.join(keep, "torch")  # compare's A: the run that saved the checkpoint
        self.torch_dir = os.path.join(keep, f"reload-W{world}")
        self.like = os.path.join(keep, "ref")
        self.ckpt = os.path.join(self.ref_dir, "ckpt")
        rest = self.cfg["steps"] - int(self.opts["--ckpt-at"])
        self.flags = [*flags, "--steps", str(rest)]
        self.t = {"plan_s": 0.0, "torch_s": 0.0, "compare_s": 0.0}
        # the resumed run's own: --load, not the saving check's --ckpt-at
        self.opts = {k: v for k, v in self.opts.items() if k not in ("--ckpt-at", "--ckpt-state-dict", "--report")}

    def torch_args(self):
        a = ["run"]
        for k in ("--api", "--device", "--backend"):
            if k in self.opts:
                a += [k, self.opts[k]]
        if self.opts.get("--force-sum-reduction"):
            a.append("--force-sum-reduction")
        return a + self.flags + ["--like", self.like, "--load", self.ckpt, "--trace", self.torch_dir]

    def command(self):
        """The resumed run and its compare, as a person would type them."""
        run = " ".join(check.torchrun_cmd(self.world, self.torch_args(), "LOGDIR")[2:])
        return f"torchrun {run}; fsdpcheck compare {self.ref_dir} {self.torch_dir}"


def judge(job, p, fails, fsdpcheck, env):
    """(exit code, text) of one resumed run: check.judge's crash verdict, else compare's."""
    done = os.path.exists(os.path.join(job.torch_dir, "trace.json"))
    err = os.path.exists(os.path.join(job.torch_dir, "error.txt"))
    if not done or err or p.returncode != 0:
        raise check.torch_failure(job, p, fails)
    rc, text = check.compare(job, fsdpcheck, env)
    return rc, f"reloaded at W={job.world}: {job.command()}\n{text}"


def run_reloads(items):
    """items: (the argv of a check that passed and kept its DCP checkpoint, W2).
    One (exit code, text, timing) each, as check.run_checks gives them: the
    resumed runs of each W2 share one torchrun."""
    results = [None] * len(items)
    jobs, groups = {}, {}
    for i, (argv, world) in enumerate(items):
        try:
            jobs[i] = Reload(argv, world)
            groups.setdefault(world, []).append(i)
        except UsageError as e:
            results[i] = check.outcome(e) + ({},)
    if not jobs:
        return results
    env = check.env_for_runs()
    fsdpcheck = check.find_fsdpcheck(next(iter(jobs.values())).opts.get("--fsdpcheck"))
    for idx in groups.values():
        try:
            p, fails = check.run_torch([jobs[i] for i in idx], env)
        except check.Hung as e:
            for i in idx:
                results[i] = check.outcome(e) + (jobs[i].t,)
            continue
        for i in idx:
            try:
                results[i] = judge(jobs[i], p, fails, fsdpcheck, env) + (jobs[i].t,)
            except (UsageError, RuntimeError, check.Crash, check.Hung) as e:
                results[i] = check.outcome(e) + (jobs[i].t,)
    return results
