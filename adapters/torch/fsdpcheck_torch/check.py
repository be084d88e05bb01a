"""`fsdpcheck-torch check`: the reference, then torch on the same config, then
`fsdpcheck compare`; prints the verdict and exits 0, 1 or 2 as fsdpcheck does.

  fsdpcheck-torch check --api fsdp1|fsdp2 [-n W] [--device D] [--backend B]
      [run flags] [--inject FAULT] [--ckpt-at K] [--force-sum-reduction]
      [--optim-state-offload] [--keep DIR] [--report FILE.md]
      [--fsdpcheck PATH] [--mpiexec PATH] [--quiet]

The reference runs as `mpiexec -n W fsdpcheck run [run flags] --trace DIR/ref`
with the gradient divide the torch API uses (FSDP1: pre/post factors; FSDP2 in
fp32/bf16: one AVG collective, which gloo computes as a sum then a divide;
fp16: pre/post), unless --divide is given. Torch then runs with
`torchrun --nproc-per-node W -m fsdpcheck_torch run ... --like DIR/ref`.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

from .config import APIS, FAULTS, UsageError, apply_flags, default_config, validate

OWN = {
    "--api": True,
    "-n": True,
    "--world": True,
    "--device": True,
    "--backend": True,
    "--inject": True,
    "--ckpt-at": True,
    "--force-sum-reduction": False,
    "--optim-state-offload": False,
    "--keep": True,
    "--report": True,
    "--fsdpcheck": True,
    "--mpiexec": True,
    "--quiet": False,
    "--timeout": True,
}
TORCH_PASS = ("--api", "--device", "--backend", "--inject", "--ckpt-at")
TORCH_PASS_BOOL = ("--force-sum-reduction", "--optim-state-offload")


def find_fsdpcheck(explicit=None):
    """The fsdpcheck binary: --fsdpcheck, $FSDPCHECK, PATH, or a build of the
    repository this package sits in (build/default/oracle/fsdpcheck)."""
    cands = [explicit, os.environ.get("FSDPCHECK"), shutil.which("fsdpcheck")]
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (os.getcwd(), here):
        d = up
        for _ in range(6):
            cands.append(os.path.join(d, "build", "default", "oracle", "fsdpcheck"))
            d = os.path.dirname(d)
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise UsageError(
        "cannot find the fsdpcheck binary: pass --fsdpcheck PATH or set FSDPCHECK "
        "(build it with cmake --preset default && cmake --build --preset default)"
    )


def model_stub(flags):
    """A model dict for validating flags before any run (the trace has the real one)."""
    name = "mlp-tiny"
    for i, f in enumerate(flags):
        if f == "--model" and i + 1 < len(flags):
            name = flags[i + 1]
    if name.startswith("gpt2"):
        return {"model_type": "gpt2", "n_positions": {"gpt2-micro": 8, "gpt2-tiny": 32}.get(name, 1024)}
    if name.startswith("mlp"):
        return {"model_type": "fsdpcheck-mlp"}
    import json

    try:
        with open(name) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"model_type": "gpt2", "n_positions": 1 << 30}  # the reference says what is wrong


def reference_divide(api, cfg, world, force_sum):
    if api == "fsdp1" or world == 1 or cfg["reduce_dtype"] == "fp16":
        return "prepost"
    # FSDP2's AVG (fp32, bf16): gloo sums then divides (ProcessGroupGloo AVG);
    # with force_sum_reduction_for_comms FSDP2 sums and post-divides itself
    return "sum-then-divide"


def torchrun_cmd(world, args):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "fsdpcheck_torch",
    ] + args


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
    # FSDP's default strategy (fsdpcheck run's default is local, which is not FSDP);
    # a --strategy or an fsdp_config sharding_strategy later in the flags wins
    flags = ["--strategy", "full_shard"] + flags
    base = default_config()
    base["model"] = model_stub(flags)
    cfg, _ = apply_flags(base, flags, opts.get("--device", "cpu"))
    cfg.pop("_model_flag", None)
    validate(cfg, world)
    from .config import unsupported

    why = unsupported(api, cfg, opts.get("--device", "cpu"))
    if why:
        raise UsageError(f"{api}: {why}")
    return opts, flags, cfg, world, api


class Job:
    """One check: its flags, config, and where its traces go."""

    def __init__(self, argv):
        self.opts, self.flags, self.cfg, self.world, self.api = parse(argv)
        self.keep = self.opts.get("--keep")
        self.work = self.keep or tempfile.mkdtemp(prefix="fsdpcheck-torch-")
        os.makedirs(self.work, exist_ok=True)
        self.ref_dir = os.path.join(self.work, "ref")
        self.torch_dir = os.path.join(self.work, "torch")
        self.timeout = float(self.opts.get("--timeout", "900"))
        self.t = {"reference_s": 0.0, "torch_s": 0.0}

    def group(self):
        return (self.world, self.opts.get("--device", "cpu"), self.opts.get("--backend", ""))

    def torch_args(self):
        a = ["run"]
        for k in TORCH_PASS:
            if k in self.opts:
                a += [k, self.opts[k]]
        for k in TORCH_PASS_BOOL:
            if self.opts.get(k):
                a.append(k)
        return a + self.flags + ["--like", self.ref_dir, "--trace", self.torch_dir]

    def cleanup(self):
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def run_reference(job, fsdpcheck, mpiexec, env):
    ref_flags = list(job.flags)
    if "--divide" not in job.flags:
        ref_flags += ["--divide", reference_divide(job.api, job.cfg, job.world, job.opts.get("--force-sum-reduction"))]
    cmd = [mpiexec, "-n", str(job.world), fsdpcheck, "run"] + ref_flags + ["--trace", job.ref_dir, "--quiet"]
    t0 = time.time()
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=job.timeout, stdin=subprocess.DEVNULL, check=False
    )
    job.t["reference_s"] = time.time() - t0
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        if p.returncode == 2:
            raise UsageError(f"the reference refused the config: {msg}")
        raise RuntimeError(f"the reference run failed (exit {p.returncode}): {msg}")


def run_torch(jobs, env):
    """One torchrun for jobs of one world size (a --jobs file when several)."""
    import json

    world = jobs[0].world
    if len(jobs) == 1:
        args = jobs[0].torch_args()
    else:
        fd, path = tempfile.mkstemp(prefix="fsdpcheck-torch-jobs-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([j.torch_args()[1:] for j in jobs], f)
        args = ["run", "--jobs", path]
    t0 = time.time()
    try:
        p = subprocess.run(
            torchrun_cmd(world, args),
            capture_output=True,
            text=True,
            env=env,
            timeout=sum(j.timeout for j in jobs),
            stdin=subprocess.DEVNULL,
            check=False,
        )
    finally:
        if len(jobs) > 1:
            os.unlink(path)
    dt = time.time() - t0
    for j in jobs:
        j.t["torch_s"] = dt / len(jobs)
    return p


def torch_failure(job, p):
    err = os.path.join(job.torch_dir, "error.txt")
    if os.path.exists(err):
        with open(err) as f:
            return RuntimeError(f"the torch run failed: {f.read().strip()[-3000:]}")
    lines = [l for l in p.stderr.splitlines() if l.startswith("fsdpcheck-torch:")]
    if lines and p.returncode != 0:
        return UsageError(lines[0][len("fsdpcheck-torch: ") :])
    tail = "\n".join(p.stderr.strip().splitlines()[-25:])
    return RuntimeError(f"the torch run failed (exit {p.returncode}):\n{tail}")


def compare(job, fsdpcheck, env):
    cmd = [fsdpcheck, "compare", job.ref_dir, job.torch_dir]
    if "--report" in job.opts:
        cmd += ["--report", job.opts["--report"]]
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=job.timeout, stdin=subprocess.DEVNULL, check=False
    )
    if p.returncode == 2:
        raise RuntimeError(f"fsdpcheck compare refused the traces: {p.stderr.strip() or p.stdout.strip()}")
    return p.returncode, p.stdout + p.stderr


def run_checks(argvs):
    """Checks several configs, starting torch once per world size. Returns one
    (exit code, compare output or error, timing) per argv: 0/1 from compare,
    2 with the message for bad input or a failed run."""
    env = env_for_runs()
    results = [None] * len(argvs)
    jobs = {}
    for i, argv in enumerate(argvs):
        try:
            jobs[i] = Job(argv)
        except UsageError as e:
            results[i] = (2, f"fsdpcheck-torch: {e}", {})
    try:
        if not jobs:
            return results
        any_job = next(iter(jobs.values()))
        fsdpcheck = find_fsdpcheck(any_job.opts.get("--fsdpcheck"))
        mpiexec = any_job.opts.get("--mpiexec", "mpiexec")
        ready = {}
        for i, j in jobs.items():
            try:
                run_reference(j, fsdpcheck, mpiexec, env)
                ready.setdefault(j.group(), []).append(i)
            except (UsageError, RuntimeError) as e:
                results[i] = (2, f"fsdpcheck-torch: {e}", j.t)
        for idx in ready.values():
            p = run_torch([jobs[i] for i in idx], env)
            for i in idx:
                j = jobs[i]
                done = os.path.exists(os.path.join(j.torch_dir, "trace.json"))
                if not done or (len(idx) == 1 and p.returncode != 0):
                    results[i] = (2, f"fsdpcheck-torch: {torch_failure(j, p)}", j.t)
                    continue
                try:
                    rc, out = compare(j, fsdpcheck, env)
                    results[i] = (rc, out, j.t)
                except RuntimeError as e:
                    results[i] = (2, f"fsdpcheck-torch: {e}", j.t)
        return results
    finally:
        for j in jobs.values():
            j.cleanup()


def run_check(argv, out=sys.stdout):
    """One check; raises UsageError (bad input) or RuntimeError (a run failed)."""
    job = Job(argv)
    env = env_for_runs()
    try:
        fsdpcheck = find_fsdpcheck(job.opts.get("--fsdpcheck"))
        run_reference(job, fsdpcheck, job.opts.get("--mpiexec", "mpiexec"), env)
        p = run_torch([job], env)
        if p.returncode != 0 or not os.path.exists(os.path.join(job.torch_dir, "trace.json")):
            raise torch_failure(job, p)
        rc, text = compare(job, fsdpcheck, env)
        if not job.opts.get("--quiet"):
            out.write(text)
        return rc, text, job.t
    finally:
        job.cleanup()


def cmd_check(argv):
    try:
        rc, _, t = run_check(argv)
    except RuntimeError as e:
        print(f"fsdpcheck-torch: {e}", file=sys.stderr)
        return 2
    print(
        f"fsdpcheck-torch check: {'PASS' if rc == 0 else 'FAIL'} (reference {t['reference_s']:.1f} s, "
        f"torch {t['torch_s']:.1f} s)"
    )
    return rc
