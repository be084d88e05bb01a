"""`fsdpcheck-torch sweep`: drawn cases judged against the reference, the
settings an API lacks reported, JUnit XML written."""

import xml.etree.ElementTree as ET

import pytest
from conftest import adapter, expected_bug


def test_sweep(tmp_path):
    junit = tmp_path / "sweep.xml"
    rc, out = adapter("sweep", "--cases", "3", "--world", "2", "--seed", "7", "--junit", str(junit))
    print(out)
    assert rc == 0, out
    root = ET.parse(junit).getroot()
    assert int(root.get("tests")) == 6 and int(root.get("failures")) == 0
    assert "passed" in out.splitlines()[-1]


def test_a_dcp_checkpoint_saved_at_w2_resumes_at_w4(tmp_path):
    """The sweep's --reload-world, for real: FSDP2 at W=2 saves DCP's files before step 1 (the
    check passes), FSDP2 at W=4 resumes them and passes compare against the saving run."""
    from fsdpcheck_torch import check, reshard

    argv = ["--api", "fsdp2", "-n", "2", "--quiet", "--model", "gpt2-tiny", "--steps", "3", "--ckpt-at", "1"]
    argv += ["--ckpt-state-dict", "sharded", "--keep", str(tmp_path)]
    expect = expected_bug("fsdp2", 2, argv)
    if expect:  # the saving check meets a known bug of this torch (pytorch#162338 on 2.7 and 2.8)
        pytest.skip(f"the saving check fails on this torch: {expect[0].issue}")
    [(rc, out, _)] = check.run_checks([argv])
    assert rc == 0, out
    [(rc, out, _)] = reshard.run_reloads([(argv, 4)])
    assert rc == 0 and "PASS: 2 steps agree" in out, out
    assert out.startswith("reloaded at W=4: torchrun ") and "comparing steps 1..2" in out, out
