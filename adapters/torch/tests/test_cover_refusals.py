"""Bad input the bad-input corpus (tests/bad_input) does not reach: run flags
the reference would refuse, flags an API lacks, --like traces whose files are
unreadable or not safetensors at all, a trace that continues a checkpoint.
Each is exit 2 with one line on stderr naming the input, nothing on stdout,
and nothing written where --trace points (the commands run in this process,
through their entry point cli.main, as tests/test_bad_input.py does)."""

import json
import os
import shutil

import pytest
from conftest import reference_trace, refused

from fsdpcheck_torch.cli import USAGE, main
from fsdpcheck_torch.config import default_config, unsupported


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    t = tmp_path_factory.mktemp("refusals") / "T"
    return reference_trace(t, "--model", "mlp-micro", "--strategy", "full_shard", "--steps", "2")


CHECK = ["check", "--api", "fsdp1", "-n", "2", "--model", "mlp-micro"]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--steps", "two"], ["--steps: not an integer: 'two'"]),
        (["--strategy", "no_shard", "--forward-prefetch"], ["--forward-prefetch needs a sharded strategy", "no_shard"]),
        (["--strategy", "no_shard", "--limit-all-gathers"], ["--limit-all-gathers needs a sharded strategy"]),
        (["--limit-all-gathers"], ["--limit-all-gathers limits prefetched all-gathers", "--forward-prefetch"]),
        (["--strategy", "hybrid_shard", "--shard-group", "4"], ["--shard-group 4 does not divide the world size 2"]),
        (["--model", "gpt2-tiny", "--seq-len", "64"], ["--seq-len 64 is outside 1..n_positions (32)"]),
        (["--api"], ["--api needs a value"]),
    ],
)
def test_check_refuses_what_the_reference_would(flags, needles, capsys):
    refused(CHECK + flags, capsys, *needles)


def test_no_command_prints_the_usage_and_exits_2(capsys):
    assert main([]) == 2
    assert capsys.readouterr().out.strip() == USAGE.strip()
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.strip() == USAGE.strip()


def test_run_refuses_a_setting_its_api_lacks(good, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", "--api", "fsdp2", "--like", good, "--trace", str(out), "--backward-prefetch", "post"]
    refused(argv, capsys, "fsdp2: FSDP2 has no BACKWARD_POST prefetch")
    assert not out.exists()


def test_run_refuses_an_integer_reshard_after_forward_outside_fsdp2(good, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", "--api", "fsdp1", "--like", good, "--trace", str(out), "--reshard-after-forward", "2"]
    refused(argv, capsys, "--reshard-after-forward 2 must divide the shard group's 1 ranks")  # one process here
    assert not out.exists()
    cfg = default_config()
    cfg["reshard_after_forward"] = 2
    assert "an integer reshard_after_forward (2) is FSDP2's" in unsupported("fsdp1", cfg, "cpu")
    assert unsupported("fsdp2", cfg, "cpu") is None


def test_comm_log_refuses_a_checkpoint_wrapper_it_cannot_place(monkeypatch):
    """The recorder places the recompute through torch's CheckpointWrapper and
    the module it wraps: a torch without them, or a wrapper around no FSDP
    unit, is refused (exit 2, naming what is missing), never recorded as if
    the run had no recompute."""
    from torch import nn
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw

    from fsdpcheck_torch.commlog import CommLog
    from fsdpcheck_torch.errors import UsageError

    def recorder(root, units):
        return CommLog(0, 1, 1, [root, *units], [(u, i + 1) for i, u in enumerate(units)])

    block = nn.Linear(2, 2)
    root = nn.Sequential(cw.checkpoint_wrapper(nn.Linear(2, 2)))  # the wrapper's module is no unit
    with pytest.raises(UsageError, match="a checkpoint wrapper around no FSDP unit"):
        recorder(root, [block])._install_recompute()
    root = nn.Sequential(cw.checkpoint_wrapper(block))
    del root[0]._modules["_checkpoint_wrapped_module"]
    with pytest.raises(UsageError, match="CheckpointWrapper lacks _checkpoint_wrapped_module"):
        recorder(root, [block])._install_recompute()
    monkeypatch.delattr(cw, "CheckpointWrapper")
    with pytest.raises(UsageError, match="lacks CheckpointWrapper"):
        recorder(nn.Sequential(block), [block])._install_recompute()


def test_run_refuses_an_fsdp_config_of_the_other_version(good, tmp_path, capsys):
    cfg = tmp_path / "fsdp_config.json"
    cfg.write_text(json.dumps({"fsdp_version": 2}))
    out = tmp_path / "out"
    argv = ["run", "--api", "fsdp1", "--like", good, "--trace", str(out), "--fsdp-config", str(cfg)]
    refused(argv, capsys, "--fsdp-config says FSDP version 2, the run says --api fsdp1")
    assert not out.exists()


def broken(good, tmp_path, name, content):
    """good with its file `name` replaced: bytes, or a directory for None."""
    t = str(tmp_path / "T")
    shutil.copytree(good, t)
    os.unlink(os.path.join(t, name))
    if content is None:
        os.mkdir(os.path.join(t, name))
    else:
        with open(os.path.join(t, name), "wb") as f:
            f.write(content)
    return t


def safetensors_bytes(header, data=b""):
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("trace.json", None, ["trace.json: cannot read: Is a directory"]),
        ("init.safetensors", None, ["init.safetensors: cannot read: Is a directory"]),
        (
            "init.safetensors",
            (1000).to_bytes(8, "little") + b"{}",
            ["header length 1000 runs past the end of the file"],
        ),
        ("init.safetensors", safetensors_bytes([]), ["init.safetensors: the header is not a JSON object"]),
        (
            "init.safetensors",
            safetensors_bytes({"x": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
            ["init.safetensors: not a valid safetensors file"],
        ),
    ],
    ids=["trace.json-dir", "init-dir", "init-header-length", "init-header-array", "init-bad-dtype"],
)
def test_run_refuses_an_unreadable_trace_file(good, tmp_path, capsys, name, content, needles):
    t = broken(good, tmp_path, name, content)
    out = tmp_path / "out"
    refused(["run", "--api", "fsdp1", "--like", t, "--trace", str(out)], capsys, *needles)
    assert not out.exists()


def test_run_refuses_a_trace_without_its_init_file(good, tmp_path, capsys):
    t = str(tmp_path / "T")
    shutil.copytree(good, t)
    os.unlink(os.path.join(t, "init.safetensors"))
    refused(["run", "--api", "fsdp1", "--like", t, "--trace", str(tmp_path / "o")], capsys, "init.safetensors: missing")


def test_run_refuses_a_trace_that_continues_a_checkpoint(good, tmp_path, capsys):
    """A trace of steps 1.. (a run resumed from a checkpoint) has no step 0 to replay from."""
    t = str(tmp_path / "T")
    shutil.copytree(good, t)
    with open(os.path.join(t, "trace.json")) as f:
        meta = json.load(f)
    meta.update(first_step=1, steps=1)
    with open(os.path.join(t, "trace.json"), "w") as f:
        json.dump(meta, f)
    refused(["run", "--api", "fsdp1", "--like", t, "--trace", str(tmp_path / "o")], capsys, "starts at step 0")
