"""The known-bug catalogue's entries from the upstream-bug hunt
(docs/measurements/upstream-bug-hunt.md), each run through `check` as a user
would: where the torch under test has the bug (known_bugs.py's measured
versions, conftest.bug_status), the check fails and names it with its measured
signature; where it is gone, or under the workaround, the check passes.

- pytorch#154888 (closed upstream as not planned): FSDP1's HYBRID_SHARD on a (W, 1) mesh never
  all-reduces across the replicas. FSDP2 on the same mesh is the clean side.
- pytorch#167178: FSDP2's set_gradient_divide_factor on a one-rank shard group
  on gloo: dropped (2.8, every gradient F x) or refused (2.9, RuntimeError);
  right from 2.11. --force-sum-reduction is the workaround there.
- Its regression (unreported upstream): from 2.11 the same one-rank shard
  group divides by F twice when F is applied outside the collective
  (--force-sum-reduction, or an fp16 reduce): every gradient 1/F.
- FSDP2's clip_grad_norm_ with norm_type=inf on a rank whose shard is empty (unreported upstream,
  found by the FSDP2 sweep; docs/repro/fsdp2-clip-inf-empty-shard.md): every measured torch has it.
- FSDP2's integer reshard_after_forward with a frozen first unit and accumulation (unreported upstream,
  found by the FSDP2 sweep; docs/repro/fsdp2-raf-int-frozen-accum.md): every measured torch has it."""

import os

import torch
from conftest import TORCH, assert_verdict, bug_status, expected_bug, register, torch_has
from safetensors.torch import save_file

from fsdpcheck_torch import check, failure, known_bugs
from fsdpcheck_torch.check import Job
from fsdpcheck_torch.known_bugs import (
    FSDP1_HSDP_NO_REPLICATE,
    FSDP2_CLIP_INF_EMPTY_SHARD,
    FSDP2_DIVIDE_FACTOR_SHARD1,
    FSDP2_DIVIDE_FACTOR_TWICE,
    FSDP2_RAF_INT_FROZEN_ACCUM,
)

MLP = ["--model", "mlp-micro", "--steps", "1"]
HSDP1 = ["--strategy", "hybrid_shard", "--shard-group", "1", *MLP]
DIV_W1 = ["--gradient-divide-factor", "2", *MLP]
DIV_HSDP = ["--strategy", "hybrid_shard", "--shard-group", "1", "--gradient-divide-factor", "4", *MLP]

register("kb-hsdp1-fsdp1", "--api", "fsdp1", "-n", "2", *HSDP1)
register("kb-hsdp1-fsdp1-no-shard", "--api", "fsdp1", "-n", "2", "--strategy", "no_shard", *MLP)
register("kb-hsdp1-fsdp2", "--api", "fsdp2", "-n", "2", *HSDP1)
register("kb-divide-w1", "--api", "fsdp2", "-n", "1", *DIV_W1)
register("kb-divide-hsdp", "--api", "fsdp2", "-n", "2", *DIV_HSDP)
register("kb-divide-w1-force-sum", "--api", "fsdp2", "-n", "1", *DIV_W1, "--force-sum-reduction")
register("kb-divide-w1-fp16", "--api", "fsdp2", "-n", "1", *DIV_W1, "--reduce-dtype", "fp16")

# llama-micro's k_proj and v_proj have 4 rows (one KV head of 4): torch.chunk over 3 ranks gives 2, 2, 0
CLIP_INF_W3 = ["--model", "llama-micro", "--global-batch", "6", "--clip-grad-norm", "0.05", "--norm-type", "inf"]
register("kb-clip-inf-w3", "--api", "fsdp2", "-n", "3", *CLIP_INF_W3, "--steps", "1")

# mlp-tiny's first unit frozen: no backward runs through it, the root's callback reshards it
RAF_FROZEN = ["--model", "mlp-tiny", "--reshard-after-forward", "2", "--freeze", "layers.0", "--steps", "1"]
register("kb-raf-frozen-accum", "--api", "fsdp2", "-n", "4", *RAF_FROZEN, "--grad-accum", "2")
register("kb-raf-frozen-one-backward", "--api", "fsdp2", "-n", "4", *RAF_FROZEN)

HAS_DIVIDE_FACTOR = torch_has("set_gradient_divide_factor")


def test_fsdp2_clip_inf_with_an_empty_shard(checks):
    rc, out, _ = checks["kb-clip-inf-w3"]
    assert_verdict(rc, out, (FSDP2_CLIP_INF_EMPTY_SHARD, bug_status(FSDP2_CLIP_INF_EMPTY_SHARD)))
    assert "rank 2: RuntimeError" in out and "empty tensor" in out, out


def test_fsdp2_integer_reshard_after_forward_with_a_frozen_unit_and_accumulation(checks):
    rc, out, _ = checks["kb-raf-frozen-accum"]
    if assert_verdict(rc, out, (FSDP2_RAF_INT_FROZEN_ACCUM, bug_status(FSDP2_RAF_INT_FROZEN_ACCUM))):
        assert "split_with_sizes expects split_sizes to sum exactly to" in out, out
    rc, out, _ = checks["kb-raf-frozen-one-backward"]  # one backward a step, always the last: right
    assert_verdict(rc, out, expected_bug("fsdp2", 4, RAF_FROZEN))


def test_the_frozen_unit_crash_is_named_only_with_its_config():
    what = "RuntimeError: split_with_sizes expects split_sizes to sum exactly to 70 (...), but got [130, 10]"
    err = failure.Failure(0, "error", what, "split_with_sizes_copy (_fsdp_collectives.py:294)", "")
    cfg = {"reshard_after_forward": 2, "grad_accum": 2, "freeze": "layers.0", "model": {}}
    assert known_bugs.match_crash("fsdp2", "cpu", None, [err], cfg) is FSDP2_RAF_INT_FROZEN_ACCUM
    for other in ({"reshard_after_forward": True}, {"grad_accum": 1}, {"freeze": ""}):
        assert known_bugs.match_crash("fsdp2", "cpu", None, [err], {**cfg, **other}) is None, other
    assert known_bugs.match_crash("fsdp1", "cpu", None, [err], cfg) is None
    lora = {**cfg, "freeze": "", "model": {"fsdpcheck_lora": {"r": 2}}}
    assert known_bugs.match_crash("fsdp2", "cpu", None, [err], lora) is FSDP2_RAF_INT_FROZEN_ACCUM


def test_fsdp1_hybrid_shard_on_a_one_rank_shard_group(checks):
    rc, out, _ = checks["kb-hsdp1-fsdp1"]
    if assert_verdict(rc, out, (FSDP1_HSDP_NO_REPLICATE, bug_status(FSDP1_HSDP_NO_REPLICATE))):
        # each rank's gradient is its own: the reference with HSDP's replicate all-reduce skipped
        assert "B = 1.0000 .. 1.0000 x the reference with --inject hsdp_no_replicate (W = 2)" in out, out


def test_the_hsdp_workarounds_pass(checks):
    rc, out, _ = checks["kb-hsdp1-fsdp1-no-shard"]  # FSDP1's NO_SHARD all-reduces over the world
    assert_verdict(rc, out, None)
    rc, out, _ = checks["kb-hsdp1-fsdp2"]  # FSDP2 on the same (2, 1) mesh: right wherever gloo can run it
    assert_verdict(rc, out, expected_bug("fsdp2", 2, HSDP1))


def divide_factor_verdict(rc, out, W, F):
    """A check of FSDP2 with --gradient-divide-factor F on a one-rank shard group."""
    if not HAS_DIVIDE_FACTOR:  # torch 2.7: no set_gradient_divide_factor, refused by name
        assert rc == 2 and "has no FSDPModule.set_gradient_divide_factor" in out, out
        return
    if assert_verdict(rc, out, (FSDP2_DIVIDE_FACTOR_SHARD1, bug_status(FSDP2_DIVIDE_FACTOR_SHARD1))):
        # torch 2.8's gloo drops the factor; 2.9's refuses the one-rank PREMUL_SUM
        dropped = f"B = {F}.0000 .. {F}.0000 x A (F = {F}, W = {W})" in out
        assert dropped or "Cannot use ReduceOp.PREMUL_SUM with Gloo" in out, out


def test_fsdp2_divide_factor_at_one_rank(checks):
    rc, out, _ = checks["kb-divide-w1"]
    divide_factor_verdict(rc, out, 1, 2)


def test_fsdp2_divide_factor_on_hsdp_with_a_one_rank_shard_group(checks):
    rc, out, _ = checks["kb-divide-hsdp"]
    divide_factor_verdict(rc, out, 2, 4)


def divide_twice_verdict(rc, out, needs):
    """A check of FSDP2 with --gradient-divide-factor 2 at W = 1, F applied outside the collective."""
    if not all(torch_has(m) for m in needs):  # torch 2.7 lacks the setters: refused by name
        assert rc == 2 and "has no FSDPModule.set_" in out, out
        return
    if assert_verdict(rc, out, (FSDP2_DIVIDE_FACTOR_TWICE, bug_status(FSDP2_DIVIDE_FACTOR_TWICE))):
        assert "B = 0.5000 .. 0.5000 x A (F = 2, W = 1)" in out, out


def test_force_sum_reduction_with_a_divide_factor_at_one_rank(checks):
    # the workaround for pytorch#167178 (2.8, 2.9), and its regression from 2.11 on
    rc, out, _ = checks["kb-divide-w1-force-sum"]
    divide_twice_verdict(rc, out, ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms"))


def test_fp16_reduce_with_a_divide_factor_at_one_rank(checks):
    rc, out, _ = checks["kb-divide-w1-fp16"]
    divide_twice_verdict(rc, out, ("set_gradient_divide_factor",))


def test_measured_versions():
    # the open bug has no clean version: past the last measured one it is unmeasured
    hsdp = FSDP1_HSDP_NO_REPLICATE
    assert [hsdp.present_on(v) for v in [(2, 7, 1), (2, 10, 0), (2, 15, 0), (2, 16, 0)]] == [True, True, True, None]
    div = FSDP2_DIVIDE_FACTOR_SHARD1
    assert [div.present_on(v) for v in [(2, 7, 1), (2, 8, 0), (2, 9, 0), (2, 10, 0), (2, 11, 0)]] == [
        None,
        True,
        True,
        None,
        False,
    ]
    assert known_bugs._versions(div.clean_on) == [(2, 11, 0), (2, 15, 0)]
    # a regression: clean before it was seen, unmeasured below and past that
    twice = FSDP2_DIVIDE_FACTOR_TWICE
    assert [twice.present_on(v) for v in [(2, 7, 1), (2, 8, 0), (2, 9, 0), (2, 10, 0), (2, 11, 0), (2, 16, 0)]] == [
        None,
        False,
        False,
        None,
        True,
        None,
    ]
    assert {hsdp, div, twice} <= set(known_bugs.CATALOGUE)
    assert bug_status(hsdp) is hsdp.present_on(TORCH)


def test_hsdp_no_replicate_signature():
    one = [(1.0, 1e-7)] * 4
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard", 1, 2, one) is FSDP1_HSDP_NO_REPLICATE
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard_zero2", 1, 4, one) is FSDP1_HSDP_NO_REPLICATE
    # not the bug: another API or strategy, a real shard group, one rank, a gradient that differs, none
    assert known_bugs.match_hsdp_no_replicate("fsdp2", "hybrid_shard", 1, 2, one) is None
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "no_shard", 1, 2, one) is None
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard", 2, 4, one) is None
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard", 1, 1, one) is None
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard", 1, 2, [*one, (0.5, 1e-7)]) is None
    assert known_bugs.match_hsdp_no_replicate("fsdp1", "hybrid_shard", 1, 2, []) is None


def test_divide_factor_signature():
    times4 = [(4.0, 1e-7)] * 3
    m = known_bugs.match_divide_factor_shard1
    assert m("fsdp2", 1, 4.0, 2, False, "fp32", times4) is FSDP2_DIVIDE_FACTOR_SHARD1
    # not the bug: FSDP1, a real shard group, no factor or the data-parallel size, force-sum, fp16, B = A
    assert m("fsdp1", 1, 4.0, 2, False, "fp32", times4) is None
    assert m("fsdp2", 2, 4.0, 4, False, "fp32", times4) is None
    assert m("fsdp2", 1, 0, 2, False, "fp32", times4) is None
    assert m("fsdp2", 1, 2.0, 2, False, "fp32", [(2.0, 1e-7)]) is None
    assert m("fsdp2", 1, 4.0, 2, True, "fp32", times4) is None
    assert m("fsdp2", 1, 4.0, 2, False, "fp16", times4) is None
    assert m("fsdp2", 1, 4.0, 2, False, "fp32", [(1.0, 1e-7)] * 3) is None


def test_divide_twice_signature():
    half = [(0.5, 1e-7)] * 3
    m = known_bugs.match_divide_factor_twice
    assert m("fsdp2", 1, 2.0, True, "fp32", half) is FSDP2_DIVIDE_FACTOR_TWICE
    assert m("fsdp2", 1, 2.0, False, "fp16", half) is FSDP2_DIVIDE_FACTOR_TWICE
    # not the bug: the factor inside the collective, a real shard group, F = 1, B = A
    assert m("fsdp2", 1, 2.0, False, "fp32", half) is None
    assert m("fsdp2", 2, 2.0, True, "fp32", half) is None
    assert m("fsdp2", 1, 1.0, True, "fp32", [(1.0, 1e-7)]) is None
    assert m("fsdp1", 1, 2.0, True, "fp32", half) is None
    assert m("fsdp2", 1, 2.0, True, "fp32", [(1.0, 1e-7)] * 3) is None


def test_the_one_rank_premul_refusal_is_named():
    err = failure.Failure(0, "error", "RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo", "", "")
    assert known_bugs.match_crash("fsdp2", "cpu", None, [err]) is FSDP2_DIVIDE_FACTOR_SHARD1
    assert known_bugs.match_crash("fsdp1", "cpu", None, [err]) is None


def _step0(d, grads):
    os.makedirs(d, exist_ok=True)
    t = {f"grad.{k}": v for k, v in grads.items()}
    t["loss"] = torch.tensor([1.0])
    save_file(t, os.path.join(d, "step-000000.safetensors"))


def test_the_divide_factor_signature_is_measured_from_the_step_files(tmp_path):
    job = Job(["--api", "fsdp2", "-n", "1", *DIV_W1, "--keep", str(tmp_path / "job")])
    assert check.divide_factor_applies(job) and not check.gloo_avg_applies(job)
    assert check.divide_factor_bug(job, job.ref_dir) is None  # no step files: no signature
    a = {"w": torch.tensor([1.0, -2.0, 3.0]), "b": torch.tensor([0.5])}
    _step0(job.ref_dir, a)
    _step0(job.torch_dir, {k: 2 * v for k, v in a.items()})  # the factor never divided
    line = check.divide_factor_bug(job, job.ref_dir)
    assert line is not None and line.startswith("known PyTorch bug pytorch#167178: "), line
    assert line.endswith("measured: all 2 gradients of step 0 are B = 2.0000 .. 2.0000 x A (F = 2, W = 1)"), line
    # with force-sum it is the double divide's to measure; a factor equal to the data-parallel size, no one's
    forced = Job(["--api", "fsdp2", "-n", "1", *DIV_W1, "--force-sum-reduction", "--keep", str(tmp_path / "job")])
    assert not check.divide_factor_applies(forced) and check.divide_twice_applies(forced)
    assert check.divide_twice_bug(forced, job.ref_dir) is None  # B = 2 A: not 1/F
    _step0(job.torch_dir, {k: v / 2 for k, v in a.items()})
    line = check.divide_twice_bug(forced, job.ref_dir)
    assert line is not None and "B = 0.5000 .. 0.5000 x A (F = 2, W = 1)" in line, line
    assert not check.divide_factor_applies(Job(["--api", "fsdp2", "-n", "2", "--gradient-divide-factor", "2", *MLP]))


def test_the_hsdp_signature_is_measured_from_the_step_files(tmp_path):
    job = Job(["--api", "fsdp1", "-n", "2", *HSDP1, "--keep", str(tmp_path / "job")])
    assert check.hsdp_no_replicate_applies(job)
    inj = str(tmp_path / "inj")
    a = {"w": torch.tensor([1.0, -2.0, 3.0])}
    _step0(inj, a)
    _step0(job.torch_dir, {"w": a["w"] + torch.tensor([0.5, 0.0, 0.0])})  # not each rank's own
    assert check.hsdp_no_replicate_bug(job, inj) is None
    _step0(job.torch_dir, a)
    line = check.hsdp_no_replicate_bug(job, inj)
    assert line is not None and line.startswith("known PyTorch bug pytorch#154888: "), line
    assert not check.hsdp_no_replicate_applies(Job(["--api", "fsdp1", "-n", "2", *HSDP1, "--inject", "no_divide"]))


def test_a_bug_measured_gone_from_this_torch_is_not_named():
    # the same shape on a torch the bug is measured absent from is another bug, or a fault injected
    for bug in known_bugs.CATALOGUE:
        assert known_bugs.gone_from_this_torch(bug.line()) == (bug.present_on(TORCH) is False), bug.issue
    assert not known_bugs.gone_from_this_torch("known PyTorch bug pytorch#1: not in the catalogue")
