"""Deliberate bugs in the torch run: `check` must fail (exit 1) and name the
tensor where the run first diverges from the reference. And the one real
bug found on the way (FSDP1's full optimizer state dict on a CPU device)."""

import json

from conftest import HAS_FORCE_SUM, assert_verdict, bug_status, check, expected_bug, first_divergence, register

from fsdpcheck_torch.known_bugs import FSDP1_OFFLOAD_SEGV

GPT2 = ["--model", "gpt2-tiny", "--steps", "2", "--strategy", "full_shard"]
GPT2_3 = ["--model", "gpt2-tiny", "--steps", "3", "--strategy", "full_shard"]

# rank 1 trains on rank 0's samples: the batch the ranks really read differs
register("fault-data_overlap", "--api", "fsdp1", "-n", "2", *GPT2, "--inject", "data_overlap")
# gradients left summed over the 2 ranks, not averaged (pytorch/pytorch#162338's symptom)
register("fault-no_divide", "--api", "fsdp2", "-n", "2", *GPT2, "--inject", "no_divide")
CKPT = ("--api", "fsdp1", "-n", "2", *GPT2_3, "--ckpt-at", "1")
# only where torch is known clean of pytorch#188989: its crash would take the shared torchrun down with it
if bug_status(FSDP1_OFFLOAD_SEGV) is False:
    register("ckpt-round-trip", *CKPT)
register("fault-ckpt_drop_optim", "--api", "fsdp2", "-n", "2", *GPT2_3, "--ckpt-at", "1", "--inject", "ckpt_drop_optim")
# torch 2.15 FSDP1: the full optimizer state dict with offload to CPU, on a CPU
# device, returns exp_avg == exp_avg_sq (one reused gather buffer; `.cpu()` of a
# CPU tensor does not copy). The adapter avoids it unless asked.
register("torchbug-fsdp1-optim-offload", "--api", "fsdp1", "-n", "2", *GPT2, "--optim-state-offload")
# torch 2.15 FSDP1 (pytorch/pytorch#154888, closed as not planned): HYBRID_SHARD
# with a one-rank shard group is clamped to NO_SHARD over that one-rank group
# with only a warning, so the replicas never all-reduce: each rank trains on
# its own gradient (fsdpcheck's hsdp_no_replicate fault, for real).
register(
    "torchbug-fsdp1-hsdp-shard-group-1",
    "--api",
    "fsdp1",
    "-n",
    "2",
    *GPT2[:4],
    "--strategy",
    "hybrid_shard",
    "--shard-group",
    "1",
)
# FSDP2 handles the same (2, 1) mesh correctly
register(
    "fsdp2-hsdp-shard-group-1",
    "--api",
    "fsdp2",
    "-n",
    "2",
    *GPT2[:4],
    "--strategy",
    "hybrid_shard",
    "--shard-group",
    "1",
)


def caught(result, prefix):
    rc, out, _ = result
    div = first_divergence(out)
    print(div)
    assert rc == 1, out
    assert div.startswith("first divergence: step ") and f"tensor {prefix}" in div, out
    return div


def test_data_overlap_is_caught(checks):
    caught(checks["fault-data_overlap"], "batch.input")


def test_no_divide_is_caught(checks):
    if not HAS_FORCE_SUM:  # FSDP2 there has no way to make its collectives SUM
        rc, out, _ = checks["fault-no_divide"]
        assert rc == 2 and "has no FSDPModule.set_force_sum_reduction_for_comms" in out, out
        return
    caught(checks["fault-no_divide"], "grad.")


def test_checkpoint_round_trip_passes(checks):
    status = bug_status(FSDP1_OFFLOAD_SEGV)
    if status is not False:  # run alone: a crash is a verdict on this torch, named
        rc, out = check(*CKPT)
        crashed = rc == 1 and "rank 0: SIGSEGV" in out and "known PyTorch bug pytorch#188989" in out
        assert crashed or (status is None and rc == 0), out
        return
    rc, out, d = checks["ckpt-round-trip"]
    assert rc == 0, out
    assert json.loads((d / "torch" / "trace.json").read_text())["torch"]["checkpoint_at"] == 1


def test_optimizer_state_not_restored_is_caught(checks):
    div = caught(checks["fault-ckpt_drop_optim"], "")
    expect = expected_bug("fsdp2", 2, GPT2_3)
    if expect and (expect[1] or "step 0," in div):  # FSDP2 on gloo there diverges at step 0 already
        assert f"known PyTorch bug {expect[0].issue}" in checks["fault-ckpt_drop_optim"][1]
        return
    assert "step 1," in div


def test_fsdp1_cpu_optim_state_dict_aliasing_is_caught(checks):
    caught(checks["torchbug-fsdp1-optim-offload"], "optim.exp_avg.")


def test_fsdp1_hsdp_one_rank_shard_group_is_caught(checks):
    caught(checks["torchbug-fsdp1-hsdp-shard-group-1"], "grad.")


def test_fsdp2_hsdp_one_rank_shard_group_passes(checks):
    rc, out, _ = checks["fsdp2-hsdp-shard-group-1"]
    assert_verdict(rc, out, expected_bug("fsdp2", 2, ["--strategy", "hybrid_shard"]))
