"""Shared helpers: every test drives the real commands (`fsdpcheck-torch check`,
torchrun, mpiexec, `fsdpcheck compare`) as a user or CI would.

FSDPCHECK names the fsdpcheck binary (ci/torch.sh sets it); otherwise it is
set here to the repository's build/default/oracle/fsdpcheck, so that every
check the tests run, in this process or another, is given the binary (the
adapter looks for it by --fsdpcheck, FSDPCHECK, PATH and its install prefix
only, never in a source tree).
"""

import glob
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples", "fsdp_config")  # copies of ../shared/examples
if not os.environ.get("FSDPCHECK"):
    os.environ["FSDPCHECK"] = os.path.join(ROOT, "build", "default", "oracle", "fsdpcheck")


def torch_version():
    """(major, minor, patch) of the torch under test."""
    from importlib.metadata import version

    return tuple(int(x) for x in version("torch").split("+")[0].split(".")[:3])


TORCH = torch_version()


def torch_has(method):
    """Whether this torch's FSDPModule has `method` (the adapter refuses, exit 2,
    a flag that needs one it lacks: set_force_sum_reduction_for_comms came with 2.8+)."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, method)


HAS_FORCE_SUM = torch_has("set_force_sum_reduction_for_comms")


def bug_status(bug):
    """Whether a known upstream bug (fsdpcheck_torch.known_bugs) is in the torch
    under test: True (measured there), False (measured clean), None (a version
    fsdpcheck never measured: either verdict may come)."""
    return bug.present_on(TORCH)


def expected_bug(api, world, flags):
    """The known bug a check of these flags meets on the torch under test, as
    (bug, status) with status as bug_status's; None where it must pass."""
    from fsdpcheck_torch.known_bugs import GLOO_AVG, GLOO_NO_AVG

    if api != "fsdp2":
        return None
    strategy = flags[flags.index("--strategy") + 1] if "--strategy" in flags else "full_shard"
    if strategy in ("no_shard", "hybrid_shard", "hybrid_shard_zero2") and bug_status(GLOO_NO_AVG) is not False:
        return GLOO_NO_AVG, bug_status(GLOO_NO_AVG)  # gloo has no AVG all_reduce across replicas, at any W
    fp16 = "--reduce-dtype" in flags and flags[flags.index("--reduce-dtype") + 1] == "fp16"
    # pytorch#162338 is the reduce-scatter's: over the shard group (HSDP's replicate all-reduce averages)
    group = int(flags[flags.index("--shard-group") + 1]) if "--shard-group" in flags else world
    shard = 1 if strategy == "no_shard" else group if strategy.startswith("hybrid") else world
    if shard > 1 and not fp16 and "--force-sum-reduction" not in flags and bug_status(GLOO_AVG) is not False:
        return GLOO_AVG, bug_status(GLOO_AVG)
    return None


def assert_verdict(rc, out, expect):
    """A check's verdict against expected_bug's: where the bug is in this torch,
    exit 1 naming it; where fsdpcheck never measured this version, either that
    or a pass; otherwise a pass."""
    if expect is not None:
        bug, status = expect
        named = rc == 1 and f"known PyTorch bug {bug.issue}" in out
        if status or rc != 0:
            assert named, out
            return bug
    assert rc == 0, f"{first_divergence(out)}\n{out}"
    return None


def fsdpcheck_bin():
    b = os.environ["FSDPCHECK"]
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


def torchrun(world, *args, log_dir):
    """argv of `torchrun --standalone --nproc-per-node WORLD ARGS` with its run directory
    under log_dir (the caller's temporary directory): without --log-dir torchrun leaves a
    torchelastic_* directory behind per run (no_torchrun_directory_left)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, f"--nproc-per-node={world}", f"--log-dir={log_dir}", *args]


def adapter(*args, timeout=900, extra_env=None):
    """Runs `python -m fsdpcheck_torch ARGS` (in env() and extra_env); returns
    (exit code, stdout + stderr)."""
    p = subprocess.run(
        [sys.executable, "-m", "fsdpcheck_torch", *args],
        capture_output=True,
        text=True,
        env=dict(env(), **(extra_env or {})),
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


@pytest.fixture(scope="session", autouse=True)
def no_torchrun_directory_left():
    """No run of the suite leaves torchrun's run directory behind: without --log-dir
    torchrun makes a torchelastic_* directory in the temporary directory per run and
    never removes it (check.torchrun_cmd; the tests' own torchruns)."""
    pattern = os.path.join(tempfile.gettempdir(), "torchelastic_*")
    before = set(glob.glob(pattern))
    yield
    left = sorted(set(glob.glob(pattern)) - before)
    assert not left, f"torchrun run directories left behind (give torchrun --log-dir): {left}"


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


def refused(argv, capsys, *needles):
    """Runs the adapter's main(argv) in-process and asserts a refusal: exit 2,
    nothing on stdout, one stderr line naming the tool and every needle."""
    from fsdpcheck_torch.cli import main

    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, cap
    assert cap.out == "" and len(lines) == 1 and lines[0].startswith("fsdpcheck-torch: "), cap
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def refuses_trainer_and_ckpt_import(like, out, tmp_path, capsys, trainer_needle, import_needle):
    """The Trainer path (where this transformers has it) and `ckpt import` (where
    torch has DCP) both refuse a run --like the trace `like`, each with one line."""
    import dataclasses

    import transformers

    from fsdpcheck_torch.dcp import missing

    if "train_sampling_strategy" in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}:
        refused(["trainer", "--like", like, "--trace", str(out)], capsys, trainer_needle)
    if missing() is None:
        src = tmp_path / "src"
        src.mkdir()
        (src / ".metadata").write_bytes(b"")
        refused(["ckpt", "import", str(src), str(out), "--like", like], capsys, import_needle)


def hf_loss_tool():
    """tools/hf_loss.py as a module: a FULL checkpoint's loss through its real readers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_loss", os.path.join(HERE, "..", "tools", "hf_loss.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
