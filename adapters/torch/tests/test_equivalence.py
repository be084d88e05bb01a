"""Real PyTorch FSDP against the reference, on the CPU with gloo, judged by
`fsdpcheck compare` under its default policy (no widening for torch).

Each case runs the reference (mpiexec fsdpcheck run), then torch on the same
config, initial weights and batches (torchrun ... --like), then compare.
"""

import os

import pytest
from conftest import EXAMPLES, first_divergence, old_torch_bug, register

GPT2 = ["--model", "gpt2-tiny", "--steps", "2"]
MLP = ["--model", "mlp-tiny", "--steps", "3"]
BF16 = ["--param-dtype", "bf16", "--reduce-dtype", "bf16"]

# every setting of the issue at W = 1, 2 and 4 ...
SETTINGS = [
    ("full_shard", ["--strategy", "full_shard"]),
    ("shard_grad_op", ["--strategy", "shard_grad_op"]),
    ("no_shard", ["--strategy", "no_shard"]),
    ("bf16", ["--strategy", "full_shard"] + BF16),
    ("accum2-no_sync", ["--strategy", "full_shard", "--grad-accum", "2", "--no-sync"]),
    ("clip", ["--strategy", "full_shard", "--clip-grad-norm", "0.05"]),
]
CASES = [(W, GPT2 + flags, f"W{W}-{name}") for W in (1, 2, 4) for name, flags in SETTINGS]
# ... plus hybrid (a shard group of 2 in W = 4), the other dtypes, norms, the MLP and SGD
CASES += [
    (4, GPT2 + ["--strategy", "hybrid_shard", "--shard-group", "2"], "W4-hybrid_shard"),
    (4, GPT2 + ["--strategy", "hybrid_shard_zero2", "--shard-group", "2"], "W4-hybrid_shard_zero2"),
    (4, GPT2 + ["--strategy", "full_shard", "--grad-accum", "2"], "W4-accum2"),
    (2, GPT2 + ["--strategy", "full_shard", "--param-dtype", "fp16", "--reduce-dtype", "fp16"], "W2-fp16"),
    (2, GPT2 + ["--strategy", "full_shard", "--param-dtype", "bf16", "--reduce-dtype", "fp32"], "W2-bf16-fp32reduce"),
    (4, GPT2 + ["--strategy", "full_shard", "--clip-grad-norm", "0.05", "--norm-type", "inf"], "W4-clip-inf"),
    (2, GPT2 + ["--strategy", "shard_grad_op", "--clip-grad-norm", "0.05", "--norm-type", "1"], "W2-clip-1"),
    (2, MLP + ["--strategy", "full_shard", "--optimizer", "sgd", "--lr", "0.05"], "W2-mlp-sgd"),
    (2, MLP + ["--strategy", "full_shard"] + BF16, "W2-mlp-bf16"),
    (4, MLP + ["--strategy", "shard_grad_op"], "W4-mlp"),
]
QUICK = {"W2-full_shard", "W4-hybrid_shard", "W2-bf16"}


def cases():
    quick = os.environ.get("FSDPCHECK_TORCH_TESTS") == "quick"
    for api in ("fsdp1", "fsdp2"):
        for W, flags, cid in CASES:
            if quick and cid not in QUICK:
                continue
            name = register(f"{api}-{cid}", "--api", api, "-n", str(W), *flags)
            yield pytest.param(name, old_torch_bug(api, W, flags), id=name)


@pytest.mark.parametrize(("name", "bug"), list(cases()))
def test_matches_reference(checks, name, bug):
    rc, out, _ = checks[name]
    print(out)
    if bug:  # an old torch: the verdict is the known bug, named
        assert rc == 1 and f"known PyTorch bug {bug}" in out, out
        return
    assert rc == 0, f"{first_divergence(out)}\n{out}"


# FSDP1's schedule knobs (they change the order of all-gathers, not the math)
register(
    "fsdp1-prefetch-limiter",
    "--api",
    "fsdp1",
    "-n",
    "2",
    *GPT2,
    "--strategy",
    "full_shard",
    "--backward-prefetch",
    "post",
    "--forward-prefetch",
    "--limit-all-gathers",
)
# examples/fsdp_config/fsdp_config.multi_gpu.json as users write it (BACKWARD_POST, forward prefetch)
register(
    "fsdp1-multi_gpu-config",
    "--api",
    "fsdp1",
    "-n",
    "2",
    *GPT2,
    "--fsdp-config",
    os.path.join(EXAMPLES, "fsdp_config.multi_gpu.json"),
)


@pytest.mark.parametrize("name", ["fsdp1-prefetch-limiter", "fsdp1-multi_gpu-config"])
def test_schedule_settings(checks, name):
    rc, out, _ = checks[name]
    assert rc == 0, out
