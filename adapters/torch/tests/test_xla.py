"""`--device xla` (fsdpcheck_torch/xla.py): PyTorch/XLA's SPMD FSDPv2, one process driving W devices
of XLA's CPU client, and classic XLA FSDP at one device, each judged by `compare` against the
reference in lockstep at every step.

The checks run where torch_xla is installed (adapters/torch/requirements-xla.lock, CI's XLA stage);
elsewhere only the refusals, which need no XLA device, run."""

import importlib.util
import json
import math
import os
import re
import subprocess

import pytest
from conftest import EXAMPLES, adapter, check, env, fsdpcheck_bin, register

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

    # the honest-flag twins (issue 51 deliverable 6): each setting changed, the trace and numbers with it
    register(
        "xla-gpt2-mesh-2x2", *XLA, "-n", "4", "--model", "gpt2-tiny", "--steps", "2", "--xla-mesh", "fsdp:2,tensor:2"
    )
    XC = os.path.join(EXAMPLES, "fsdp_config.xla.json")  # bf16 compute, checkpointing: as users write it
    register("xla-classic-gpt2-example", *C, "--model", "gpt2-tiny", "--steps", "2", "--fsdp-config", XC)
    BF = ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--activation-checkpointing", "inside"]
    register("xla-classic-gpt2-bf16-fp32-reduce", *C, "--model", "gpt2-tiny", "--steps", "2", *BF)


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


def step_loss(keep, step=0):
    from safetensors.torch import load_file

    return float(load_file(str(keep / "torch" / f"step-{step:06d}.safetensors"))["loss"])


@needs_xla
def test_the_mesh_flag_changes_the_mesh_and_the_sharding(checks):
    """--xla-mesh fsdp:2,tensor:2 on 4 devices: the trace's mesh is that, each parameter is split in
    2 along its largest dimension and replicated over "tensor" (read back), and the run still passes."""
    rc, out, keep = checks["xla-gpt2-mesh-2x2"]
    assert rc == 0 and "PASS: " in out, out
    info, w4 = torch_info(keep), torch_info(checks["xla-gpt2-w4"][2])
    assert info["mesh"] == {"shape": [2, 2], "axes": ["fsdp", "tensor"]}, info["mesh"]
    for name, spec in info["sharding"].items():
        assert spec.endswith("last_tile_dim_replicate}") and spec != w4["sharding"][name], (name, spec)
        assert "2" in spec.split("]")[0] and "4" not in spec.split("]")[0], (name, spec)


@needs_xla
def test_classic_compute_dtype_is_the_configs_and_changes_the_numbers(checks):
    """The example fsdp_config (xla_fsdp_settings compute_dtype bfloat16, checkpointing) as written, and
    --param-dtype bf16 --reduce-dtype fp32: each passes against the reference planned in those dtypes,
    the wrapper reads back what was asked, and the losses are not the fp32 run's."""
    fp32 = checks["xla-classic-gpt2-ckpt"][2]
    want = {
        "xla-classic-gpt2-example": ("bf16", False, True),
        "xla-classic-gpt2-bf16-fp32-reduce": ("fp32", True, False),
    }
    for name, (reduce, fp32_rs, on_dim0) in want.items():
        rc, out, keep = checks[name]
        assert rc == 0 and "PASS: " in out, out
        w = torch_info(keep)["wrapper"]
        assert w["compute_dtype"] == "bfloat16" and w["fp32_reduce_scatter"] is fp32_rs, w
        assert w["shard_param_on_dim_0"] is on_dim0 and w["flatten_parameters"] is False, w
        c = json.loads((keep / "torch" / "trace.json").read_text())["config"]
        assert (c["param_dtype"], c["reduce_dtype"]) == ("bf16", reduce), c
        assert step_loss(keep) != step_loss(fp32), name
    assert torch_info(fp32)["wrapper"]["compute_dtype"] == "float32"


@needs_xla
def test_a_parameter_sharded_along_the_wrong_dimension_fails_the_check(tmp_path):
    """The mutant re-shards one weight along the dimension FSDPv2's rule does not pick: the numbers
    are the same (SPMD computes the same function whatever the layout), so compare passes, and the
    check fails on the layout read back, naming the parameter."""
    p = "transformer.h.0.attn.c_attn.weight"
    rc, out = adapter("check", *XLA, "-n", "4", "--model", "gpt2-tiny", "--steps", "1", extra_env={xla.MUTANT: p})
    assert rc == 1 and "PASS: 1 step agree" in out, out
    assert any(line.startswith("FAIL: layout") and p in line for line in out.splitlines()), out


def trainer_xla(tmp_path, world, model, fsdp_config, *plan_flags):
    """The reference's plan at W = world, then `trainer --device xla` on world XLA:CPU devices with
    fsdp_config, then compare: (trainer's exit, its stderr, compare's exit, its output, trace info)."""
    ref, out = tmp_path / "ref", tmp_path / "trainer"
    e = env()
    plan = [fsdpcheck_bin(), "plan", "--world", str(world), "--model", model, "--strategy", "full_shard"]
    plan += ["--weight-decay", "0", "--steps", "2", "--trace", str(ref), "--quiet", *plan_flags]
    subprocess.run(plan, check=True, env=e, stdin=subprocess.DEVNULL)
    rc, err = adapter(
        "trainer",
        "--device",
        "xla",
        "--like",
        str(ref),
        "--trace",
        str(out),
        "--fsdp",
        "full_shard auto_wrap",
        "--fsdp-config",
        str(fsdp_config),
        extra_env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(world)},
    )
    c = subprocess.run([fsdpcheck_bin(), "compare", str(ref), str(out)], capture_output=True, text=True, check=False)
    info = json.loads((out / "trace.json").read_text())["torch"] if (out / "trace.json").exists() else None
    return rc, err, c.returncode, c.stdout + c.stderr, info


@needs_xla
def test_the_trainers_fsdpv2_with_checkpointing_passes_on_llama(tmp_path):
    """xla: true, xla_fsdp_v2: true, xla_fsdp_grad_ckpt: true through the Trainer on 2 devices: judged
    in lockstep against the reference planned with checkpointing, it passes; the trace shows the
    Trainer's mesh, its wrapper, the recompute, and the one workaround it needed."""
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(
        json.dumps(
            {
                "xla": True,
                "xla_fsdp_v2": True,
                "xla_fsdp_grad_ckpt": True,
                "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            }
        )
    )
    rc, err, crc, cout, info = trainer_xla(tmp_path, 2, "llama-tiny", cfg, "--activation-checkpointing", "inside")
    assert rc == 0, err[-3000:]
    assert crc == 0 and "PASS: 2 steps agree" in cout, cout
    assert info["wrapped_as"] == "SpmdFullyShardedDataParallel" and info["fsdp_applied"] is True, info
    assert info["mesh"] == {"shape": [2, 1], "axes": ["fsdp", "tensor"]}, info
    assert info["activation_checkpointing"] == {"placement": "inside", "by": "xla_fsdp_grad_ckpt", "block_forwards": 8}
    from fsdpcheck_torch.trainer_xla import OPTIMIZER

    assert info["workarounds"] == [OPTIMIZER], info


@needs_xla
def test_the_trainers_fsdpv2_unties_gpt2s_head_and_the_check_fails_there(tmp_path):
    """The same path on GPT-2 (tied head) at 4 devices: the Trainer leaves moving the model to the
    device to FSDPv2, which makes each parameter anew, so the head comes apart from the embedding and
    trains apart. The trainer says so, the trace records it, and compare fails at the embedding's
    gradient in step 0 (a transformers bug this check exists to catch)."""
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps({"xla": True, "xla_fsdp_v2": True, "fsdp_transformer_layer_cls_to_wrap": ["GPT2Block"]}))
    rc, err, crc, cout, info = trainer_xla(tmp_path, 4, "gpt2-tiny", cfg)
    assert rc == 0 and "untied the LM head from the token embedding" in err, err[-3000:]
    assert info["tied_weights"] == {"before_wrap": True, "after_wrap": False}, info
    assert len(info["workarounds"]) == 2, info
    assert crc == 1 and "first divergence: step 0, tensor grad.transformer.wte.weight" in cout, cout


@needs_xla
def test_the_example_xla_fsdp_config_passes_through_the_trainer(tmp_path):
    """examples/fsdp_config/fsdp_config.xla.json as written (classic XLA FSDP, xla_fsdp_settings'
    compute_dtype bfloat16, xla_fsdp_grad_ckpt) through the Trainer at one device: it passes against
    the reference planned in bf16 with checkpointing; classic XLA FSDP keeps GPT-2's head tied."""
    XC = os.path.join(EXAMPLES, "fsdp_config.xla.json")
    plan = ["--param-dtype", "bf16", "--activation-checkpointing", "inside"]
    rc, err, crc, cout, info = trainer_xla(tmp_path, 1, "gpt2-tiny", XC, *plan)
    assert rc == 0, err[-3000:]
    assert crc == 0 and "PASS: 2 steps agree" in cout, cout
    assert info["wrapped_as"] == "XlaFullyShardedDataParallel" and info["mesh"] is None, info
    assert info["tied_weights"] == {"before_wrap": True, "after_wrap": True}, info
    assert info["wrapper"]["compute_dtype"] == "bfloat16" and info["wrapper"]["shard_param_on_dim_0"] is True, info
    assert info["activation_checkpointing"]["block_forwards"] == 8, info
