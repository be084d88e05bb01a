"""gather.py against DTensor.full_tensor(): bit for bit, on every mesh shape the
adapter builds, at W = 2 and 4 (tests/gather_worker.py does the checking)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("W", [2, 4])
def test_gather_full_is_full_tensor(W, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(W)]
    cmd += [os.path.join(HERE, "gather_worker.py")]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"gather_worker W={W}: 0 failures" in p.stdout, p.stdout + p.stderr
