"""Paths of the torch run (fsdpcheck_torch/engine.py) the equivalence and
fault tests leave out, run in the shared `checks` torchrun of W = 2: FSDP1's
gradient divide left out (--inject no_divide, so far only FSDP2's was), FSDP2's
backward prefetch set explicitly, and a checkpoint round trip of an SGD
optimizer with momentum (its state is the momentum buffer, no step count)."""

import json
import os

import pytest
from conftest import assert_verdict, expected_bug, first_divergence, register

GPT2 = ["--model", "gpt2-tiny", "--steps", "2", "--strategy", "full_shard"]
BWD_PRE = [*GPT2, "--backward-prefetch", "pre"]
SGD_CKPT = ["--model", "mlp-tiny", "--steps", "3", "--strategy", "full_shard"]
SGD_CKPT += ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--ckpt-at", "1"]

# not in the quick selection (FSDPCHECK_TORCH_TESTS=quick, the oldest pair's compatibility run)
QUICK = os.environ.get("FSDPCHECK_TORCH_TESTS") == "quick"
if not QUICK:
    register("cover-fsdp1-no_divide", "--api", "fsdp1", "-n", "2", *GPT2, "--inject", "no_divide")
    register("cover-fsdp2-backward-prefetch-pre", "--api", "fsdp2", "-n", "2", *BWD_PRE)
    # not tried where FSDP2 on gloo has a known bug: its verdict would be that bug, not the round trip
    if expected_bug("fsdp2", 2, SGD_CKPT) is None:
        register("cover-fsdp2-sgd-ckpt", "--api", "fsdp2", "-n", "2", *SGD_CKPT)
not_quick = pytest.mark.skipif(QUICK, reason="not in the quick selection")


def torch_meta(d):
    return json.loads((d / "torch" / "trace.json").read_text())


@not_quick
def test_fsdp1_without_its_divide_is_caught(checks):
    rc, out, d = checks["cover-fsdp1-no_divide"]
    assert rc == 1, out
    assert first_divergence(out).startswith("first divergence: step 0, tensor grad."), out
    t = torch_meta(d)
    assert t["torch"]["reduction"] == {"gradient_predivide_factor": 1.0, "gradient_postdivide_factor": 1.0}, t
    assert t["config"]["inject"] == "no_divide"


@not_quick
def test_fsdp2_backward_prefetch_pre_matches(checks):
    rc, out, _ = checks["cover-fsdp2-backward-prefetch-pre"]
    assert_verdict(rc, out, expected_bug("fsdp2", 2, BWD_PRE))


@not_quick
@pytest.mark.skipif(expected_bug("fsdp2", 2, SGD_CKPT) is not None, reason="FSDP2 on gloo has a known bug here")
def test_fsdp2_sgd_momentum_checkpoint_round_trip_matches(checks):
    rc, out, d = checks["cover-fsdp2-sgd-ckpt"]
    assert rc == 0, out  # momentum buffers not restored would diverge at step 2
    assert torch_meta(d)["torch"]["checkpoint_at"] == 1
