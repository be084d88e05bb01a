"""Real PyTorch FSDP against the reference, on the CPU with gloo, judged by
`fsdpcheck compare` under its default policy (no widening for torch).

Each case runs the reference (mpiexec fsdpcheck run), then torch on the same
config, initial weights and batches (torchrun ... --like), then compare.
"""

import os

import pytest
from conftest import CHECKS, EXAMPLES, assert_verdict, expected_bug, first_divergence, register

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
            yield pytest.param(name, expected_bug(api, W, flags), id=name)


@pytest.mark.parametrize(("name", "bug"), list(cases()))
def test_matches_reference(checks, name, bug):
    rc, out, _ = checks[name]
    print(out)
    assert_verdict(rc, out, bug)  # where this torch has a known bug: the verdict names it


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


# The total gradient norm clip_grad_norm_ returned is in every step of a
# clipping torch trace and judged by compare: it passes at torch's own
# rounding, and (G - 1) eps more (pytorch#149768's class: the eps added once per
# rank of the norm group) fails, named as the norm, at the first step.
CLIPPED = [f"{api}-{cid}" for api in ("fsdp1", "fsdp2") for W, _, cid in CASES if "clip" in cid and W > 1]


@pytest.mark.parametrize("name", [n for n in CLIPPED if n in CHECKS])
def test_the_norm_is_recorded_and_judged(checks, name, tmp_path):
    import shutil
    import subprocess

    from conftest import fsdpcheck_bin
    from safetensors import safe_open
    from safetensors.torch import save_file

    rc, out, keep = checks[name]
    argv = CHECKS[name]
    W = int(argv[argv.index("-n") + 1])
    if assert_verdict(rc, out, expected_bug(argv[argv.index("--api") + 1], W, argv)):
        pytest.skip("this torch's verdict is its known bug (test_matches_reference)")
    ref, torch_dir = keep / "ref", keep / "torch"
    cmp = subprocess.run(
        [fsdpcheck_bin(), "compare", str(ref), str(torch_dir)], capture_output=True, text=True, check=False
    )
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    rows = [line.split() for line in cmp.stdout.splitlines() if " norm " in line and line.split()[0].isdigit()]
    steps = sorted(p.name for p in torch_dir.glob("step-*.safetensors"))
    assert len(rows) == len(steps) and all(r[-1] == "pass" for r in rows), cmp.stdout
    bad = tmp_path / "torch"
    shutil.copytree(torch_dir, bad)
    step0 = bad / steps[0]
    with safe_open(str(step0), "pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    assert t["grad_norm"].dtype.is_floating_point and t["grad_norm"].element_size() == 8
    # (G - 1) eps is caught while it is above the row's own rounding (6e-7 of the
    # norm): the 2- and inf-norms of gpt2-tiny (0.7-1.4, 0.1) are; its 1-norm (29)
    # is not, so there the norm is moved by 5x the row instead (3e-6 of itself).
    one = "--norm-type" in argv and argv[argv.index("--norm-type") + 1] == "1"
    t["grad_norm"] = t["grad_norm"] * (1 + 3e-6) if one else t["grad_norm"] + (W - 1) * 1e-6
    save_file(t, str(step0), metadata=meta)
    cmp = subprocess.run([fsdpcheck_bin(), "compare", str(ref), str(bad)], capture_output=True, text=True, check=False)
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    assert first_divergence(cmp.stdout).startswith("first divergence: step 0, tensor grad_norm"), cmp.stdout
