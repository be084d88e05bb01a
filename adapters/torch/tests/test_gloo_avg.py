"""pytorch/pytorch#162338: FSDP2 on gloo applied ReduceOp.AVG as SUM, so
gradients came out W times too large. On torch 2.7/2.8 (the oldest pair CI
tests) check must fail and name the bug, and --force-sum-reduction, which
that torch cannot honour, must be refused naming what it lacks. With the pinned torch, FSDP2's
fp32/bf16 reduce-scatter uses ReduceOp.AVG and gloo averages: the gradients
match the reference at W = 2 and 4 (a SUM would be caught: see
test_faults.test_no_divide_is_caught). The workaround,
set_force_sum_reduction_for_comms(True), also matches."""

import json

import pytest
from conftest import HAS_FORCE_SUM, assert_verdict, expected_bug, register

GPT2 = ["--model", "gpt2-tiny", "--steps", "2", "--strategy", "full_shard"]


for W in (2, 4):
    register(f"gloo-avg-W{W}", "--api", "fsdp2", "-n", str(W), *GPT2)
register("gloo-force-sum", "--api", "fsdp2", "-n", "2", *GPT2, "--force-sum-reduction")


@pytest.mark.parametrize("W", [2, 4])
def test_fsdp2_gloo_avg_averages(checks, W):
    rc, out, d = checks[f"gloo-avg-W{W}"]
    if assert_verdict(rc, out, expected_bug("fsdp2", W, GPT2)):  # pytorch#162338 in this torch
        assert f"B = {W}.0000 .. {W}.0000 x A" in out, out
    info = json.loads((d / "torch" / "trace.json").read_text())["torch"]
    assert info["backend"] == "gloo" and info["gradient_divide"] == "avg"


def test_force_sum_reduction_workaround(checks):
    rc, out, d = checks["gloo-force-sum"]
    if not HAS_FORCE_SUM:
        assert rc == 2 and "has no FSDPModule.set_force_sum_reduction_for_comms" in out, out
        return
    assert rc == 0, out
    assert json.loads((d / "torch" / "trace.json").read_text())["torch"]["gradient_divide"] == "sum-then-divide"
