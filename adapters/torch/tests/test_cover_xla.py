"""`run --device xla` on a machine without XLA devices: every refusal the XLA
runner (fsdpcheck_torch/xla.py) makes before it needs torch_xla is exit 2 with
one line naming the setting, and nothing is written. (What follows the
torch_xla import needs XLA devices and is marked `# pragma: no cover (xla)`.)"""

import importlib.util
import json

import pytest
from conftest import reference_trace

from fsdpcheck_torch.cli import main

HAVE_XLA = importlib.util.find_spec("torch_xla") is not None


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """A full_shard reference trace (W = 1), the one strategy FSDPv2 has."""
    t = tmp_path_factory.mktemp("xla") / "ref"
    return reference_trace(t, "--model", "mlp-micro", "--strategy", "full_shard", "--steps", "2")


def xla_run(ref, out, *flags, api="fsdp2"):
    return main(["run", "--api", api, "--device", "xla", "--like", ref, "--trace", str(out), *flags])


def one_line(rc, capsys, *needles):
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, cap
    assert cap.out == "" and len(lines) == 1 and lines[0].startswith("fsdpcheck-torch: --device xla"), cap
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--strategy", "shard_grad_op"], ["full_shard only", "(not shard_grad_op)"]),
        (["--forward-prefetch"], ["--forward-prefetch has no XLA FSDP equivalent"]),
        (["--backward-prefetch", "pre"], ["--backward-prefetch has no XLA FSDP equivalent"]),
        (["--param-dtype", "bf16", "--reduce-dtype", "bf16"], ["SPMD FSDPv2 has no compute dtype", "run fp32"]),
        (["--reduce-dtype", "bf16"], ["SPMD FSDPv2 has no compute dtype"]),
        (["--reshard-after-forward", "2"], ["--reshard-after-forward R has no XLA FSDP equivalent"]),
        (["--gradient-divide-factor", "2"], ["no gradient divide factor"]),
        (["--activation-checkpointing", "outside"], ["inside each XLA FSDP unit"]),
        (["--activation-checkpointing", "inside"], ["per transformer block", "not to an mlp"]),
        (["--inject", "no_divide"], ["--inject no_divide: the XLA runner injects no fault"]),
        (["--ckpt-at", "1"], ["checkpoints (--ckpt-at, --load) are not wired"]),
        (["--force-sum-reduction"], ["--force-sum-reduction is FSDP2's setter"]),
        (["--optim-state-offload"], ["--optim-state-offload is torch FSDP's"]),
    ],
)
def test_settings_fsdpv2_lacks_are_refused(ref, tmp_path, capsys, flags, needles):
    out = tmp_path / "out"
    one_line(xla_run(ref, out, *flags), capsys, *needles)
    assert not out.exists()


@pytest.mark.skipif(HAVE_XLA, reason="torch_xla is installed here")
def test_classic_xla_fsdp_needs_torch_xla(ref, tmp_path, capsys):
    out = tmp_path / "out"
    one_line(xla_run(ref, out, api="fsdp1"), capsys, "needs torch_xla")
    assert not out.exists()


@pytest.mark.skipif(HAVE_XLA, reason="torch_xla is installed here")
def test_a_supported_config_needs_torch_xla(ref, tmp_path, capsys):
    out = tmp_path / "out"
    one_line(xla_run(ref, out), capsys, "needs torch_xla", "torch_xla")
    assert not out.exists()


@pytest.mark.skipif(HAVE_XLA, reason="torch_xla is installed here")
def test_the_xla_fsdp_config_is_read_with_device_xla(ref, tmp_path, capsys):
    """The XLA keys of an fsdp_config are accepted with --device xla (and refused
    with --device cpu): the run gets as far as importing torch_xla."""
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps({"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": False}))
    out = tmp_path / "out"
    one_line(xla_run(ref, out, "--fsdp-config", str(cfg)), capsys, "needs torch_xla")
    rc = main(["run", "--api", "fsdp2", "--like", ref, "--trace", str(out), "--fsdp-config", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2 and '"xla": true is an XLA FSDP configuration' in err and "not --device cpu" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("fsdp_config", "needles"),
    [
        ({"xla": True}, ["--api fsdp2", "classic XLA FSDP: use --api fsdp1"]),
        (
            {"xla": True, "xla_fsdp_v2": True, "xla_fsdp_settings": {"compute_dtype": "bfloat16"}},
            ["SPMD FSDPv2 does not take", "drops them under xla_fsdp_v2"],
        ),
        ({"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": True}, ["not to an mlp"]),
        ({"xla_fsdp_v2": True}, ['xla_fsdp_v2 without "xla": true']),
    ],
)
def test_the_xla_fsdp_config_keys_fsdpv2_cannot_honour_are_refused(ref, tmp_path, capsys, fsdp_config, needles):
    """An fsdp_config whose XLA FSDP is not the --api's, and xla_fsdp_settings, are refused by name;
    xla_fsdp_grad_ckpt turns checkpointing on (which an mlp refuses)."""
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps(fsdp_config))
    out = tmp_path / "out"
    one_line(xla_run(ref, out, "--fsdp-config", str(cfg)), capsys, *needles)
    assert not out.exists()


@pytest.fixture(scope="module")
def gref(tmp_path_factory):
    """A GPT-2 reference the Trainer path can replay (its AdamW without weight decay)."""
    t = tmp_path_factory.mktemp("xla-trainer") / "ref"
    flags = [
        "--model",
        "gpt2-micro",
        "--seq-len",
        "8",
        "--strategy",
        "full_shard",
        "--steps",
        "1",
        "--weight-decay",
        "0",
    ]
    return reference_trace(t, *flags)


def test_the_trainer_on_xla_needs_the_xla_switch_and_torch_xla(gref, tmp_path, capsys):
    """trainer --device xla: an fsdp_config without "xla": true is refused in one line; with it, a
    machine without torch_xla refuses in one line; nothing is written either way."""
    out = tmp_path / "out"
    rc = main(["trainer", "--device", "xla", "--like", gref, "--trace", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and '"xla": true' in err[0], err
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps({"xla": True, "xla_fsdp_v2": True}))
    argv = ["trainer", "--device", "xla", "--like", gref, "--trace", str(out), "--fsdp-config", str(cfg)]
    if not HAVE_XLA:
        import dataclasses

        from transformers import TrainingArguments

        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        # a transformers without the sequential sampler is refused first (trainer.parse)
        old = "train_sampling_strategy" not in {f.name for f in dataclasses.fields(TrainingArguments)}
        assert rc == 2 and len(err) == 1 and ("train_sampling_strategy" if old else "needs torch_xla") in err[0], err
    # classic, with a setting the adapter does not apply
    cfg.write_text(json.dumps({"xla": True, "xla_fsdp_settings": {"reshard_after_forward": False}}))
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "reshard_after_forward: not applied by this adapter" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    ("fsdp_config", "needles"),
    [
        ({"xla": True, "xla_fsdp_settings": {"flatten_parameters": True}}, ["flatten_parameters: not applied"]),
        ({"xla": True, "xla_fsdp_settings": {"compute_dtype": "int8"}}, ["compute_dtype", "is not a dtype"]),
        ({"xla": True, "xla_fsdp_settings": {"fp32_reduce_scatter": "yes"}}, ["must be a JSON boolean"]),
        ({"xla": True, "mixed_precision_policy": {"param_dtype": "float32", "reduce_dtype": "bfloat16"}}, ["classic"]),
    ],
)
def test_classic_settings_it_cannot_apply_are_refused(ref, tmp_path, capsys, fsdp_config, needles):
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps(fsdp_config))
    out = tmp_path / "out"
    rc = main(
        ["run", "--api", "fsdp1", "--device", "xla", "--like", ref, "--trace", str(out), "--fsdp-config", str(cfg)]
    )
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and all(n in lines[0] for n in needles), cap
    assert not out.exists()


def test_the_xla_settings_set_the_runs_dtypes(tmp_path):
    """compute_dtype is the param_dtype, reduced in it unless fp32_reduce_scatter (as classic XLA FSDP
    does); the reference is planned with those dtypes and the file's checkpointing, not the file."""
    from fsdpcheck_torch.check import parse
    from fsdpcheck_torch.xla import reference_flags

    cfg = tmp_path / "fsdp_config.json"
    for settings, want in (
        ({"compute_dtype": "bfloat16"}, "bf16"),
        ({"compute_dtype": "bf16", "fp32_reduce_scatter": True}, "fp32"),
    ):
        cfg.write_text(json.dumps({"xla": True, "xla_fsdp_grad_ckpt": True, "xla_fsdp_settings": settings}))
        _, flags, c, _, _ = parse(
            ["--api", "fsdp1", "--device", "xla", "-n", "1", "--model", "gpt2-tiny", "--fsdp-config", str(cfg)]
        )
        assert (c["param_dtype"], c["reduce_dtype"]) == ("bf16", want), c
        f = reference_flags(flags, c)
        assert "--fsdp-config" not in f and f[-8:] == [
            "--strategy",
            "full_shard",
            "--param-dtype",
            "bf16",
            "--reduce-dtype",
            want,
            "--activation-checkpointing",
            "inside",
        ], f
    assert reference_flags(["--model", "gpt2-tiny"], c) == ["--model", "gpt2-tiny"]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("fsdp:2,model", "expected NAME:SIZE"),
        ("fsdp:2,fsdp:2", "distinct names"),
        ("data:4", "axis named fsdp"),
        ("fsdp:0", "expected NAME:SIZE"),
        ("fsdp:2,model:1", "2 devices, the run has 4"),
    ],
)
def test_a_mesh_fsdpv2_cannot_take_is_refused(spec, needle):
    from fsdpcheck_torch.config import UsageError
    from fsdpcheck_torch.xla import parse_mesh

    with pytest.raises(UsageError, match=needle):
        parse_mesh(spec, 4)


def test_the_mesh_is_fsdp_by_model_unless_given():
    from fsdpcheck_torch.xla import parse_mesh

    assert parse_mesh(None, 4) == ((4, 1), ("fsdp", "model"))
    assert parse_mesh("fsdp:2,tensor:2", 4) == ((2, 2), ("fsdp", "tensor"))


def test_the_mesh_flag_is_fsdpv2_on_xla_only():
    from fsdpcheck_torch.check import parse
    from fsdpcheck_torch.config import UsageError

    for argv in (
        ["--api", "fsdp2", "--xla-mesh", "fsdp:2"],
        ["--api", "fsdp1", "--device", "xla", "-n", "1", "--xla-mesh", "fsdp:1"],
    ):
        with pytest.raises(UsageError, match="--xla-mesh is SPMD FSDPv2's device mesh"):
            parse(argv)
    with pytest.raises(UsageError, match="'fsdp:3': 3 devices, the run has 4"):
        parse(["--api", "fsdp2", "--device", "xla", "-n", "4", "--model", "gpt2-tiny", "--xla-mesh", "fsdp:3"])


def test_jobs_must_share_one_device(ref, tmp_path, capsys):
    """A --jobs file mixing --device cpu and --device xla is refused before anything runs."""
    jobs = tmp_path / "jobs.json"
    out = tmp_path / "out"
    cpu = ["--api", "fsdp2", "--like", ref, "--trace", str(out / "a")]
    jobs.write_text(json.dumps([cpu, cpu[:-1] + [str(out / "b"), "--device", "xla"]]))
    rc = main(["run", "--jobs", str(jobs)])
    cap = capsys.readouterr()
    assert rc == 2 and "every job must use the same --device and --backend" in cap.err, cap
    assert not out.exists()
