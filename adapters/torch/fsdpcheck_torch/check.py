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

OWN = {"--api": True, "-n": True, "--world": True, "--device": True, "--backend": True,
       "--inject": True, "--ckpt-at": True, "--force-sum-reduction": False, "--optim-state-offload": False,
       "--keep": True, "--report": True, "--fsdpcheck": True, "--mpiexec": True, "--quiet": False,
       "--timeout": True}
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
    raise UsageError("cannot find the fsdpcheck binary: pass --fsdpcheck PATH or set FSDPCHECK "
                     "(build it with cmake --preset default && cmake --build --preset default)")


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
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            "-m", "fsdpcheck_torch"] + args


def env_for_runs():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HWLOC_COMPONENTS", "-pci,-x86")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def parse(argv):
    from .cli import split_args
    opts, flags = split_args(argv, OWN)
    api = opts.get("--api")
    if api not in APIS:
        raise UsageError("check: --api fsdp1|fsdp2 is required" if api is None else f"--api {api!r}: not fsdp1 or fsdp2")
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
    if "--strategy" not in flags and "--fsdp-config" not in flags:
        flags = ["--strategy", "full_shard"] + flags
    base = default_config()
    base["model"] = model_stub(flags)
    cfg, _ = apply_flags(base, flags, opts.get("--device", "cpu"))
    cfg.pop("_model_flag", None)
    validate(cfg, world)
    from .engine import unsupported
    why = unsupported(api, cfg, opts.get("--device", "cpu"))
    if why:
        raise UsageError(f"{api}: {why}")
    return opts, flags, cfg, world, api


def run_check(argv, out=sys.stdout):
    """Returns (exit code, compare's stdout, timing dict)."""
    opts, flags, cfg, world, api = parse(argv)
    fsdpcheck = find_fsdpcheck(opts.get("--fsdpcheck"))
    mpiexec = opts.get("--mpiexec", "mpiexec")
    keep = opts.get("--keep")
    work = keep or tempfile.mkdtemp(prefix="fsdpcheck-torch-")
    os.makedirs(work, exist_ok=True)
    ref_dir, torch_dir = os.path.join(work, "ref"), os.path.join(work, "torch")
    timeout = float(opts.get("--timeout", "600"))
    env = env_for_runs()
    quiet = bool(opts.get("--quiet"))
    t = {}
    try:
        ref_flags = list(flags)
        if "--divide" not in flags:
            ref_flags += ["--divide", reference_divide(api, cfg, world, opts.get("--force-sum-reduction"))]
        cmd = [mpiexec, "-n", str(world), fsdpcheck, "run"] + ref_flags + ["--trace", ref_dir, "--quiet"]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
        t["reference_s"] = time.time() - t0
        if p.returncode != 0:
            msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
            if p.returncode == 2:
                raise UsageError(f"the reference refused the config: {msg}")
            raise RuntimeError(f"the reference run failed (exit {p.returncode}): {msg}")
        targs = ["run"]
        for k in TORCH_PASS:
            if k in opts:
                targs += [k, opts[k]]
        for k in TORCH_PASS_BOOL:
            if opts.get(k):
                targs.append(k)
        targs += flags + ["--like", ref_dir, "--trace", torch_dir]
        t0 = time.time()
        p = subprocess.run(torchrun_cmd(world, targs), capture_output=True, text=True, env=env, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        t["torch_s"] = time.time() - t0
        if p.returncode != 0:
            lines = [l for l in p.stderr.splitlines() if l.startswith("fsdpcheck-torch:")]
            if lines:
                raise UsageError(lines[0][len("fsdpcheck-torch: "):])
            tail = "\n".join(p.stderr.strip().splitlines()[-25:])
            raise RuntimeError(f"the torch run failed (exit {p.returncode}):\n{tail}")
        cmd = [fsdpcheck, "compare", ref_dir, torch_dir]
        if "--report" in opts:
            cmd += ["--report", opts["--report"]]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
        if not quiet:
            out.write(p.stdout)
            if p.stderr:
                out.write(p.stderr)
        if p.returncode == 2:
            raise RuntimeError(f"fsdpcheck compare refused the traces: {p.stderr.strip() or p.stdout.strip()}")
        return p.returncode, p.stdout, t
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def cmd_check(argv):
    try:
        rc, _, t = run_check(argv)
    except RuntimeError as e:
        print(f"fsdpcheck-torch: {e}", file=sys.stderr)
        return 2
    print(f"fsdpcheck-torch check: {'PASS' if rc == 0 else 'FAIL'} (reference {t['reference_s']:.1f} s, "
          f"torch {t['torch_s']:.1f} s)")
    return rc
