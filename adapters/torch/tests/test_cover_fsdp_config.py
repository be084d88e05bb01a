"""fsdp_config files as users write them (fsdpcheck_torch/fsdp_config.py):
the forms the examples do not use are read to the right run config (booleans
as strings, Accelerate's nesting under "fsdp_config", the version, mixed
precision by name and by policy), and a bad value names the file, the key and
the problem."""

import json

import pytest

from fsdpcheck_torch.config import UsageError, apply_flags, default_config


def load(tmp_path, data, device="cpu"):
    p = tmp_path / "fsdp_config.json"
    p.write_text(json.dumps(data))
    c = default_config()
    c["model"] = {"model_type": "gpt2", "n_positions": 32}
    return apply_flags(c, ["--fsdp-config", str(p)], device)


def test_accelerate_nesting_and_string_booleans(tmp_path):
    cfg, extras = load(
        tmp_path,
        {
            "compute_environment": "LOCAL_MACHINE",
            "fsdp_config": {
                "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                "fsdp_forward_prefetch": "True",
                "fsdp_limit_all_gathers": "false",
                "fsdp_version": 2,
            },
        },
    )
    assert cfg["strategy"] == "shard_grad_op" and cfg["forward_prefetch"] is True
    assert cfg["limit_all_gathers"] is False and extras == {"api": "fsdp2"}


def test_the_limiter_and_version_1(tmp_path):
    cfg, extras = load(tmp_path, {"limit_all_gathers": True, "backward_prefetch": "BACKWARD_PRE", "version": "1"})
    assert cfg["limit_all_gathers"] is True and cfg["backward_prefetch"] == "pre" and extras == {"api": "fsdp1"}


@pytest.mark.parametrize(("name", "dtype"), [("bf16", "bf16"), ("FP16", "fp16"), ("no", "fp32")])
def test_mixed_precision_by_name(tmp_path, name, dtype):
    cfg, _ = load(tmp_path, {"mixed_precision": name})
    assert cfg["param_dtype"] == cfg["reduce_dtype"] == dtype


def test_mixed_precision_policy(tmp_path):
    policy = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "float16"}
    cfg, _ = load(tmp_path, {"mixed_precision_policy": policy})
    assert (cfg["param_dtype"], cfg["reduce_dtype"]) == ("bf16", "fp32")  # buffers: none in these models


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"fsdp_version": 3}, '"fsdp_version": 3 is not an FSDP version (1 or 2)'),
        ({"mixed_precision_policy": {"param_dtype": "bfloat16", "keep_low": True}}, "is not a key of a mixed"),
        ({"mixed_precision_policy": {"reduce_dtype": "float64"}}, '"float64" is not a dtype'),
        ({"forward_prefetch": "yes"}, '"forward_prefetch": "yes" is not a boolean'),
        ({"xla_fsdp_settings": {"compute_dtype": "bfloat16"}}, "is an XLA FSDP setting: it runs with --device xla"),
    ],
)
def test_a_bad_value_names_file_key_and_problem(tmp_path, data, needle):
    with pytest.raises(UsageError) as e:
        load(tmp_path, data)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "fsdp_config.json") + ": ") and needle in msg, msg
    assert "\n" not in msg
