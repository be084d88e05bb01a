"""The Hugging Face Trainer path on the CPU: a real Trainer.train() with
fsdp="full_shard auto_wrap" and examples/fsdp_config/fsdp_config.trainer.json,
traced by the TrainerCallback.

With the pinned transformers 5.23 / accelerate 1.15, Accelerate turns FSDP on
only for accelerator distributed types (MULTI_GPU, MULTI_HPU, MULTI_XPU, ...);
on the CPU (MULTI_CPU) the Trainer silently wraps the model in DDP. The test
pins that down (so a version that starts applying FSDP on the CPU shows up)
and checks everything else of the path against the reference: the data
order, the all-token loss, the optimizer, the callback's capture."""

import json
import os
import subprocess

from conftest import EXAMPLES, env, fsdpcheck_bin, torchrun


def test_trainer_path_on_cpu(tmp_path):
    trainer_path(tmp_path)


def test_trainer_gradient_checkpointing_on_cpu(tmp_path):
    """TrainingArguments' checkpointing (transformers checkpoints each block's
    forward: the reference's inside placement) judged against the reference
    run with --gradient-checkpointing; trace.json shows the recompute ran
    (every block's attention twice per micro-batch)."""
    out = trainer_path(tmp_path, "--gradient-checkpointing")
    if out is None:
        return
    t = json.loads((out / "trace.json").read_text())
    K, steps = t["config"]["grad_accum"], t["steps"]
    want = {"placement": "inside", "by": "trainer", "block_forwards": 2 * steps * K * 2}
    assert t["torch"]["activation_checkpointing"] == want


def trainer_path(tmp_path, *flags):
    cfgfile = os.path.join(EXAMPLES, "fsdp_config.trainer.json")
    ref, out = tmp_path / "ref", tmp_path / "trainer"
    e = env()
    subprocess.run(
        [
            "mpiexec",
            "-n",
            "2",
            fsdpcheck_bin(),
            "run",
            "--model",
            "gpt2-tiny",
            "--fsdp-config",
            cfgfile,
            "--weight-decay",
            "0",
            "--steps",
            "2",
            "--trace",
            str(ref),
            "--quiet",
            *flags,
        ],
        check=True,
        env=e,
        stdin=subprocess.DEVNULL,
    )
    p = subprocess.run(
        torchrun(
            2,
            "-m",
            "fsdpcheck_torch",
            "trainer",
            "--like",
            str(ref),
            "--trace",
            str(out),
            "--fsdp",
            "full_shard auto_wrap",
            "--fsdp-config",
            cfgfile,
            "--allow-ddp",
            *flags,
            log_dir=tmp_path / "torchrun-log",
        ),
        capture_output=True,
        text=True,
        env=e,
        stdin=subprocess.DEVNULL,
        timeout=900,
        check=False,
    )
    print(p.stdout, p.stderr[-3000:])
    from importlib.metadata import version

    if int(version("transformers").split(".")[0]) < 5:  # the oldest pair's 4.56 cannot replay in order
        assert p.returncode != 0 and "has no TrainingArguments.train_sampling_strategy" in p.stderr, p.stderr
        assert not (out / "trace.json").exists()
        return None
    assert p.returncode == 0, p.stderr[-3000:]
    assert "not FSDP: Accelerate's distributed type was MULTI_CPU at world size 2" in p.stderr
    info = json.loads((out / "trace.json").read_text())["torch"]
    assert info["wrapped_as"] == "DistributedDataParallel" and info["fsdp_applied"] is False
    c = subprocess.run([fsdpcheck_bin(), "compare", str(ref), str(out)], capture_output=True, text=True, check=False)
    print(c.stdout)
    assert c.returncode == 0, c.stdout
    return out
