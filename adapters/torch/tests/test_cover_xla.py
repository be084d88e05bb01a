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
        (["--param-dtype", "bf16", "--reduce-dtype", "bf16"], ["mixed precision", "run fp32"]),
        (["--reduce-dtype", "bf16"], ["mixed precision"]),
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
        ({"xla": True, "xla_fsdp_v2": True, "xla_fsdp_settings": {"compute_dtype": "bfloat16"}}, ["not wired"]),
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


def test_the_trainer_on_xla_is_refused(ref, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["trainer", "--device", "xla", "--like", ref, "--trace", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "trainer --device xla" in err[0] and "check --device xla" in err[0], err
    assert not out.exists()


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
