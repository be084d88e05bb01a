"""Run configuration: the reference trace's config, changed by run flags.

The config is the dictionary `fsdpcheck run` writes into trace.json
("config": model, strategy, shard_group, prefetch, dtypes, divide, grad_accum,
no_sync, clip, offload, optimizer, steps, global_batch, seq_len, seed, ...), so
the trace this adapter writes carries a config the C reader accepts as it is.

Flags are the `fsdpcheck run` flags (docs/contract.md §7) and apply left to right, like
the C CLI: `--fsdp-config FILE` sets what the file sets, at its position.
"""

import copy
import math

from . import fsdp_config
from .errors import UsageError
from .freeze import freeze_flag, freeze_pattern, frozen_names
from .lora import LORA_WITH_FREEZE, has_lora, parse_flag

STRATEGIES = ("no_shard", "full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2")
PREFETCH = ("none", "pre", "post")
DTYPES = ("fp32", "bf16", "fp16")
NORMS = ("1", "2", "inf")
OPTIMIZERS = ("adamw", "sgd")
DIVIDES = ("prepost", "avg", "sum-then-divide")
APIS = ("fsdp1", "fsdp2")
DEVICES = ("cpu", "cuda", "hpu", "xla")
BACKENDS = ("gloo", "nccl", "hccl", "xla")
# faults this adapter can put into the torch run: numerical ones (names from
# docs/contract.md §9) that compare must catch, and two crashes of the implementation
# under test that check must report as a verdict (exit 1) naming the rank:
# segv (the last rank dies of SIGSEGV in step 1's backward, or step 0's with
# one step) and abort_at_exit (the last rank aborts after the whole trace is
# written, the failure a trace on disk must not hide); and hang (the last rank
# sleeps in step 0's backward, the others wait in its collective: check must
# end it at --timeout with exit 3 and leave no worker behind)
# frozen_decay (fsdpcheck's fault of that name): AdamW's decoupled decay applied
# to the frozen parameters too, as an optimizer loop over every parameter would;
# lora_alpha (fsdpcheck's too): PEFT's scaling set to lora_alpha, not lora_alpha / r
FAULTS = (
    "none",
    "data_overlap",
    "no_divide",
    "ckpt_drop_optim",
    "segv",
    "abort_at_exit",
    "hang",
    "frozen_decay",
    "lora_alpha",
)

# Flags that change what the run trains on: with --like they must equal the
# reference's (the batches and the initial weights come from its trace).
DATA_FLAGS = ("--model", "--global-batch", "--seq-len", "--seed")


def _float(flag, v):
    try:
        x = float(v)
    except ValueError:
        raise UsageError(f"{flag}: not a number: {v!r}")
    if not math.isfinite(x):
        raise UsageError(f"{flag}: must be finite, got {v!r}")
    return x


def _int(flag, v, lo=1):
    try:
        x = int(v)
    except ValueError:
        raise UsageError(f"{flag}: not an integer: {v!r}")
    if x < lo:
        raise UsageError(f"{flag}: must be at least {lo}, got {x}")
    return x


def _choice(flag, v, choices):
    if v not in choices:
        raise UsageError(f"{flag}: {v!r} is not one of {', '.join(choices)}")
    return v


def _forward_prefetch(cfg, n):
    """--forward-prefetch (n = 1) and --forward-prefetch-units N, as the reference keeps them (one int:
    the last given wins) and writes them: "forward_prefetch" true, "forward_prefetch_units" only above 1."""
    cfg["forward_prefetch"] = True
    if n > 1:
        cfg["forward_prefetch_units"] = n
    else:
        cfg.pop("forward_prefetch_units", None)


def _divide_factor(flag, v):
    """A finite number above 0, as the reference's parser takes it (oracle/cli.c)."""
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (x > 0 and math.isfinite(x)):
        raise UsageError(f"{flag}: {v!r} is not a finite number above 0")
    return x


def forward_prefetch_units(cfg):
    """How many units each unit's forward prefetch list names: 0 (off), 1 (--forward-prefetch), N."""
    return cfg.get("forward_prefetch_units", 1) if cfg["forward_prefetch"] else 0


# The process group's backend a device gets unless --backend says otherwise
DEFAULT_BACKEND = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl", "xla": "xla"}


# FSDP2's settings the reference writes only when set (core/config.c fc_run_config_to_json),
# what each means, and the flag that sets it
FSDP2_ONLY = {
    "reshard_after_forward": "--reshard-after-forward",
    "forward_prefetch_units": "--forward-prefetch-units",
    "backward_prefetch_units": "--backward-prefetch-units",
    "gradient_divide_factor": "--gradient-divide-factor",
}


def fsdp2_only(cfg):
    """The FSDP2-only settings cfg has (the reference needs --fsdp-version 2 for them), as flags."""
    return [flag for k, flag in FSDP2_ONLY.items() if cfg.get(k)]


def shard_size(api, cfg, world):
    """The ranks of the group FSDP reduce-scatters over (FSDP2: 1 for no_shard's (W, 1) mesh)."""
    s = cfg["strategy"]
    if s.startswith("hybrid"):
        return cfg["shard_group"] or world
    return 1 if s == "no_shard" else world


def premul_refusal(api, cfg, world, backend, force_sum, inject="none"):
    """Why this run's gradient divide factor cannot run on its backend, or None: FSDP2 in fp32 or bf16
    without force-sum reduce-scatters with ReduceOp.PREMUL_SUM(1/F) when F is not the shard group's
    size (torch's _get_gradient_divide_factors), which gloo refuses."""
    F = cfg.get("gradient_divide_factor")
    if api != "fsdp2" or not F or backend != "gloo" or force_sum or inject == "no_divide":
        return None
    n = shard_size(api, cfg, world)
    if cfg["reduce_dtype"] == "fp16" or n == 1 or F == n:
        return None
    return (
        f"--gradient-divide-factor {F:g} on gloo: FSDP2 would reduce-scatter {cfg['reduce_dtype']} gradients with "
        f"ReduceOp.PREMUL_SUM(1/{F:g}) (the factor is not the shard group's {n} ranks), which gloo cannot run: "
        "add --force-sum-reduction (FSDP2 sums, then divides by the factor itself)"
    )


# flag -> (takes a value, apply(cfg, value))
RUN_FLAGS = {
    "--strategy": (True, lambda c, v: c.__setitem__("strategy", _choice("--strategy", v, STRATEGIES))),
    "--shard-group": (True, lambda c, v: c.__setitem__("shard_group", _int("--shard-group", v))),
    "--reshard-after-forward": (
        True,
        lambda c, v: c.__setitem__("reshard_after_forward", _int("--reshard-after-forward", v, lo=2)),
    ),
    "--backward-prefetch": (
        True,
        lambda c, v: c.__setitem__("backward_prefetch", _choice("--backward-prefetch", v, PREFETCH)),
    ),
    "--forward-prefetch": (False, lambda c, v: _forward_prefetch(c, 1)),
    # FSDP2's explicit lists (set_modules_to_forward_prefetch / _backward_prefetch of the next N units)
    "--forward-prefetch-units": (True, lambda c, v: _forward_prefetch(c, _int("--forward-prefetch-units", v))),
    "--backward-prefetch-units": (
        True,
        lambda c, v: c.__setitem__("backward_prefetch_units", _int("--backward-prefetch-units", v)),
    ),
    # FSDP2's set_gradient_divide_factor(F) on every unit
    "--gradient-divide-factor": (
        True,
        lambda c, v: c.__setitem__("gradient_divide_factor", _divide_factor("--gradient-divide-factor", v)),
    ),
    "--limit-all-gathers": (False, lambda c, v: c.__setitem__("limit_all_gathers", True)),
    "--param-dtype": (True, lambda c, v: c.__setitem__("param_dtype", _choice("--param-dtype", v, DTYPES))),
    "--reduce-dtype": (True, lambda c, v: c.__setitem__("reduce_dtype", _choice("--reduce-dtype", v, DTYPES))),
    "--divide": (True, lambda c, v: c.__setitem__("divide", _choice("--divide", v, DIVIDES))),
    "--grad-accum": (True, lambda c, v: c.__setitem__("grad_accum", _int("--grad-accum", v))),
    "--no-sync": (False, lambda c, v: c.__setitem__("no_sync", True)),
    "--clip-grad-norm": (True, lambda c, v: c.__setitem__("clip_grad_norm", _float("--clip-grad-norm", v))),
    "--norm-type": (True, lambda c, v: c.__setitem__("norm_type", _choice("--norm-type", v, NORMS))),
    "--cpu-offload": (False, lambda c, v: c.__setitem__("cpu_offload", True)),
    "--activation-checkpointing": (
        True,
        lambda c, v: c.__setitem__(
            "activation_checkpointing", _choice("--activation-checkpointing", v, ("none", "inside", "outside"))
        ),
    ),
    # Hugging Face's flag: the model checkpoints each block's forward, inside the unit
    "--gradient-checkpointing": (False, lambda c, v: c.__setitem__("activation_checkpointing", "inside")),
    "--optimizer": (True, lambda c, v: c["optimizer"].__setitem__("kind", _choice("--optimizer", v, OPTIMIZERS))),
    "--lr": (True, lambda c, v: c["optimizer"].__setitem__("lr", _float("--lr", v))),
    "--weight-decay": (True, lambda c, v: c["optimizer"].__setitem__("weight_decay", _float("--weight-decay", v))),
    "--momentum": (True, lambda c, v: c["optimizer"].__setitem__("momentum", _float("--momentum", v))),
    "--steps": (True, lambda c, v: c.__setitem__("steps", _int("--steps", v))),
    "--model": (True, lambda c, v: c.__setitem__("_model_flag", v)),
    "--global-batch": (True, lambda c, v: c.__setitem__("global_batch", _int("--global-batch", v))),
    "--seq-len": (True, lambda c, v: c.__setitem__("seq_len", _int("--seq-len", v))),
    "--seed": (True, lambda c, v: c.__setitem__("seed", str(_int("--seed", v, lo=0)))),
    "--freeze": (True, lambda c, v: c.__setitem__("freeze", freeze_flag(v))),
    # the adapters of the model finally chosen: applied after --model, wherever it stands (lora_flag)
    "--lora": (True, lambda c, v: c.__setitem__("_lora_flag", parse_flag(v))),
    "--fsdp-config": (True, None),  # handled in apply_flags
}


def default_config():
    """`fsdpcheck run`'s defaults (core/config.c fc_run_config_defaults)."""
    return {
        "strategy": "full_shard",
        "shard_group": 0,
        "backward_prefetch": "none",
        "forward_prefetch": False,
        "limit_all_gathers": False,
        "param_dtype": "fp32",
        "reduce_dtype": "fp32",
        "divide": "prepost",
        "grad_accum": 1,
        "no_sync": False,
        "clip_grad_norm": 0.0,
        "norm_type": "2",
        "cpu_offload": False,
        "optimizer": {
            "kind": "adamw",
            "lr": 1e-3,
            "weight_decay": 0.01,
            "beta1": 0.9,
            "beta2": 0.999,
            "eps": 1e-8,
            "momentum": 0.9,
            "dampening": 0.0,
            "nesterov": False,
        },
        "steps": 3,
        "global_batch": 8,
        "seq_len": 16,
        "seed": "1234",
        "freeze": "",
    }


def apply_flags(cfg, flags, device="cpu"):
    """Applies `fsdpcheck run` flags to cfg (a config dict) left to right.
    Returns (cfg, extras) where extras holds what the fsdp_config file said
    beyond the run config (auto wrap class, xla settings, state dict type)."""
    cfg = copy.deepcopy(cfg)
    extras = {}
    for flag, value in run_flags(flags):
        if flag == "--fsdp-config":
            fsdp_config.apply_file(cfg, extras, value, device)
        else:
            RUN_FLAGS[flag][1](cfg, value)
    return cfg, extras


def run_flags(flags):
    """The run flags as (flag, value or None) pairs, left to right, read as
    apply_flags reads them: an unknown flag or a missing value is refused
    where it stands."""
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag not in RUN_FLAGS:
            raise UsageError(f"unknown flag {flag!r} (run flags: {', '.join(sorted(RUN_FLAGS))})")
        value = None
        if RUN_FLAGS[flag][0]:
            if i + 1 >= len(flags):
                raise UsageError(f"{flag} needs a value")
            value = flags[i + 1]
            i += 2
        else:
            i += 1
        yield flag, value


def validate(cfg, world):
    """The checks `fsdpcheck run` makes (core/config.c), so a config the
    reference refuses is refused here too, with exit code 2."""
    s = cfg["strategy"]
    sharded = s != "no_shard"
    hybrid = s in ("hybrid_shard", "hybrid_shard_zero2")
    if not sharded and cfg["backward_prefetch"] != "none":
        raise UsageError(f"--backward-prefetch needs a sharded strategy ({s} gathers nothing)")
    if not sharded and cfg["forward_prefetch"]:
        raise UsageError(f"--forward-prefetch needs a sharded strategy ({s} gathers nothing)")
    if not sharded and cfg["limit_all_gathers"]:
        raise UsageError(f"--limit-all-gathers needs a sharded strategy ({s} gathers nothing)")
    if cfg["limit_all_gathers"] and not cfg["forward_prefetch"] and cfg["backward_prefetch"] == "none":
        raise UsageError(
            "--limit-all-gathers limits prefetched all-gathers: add --forward-prefetch or --backward-prefetch pre|post"
        )
    if not sharded and cfg.get("backward_prefetch_units"):
        raise UsageError(f"--backward-prefetch-units needs a sharded strategy ({s} gathers nothing)")
    if cfg["shard_group"] and not hybrid:
        raise UsageError("--shard-group applies to hybrid_shard and hybrid_shard_zero2 only")
    if cfg["no_sync"] and cfg["grad_accum"] < 2:
        raise UsageError("--no-sync needs --grad-accum K with K >= 2")
    F = cfg["shard_group"] or world
    if F > world or world % F:
        raise UsageError(f"--shard-group {F} does not divide the world size {world}")
    R = cfg.get("reshard_after_forward", 0)
    if R and s not in ("full_shard", "hybrid_shard"):
        raise UsageError(f"--reshard-after-forward {R} needs a strategy that reshards after forward, not {s}")
    if R and (R >= F or F % R):
        raise UsageError(f"--reshard-after-forward {R} must divide the shard group's {F} ranks and be smaller")
    B = cfg["global_batch"]
    if B % world:
        raise UsageError(f"--global-batch {B} is not divisible by the data-parallel size {world}")
    if (B // world) % cfg["grad_accum"]:
        raise UsageError(f"per-rank batch {B // world} is not divisible by --grad-accum {cfg['grad_accum']}")
    if cfg.get("freeze") and has_lora(cfg):
        raise UsageError(LORA_WITH_FREEZE)
    if cfg.get("freeze"):
        freeze_pattern(cfg["freeze"])  # what it matches is the reference's to judge (check) or the run's
    o = cfg["optimizer"]
    if o["lr"] < 0 or o["weight_decay"] < 0 or o["momentum"] < 0 or cfg["clip_grad_norm"] < 0:
        raise UsageError("--lr, --weight-decay, --momentum and --clip-grad-norm must be >= 0")
    m = cfg["model"]
    n = m.get("n_positions") if isinstance(m, dict) else None
    # a model file with no usable n_positions (true is no integer) is the reference's to refuse, by name.
    # llama's max_position_embeddings bounds nothing: RoPE has no position table, and neither
    # LlamaForCausalLM nor the reference (core/config.c) refuses a longer --seq-len
    if m.get("model_type") == "gpt2" and type(n) is int and not 1 <= cfg["seq_len"] <= n:
        raise UsageError(f"--seq-len {cfg['seq_len']} is outside 1..n_positions ({n})")


def lora_flag(cfg, model_name):
    """Applies a --lora flag (apply_flags kept it aside, a LoraSpec) to cfg's model,
    a check's: the model is known only after every flag, as in the reference."""
    lora = cfg.pop("_lora_flag", None)
    if lora is None:
        return
    cfg["model"] = dict(cfg["model"], fsdpcheck_lora=lora.as_json(), fsdpcheck_name=model_name)
    lora.check_model(cfg["model"])
    if cfg.get("freeze"):
        raise UsageError(LORA_WITH_FREEZE)


def frozen_of(cfg, names, lora):
    """The parameter names the run freezes, in order: --freeze's, or with LoRA
    (lora: the run's LoraSpec) every parameter but the adapters (get_peft_model's default)."""
    if lora:
        adapters = set(lora.parameters(cfg["model"]))
        return [n for n in names if n not in adapters]
    return frozen_names(cfg.get("freeze", ""), names)


FROZEN_CHECKPOINT = (
    "a frozen parameter has no optimizer state in torch's checkpoints or in fsdpcheck's FULL and DCP ones, "
    "and the adapter's checkpoint import and export do not carry that absence yet"
)


def inject_refusal(inject, cfg):
    """Why the torch run cannot inject this fault into a run of cfg, as
    fsdpcheck's own validation says it, or None."""
    lora = has_lora(cfg)
    if inject == "lora_alpha" and not lora:
        return "--inject lora_alpha needs LoRA adapters: give --lora R:ALPHA:REGEX with R > 1"
    # the model config's own r, not a LoraSpec: a check's model file may hold adapters no --lora gave
    # (a malformed one is the reference's to refuse, with the file named)
    spec = cfg["model"]["fsdpcheck_lora"] if lora else None
    if inject == "lora_alpha" and isinstance(spec, dict) and spec.get("r") == 1:
        return "--inject lora_alpha needs --lora with R > 1 (at r = 1, alpha and alpha / r agree)"
    if inject == "frozen_decay" and not cfg.get("freeze") and not lora:
        return "--inject frozen_decay needs frozen parameters: give --freeze REGEX or --lora"
    if inject == "frozen_decay" and not cfg["optimizer"]["weight_decay"] > 0:
        return "--inject frozen_decay needs a --weight-decay above 0 (there is no decay to misapply)"
    return None


def freeze_unsupported(cfg, schedule=False, checkpoint=None, api=None, whole=()):
    """Why a run of cfg with frozen parameters cannot be judged, or None.
    whole: the units it freezes whole (frozen_units), where known."""
    if has_lora(cfg):
        # LoRA freezes the root unit (embedding, final norm, head) whole, always
        if schedule:
            return (
                "--lora with the comm log (--schedule, --comm-log): LoRA freezes the root unit (embedding, norm, "
                "head) whole, which FSDP1 schedules in backward as neither the recorder nor the theory (P10) "
                "places it yet, and FSDP2 reduce-scatters only the adapters; judge the numbers without it"
            )
        return f"--lora with {checkpoint}: {FROZEN_CHECKPOINT}" if checkpoint else None
    if not cfg.get("freeze"):
        return None
    if schedule and api == "fsdp2":
        return (
            "--freeze with the comm log (--schedule, --comm-log) under FSDP2: FSDP2 reduce-scatters only the "
            "parameters that have a gradient, the theory counts every row of the unit (P10's FSDP2 bytes under "
            "--freeze are not modelled yet); judge the numbers without it, or use fsdp1"
        )
    if schedule and whole:
        # measured (torch 2.15, gloo, W=2, gpt2-tiny): FSDP1 runs no post-backward hook for a
        # FlatParameter that needs no gradient, so the recorder logs no backward compute for a
        # frozen root's embedding, and with the last block frozen the block before it is
        # gathered ahead of the theory's point of need (fsdpcheck schedule fails either way)
        return (
            f"--freeze with the comm log (--schedule, --comm-log): it freezes every parameter of unit "
            f"{whole[0]!r}, which FSDP1 schedules in backward as neither the recorder nor the theory (P10) "
            "places it yet; judge the numbers without it, or leave one of the unit's parameters trainable"
        )
    if checkpoint:
        return f"--freeze with {checkpoint}: {FROZEN_CHECKPOINT}"
    return None


def optim_state_names(cfg):
    o = cfg["optimizer"]
    if o["kind"] == "adamw":
        return ["exp_avg", "exp_avg_sq"]
    return [] if o["momentum"] == 0 else ["momentum_buffer"]


def like_config(trace, flags, device="cpu"):
    """The config of a run --like the reference trace (a tracefile.RefTrace: its
    trace.json and LoRA spec), changed by flags; data-defining flags must agree
    with the trace."""
    ref, lora_ref = trace.meta, trace.lora
    base = copy.deepcopy(ref["config"])
    # as the reference reads them: units only with forward_prefetch, 0 for "not set" (none is written)
    if not base.get("forward_prefetch") or base.get("forward_prefetch_units") == 1:
        base.pop("forward_prefetch_units", None)
    for k in ("backward_prefetch_units", "gradient_divide_factor"):
        if k in base and not base[k]:
            del base[k]
    cfg, extras = apply_flags(base, flags, device)
    mflag = cfg.pop("_model_flag", None)
    if mflag is not None and mflag != ref["config"]["model"].get("fsdpcheck_name"):
        raise UsageError(
            f"--model {mflag}: the reference trace's model is "
            f"{ref['config']['model'].get('fsdpcheck_name')} (--like takes the model, "
            "its weights and its batches from the trace)"
        )
    for key, flag in (("global_batch", "--global-batch"), ("seq_len", "--seq-len"), ("seed", "--seed")):
        if cfg[key] != ref["config"][key]:
            raise UsageError(
                f"{flag} {cfg[key]}: the reference trace has {ref['config'][key]} (--like replays its batches)"
            )
    if ref["first_step"] != 0:
        raise UsageError("--like needs a trace that starts at step 0 (this one continues a checkpoint)")
    lora = cfg.pop("_lora_flag", None)
    if lora is not None and lora != lora_ref:
        have = f"LoRA r {lora_ref.r} alpha {lora_ref.lora_alpha:g} on {lora_ref.target!r}" if lora_ref else "none"
        raise UsageError(
            f"--lora {lora.r}:{lora.lora_alpha:g}:{lora.target}: the reference trace's adapters are {have} "
            "(--like takes the model, its adapters included, from the trace)"
        )
    if lora_ref and cfg.get("freeze"):
        raise UsageError(LORA_WITH_FREEZE)
    # the reference's pattern first: one this adapter cannot read as the reference did is refused
    names = [p for u in ref["units"] for p in u["params"]]
    rx_ref, rx = ref["config"].get("freeze", ""), cfg.get("freeze", "")
    try:
        want = frozen_names(rx_ref, names)
    except UsageError as e:
        raise UsageError(f"the reference trace's {e}")
    if rx != rx_ref and frozen_names(rx, names) != want:
        raise UsageError(
            f"--freeze {rx!r}: the reference trace froze other parameters ({rx_ref!r}, {len(want)} of them), and "
            "compare judges only runs that froze the same ones"
        )
    if cfg["steps"] > ref["steps"]:
        raise UsageError(f"--steps {cfg['steps']}: the reference trace holds only {ref['steps']} steps")
    return cfg, extras


# What each API lacks of the reference's config space (checked before running).
def unsupported(api, cfg, device):
    """The first setting `api` cannot express, as a sentence, or None."""
    if cfg["strategy"] == "local":  # a --like trace of fsdpcheck run's default
        return "--strategy local (the reference's single-process run) is no FSDP strategy: give --strategy"
    if api != "fsdp2" and cfg.get("reshard_after_forward"):
        return f"an integer reshard_after_forward ({cfg['reshard_after_forward']}) is FSDP2's (--api fsdp2)"
    if api != "fsdp2" and cfg.get("forward_prefetch_units"):
        return (
            f"--forward-prefetch-units {cfg['forward_prefetch_units']}: FSDP1's forward_prefetch prefetches one "
            "unit; lists of more are FSDP2's set_modules_to_forward_prefetch (--api fsdp2)"
        )
    if api != "fsdp2" and cfg.get("backward_prefetch_units"):
        return (
            f"--backward-prefetch-units {cfg['backward_prefetch_units']} is FSDP2's "
            "set_modules_to_backward_prefetch (--api fsdp2; FSDP1 has --backward-prefetch pre|post|none)"
        )
    if api != "fsdp2" and cfg.get("gradient_divide_factor"):
        return (
            f"--gradient-divide-factor {cfg['gradient_divide_factor']:g} is FSDP2's set_gradient_divide_factor "
            "(--api fsdp2; FSDP1 has no public setter of its divide factors)"
        )
    if api == "fsdp2":
        if cfg["backward_prefetch"] == "pre" and cfg.get("backward_prefetch_units"):
            return (
                "--backward-prefetch pre with --backward-prefetch-units: FSDP2 takes one backward list per unit "
                "(pre is the implicit one unit ahead, --backward-prefetch-units 1): give one of them"
            )
        if cfg["backward_prefetch"] == "post":
            return (
                "FSDP2 has no BACKWARD_POST prefetch (fully_shard prefetches the next unit's "
                "all-gather before the current backward, i.e. BACKWARD_PRE)"
            )
        if cfg["limit_all_gathers"]:
            return "FSDP2 has no all-gather rate limiter (limit_all_gathers is FSDP1's)"
    if cfg.get("freeze") and device == "xla":
        return (
            "--freeze with --device xla: the XLA runner builds its optimizer over every "
            "parameter and exports gradients as they are; frozen parameters are not wired into it"
        )
    if has_lora(cfg) and device == "xla":
        return (
            "--lora with --device xla: the XLA runner builds the model without PEFT's adapters "
            "and its optimizer over every parameter"
        )
    if cfg["cpu_offload"] and device == "cpu":
        # measured with torch 2.15: FSDP1 CPUOffload(offload_params=True) and FSDP2
        # CPUOffloadPolicy() both pin host memory through CUDA and raise "Found no
        # NVIDIA driver on your system" on a CPU-only machine
        return (
            "--cpu-offload needs an accelerator: FSDP1 CPUOffload and FSDP2 CPUOffloadPolicy pin host memory "
            'through CUDA ("Found no NVIDIA driver" here), and with --device cpu there is nothing to offload'
        )
    return None
