"""Hugging Face `fsdp_config.json` (Transformers `TrainingArguments.fsdp_config`,
Accelerate's `fsdp_config` section) read as users write it.

Keys are accepted with or without the `fsdp_` prefix, enum values in any case
("BACKWARD_POST" or "backward_post"). What the file sets goes into the run
config (strategy, prefetch, limiter, offload, mixed precision) or into
`extras` (wrap class, state dict type, FSDP version, XLA settings); a key or
value this adapter cannot honour is one clear line and exit code 2.
"""

import json

from . import strictjson

STRATEGY = {
    "FULL_SHARD": "full_shard",
    "SHARD_GRAD_OP": "shard_grad_op",
    "NO_SHARD": "no_shard",
    "HYBRID_SHARD": "hybrid_shard",
    "HYBRID_SHARD_ZERO2": "hybrid_shard_zero2",
    "_HYBRID_SHARD_ZERO2": "hybrid_shard_zero2",
    "1": "full_shard",
    "2": "shard_grad_op",
    "3": "no_shard",
    "4": "hybrid_shard",
    "5": "hybrid_shard_zero2",
}
PREFETCH = {"BACKWARD_PRE": "pre", "BACKWARD_POST": "post", "NO_PREFETCH": "none"}
DTYPE = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
}
WRAP_CLASSES = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer", "fsdpcheck-mlp": "Linear"}
# keys that cannot change the results (accepted and ignored)
NEUTRAL = ("use_orig_params", "sync_module_states", "cpu_ram_efficient_loading", "min_num_params")


def _err(path, key, value, why):
    from .errors import UsageError

    # the key as JSON writes it, like the value: one line whatever characters it holds
    return UsageError(f"{path}: {json.dumps(key)}: {json.dumps(value)[:80]} {why}")


def _bool(path, key, v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise _err(path, key, v, 'is not a boolean (true, false, "true" or "false")')


def _enum(path, key, v, table, what):
    s = str(v).upper() if not isinstance(v, bool) else None
    if s is None or s not in table:
        raise _err(path, key, v, f"is not {what}")
    return table[s]


def load(path):
    from .errors import UsageError

    try:
        with open(path) as f:
            data = strictjson.load(f)
    except FileNotFoundError:
        raise UsageError(f"--fsdp-config {path}: no such file")
    except (OSError, ValueError) as e:
        raise UsageError(f"--fsdp-config {path}: not valid JSON ({e})")
    if not isinstance(data, dict):
        raise UsageError(f"--fsdp-config {path}: must be a JSON object")
    # an Accelerate config file holds the section under "fsdp_config"
    if isinstance(data.get("fsdp_config"), dict):
        data = data["fsdp_config"]
    return data


def _xla_key(cfg, extras, path, raw_key, key, v, device):
    """An fsdp_config's XLA key: run with --device xla only; xla_fsdp_grad_ckpt true checkpoints each
    unit inside it (false leaves the flags' setting as it is)."""
    if key == "xla" and not _bool(path, raw_key, v):
        return
    if device != "xla":
        what = "an XLA FSDP configuration" if key == "xla" else "an XLA FSDP setting"
        raise _err(path, raw_key, v, f"is {what}: it runs with --device xla, not --device {device}")
    if key == "xla_fsdp_settings":
        if not isinstance(v, dict):
            raise _err(path, raw_key, v, "must be an object (XlaFullyShardedDataParallel's arguments)")
        _xla_settings(cfg, path, raw_key, v)
        extras[key] = v
        return
    extras[key] = _bool(path, raw_key, v)
    if key == "xla_fsdp_grad_ckpt" and extras[key]:
        cfg["activation_checkpointing"] = "inside"


def _xla_settings(cfg, path, raw_key, v):
    """xla_fsdp_settings' dtypes as the run's: compute_dtype casts every parameter for compute (the
    param_dtype), whose gradients classic XLA FSDP reduces in it unless fp32_reduce_scatter; the
    other settings are checked as booleans and passed to the wrapper as written (xla.py)."""
    for k, x in v.items():
        if k != "compute_dtype" and not isinstance(x, bool):
            raise _err(path, f"{raw_key}.{k}", x, "must be a JSON boolean")
    if "compute_dtype" in v:
        d = v["compute_dtype"]
        if str(d).removeprefix("torch.") not in DTYPE:
            raise _err(path, f"{raw_key}.compute_dtype", d, "is not a dtype (float32, bfloat16, float16)")
        cfg["param_dtype"] = DTYPE[str(d).removeprefix("torch.")]
        cfg["reduce_dtype"] = "fp32" if v.get("fp32_reduce_scatter") else cfg["param_dtype"]


def apply_file(cfg, extras, path, device):
    data = load(path)
    mtype = cfg.get("model", {}).get("model_type", "gpt2")
    for raw_key, v in data.items():
        key = raw_key[5:] if raw_key.startswith("fsdp_") and raw_key != "fsdp_config" else raw_key
        if key == "sharding_strategy":
            cfg["strategy"] = _enum(
                path,
                raw_key,
                v,
                STRATEGY,
                "a sharding strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1..5",
            )
        elif key in ("backward_prefetch", "backward_prefetch_policy"):
            cfg["backward_prefetch"] = _enum(path, raw_key, v, PREFETCH, "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH")
        elif key == "forward_prefetch":
            cfg["forward_prefetch"] = _bool(path, raw_key, v)
            cfg.pop("forward_prefetch_units", None)  # the reference's one int: the file sets it to 0 or 1
        elif key == "offload_params":
            cfg["cpu_offload"] = _bool(path, raw_key, v)
        elif key == "limit_all_gathers":
            cfg["limit_all_gathers"] = _bool(path, raw_key, v)
        elif key == "state_dict_type":
            sd = _enum(
                path,
                raw_key,
                v,
                {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded", "1": "full", "3": "sharded"},
                "FULL_STATE_DICT or SHARDED_STATE_DICT",
            )
            extras["state_dict_type"] = sd
        elif key == "auto_wrap_policy":
            if str(v).upper() != "TRANSFORMER_BASED_WRAP":
                raise _err(
                    path,
                    raw_key,
                    v,
                    "is not supported: fsdpcheck's units are one per transformer block (gpt2, llama) "
                    "or Linear layer (mlp): use TRANSFORMER_BASED_WRAP",
                )
        elif key == "transformer_layer_cls_to_wrap":
            names = v if isinstance(v, list) else [v]
            want = WRAP_CLASSES.get(mtype)
            if not names or any(not isinstance(n, str) for n in names) or want not in names or len(set(names)) != 1:
                raise _err(path, raw_key, v, f"must name the model's unit class ({want} for this {mtype} model)")
            extras["wrap_cls"] = want
        elif key == "activation_checkpointing":
            # Accelerate's apply_activation_checkpointing wraps each block inside its unit
            on = _bool(path, raw_key, v)
            cfg["activation_checkpointing"] = "inside" if on else "none"
            if on:  # the Trainer leaves it to Accelerate
                extras["activation_checkpointing"] = True
            else:
                extras.pop("activation_checkpointing", None)
        elif key == "version":
            if v not in (1, 2, "1", "2"):
                raise _err(path, raw_key, v, "is not an FSDP version (1 or 2)")
            extras["api"] = "fsdp1" if int(v) == 1 else "fsdp2"
        elif key == "mixed_precision":
            p = {"no": "fp32", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(str(v).lower())
            if p is None:
                raise _err(path, raw_key, v, "is not a mixed precision (no, fp32, bf16, fp16)")
            cfg["param_dtype"] = cfg["reduce_dtype"] = p
        elif key == "mixed_precision_policy":
            if not isinstance(v, dict):
                raise _err(path, raw_key, v, "must be an object with param_dtype, reduce_dtype, buffer_dtype")
            for k2, d in v.items():
                if k2 not in ("param_dtype", "reduce_dtype", "buffer_dtype"):
                    raise _err(path, f"{raw_key}.{k2}", d, "is not a key of a mixed precision policy")
                if str(d) not in DTYPE:
                    raise _err(path, f"{raw_key}.{k2}", d, "is not a dtype (float32, bfloat16, float16)")
                if k2 != "buffer_dtype":
                    cfg[k2] = DTYPE[str(d)]
        elif key in ("xla", "xla_fsdp_settings", "xla_fsdp_grad_ckpt", "xla_fsdp_v2"):
            _xla_key(cfg, extras, path, raw_key, key, v, device)
        elif key in NEUTRAL:
            if key == "min_num_params" and v not in (0, "0"):
                raise _err(
                    path, raw_key, v, "is not supported: size-based wrapping does not match fsdpcheck's units (use 0)"
                )
        else:
            raise _err(
                path,
                raw_key,
                v,
                "is not a key this adapter knows (sharding_strategy, backward_prefetch, "
                "forward_prefetch, offload_params, limit_all_gathers, state_dict_type, auto_wrap_policy, "
                "transformer_layer_cls_to_wrap, activation_checkpointing, version, mixed_precision, "
                "mixed_precision_policy, xla, xla_fsdp_v2, xla_fsdp_grad_ckpt, xla_fsdp_settings, use_orig_params, "
                "sync_module_states, cpu_ram_efficient_loading)",
            )
