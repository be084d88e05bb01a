"""gather.py against DTensor.full_tensor(): bit for bit, on every mesh shape the
adapter builds, at W = 2 and 4 (tests/gather_worker.py does the checking)."""

import os
import subprocess

import pytest
from conftest import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


# shared memory (every rank on this host: what check starts) at W = 2 and 4, and
# gloo's dist.gather (FSDPCHECK_GATHER=collective, as on several hosts) at W = 2
@pytest.mark.parametrize(("W", "transport"), [(2, "auto"), (4, "auto"), (2, "collective")])
def test_gather_full_is_full_tensor(W, transport, tmp_path):
    cmd = torchrun(W, os.path.join(HERE, "gather_worker.py"), log_dir=tmp_path / "torchrun-log")
    env = dict(os.environ, FSDPCHECK_GATHER=transport)
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"gather_worker W={W}: 0 failures" in p.stdout, p.stdout + p.stderr
    want = "collective" if transport == "collective" or not os.access("/dev/shm", os.W_OK) else "shm"
    assert f"gather_worker W={W}: transport {want}" in p.stdout, p.stdout
