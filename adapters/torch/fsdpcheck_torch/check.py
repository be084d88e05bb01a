"""`fsdpcheck-torch check`: the reference's plan, then torch on the same config,
then `fsdpcheck compare`; prints the verdict and exits 0, 1 or 2 as fsdpcheck does.

  fsdpcheck-torch check --api fsdp1|fsdp2 [-n W] [--device D] [--backend B]
      [run flags] [--inject FAULT] [--ckpt-at K [--ckpt-state-dict full|sharded]] [--force-sum-reduction]
      [--optim-state-offload] [--schedule] [--keep DIR] [--report FILE.md]
      [--fsdpcheck PATH] [--mpiexec PATH] [--quiet]

The reference plans the run as `fsdpcheck plan --world W [run flags] --trace
DIR/ref`: its initial weights and every step's batch, no step run, with the
gradient divide the torch API uses (FSDP1: pre/post factors; FSDP2 in
fp32/bf16: one AVG collective, which gloo computes as a sum then a divide;
fp16: pre/post), unless --divide is given. Torch runs with
`torchrun --nproc-per-node W -m fsdpcheck_torch run ... --like DIR/ref`,
started beside the plan (its ranks open DIR/ref once the plan is written:
planwait; several checks at once plan first, then start torch), and
compare judges every torch step in lockstep: the reference re-runs it from
torch's own state before it, the first from torch's initial weights (which
must be the plan's, bit for bit) and a fresh optimizer. Only a failed check
that a known bug's signature may explain runs the reference itself, `mpiexec
-n W fsdpcheck run [run flags] --steps 1` (--mpiexec), to measure that
signature against its step 0: FSDP2 on gloo (pytorch#162338), FSDP2 with a
divide factor on a one-rank shard group (pytorch#167178, and its double
divide under force-sum or fp16), and FSDP1's hybrid
strategies on a one-rank shard group, against the reference's run with
--inject hsdp_no_replicate (pytorch#154888).
--schedule also records the collectives torch FSDP issues (run --comm-log) and
judges them with `fsdpcheck schedule --api torch-fsdpN` (P10, the oracle's own
rules): the check fails if either the numbers or the schedule do.
The optimizer state is read through torch.distributed.checkpoint's full
optimizer state dict (FSDP1), or straight from `optim.state` (FSDP2);
--optim-state-offload reads it through that state dict with cpu_offload=True,
for either API (on the CPU, FSDP1's then aliases exp_avg to exp_avg_sq).
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import strictjson
from .config import (
    APIS,
    DEFAULT_BACKEND,
    FAULTS,
    UsageError,
    apply_flags,
    default_config,
    freeze_unsupported,
    fsdp2_only,
    inject_refusal,
    lora_flag,
    premul_refusal,
    shard_size,
    validate,
)
from .env import find_fsdpcheck, gather_mode

OWN = {
    "--api": True,
    "-n": True,
    "--world": True,
    "--device": True,
    "--backend": True,
    "--inject": True,
    "--ckpt-at": True,
    "--ckpt-state-dict": True,
    "--force-sum-reduction": False,
    "--optim-state-offload": False,
    "--schedule": False,
    "--xla-mesh": True,
    "--keep": True,
    "--report": True,
    "--fsdpcheck": True,
    "--mpiexec": True,
    "--quiet": False,
    "--timeout": True,
}
TORCH_PASS = ("--api", "--device", "--backend", "--inject", "--ckpt-at", "--ckpt-state-dict", "--xla-mesh")
TORCH_PASS_BOOL = ("--force-sum-reduction", "--optim-state-offload")


def model_stub(flags):
    """A model dict for validating flags before any run (the trace has the real one)."""
    name = "mlp-tiny"
    for i, f in enumerate(flags):
        if f == "--model" and i + 1 < len(flags):
            name = flags[i + 1]
    if name.startswith("gpt2"):
        return {"model_type": "gpt2", "n_positions": {"gpt2-micro": 8, "gpt2-tiny": 32}.get(name, 1024)}
    if name.startswith("llama"):
        return {"model_type": "llama", "max_position_embeddings": {"llama-micro": 8, "llama-tiny": 32}.get(name, 2048)}
    if name.startswith("mlp"):
        return {"model_type": "fsdpcheck-mlp"}
    try:
        with open(name, "rb") as f:
            m = strictjson.loads(f.read())  # nesting too deep is a ValueError there, as a key given twice
    except (OSError, ValueError, UnicodeDecodeError):
        m = None
    # anything else the file gets wrong, the reference says, naming the file
    return m if isinstance(m, dict) else {"model_type": "unknown"}


def backend_of(opts):
    """The torch run's backend: --backend, else the device's default (config.DEFAULT_BACKEND)."""
    return opts.get("--backend") or DEFAULT_BACKEND.get(opts.get("--device", "cpu"), "")


def reference_divide(api, cfg, world, force_sum, backend="gloo"):
    if api == "fsdp1" or world == 1 or cfg["reduce_dtype"] == "fp16":
        return "prepost"
    # FSDP2's set_gradient_divide_factor(F) other than the shard group's size, without
    # force-sum: ReduceOp.PREMUL_SUM(1/F), each rank's gradient times 1/F, then summed
    # (gloo cannot run it: premul_refusal)
    F = cfg.get("gradient_divide_factor")
    if F and not force_sum and backend != "gloo" and F != shard_size(api, cfg, world):
        return "avg"
    # FSDP2's AVG (fp32, bf16): gloo sums then divides (ProcessGroupGloo AVG);
    # with force_sum_reduction_for_comms FSDP2 sums and post-divides itself
    return "sum-then-divide"


def torchrun_cmd(world, args, log_dir):
    """torchrun for world ranks of `fsdpcheck_torch ARGS`. Its run directory goes
    under log_dir, which the caller removes: without --log-dir torchrun makes a
    /tmp/torchelastic_* directory per run and leaves it there."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        f"--log-dir={log_dir}",
        "-m",
        "fsdpcheck_torch",
    ] + args


# the environment variable by which a one-process XLA run learns the W its check asked for
XLA_WORLD = "FSDPCHECK_TORCH_XLA_WORLD"


def launch_cmd(world, args, log_dir, device, env):
    """(command, environment) of the torch side: torchrun for world ranks, or for --device xla one
    process driving every device (SPMD), told W; on XLA's CPU client (PJRT_DEVICE=CPU, the default
    where none is set) that is W virtual devices."""
    if device != "xla":
        return torchrun_cmd(world, args, log_dir), env
    env = dict(env, **{XLA_WORLD: str(world)})
    env.setdefault("PJRT_DEVICE", "CPU")
    if env["PJRT_DEVICE"] == "CPU":
        env["CPU_NUM_DEVICES"] = str(world)
    return [sys.executable, "-m", "fsdpcheck_torch"] + args, env


# glibc's malloc advises its large mappings to transparent huge pages (glibc
# 2.35+; an older glibc ignores a tunable it does not know). Measured on the
# gpt2-124m bench check, three interleaved pairs (README "Huge pages"): torch's
# part 33.9 / 32.6 / 38.2 s without it, 30.5 / 26.7 / 31.0 s with it, rank 0's
# trace writing 12.7 / 11.4 / 12.8 s -> 3.9 / 3.1 / 3.0 s. The same advice in
# fsdpcheck's own allocations made its reference run slower in those pairs
# (17.7 / 17.2 / 16.7 s -> 18.5 / 19.4 / 20.3 s) and compare no faster, so the
# C side does not take it: this is for the torch ranks.
HUGE_PAGES = "glibc.malloc.hugetlb=1"


def with_huge_pages(tunables):
    """GLIBC_TUNABLES with HUGE_PAGES added, unless it already says hugetlb
    (a user's own choice, 0 included, stands)."""
    if not tunables:
        return HUGE_PAGES
    if "glibc.malloc.hugetlb=" in tunables:
        return tunables
    return f"{tunables}:{HUGE_PAGES}"


def env_for_torch(env):
    """The environment of the torch ranks: env_for_runs()'s with HUGE_PAGES."""
    return dict(env, GLIBC_TUNABLES=with_huge_pages(env.get("GLIBC_TUNABLES", "")))


def env_for_runs():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HWLOC_COMPONENTS", "-pci,-x86")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def parse(argv):
    from .flags import split_args

    opts, flags = split_args(argv, OWN)
    api = opts.get("--api")
    if api not in APIS:
        raise UsageError(
            "check: --api fsdp1|fsdp2 is required" if api is None else f"--api {api!r}: not fsdp1 or fsdp2"
        )
    w = opts.get("-n", opts.get("--world", "2"))
    try:
        world = int(w)
    except ValueError:
        raise UsageError(f"-n: not an integer: {w!r}")
    if not 1 <= world <= 64:
        raise UsageError(f"-n {world}: must be in 1..64")
    inject = opts.get("--inject", "none")
    if inject not in FAULTS:
        raise UsageError(f"--inject {inject!r}: this adapter injects {', '.join(FAULTS[1:])}")
    t = opts.get("--timeout", "900")
    try:
        timeout = float(t)
    except ValueError:
        raise UsageError(f"--timeout: not a number of seconds: {t!r}")
    if not timeout > 0 or timeout == float("inf"):
        raise UsageError(f"--timeout {t}: must be a positive, finite number of seconds")
    opts["--timeout"] = timeout
    if opts.get("--schedule") and "--ckpt-at" in opts:
        raise UsageError("--schedule with --ckpt-at: the schedule is recorded for one model, not across a reload")
    # FSDP's default strategy (fsdpcheck run's default is local, which is not FSDP);
    # a --strategy or an fsdp_config sharding_strategy later in the flags wins
    flags = ["--strategy", "full_shard"] + flags
    base = default_config()
    base["model"] = model_stub(flags)
    cfg, _ = apply_flags(base, flags, opts.get("--device", "cpu"))
    lora_flag(cfg, cfg.pop("_model_flag", None) or "mlp-tiny")  # fsdpcheck run's default model
    validate(cfg, world)
    if api == "fsdp1" and opts.get("--device") == "xla":
        from .xla import classic_refusal

        if classic_refusal(world):
            raise UsageError(classic_refusal(world))
    from .xla import mesh_flag

    mesh_flag(opts, api, opts.get("--device", "cpu"), world)
    from .config import unsupported

    why = unsupported(api, cfg, opts.get("--device", "cpu"))
    why = why or premul_refusal(api, cfg, world, backend_of(opts), opts.get("--force-sum-reduction"), inject)
    if why:
        raise UsageError(f"{api}: {why}")
    # refused before the reference runs, as the torch run would refuse them
    ckpt = "--ckpt-at" if "--ckpt-at" in opts else None
    why = freeze_unsupported(cfg, bool(opts.get("--schedule")), ckpt, api) or inject_refusal(inject, cfg)
    if why:
        raise UsageError(why)
    return opts, flags, cfg, world, api


class Job:
    """One check: its flags, config, and where its traces go."""

    def __init__(self, argv):
        self.opts, self.flags, self.cfg, self.world, self.api = parse(argv)
        gather_mode()  # FSDPCHECK_GATHER, refused here rather than by every torch rank
        self.keep = self.opts.get("--keep")
        self.work = self.keep or tempfile.mkdtemp(prefix="fsdpcheck-torch-")
        os.makedirs(self.work, exist_ok=True)
        self.ref_dir = os.path.join(self.work, "ref")
        self.torch_dir = os.path.join(self.work, "torch")
        self.timeout = self.opts["--timeout"]
        self.t = {"plan_s": 0.0, "torch_s": 0.0, "compare_s": 0.0}
        # FSDP2's prefetch lists and divide factor are the reference's under --fsdp-version 2 only
        # (the reference and `fsdpcheck schedule` refuse them with FSDP1's layout); no_shard, which has no
        # FSDP2 layout there (FSDP2's is a (W, 1) mesh of whole replicas), keeps FSDP1's, where a divide
        # factor is taken as it is
        v2 = self.api == "fsdp2" and fsdp2_only(self.cfg) and self.cfg["strategy"] != "no_shard"
        self.version_flags = ["--fsdp-version", "2"] if v2 else []

    def group(self):
        device = self.opts.get("--device", "cpu")
        # one XLA process runs either SPMD (FSDPv2) or not (classic XLA FSDP), never both
        return (self.world, device, self.opts.get("--backend", ""), self.api if device == "xla" else "")

    def torch_args(self):
        a = ["run"]
        for k in TORCH_PASS:
            if k in self.opts:
                a += [k, self.opts[k]]
        for k in TORCH_PASS_BOOL:
            if self.opts.get(k):
                a.append(k)
        if self.opts.get("--schedule"):
            a.append("--comm-log")
        return a + self.flags + ["--like", self.ref_dir, "--trace", self.torch_dir]

    def cleanup(self):
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def versioned_flags(job):
    """job's run flags with FSDP2's version flags, where it needs them. `--backward-prefetch pre` is then
    dropped: FSDP1's option, which the reference refuses under FSDP2's layout, where its implicit
    one-unit backward prefetch is what fully_shard does (config.py takes only `pre` for fsdp2)."""
    flags = list(job.flags) + job.version_flags
    if job.version_flags and "--backward-prefetch" in flags:
        i = flags.index("--backward-prefetch")
        del flags[i : i + 2]
    return flags


def reference_flags(job):
    """The run flags the reference takes for job: the user's, FSDP2's version
    flags, and the gradient divide of the torch API unless --divide is given."""
    flags = versioned_flags(job)
    if job.opts.get("--device") == "xla":
        from .xla import reference_flags as xla_flags

        flags = xla_flags(flags, job.cfg)
    if "--divide" not in job.flags:
        force_sum = job.opts.get("--force-sum-reduction")
        flags += ["--divide", reference_divide(job.api, job.cfg, job.world, force_sum, backend_of(job.opts))]
    return flags


def plan_reference(job, fsdpcheck, env):
    """`fsdpcheck plan`: the initial weights and every step's batch torch runs
    from (--like), in job.ref_dir. No step is run: compare re-runs each step."""
    cmd = [fsdpcheck, "plan", "--world", str(job.world)] + reference_flags(job) + ["--trace", job.ref_dir]
    t0 = time.time()
    p = run_bounded(cmd, env, job.timeout, "the reference's plan")
    job.t["plan_s"] = time.time() - t0
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        if p.returncode == 2:
            raise UsageError(f"the reference refused the config: {msg}")
        raise RuntimeError(f"the reference's plan failed (exit {p.returncode}): {msg}")
    job.t["plan_rss_mib"] = plan_rss(p.stdout)


def reference_step0(job, fsdpcheck, mpiexec, env, inject=None):
    """The reference's own run of step 0 at W ranks, its tensors traced, in
    DIR/ref-step0 (what a known bug's signature is measured against), with the
    reference's fault `inject` where given (DIR/ref-step0-INJECT), or None where
    it failed: the verdict already stands without it."""
    out = os.path.join(job.work, "ref-step0" + (f"-{inject}" if inject else ""))
    cmd = [mpiexec, "-n", str(job.world), fsdpcheck, "run"] + reference_flags(job) + ["--steps", "1", "--quiet"]
    cmd += ["--inject", inject] if inject else []
    try:
        p = run_bounded(cmd + ["--trace", out], env, job.timeout, "the reference's step 0")
    except Hung:
        return None
    return out if p.returncode == 0 else None


class Crash(Exception):
    """The implementation under test failed to finish its run: a verdict on
    it (exit 1), not bad input. Its message names each failing rank, its signal
    or exception, and where."""


class Hung(Exception):
    """A run that did not end within --timeout (exit 3, as fsdpcheck's watchdog)."""


# How long a run told to stop (SIGTERM) may take before it is killed.
GRACE_S = 30


def run_bounded(cmd, env, timeout, what):
    """subprocess.run for a launcher (mpiexec, torchrun) or one process: past
    `timeout` the whole run is stopped and Hung raised (Launched.finish)."""
    return Launched(cmd, env).finish(timeout, what)


class Launched:
    """A launcher (mpiexec, torchrun) or one process, started in a session of
    its own; its output goes through files, not pipes: nothing waits on a
    reader. Stopping it sends SIGTERM to that session's group: mpiexec and
    torchrun take their ranks down with them (torchrun's workers sit in
    sessions of their own, out of reach of a signal to its group); SIGKILL to
    the group after GRACE_S if it has not ended. The child is reaped with
    os.wait4, so finish's result carries its peak resident set (`peak_rss_mib`:
    the largest of the process and the descendants it waited for; for
    `fsdpcheck compare`, the process itself)."""

    def __init__(self, cmd, env):
        self.cmd = cmd
        # the run outlives this call: the files are closed once it has ended (_close)
        self.out = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115
        try:
            self.p = subprocess.Popen(
                cmd,
                stdout=self.out,
                stderr=self.err,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self._close()
            raise

    def _close(self):
        self.out.close()
        self.err.close()

    def stop(self):
        """Ends the run (SIGTERM, then SIGKILL after GRACE_S) and reaps it."""
        try:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGTERM)
            status, _ = _wait(self.p, GRACE_S)
            if status is None:
                # the launcher's own group only: a worker that outlived SIGTERM
                # is not waited for, the launcher is
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                _wait(self.p, None)
        finally:
            self._close()

    def finish(self, timeout, what):
        """The completed process once it ends; past `timeout` seconds from now
        it is stopped and Hung raised."""
        try:
            status, ru = _wait(self.p, timeout)
        except BaseException:
            self.stop()
            raise
        if status is None:
            self.stop()
            raise Hung(f"{what} did not finish within {timeout:.0f} s (--timeout): a hung rank or collective")
        try:
            self.out.seek(0)
            self.err.seek(0)
            done = subprocess.CompletedProcess(self.cmd, self.p.returncode, self.out.read(), self.err.read())
        finally:
            self._close()
        done.peak_rss_mib = ru.ru_maxrss / 1024.0  # Linux: KiB
        return done


def _wait(p, timeout):
    """(status, rusage) of p once it has ended, or (None, None) after timeout
    seconds (None: no limit). Sets p.returncode, so Popen never waits again."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return status, ru
        if deadline is not None and time.monotonic() >= deadline:
            return None, None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def plan_rss(stdout):
    """MiB from `fsdpcheck plan`'s "peak RSS (MiB): 12.5" line; None without one (--quiet)."""
    for line in stdout.splitlines():
        if line.startswith("peak RSS (MiB):"):
            return float(line.split(":")[1])
    return None


def run_torch(jobs, env, beside=None):
    """One torchrun for jobs of one world size (a --jobs file when several).
    Returns (the completed process, the ranks' failure reports). With beside
    (a function: the reference's plan of the one job), torch starts first and
    beside() runs while it starts; the ranks wait for its outcome before they
    read the plan (planwait). If beside raises, torch is stopped and the
    exception goes on."""
    from . import failure, planwait

    world = jobs[0].world
    report = tempfile.mkdtemp(prefix="fsdpcheck-torch-report-")
    log_dir = tempfile.mkdtemp(prefix="fsdpcheck-torch-log-")
    env = dict(env_for_torch(env), **{failure.ENV: report})
    flag = os.path.join(log_dir, "plan")
    if beside:
        env[planwait.ENV] = flag
    path = None
    if len(jobs) == 1:
        args = jobs[0].torch_args()
    else:
        fd, path = tempfile.mkstemp(prefix="fsdpcheck-torch-jobs-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([j.torch_args()[1:] for j in jobs], f)
        args = ["run", "--jobs", path]
    t0 = time.time()
    limit = sum(j.timeout for j in jobs)
    try:
        cmd, env = launch_cmd(world, args, log_dir, jobs[0].opts.get("--device", "cpu"), env)
        run = Launched(cmd, env)
        if beside:
            try:
                beside()
                planwait.write_outcome(flag, True)
            except BaseException:
                # the ranks wait for an outcome: told where it can be written, stopped in any case
                with contextlib.suppress(OSError):
                    planwait.write_outcome(flag, False)
                run.stop()
                raise
        p = run.finish(limit, "the torch run")
        fails = failure.collect(report)
    finally:
        if path:
            os.unlink(path)
        shutil.rmtree(report, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    dt = time.time() - t0
    for j in jobs:
        j.t["torch_s"] = dt / len(jobs)
    return p, fails


def launcher_failures(stderr):
    """The ranks torchrun's ChildFailedError summary names, for a rank that
    left no report of its own (killed by SIGKILL, say): "rank R: SIGNAL"."""
    import re
    import signal

    from .failure import Failure

    out = []
    for m in re.finditer(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", stderr):
        r, code = int(m.group(1)), int(m.group(2))
        try:
            what = signal.Signals(-code).name if code < 0 else f"exit code {code}"
        except ValueError:
            what = f"signal {-code}"
        out.append(Failure(r, "signal" if code < 0 else "error", what, "", ""))
    return out


def torch_failure(job, p, fails):
    """Why job's torch run did not give a trace to judge: UsageError (bad input,
    exit 2) or Crash (the implementation failed, exit 1)."""
    from . import known_bugs

    err = os.path.join(job.torch_dir, "error.txt")
    if os.path.exists(err):  # a job of a --jobs file: its own exception
        from .failure import parse_error

        with open(err) as f:
            fails = [parse_error(0, f.read())]
    if fails and all(f.kind == "usage" for f in fails):
        return UsageError(fails[0].what)
    if not fails:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("fsdpcheck-torch:")]
        if lines and p.returncode != 0:  # refused before any rank armed its report
            return UsageError(lines[0][len("fsdpcheck-torch: ") :])
        fails = launcher_failures(p.stderr)
    done = os.path.exists(os.path.join(job.torch_dir, "trace.json"))
    head = (
        f"the torch run ({job.api}) {'ended' if done else 'failed'}"
        + (f" with exit {p.returncode}" if p.returncode else "")
        + (" after writing its whole trace" if done else "")
        + ":"
    )
    lines = [f.line() for f in fails] or ["no rank left a report; the launcher's last lines:"] + [
        "  " + ln for ln in p.stderr.strip().splitlines()[-8:]
    ]
    bug = known_bugs.match_crash(job.api, job.opts.get("--device", "cpu"), job.opts.get("--ckpt-at"), fails, job.cfg)
    if bug:
        lines.append(bug.line())
    return Crash("\n  ".join([head] + lines))


def gloo_avg_applies(job):
    """Whether job could show pytorch#162338: FSDP2 on gloo at W >= 2, averaging."""
    if job.api != "fsdp2" or job.world < 2 or job.opts.get("--force-sum-reduction"):
        return False
    return job.opts.get("--backend", "gloo" if job.opts.get("--device", "cpu") == "cpu" else "") == "gloo"


def hsdp_no_replicate_applies(job):
    """Whether job could show pytorch#154888: FSDP1's hybrid strategies with a
    shard group of one rank at W >= 2, no fault injected."""
    hybrid = job.cfg["strategy"].startswith("hybrid")
    return (
        job.api == "fsdp1" and hybrid and job.cfg["shard_group"] == 1 and job.world > 1 and "--inject" not in job.opts
    )


def divide_factor_applies(job):
    """Whether job could show pytorch#167178: FSDP2 with a gradient divide factor
    other than the data-parallel size on a one-rank shard group, averaging."""
    F = job.cfg.get("gradient_divide_factor")
    if job.api != "fsdp2" or not F or F == job.world or job.opts.get("--force-sum-reduction"):
        return False
    return shard_size(job.api, job.cfg, job.world) == 1 and "--inject" not in job.opts


def divide_twice_applies(job):
    """Whether job could show the one-rank double divide (known_bugs.FSDP2_DIVIDE_FACTOR_TWICE):
    FSDP2 with a gradient divide factor F != 1 on a one-rank shard group, F applied
    outside the collective (force-sum, or an fp16 reduce)."""
    F = job.cfg.get("gradient_divide_factor")
    outside = job.opts.get("--force-sum-reduction") or job.cfg["reduce_dtype"] == "fp16"
    if job.api != "fsdp2" or not F or F == 1 or not outside or "--inject" in job.opts:
        return False
    return shard_size(job.api, job.cfg, job.world) == 1


def ratio_tol(job):
    # fp32: B = k A to rounding (1e-3 is far above it); 16-bit: the two runs'
    # own roundings differ by up to ~1e-2 of a tensor, far below any k - 1 named
    return 1e-3 if job.cfg["param_dtype"] == job.cfg["reduce_dtype"] == "fp32" else 3e-2


def gloo_avg_bug(job, ref_dir):
    """The line naming pytorch#162338, with the ratios measured, when a failed
    FSDP2 check has its signature (every step-0 gradient exactly S x the
    reference's in ref_dir, a trace of the reference's step 0, S the shard
    group's size: W but under HSDP), else None."""
    from . import known_bugs

    if not gloo_avg_applies(job):
        return None
    ratios = known_bugs.step0_ratios(ref_dir, job.torch_dir)
    S = shard_size(job.api, job.cfg, job.world)
    if known_bugs.match_gloo_avg(job.api, "gloo", job.world, False, ratios or [], ratio_tol(job), S) is None:
        return None
    group = f"shard group of {S}, " if S != job.world else ""
    return f"{known_bugs.GLOO_AVG.line()}\n{known_bugs.measured(ratios, 'A')} ({group}W = {job.world})"


def divide_factor_bug(job, ref_dir):
    """The line naming pytorch#167178 when every step-0 gradient is exactly F x
    the reference's in ref_dir, else None."""
    from . import known_bugs

    if not divide_factor_applies(job):
        return None
    c, F = job.cfg, job.cfg.get("gradient_divide_factor")
    ratios = known_bugs.step0_ratios(ref_dir, job.torch_dir) or []
    args = (job.api, shard_size(job.api, c, job.world), F, job.world, False, c["reduce_dtype"], ratios, ratio_tol(job))
    bug = known_bugs.match_divide_factor_shard1(*args)
    return f"{bug.line()}\n{known_bugs.measured(ratios, 'A')} (F = {F:g}, W = {job.world})" if bug else None


def divide_twice_bug(job, ref_dir):
    """The line naming the one-rank double divide when every step-0 gradient is
    exactly 1/F x the reference's in ref_dir, else None."""
    from . import known_bugs

    if not divide_twice_applies(job):
        return None
    c, F = job.cfg, job.cfg.get("gradient_divide_factor")
    ratios = known_bugs.step0_ratios(ref_dir, job.torch_dir) or []
    force_sum = bool(job.opts.get("--force-sum-reduction"))
    args = (job.api, shard_size(job.api, c, job.world), F, force_sum, c["reduce_dtype"], ratios, ratio_tol(job))
    bug = known_bugs.match_divide_factor_twice(*args)
    return f"{bug.line()}\n{known_bugs.measured(ratios, 'A')} (F = {F:g}, W = {job.world})" if bug else None


def hsdp_no_replicate_bug(job, inj_dir):
    """The line naming pytorch#154888 when every step-0 gradient matches the
    reference's run with --inject hsdp_no_replicate in inj_dir, else None."""
    from . import known_bugs

    ratios = known_bugs.step0_ratios(inj_dir, job.torch_dir) or []
    c = job.cfg
    bug = known_bugs.match_hsdp_no_replicate(
        job.api, c["strategy"], c["shard_group"], job.world, ratios, ratio_tol(job)
    )
    if bug is None:
        return None
    return f"{bug.line()}\n{known_bugs.measured(ratios, 'the reference with --inject hsdp_no_replicate')} (W = {job.world})"


def known_bug_line(job, fsdpcheck, env):
    """The line naming the known bug a failed check's step 0 shows, measured
    against the reference's own run of step 0 (with the bug's fault injected
    where the catalogue has it), or None: the verdict stands either way. A bug
    fsdpcheck measured gone from this torch is not named: the same shape there
    is another bug (or a fault injected, --inject no_divide's is #162338's)."""
    from . import known_bugs

    line = None
    mpiexec = job.opts.get("--mpiexec", "mpiexec")
    if gloo_avg_applies(job) or divide_factor_applies(job) or divide_twice_applies(job):
        ref0 = reference_step0(job, fsdpcheck, mpiexec, env)
        line = ref0 and (gloo_avg_bug(job, ref0) or divide_factor_bug(job, ref0) or divide_twice_bug(job, ref0))
    elif hsdp_no_replicate_applies(job):
        inj = reference_step0(job, fsdpcheck, mpiexec, env, inject="hsdp_no_replicate")
        line = inj and hsdp_no_replicate_bug(job, inj)
    return line if line and not known_bugs.gone_from_this_torch(line) else None


def compare(job, fsdpcheck, env):
    cmd = [fsdpcheck, "compare", job.ref_dir, job.torch_dir]
    if "--report" in job.opts:
        cmd += ["--report", job.opts["--report"]]
    t0 = time.time()
    p = run_bounded(cmd, env, job.timeout, "fsdpcheck compare")
    job.t["compare_s"] = time.time() - t0
    job.t["compare_rss_mib"] = p.peak_rss_mib
    if p.returncode == 2:
        raise RuntimeError(f"fsdpcheck compare refused the traces: {p.stderr.strip() or p.stdout.strip()}")
    return p.returncode, p.stdout + p.stderr


def torch_timing(torch_dir):
    """What rank 0 of the torch run spent gathering full tensors and writing
    the trace, and every rank's peak resident set (recording.Recorder records them
    in trace.json's torch.timing_s and torch.peak_rss_mib)."""
    try:
        with open(os.path.join(torch_dir, "trace.json")) as f:
            info = json.load(f).get("torch", {})
        t = info.get("timing_s", {})
        return {
            "gather_s": float(t["gather"]),
            "trace_s": float(t["trace_write"]),
            "rss_mib": [float(x) for x in info.get("peak_rss_mib", [])],
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def judge(job, p, fails, fsdpcheck, env):
    """(exit code, text) for one job after its torch run: the crash verdict
    (1) if the run did not end cleanly, whatever it wrote; else compare's
    verdict, with the known bug its failure shows."""
    done = os.path.exists(os.path.join(job.torch_dir, "trace.json"))
    err = os.path.exists(os.path.join(job.torch_dir, "error.txt"))
    if not done or err or p.returncode != 0:
        raise torch_failure(job, p, fails)
    job.t.update(torch_timing(job.torch_dir))
    rc, text = compare(job, fsdpcheck, env)
    line = known_bug_line(job, fsdpcheck, env) if rc == 1 else None
    if line:
        text += line + "\n"
    if job.opts.get("--schedule"):
        src, stext = schedule(job, fsdpcheck, env)
        rc, text = max(rc, src), text + stext
    if job.opts.get("--device") == "xla" and job.api == "fsdp2":
        lrc, ltext = xla_layout_verdict(job)
        rc, text = max(rc, lrc), text + ltext
    return rc, text


def xla_layout_verdict(job):
    """(0 or 1, lines): whether every parameter of an SPMD FSDPv2 run was sharded by FSDPv2's rule, as
    read back into its trace. SPMD computes the same function whatever the layout, so compare cannot
    see a parameter sharded along the wrong dimension; this can."""
    from .tracefile import RefTrace
    from .xla_layout import sharding_findings

    with open(os.path.join(job.torch_dir, "trace.json")) as f:
        info = json.load(f)["torch"]
    found = sharding_findings(info, RefTrace(job.ref_dir).shapes)
    if not found:
        n = len(info["sharding"])
        return (
            0,
            f"layout: all {n} parameters sharded as FSDPv2's rule says (each one's largest dimension along fsdp)\n",
        )
    return 1, "".join(f"FAIL: layout: {line}\n" for line in found)


def schedule(job, fsdpcheck, env):
    """`fsdpcheck schedule` on the comm log the torch run recorded: (0 or 1, its output)."""
    log = os.path.join(job.torch_dir, "commlog.jsonl")
    cmd = [fsdpcheck, "schedule", log, "--world", str(job.world), "--api", f"torch-{job.api}", *versioned_flags(job)]
    p = run_bounded(cmd, env, job.timeout, "fsdpcheck schedule")
    if p.returncode == 2:
        raise RuntimeError(f"fsdpcheck schedule refused the comm log: {p.stderr.strip() or p.stdout.strip()}")
    return p.returncode, p.stdout + p.stderr


def outcome(e):
    """An exception of a check -> (exit code, its one line or lines)."""
    code = 1 if isinstance(e, Crash) else 3 if isinstance(e, Hung) else 2
    verdict = "FAIL: " if code == 1 else ""
    return code, f"fsdpcheck-torch: {verdict}{e}"


def run_group(jobs, idx, results, fsdpcheck, env):
    """One torchrun for the jobs idx, each judged into results[i]. Returns whether it ended cleanly."""
    try:
        p, fails = run_torch([jobs[i] for i in idx], env)
    except Hung as e:
        for i in idx:
            results[i] = outcome(e) + (jobs[i].t,)
        return False
    for i in idx:
        try:
            results[i] = judge(jobs[i], p, fails, fsdpcheck, env) + (jobs[i].t,)
        except (UsageError, RuntimeError, Crash, Hung) as e:
            results[i] = outcome(e) + (jobs[i].t,)
    return p.returncode == 0


def run_isolating(jobs, idx, results, fsdpcheck, env):
    """run_group, and where its torchrun failed, the jobs that did not pass again: a run that fails leaves
    the others of its torchrun waiting in a collective until gloo's timeout, and the torchrun's exit
    fails them all. The jobs run in order, so the first without a whole trace is the one that failed:
    it runs alone, the rest together (and so on); with none such (a run that failed after its trace),
    each runs alone."""
    if run_group(jobs, idx, results, fsdpcheck, env) or len(idx) < 2:
        return
    redo = [i for i in idx if results[i][0] != 0]

    def whole(i):
        d = jobs[i].torch_dir
        return os.path.exists(os.path.join(d, "trace.json")) and not os.path.exists(os.path.join(d, "error.txt"))

    first = next((i for i in redo if not whole(i)), None)
    for i in redo:
        shutil.rmtree(jobs[i].torch_dir, ignore_errors=True)
        jobs[i].t["torch_s"] = 0.0
    groups = [[first], [i for i in redo if i != first]] if first is not None else [[i] for i in redo]
    for g in groups:
        if g:
            run_isolating(jobs, g, results, fsdpcheck, env)


def run_checks(argvs):
    """Checks several configs, starting torch once per world size. Returns one
    (exit code, compare output or error, timing) per argv: 0/1 from compare,
    1 for a torch run that crashed, 2 with the message for bad input or a
    failed reference run, 3 for a run that hung. A torchrun that exits
    non-zero gives none of its jobs a verdict (the exit code of a run is never
    explained away by a trace that exists): those that did not pass run again
    (run_isolating), until each verdict comes from a clean torchrun or its own."""
    env = env_for_runs()
    results = [None] * len(argvs)
    jobs = {}
    for i, argv in enumerate(argvs):
        try:
            jobs[i] = Job(argv)
        except UsageError as e:
            results[i] = outcome(e) + ({},)
    try:
        if not jobs:
            return results
        any_job = next(iter(jobs.values()))
        fsdpcheck = find_fsdpcheck(any_job.opts.get("--fsdpcheck"))
        ready = {}
        for i, j in jobs.items():
            try:
                plan_reference(j, fsdpcheck, env)
                ready.setdefault(j.group(), []).append(i)
            except (UsageError, RuntimeError, Hung) as e:
                results[i] = outcome(e) + (j.t,)
        for idx in ready.values():
            run_isolating(jobs, idx, results, fsdpcheck, env)
        return results
    finally:
        for j in jobs.values():
            j.cleanup()


def run_check(argv, out=sys.stdout):
    """One check -> (exit code, text, timing); raises UsageError (bad input),
    Crash (the torch run failed), Hung, or RuntimeError (the reference failed)."""
    job = Job(argv)
    env = env_for_runs()
    try:
        fsdpcheck = find_fsdpcheck(job.opts.get("--fsdpcheck"))
        p, fails = run_torch([job], env, beside=lambda: plan_reference(job, fsdpcheck, env))
        job.t["plan_beside"] = True  # torch_s counts from torch's start, the plan's time in it
        rc, text = judge(job, p, fails, fsdpcheck, env)
        if not job.opts.get("--quiet"):
            out.write(text)
        return rc, text, job.t
    finally:
        job.cleanup()


def cmd_check(argv):
    try:
        rc, _, t = run_check(argv)
    except (RuntimeError, Crash, Hung) as e:
        code, line = outcome(e)
        print(line, file=sys.stderr)
        if code == 1:
            print("fsdpcheck-torch check: FAIL (the implementation under test did not finish its run)")
        return code
    split = ""
    if t.get("trace_s") is not None:  # rank 0's own clock, from the torch trace.json
        split = f" of which gathering full tensors {t['gather_s']:.1f} s and trace writing {t['trace_s']:.1f} s,"
    beside = " from its start, the plan run beside it" if t.get("plan_beside") else ""
    ranks = lambda xs: ", ".join(f"{r}: {x:.1f}" for r, x in enumerate(xs))
    if t.get("plan_rss_mib"):
        print(f"reference plan peak RSS (MiB): {t['plan_rss_mib']:.1f}")
    if t.get("rss_mib"):
        print("torch peak RSS per rank (MiB): " + ranks(t["rss_mib"]))
    if t.get("compare_rss_mib"):
        print(f"compare peak RSS, the reference re-running each step in it (MiB): {t['compare_rss_mib']:.1f}")
    print(
        f"fsdpcheck-torch check: {'PASS' if rc == 0 else 'FAIL'} (reference plan {t['plan_s']:.1f} s, "
        f"torch {t['torch_s']:.1f} s{beside},{split} compare {t['compare_s']:.1f} s, the reference re-running each step)"
    )
    return rc
