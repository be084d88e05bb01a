"""A reference trace's trace.json, read and checked before anything runs
(tracefile.RefTrace then checks its tensors): the format and version, the
parts this adapter relies on with their types (_check_meta), and the run
settings as fsdpcheck's C reader requires them (_check_run_config), so a
trace.json edited by hand is refused here (exit 2), not by a KeyError halfway
through training."""

import os

from . import strictjson
from .config import DIVIDES, DTYPES, NORMS, OPTIMIZERS, PREFETCH, STRATEGIES
from .errors import UsageError
from .strictjson import finite


def read(directory):
    """DIRECTORY/trace.json as a dict, checked (UsageError names what is wrong)."""
    t = _read_json(directory)
    _check_meta(os.path.join(directory, "trace.json"), t)
    return t


def _read_json(directory):
    """trace.json parsed, its format and version checked, and its run settings (_check_run_config)."""
    path = os.path.join(directory, "trace.json")
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: not a trace directory")
    try:
        with open(path) as f:
            t = strictjson.load(f)
    except FileNotFoundError:
        raise UsageError(f"{directory}: no trace.json (an incomplete trace, or not a trace)")
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})")
    if not isinstance(t, dict) or t.get("format") != "fsdpcheck-trace":
        raise UsageError(f'{path}: "format" is not "fsdpcheck-trace" (not an fsdpcheck trace)')
    if t.get("version") != 1 or isinstance(t.get("version"), bool):
        raise UsageError(f"{path}: trace format version {t.get('version')!r}, this adapter reads version 1")
    for k in ("config", "units", "steps", "first_step", "world_size"):
        if k not in t:
            raise UsageError(f'{path}: missing "{k}"')
    if isinstance(t["config"], dict):  # not an object: _check_meta says so
        _check_run_config(path, t["config"])
    return t


# The run settings of a reference trace's config that the run reads, beyond
# those _check_meta checks, as fsdpcheck's C reader requires them
# (core/config.c fc_run_config_from_json and its validate): key -> (valid?, what).
_RUN_CONFIG = {
    "shard_group": (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    # written by the reference only when it is an integer R (absent: 0)
    "reshard_after_forward": (lambda v: type(v) is int and v >= 0, "an integer >= 0", 0),
    "activation_checkpointing": (lambda v: v in ("none", "inside", "outside"), "none, inside or outside", "none"),
    "clip_grad_norm": (lambda v: finite(v) and v >= 0, "a finite number >= 0"),
    **{
        k: (lambda v: isinstance(v, bool), "true or false")
        for k in ("forward_prefetch", "limit_all_gathers", "no_sync", "cpu_offload")
    },
    "backward_prefetch": (lambda v: v in PREFETCH, "one of " + ", ".join(PREFETCH)),
    **{k: (lambda v: v in DTYPES, "one of " + ", ".join(DTYPES)) for k in ("param_dtype", "reduce_dtype")},
    "divide": (lambda v: v in DIVIDES, "one of " + ", ".join(DIVIDES)),
    "norm_type": (lambda v: v in NORMS, "one of " + ", ".join(NORMS)),
    "seed": (lambda v: isinstance(v, str) and v.isascii() and v.isdigit() and int(v) < 2**64, "a string of digits"),
    # written by the reference since frozen parameters (absent: none frozen)
    "freeze": (lambda v: isinstance(v, str), "a string", ""),
    # FSDP2's lists and divide factor, written by the reference only when set (absent: not set;
    # forward_prefetch_units is read only with forward_prefetch true, as the reference reads it)
    "forward_prefetch_units": (lambda v: type(v) is int and v >= 1, "an integer >= 1", 1),
    "backward_prefetch_units": (lambda v: type(v) is int and v >= 0, "an integer >= 0", 0),
    "gradient_divide_factor": (lambda v: finite(v) and v >= 0, "a finite number >= 0", 0),
}
_OPTIMIZER = {
    "kind": (lambda v: v in OPTIMIZERS, "one of " + ", ".join(OPTIMIZERS)),
    **{k: (lambda v: finite(v) and v >= 0, "a finite number >= 0") for k in ("lr", "weight_decay", "eps", "momentum")},
    **{k: (lambda v: finite(v) and 0 <= v < 1, "a number in [0, 1)") for k in ("beta1", "beta2")},
    "dampening": (lambda v: finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "nesterov": (lambda v: isinstance(v, bool), "true or false"),
}


def _check_run_config(path, c):
    """A reference trace's run settings, so that a trace.json edited by hand is
    refused here (exit 2), not by a KeyError halfway through training."""
    o = c.get("optimizer")
    fields = [(f"config.{k}", c, k, rule) for k, rule in _RUN_CONFIG.items()]
    if isinstance(o, dict):  # not an object: _check_meta says so
        fields += [(f"config.optimizer.{k}", o, k, rule) for k, rule in _OPTIMIZER.items()]
    for name, obj, k, (ok, what, *default) in fields:
        if k not in obj and default:  # an optional key: traces written before it have none
            continue
        if k not in obj or not ok(obj[k]):
            raise UsageError(f'{path}: "{name}" is missing or not {what}')


def _check_meta(path, t):
    """The parts of trace.json this adapter relies on, with their types."""

    def need(cond, what):
        if not cond:
            raise UsageError(f"{path}: {what}")

    def is_int(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    need(is_int(t["world_size"], 1), '"world_size" is not an integer >= 1')
    need(is_int(t["steps"], 1), '"steps" is not an integer >= 1')
    need(is_int(t["first_step"], 0), '"first_step" is not an integer >= 0')
    # a plan (`fsdpcheck plan`) ran no step: from step 0, no tensor set (oracle/tracefile.c)
    planned = t.get("planned", False)
    need(isinstance(planned, bool), '"planned" is not true or false')
    need(not planned or t["first_step"] == 0, f'a plan ("planned": true) starts at step 0, not {t["first_step"]}')
    if "tensor_steps" in t or planned:
        lo, hi = (0, 0) if planned else (1, t["steps"])
        need(
            is_int(t.get("tensor_steps"), lo) and t["tensor_steps"] <= hi,
            f'"tensor_steps" is not an integer in {lo}..{hi}' + (" (a plan holds no tensor set)" if planned else ""),
        )
    c = t["config"]
    need(isinstance(c, dict), '"config" is not an object')
    for k in ("model", "strategy", "global_batch", "seq_len", "seed", "steps", "optimizer", "grad_accum"):
        need(k in c, f'"config" has no "{k}"')
    need(
        isinstance(c["model"], dict) and isinstance(c["model"].get("model_type"), str), '"config.model" is not a model'
    )
    known = (*STRATEGIES, "local")  # a reference trace may be the local (W=1, unsharded) run
    need(c["strategy"] in known, f'"config.strategy" {c["strategy"]!r} is not one of {", ".join(known)}')
    for k in ("global_batch", "seq_len", "grad_accum", "steps"):
        need(is_int(c[k], 1), f'"config.{k}" is not an integer >= 1')
    need(isinstance(c["optimizer"], dict) and "kind" in c["optimizer"], '"config.optimizer" is not an optimizer')
    need(
        c["global_batch"] % t["world_size"] == 0,
        f'"config.global_batch" {c["global_batch"]} is not divisible by "world_size" {t["world_size"]}',
    )
    u = t["units"]
    need(isinstance(u, list) and u, '"units" is not a non-empty list')
    for x in u:
        need(
            isinstance(x, dict)
            and isinstance(x.get("name"), str)
            and is_int(x.get("numel"), 1)
            and isinstance(x.get("params"), list)
            and x["params"]
            and all(isinstance(p, str) for p in x["params"]),
            '"units": each needs a "name", a "numel" >= 1 and a list of "params"',
        )
