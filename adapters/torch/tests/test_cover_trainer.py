"""The Trainer path's refusals (fsdpcheck_torch/trainer.py): a reference the
Hugging Face Trainer cannot replay exactly (an MLP, SGD, weight decay on every
parameter, another sharding strategy) and a malformed --fsdp are exit 2 with
one line, before any process group or Trainer is made."""

import dataclasses
import subprocess

import pytest
import transformers
from conftest import fsdpcheck_bin

from fsdpcheck_torch.cli import main

# transformers 5.23 has it, 4.56.2 (the oldest pair) not: the Trainer path refuses to run there
SEQUENTIAL = "train_sampling_strategy" in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


def reference(path, *flags):
    subprocess.run(
        [fsdpcheck_bin(), "run", "--steps", "1", "--strategy", "full_shard", *flags, "--trace", str(path), "--quiet"],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return str(path)


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    d = tmp_path_factory.mktemp("trainer")
    gpt2 = ["--model", "gpt2-micro", "--seq-len", "8"]
    return {
        "mlp": reference(d / "mlp", "--model", "mlp-micro", "--weight-decay", "0"),
        "sgd": reference(d / "sgd", *gpt2, "--optimizer", "sgd", "--lr", "0.05", "--weight-decay", "0"),
        "decay": reference(d / "decay", *gpt2, "--weight-decay", "0.01"),
        "good": reference(d / "good", *gpt2, "--weight-decay", "0"),
    }


@pytest.mark.parametrize(
    ("ref", "flags", "needle"),
    [
        (
            "mlp",
            [],
            "the Trainer path trains Hugging Face models, gpt2 and llama (the reference trace's model is fsdpcheck-mlp)",
        ),
        ("sgd", [], "the Trainer path uses optim=adamw_torch (the reference trace uses sgd)"),
        ("decay", [], "run the reference with --weight-decay 0"),
        ("good", ["--fsdp", "full_shard shard_grad_op auto_wrap"], "expected one of full_shard, shard_grad_op"),
        ("good", ["--fsdp", "full_shard auto_wrap fast"], "expected one of"),
        ("good", ["--fsdp", "shard_grad_op auto_wrap"], "--fsdp shard_grad_op: the reference trace ran full_shard"),
    ],
)
def test_a_reference_the_trainer_cannot_replay_is_refused(refs, tmp_path, capsys, ref, flags, needle):
    if ref != "mlp" and not SEQUENTIAL:  # checked first after the model: a transformers without it is refused
        needle = f"transformers {transformers.__version__} has no TrainingArguments.train_sampling_strategy"
    out = tmp_path / "out"
    rc = main(["trainer", "--like", refs[ref], "--trace", str(out), *flags])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(lines) == 1, cap
    assert lines[0].startswith("fsdpcheck-torch: ") and needle in lines[0], lines[0]
    assert not out.exists()
