"""Bad input is one clear line on stderr and exit code 2; the users'
fsdp_config files are read as they are."""

import json
import os

import pytest
from conftest import EXAMPLES, adapter

from fsdpcheck_torch.config import UsageError, apply_flags, default_config


def one_line_exit_2(rc, out, needle):
    assert rc == 2, out
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("fsdpcheck-torch: ") and needle in lines[0], out


def test_unknown_flag():
    rc, out = adapter("check", "--api", "fsdp1", "--bogus")
    one_line_exit_2(rc, out, "unknown flag '--bogus'")


def test_missing_api():
    rc, out = adapter("check", "--model", "gpt2-tiny")
    one_line_exit_2(rc, out, "--api fsdp1|fsdp2 is required")


def test_run_missing_trace(tmp_path):
    rc, out = adapter("run", "--api", "fsdp2", "--like", str(tmp_path / "nope"), "--trace", str(tmp_path / "out"))
    one_line_exit_2(rc, out, "not a trace directory")


def test_run_not_a_trace(tmp_path):
    (tmp_path / "trace.json").write_text('{"format": "something-else"}')
    rc, out = adapter("run", "--api", "fsdp1", "--like", str(tmp_path), "--trace", str(tmp_path / "out"))
    one_line_exit_2(rc, out, "not an fsdpcheck trace")


def test_fsdp2_lacks_backward_post():
    rc, out = adapter("check", "--api", "fsdp2", "--model", "gpt2-tiny", "--backward-prefetch", "post")
    one_line_exit_2(rc, out, "FSDP2 has no BACKWARD_POST")


def test_fsdp2_lacks_limiter():
    rc, out = adapter("check", "--api", "fsdp2", "--forward-prefetch", "--limit-all-gathers")
    one_line_exit_2(rc, out, "no all-gather rate limiter")


def test_cpu_offload_needs_an_accelerator():
    rc, out = adapter("check", "--api", "fsdp1", "--cpu-offload")
    one_line_exit_2(rc, out, "--cpu-offload needs an accelerator")


def test_reference_refusal_is_exit_2():
    rc, out = adapter("check", "--api", "fsdp1", "-n", "2", "--global-batch", "7")
    one_line_exit_2(rc, out, "not divisible")


def test_unknown_fault():
    rc, out = adapter("check", "--api", "fsdp1", "--inject", "stale_gather")
    one_line_exit_2(rc, out, "this adapter injects")


def _cfg(model_type="gpt2"):
    c = default_config()
    c["model"] = {"model_type": model_type, "n_positions": 32}
    return c


def test_trainer_example_config():
    cfg, extras = apply_flags(_cfg(), ["--fsdp-config", os.path.join(EXAMPLES, "fsdp_config.trainer.json")])
    assert cfg["strategy"] == "full_shard" and cfg["backward_prefetch"] == "pre" and not cfg["forward_prefetch"]
    assert extras == {"state_dict_type": "full", "wrap_cls": "GPT2Block"}


def test_multi_gpu_example_config():
    cfg, extras = apply_flags(_cfg(), ["--fsdp-config", os.path.join(EXAMPLES, "fsdp_config.multi_gpu.json")])
    assert cfg["backward_prefetch"] == "post" and cfg["forward_prefetch"]
    assert extras["wrap_cls"] == "GPT2Block"


def test_xla_example_config_needs_xla():
    path = os.path.join(EXAMPLES, "fsdp_config.xla.json")
    with pytest.raises(UsageError, match="XLA FSDP configuration: it runs with --device xla"):
        apply_flags(_cfg(), ["--fsdp-config", path])
    _cfg_xla, extras = apply_flags(_cfg(), ["--fsdp-config", path], device="xla")
    assert extras["xla"] and extras["xla_fsdp_settings"]["compute_dtype"] == "bfloat16"


def test_flags_after_the_file_win():
    path = os.path.join(EXAMPLES, "fsdp_config.trainer.json")
    cfg, _ = apply_flags(_cfg(), ["--fsdp-config", path, "--backward-prefetch", "none", "--strategy", "no_shard"])
    assert cfg["backward_prefetch"] == "none" and cfg["strategy"] == "no_shard"
    cfg, _ = apply_flags(_cfg(), ["--strategy", "no_shard", "--fsdp-config", path])
    assert cfg["strategy"] == "full_shard"


def test_bad_fsdp_config_value(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}))
    rc, out = adapter("check", "--api", "fsdp1", "--model", "gpt2-tiny", "--fsdp-config", str(p))
    one_line_exit_2(rc, out, "SIZE_BASED_WRAP")
