"""FSDP2's explicit prefetch lists and gradient divide factor (--forward-prefetch-units N,
--backward-prefetch-units N, --gradient-divide-factor F): real FSDP2 set as the reference
states them (every unit lists the next N units of the pass; set_gradient_divide_factor(F)
on every unit) trains as the reference does, its comm log is the theory's schedule for
those lists and fails the theory without them, and the factor reaches torch (a
reference without it disagrees). On gloo, a factor that makes FSDP2 reduce-scatter with
PREMUL_SUM is refused before training, and FSDP1 refuses all three.

The lists run on a 4-block gpt2 (tests/gpt2-4layer.json): with lists of 2 a block's list
names a unit another list already issued (torch's unshard of a unit in flight is a
no-op) and one it issues itself, which gpt2-tiny's 2 blocks cannot show."""

import json
import os
import subprocess

import pytest
from conftest import (
    HAS_FORCE_SUM,
    HERE,
    TORCH,
    assert_verdict,
    env,
    expected_bug,
    fsdpcheck_bin,
    reference_trace,
    refused,
    register,
    torch_has,
)

FSDP2_OK = TORCH >= (2, 15, 0)  # FSDP2's schedule is modelled as torch 2.15 runs it (test_schedule.py)
HAS_DIVIDE = torch_has("set_gradient_divide_factor")
W = 2
MODEL4 = os.path.join(HERE, "gpt2-4layer.json")
BASE = ["--steps", "2", "--global-batch", "4", "--strategy", "full_shard"]
LISTS = ["--forward-prefetch-units", "2", "--backward-prefetch-units", "2"]
FACTOR = ["--gradient-divide-factor", "4"]

LIST_RUN = ["--model", MODEL4, *BASE, *LISTS, "--clip-grad-norm", "1.0"]
register("fsdp2-lists", "--api", "fsdp2", "-n", str(W), *LIST_RUN, *(["--schedule"] if FSDP2_OK else []))
register(
    "fsdp2-factor", "--api", "fsdp2", "-n", str(W), "--model", "gpt2-tiny", *BASE, *FACTOR, "--force-sum-reduction"
)


def config(d):
    with open(os.path.join(d, "trace.json")) as f:
        return json.load(f)


def fsdpcheck(*args):
    p = subprocess.run(
        [fsdpcheck_bin(), *args], capture_output=True, text=True, env=env(), stdin=subprocess.DEVNULL, check=False
    )
    return p.returncode, p.stdout + p.stderr


def test_lists_train_as_the_reference_and_schedule_as_the_theory(checks):
    rc, out, d = checks["fsdp2-lists"]
    if assert_verdict(rc, out, expected_bug("fsdp2", W, LIST_RUN)):
        return  # pytorch#162338 in this torch (test_gloo_avg.py): its FSDP2 sums where it should average
    assert "PASS: 2 steps agree within the policy" in out, out
    ref, torch_cfg = config(d / "ref")["config"], config(d / "torch")["config"]
    for k in ("fsdp_version", "forward_prefetch", "forward_prefetch_units", "backward_prefetch_units"):
        assert torch_cfg.get(k) == ref.get(k), (k, torch_cfg.get(k), ref.get(k))
    assert (ref["fsdp_version"], ref["forward_prefetch_units"], ref["backward_prefetch_units"]) == (2, 2, 2)
    assert "gradient_divide_factor" not in torch_cfg  # written only when set, as the reference does
    if not FSDP2_OK:
        pytest.skip(f"FSDP2's schedule is modelled as torch 2.15 runs it, not {TORCH}")
    assert f"fsdpcheck schedule: PASS (0 of {W} rank(s)" in out, out
    log = str(d / "torch" / "commlog.jsonl")
    flags = ["--model", MODEL4, *BASE, "--clip-grad-norm", "1.0"]
    rc, out = fsdpcheck(
        "schedule", log, "--world", str(W), "--api", "torch-fsdp2", *flags, "--fsdp-version", "2", *LISTS
    )
    assert rc == 0 and "PASS" in out, out
    # the theory without the lists (torch's defaults), or with lists of 1, fails on the prefetches
    rc, out = fsdpcheck("schedule", log, "--world", str(W), "--api", "torch-fsdp2", *flags)
    assert rc == 1 and "forward_prefetch off: all_gather of unit" in out, out
    one = ["--fsdp-version", "2", "--forward-prefetch-units", "1", "--backward-prefetch-units", "1"]
    rc, out = fsdpcheck("schedule", log, "--world", str(W), "--api", "torch-fsdp2", *flags, *one)
    assert rc == 1 and "all_gather of unit" in out, out


def test_the_divide_factor_reaches_torch(checks, tmp_path):
    rc, out, d = checks["fsdp2-factor"]
    if not HAS_FORCE_SUM or not HAS_DIVIDE:
        assert rc == 2 and "has no FSDPModule.set_" in out, out
        return
    assert rc == 0 and "PASS" in out, out
    t = config(d / "torch")
    assert t["config"]["gradient_divide_factor"] == 4 == config(d / "ref")["config"]["gradient_divide_factor"]
    assert t["torch"]["reduction"] == {"force_sum_reduction_for_comms": True, "gradient_divide_factor": 4.0}
    # the same run judged against a reference that divides by W: torch's gradients are W / F of its
    ref = tmp_path / "ref-no-factor"
    subprocess.run(
        ["mpiexec", "-n", str(W), fsdpcheck_bin(), "run", "--model", "gpt2-tiny", *BASE, "--fsdp-version", "2"]
        + ["--divide", "sum-then-divide", "--trace", str(ref), "--quiet"],
        check=True,
        env=env(),
        stdin=subprocess.DEVNULL,
    )
    rc, out = fsdpcheck("compare", str(ref), str(d / "torch"))
    assert rc == 1 and "FAIL" in out, out


CHECK2 = ["check", "--api", "fsdp2", "-n", str(W), "--model", "gpt2-tiny"]


def test_gloo_refuses_a_premul_sum_factor(tmp_path, capsys, monkeypatch):
    """F other than the shard group's size, fp32 or bf16, no force-sum: torch would issue
    ReduceOp.PREMUL_SUM(1/F), which gloo cannot run. Refused before the reference runs (check)
    and before training (run); F equal to the group's size (AVG), fp16 (SUM, pre/post) and
    force-sum are not."""
    refused([*CHECK2, *FACTOR], capsys, "PREMUL_SUM(1/4)", "gloo", "--force-sum-reduction")
    refused([*CHECK2, "--gradient-divide-factor", "3", "--reduce-dtype", "bf16"], capsys, "PREMUL_SUM(1/3)")
    from fsdpcheck_torch.check import parse

    for ok in (
        ["--gradient-divide-factor", "2"],
        [*FACTOR, "--reduce-dtype", "fp16"],
        [*FACTOR, "--force-sum-reduction"],
    ):
        parse(CHECK2[1:] + ok)
    like = reference_trace(tmp_path / "ref", "--model", "gpt2-tiny", "--strategy", "full_shard", "--fsdp-version", "2")
    monkeypatch.setenv("WORLD_SIZE", str(W))
    out = tmp_path / "out"
    refused(["run", "--api", "fsdp2", "--like", like, "--trace", str(out), *FACTOR], capsys, "--force-sum-reduction")
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--forward-prefetch-units", "2"], "--forward-prefetch-units 2: FSDP1's forward_prefetch prefetches one"),
        (["--backward-prefetch-units", "1"], "--backward-prefetch-units 1 is FSDP2's set_modules_to_backward_pre"),
        (FACTOR, "--gradient-divide-factor 4 is FSDP2's set_gradient_divide_factor"),
    ],
)
def test_fsdp1_refuses_them(flags, needle, capsys):
    refused(["check", "--api", "fsdp1", "-n", str(W), "--model", "gpt2-tiny", *flags], capsys, "fsdp1: " + needle)


def test_a_reference_traces_settings_are_read_and_checked(tmp_path, capsys):
    """--like a reference trace with the three settings: FSDP1 and the paths that do not
    apply them (the Trainer's, XLA's) refuse them from the trace too, and a value the
    reference would not write is refused naming the key."""
    import dataclasses

    import transformers

    from fsdpcheck_torch import xla
    from fsdpcheck_torch.config import UsageError, like_config, unsupported, validate

    flags = ["--model", "gpt2-tiny", "--strategy", "full_shard", "--steps", "1", "--fsdp-version", "2", *LISTS, *FACTOR]
    like = reference_trace(tmp_path / "ref", *flags, "--weight-decay", "0")
    out = str(tmp_path / "out")
    refused(["run", "--api", "fsdp1", "--like", like, "--trace", out], capsys, "--forward-prefetch-units 2")
    if "train_sampling_strategy" in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}:
        refused(["trainer", "--like", like, "--trace", out], capsys, "--backward-prefetch-units", "Trainer")
    from fsdpcheck_torch.tracefile import RefTrace

    ref = RefTrace(like)
    cfg, _ = like_config(ref, [])
    assert "--backward-prefetch-units" in xla._unsupported("fsdp2", dict(cfg, forward_prefetch=False), {})
    no_lists = dict(cfg, forward_prefetch=False, backward_prefetch_units=0, forward_prefetch_units=0)
    assert "no gradient divide factor" in xla._unsupported("fsdp2", no_lists, {})
    assert "give one of them" in unsupported("fsdp2", dict(cfg, backward_prefetch="pre"), "cpu")
    with pytest.raises(UsageError, match="--backward-prefetch-units needs a sharded strategy"):
        validate(dict(cfg, strategy="no_shard", forward_prefetch=False), 1)
    # the last flag wins, as in the reference: --forward-prefetch is a list of one again
    cfg, _ = like_config(ref, ["--forward-prefetch"])
    assert cfg["forward_prefetch"] and "forward_prefetch_units" not in cfg
    t = config(like)
    for key, bad, what in (
        ("forward_prefetch_units", 0, "an integer >= 1"),
        ("backward_prefetch_units", 1.5, "an integer >= 0"),
        ("gradient_divide_factor", -1, "a finite number >= 0"),
    ):
        c = dict(t["config"], **{key: bad})
        with open(os.path.join(like, "trace.json"), "w") as f:
            json.dump(dict(t, config=c), f)
        refused(["run", "--api", "fsdp2", "--like", like, "--trace", out], capsys, f'"config.{key}"', what)
