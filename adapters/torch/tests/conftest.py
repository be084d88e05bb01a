"""Shared helpers: every test drives the real commands (`fsdpcheck-torch check`,
torchrun, mpiexec, `fsdpcheck compare`) as a user or CI would.

FSDPCHECK names the fsdpcheck binary (ci/torch.sh sets it); otherwise the
repository's build/default/oracle/fsdpcheck is used.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples", "fsdp_config")  # copies of ../shared/examples


def torch_version():
    """(major, minor) of the torch under test, for the tests whose expected
    verdict is a known upstream bug on old versions (fsdpcheck_torch.known_bugs)."""
    from importlib.metadata import version

    return tuple(int(x) for x in version("torch").split("+")[0].split(".")[:2])


# the oldest pair CI tests (torch 2.7.1): pytorch#162338 and pytorch#188989 are there
OLD_TORCH = torch_version() <= (2, 8)


def old_torch_bug(api, world, flags):
    """The known bug (its issue, as check names it) a check of these flags
    must report on an old torch, or None where it must pass there too."""
    if not OLD_TORCH or api != "fsdp2":
        return None
    strategy = flags[flags.index("--strategy") + 1] if "--strategy" in flags else "full_shard"
    if strategy in ("no_shard", "hybrid_shard", "hybrid_shard_zero2"):
        return "pytorch#149781"  # gloo has no AVG all_reduce across replicas, at any W
    fp16 = "--reduce-dtype" in flags and flags[flags.index("--reduce-dtype") + 1] == "fp16"
    return "pytorch#162338" if world > 1 and not fp16 else None


def fsdpcheck_bin():
    b = os.environ.get("FSDPCHECK") or os.path.join(ROOT, "build", "default", "oracle", "fsdpcheck")
    if not os.access(b, os.X_OK):
        pytest.fail(f"no fsdpcheck binary at {b}: build it (cmake --preset default && cmake --build --preset default)")
    return b


def reference_trace(path, *flags):
    """`fsdpcheck run FLAGS --trace PATH` in one process; returns PATH (a str)."""
    subprocess.run(
        [fsdpcheck_bin(), "run", *flags, "--trace", str(path), "--quiet"], check=True, stdin=subprocess.DEVNULL
    )
    return str(path)


def env():
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("HWLOC_COMPONENTS", "-pci,-x86")
    e.setdefault("TRANSFORMERS_VERBOSITY", "error")
    e["FSDPCHECK"] = fsdpcheck_bin()
    return e


def adapter(*args, timeout=900):
    """Runs `python -m fsdpcheck_torch ARGS`; returns (exit code, stdout + stderr)."""
    p = subprocess.run(
        [sys.executable, "-m", "fsdpcheck_torch", *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return p.returncode, p.stdout + p.stderr


def check(*args, keep=None):
    a = ["check", *args]
    if keep:
        a += ["--keep", str(keep)]
    return adapter(*a)


# Checks the tests need, registered at collection time and run together by the
# session fixture `checks`: every reference first, then one torchrun per world
# size for all of them (`run --jobs`), then one `fsdpcheck compare` each.
CHECKS = {}


def register(name, *argv):
    assert name not in CHECKS, name
    CHECKS[name] = list(argv)
    return name


@pytest.fixture(scope="session")
def checks(tmp_path_factory):
    import time

    from fsdpcheck_torch.check import run_checks

    os.environ.update({k: v for k, v in env().items() if k not in os.environ or k == "FSDPCHECK"})
    base = tmp_path_factory.mktemp("checks")
    names = list(CHECKS)
    t0 = time.time()
    res = run_checks([CHECKS[n] + ["--keep", str(base / n), "--quiet"] for n in names])
    print(f"\n{len(names)} checks in {time.time() - t0:.0f} s")
    return {n: (rc, out, base / n) for n, (rc, out, _) in zip(names, res)}


def first_divergence(out):
    return next((l.strip() for l in out.splitlines() if l.startswith("first divergence")), "")
