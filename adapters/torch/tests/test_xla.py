"""`--device xla` (fsdpcheck_torch/xla.py): PyTorch/XLA's SPMD FSDPv2, one process driving W devices
of XLA's CPU client, and classic XLA FSDP at one device, each judged by `compare` against the
reference in lockstep at every step.

The checks run where torch_xla is installed (adapters/torch/requirements-xla.lock, CI's XLA stage);
elsewhere only the refusals, which need no XLA device, run."""

import importlib.util
import json
import math
import re

import pytest
from conftest import check, register

from fsdpcheck_torch import xla
from fsdpcheck_torch.config import UsageError

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
needs_xla = pytest.mark.skipif(not HAS_XLA, reason="no torch_xla here (adapters/torch/requirements-xla.lock has it)")

XLA = ["--api", "fsdp2", "--device", "xla"]
if HAS_XLA:
    register("xla-gpt2-w4", *XLA, "-n", "4", "--model", "gpt2-tiny", "--steps", "2")
    register("xla-llama-w2", *XLA, "-n", "2", "--model", "llama-tiny", "--steps", "2")
    register("xla-mlp-w2", *XLA, "-n", "2", "--model", "mlp-tiny", "--grad-accum", "2", "--clip-grad-norm", "1.0")
    # classic XlaFullyShardedDataParallel at one device (its collectives hang on the CPU client at more)
    C = ["--api", "fsdp1", "--device", "xla", "-n", "1"]
    register("xla-classic-mlp", *C, "--model", "mlp-tiny", "--grad-accum", "2", "--clip-grad-norm", "1.0")
    register(
        "xla-classic-gpt2-ckpt", *C, "--model", "gpt2-tiny", "--steps", "2", "--activation-checkpointing", "inside"
    )
    register(
        "xla-gpt2-w2-ckpt",
        *XLA,
        "-n",
        "2",
        "--model",
        "gpt2-tiny",
        "--steps",
        "2",
        "--activation-checkpointing",
        "inside",
    )


def torch_info(keep):
    return json.loads((keep / "torch" / "trace.json").read_text())["torch"]


def trace_params(keep):
    """The parameter names of the trace's units: what every read-back must cover."""
    trace = json.loads((keep / "torch" / "trace.json").read_text())
    return {n for u in trace["units"] for n in u["params"]}


@needs_xla
@pytest.mark.parametrize(
    ("name", "W"), [("xla-gpt2-w4", 4), ("xla-llama-w2", 2), ("xla-mlp-w2", 2), ("xla-gpt2-w2-ckpt", 2)]
)
def test_fsdpv2_on_xla_cpu_passes_in_lockstep(checks, name, W):
    rc, out, keep = checks[name]
    assert rc == 0 and "PASS: " in out, out
    info = torch_info(keep)
    assert info["api"] == "xla-spmd-fsdpv2" and info["world_size"] == W, info
    assert info["mesh"] == {"shape": [W, 1], "axes": ["fsdp", "model"]}, info
    # every parameter read back tiled over the W devices along one of its dimensions
    assert set(info["sharding"]) == trace_params(keep), info["sharding"]
    for name_, spec in info["sharding"].items():
        m = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+)\}", spec)
        assert m and sorted(int(t) for t in m[1].split(",")) == [1] * (m[1].count(",")) + [W], (name_, spec)
        assert [int(d) for d in m[2].split(",")] == list(range(W)), (name_, spec)


@needs_xla
def test_checkpointing_recomputes_each_block_in_its_backward(checks):
    """xla_fsdp_grad_ckpt's placement, read back: each block's attention runs twice a micro-batch
    with it (forward, then the recompute in backward); without it the trace records none."""
    _, _, keep = checks["xla-gpt2-w2-ckpt"]
    trace = json.loads((keep / "torch" / "trace.json").read_text())
    L, steps = trace["config"]["model"]["n_layer"], trace["steps"]
    ac = trace["torch"]["activation_checkpointing"]
    assert ac == {"placement": "inside", "by": "torch_xla checkpoint_module", "block_forwards": 2 * steps * L}, ac
    assert torch_info(checks["xla-gpt2-w4"][2])["activation_checkpointing"] is None


@needs_xla
@pytest.mark.parametrize("name", ["xla-classic-mlp", "xla-classic-gpt2-ckpt"])
def test_classic_xla_fsdp_at_one_device_passes_in_lockstep(checks, name):
    rc, out, keep = checks[name]
    assert rc == 0 and "PASS: " in out, out
    info = torch_info(keep)
    assert info["api"] == "xla-fsdp" and info["world_size"] == 1 and info["mesh"] is None, info
    # each parameter its own flat shard, padded past its elements
    assert set(info["sharding"]) == trace_params(keep), info["sharding"]
    for name_, sh in info["sharding"].items():
        assert sh["shard"] >= math.prod(sh["of"]), (name_, sh)
    if name.endswith("ckpt"):
        trace = json.loads((keep / "torch" / "trace.json").read_text())
        L, steps = trace["config"]["model"]["n_layer"], trace["steps"]
        assert info["activation_checkpointing"]["block_forwards"] == 2 * steps * L, info


def test_classic_xla_fsdp_at_two_devices_is_refused_before_it_starts():
    rc, out = check("--api", "fsdp1", "--device", "xla", "-n", "2", "--model", "mlp-micro", "--steps", "1")
    assert rc == 2 and "pytorch/xla#9089" in out and len(out.strip().splitlines()) == 1, out


def test_classic_xla_fsdp_runs_one_device_whatever_the_client(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")  # a TPU host too: one process drives one device
    assert "pytorch/xla#9089" in xla.device_count_refusal(4, {}, classic=True)
    assert xla.classic_refusal(1) is None


def test_the_xla_run_is_one_process_told_its_world():
    from fsdpcheck_torch.check import launch_cmd

    env = {"PATH": "/bin"}
    cmd, e = launch_cmd(4, ["run"], "/tmp/log", "xla", env)
    assert cmd[1:] == ["-m", "fsdpcheck_torch", "run"] and env == {"PATH": "/bin"}, (cmd, env)
    assert e["PJRT_DEVICE"] == "CPU" and e["CPU_NUM_DEVICES"] == "4" and e["FSDPCHECK_TORCH_XLA_WORLD"] == "4", e
    _, e = launch_cmd(4, ["run"], "/tmp/log", "xla", {"PJRT_DEVICE": "TPU"})
    assert e["PJRT_DEVICE"] == "TPU" and "CPU_NUM_DEVICES" not in e, e  # a TPU host's chips are its own
    cmd, e = launch_cmd(2, ["run"], "/tmp/log", "cpu", env)
    assert "--nproc-per-node=2" in cmd and e is env, cmd


def test_a_device_count_other_than_the_checks_w_is_refused(monkeypatch):
    monkeypatch.setenv("FSDPCHECK_TORCH_XLA_WORLD", "4")
    why = xla.device_count_refusal(2, {})
    assert "the XLA runtime has 2 devices, the check asked for W = 4" in why, why


def test_a_batch_the_devices_do_not_divide_is_refused(monkeypatch):
    monkeypatch.delenv("FSDPCHECK_TORCH_XLA_WORLD", raising=False)
    from fsdpcheck_torch.check import parse

    cfg = parse(["--api", "fsdp2", "-n", "3", "--model", "mlp-tiny", "--global-batch", "6"])[2]
    with pytest.raises(UsageError, match="not divisible"):
        xla.device_count_refusal(4, cfg)


@pytest.mark.skipif(HAS_XLA, reason="torch_xla is installed here")
def test_without_torch_xla_the_check_refuses_in_one_line():
    rc, out = check(*XLA, "-n", "2", "--model", "mlp-micro", "--steps", "1")
    assert rc == 2 and "needs torch_xla" in out and "requirements-xla.lock" in out, out
