"""Run configuration: the reference trace's config, changed by run flags.

The config is the dictionary `fsdpcheck run` writes into trace.json
("config": model, strategy, shard_group, prefetch, dtypes, divide, grad_accum,
no_sync, clip, offload, optimizer, steps, global_batch, seq_len, seed, ...), so
the trace this adapter writes carries a config the C reader accepts as it is.

Flags are the `fsdpcheck run` flags (DESIGN §7) and apply left to right, like
the C CLI: `--fsdp-config FILE` sets what the file sets, at its position.
"""

import copy
import math
import os
import re

from . import fsdp_config, strictjson
from .errors import UsageError

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
# DESIGN §9) that compare must catch, and two crashes of the implementation
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

# the longest --freeze the reference keeps (core/config.h: char freeze[256])
FREEZE_MAX = 255

# --lora R:ALPHA:REGEX, as the reference keeps it (core/config.h: int lora_r, char lora_target[128])
LORA_R_MAX = 4096
LORA_TARGET_MAX = 127
# llama's decoder-layer linears in registration order (core/config.c FC_LLAMA_LINEAR): what
# --lora may adapt, each under the module path model.layers.N.<linear>
LLAMA_LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
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


def _freeze_flag(v):
    """--freeze REGEX as the reference's parser takes it (oracle/cli.c)."""
    if not v:
        raise UsageError("--freeze: give a regex of parameter names")
    if len(v) > FREEZE_MAX:
        raise UsageError(f"--freeze: regex longer than {FREEZE_MAX} characters")
    return v


# C's strtol and strtod prefixes (leading white space, a sign; decimal or hexadecimal
# floats, inf, nan), matched whole: the reference takes the text up to each ':' only
# when the number ends there (core/config.c fc_model_config_set_lora)
_C_SPACE = "[ \t\n\v\f\r]*"
_STRTOL = re.compile(_C_SPACE + "[+-]?[0-9]+")
_STRTOD = re.compile(
    _C_SPACE + "[+-]?(?:(?:[0-9]+[.]?[0-9]*|[.][0-9]+)(?:[eE][+-]?[0-9]+)?"
    "|0[xX](?:[0-9a-fA-F]+[.]?[0-9a-fA-F]*|[.][0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    "|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN](?:[(][0-9A-Za-z_]*[)])?)"
)


def _strtod(text):
    """The value C's strtod gives text (one _STRTOD matches whole): out of range, +-inf."""
    t = text.strip(" \t\n\v\f\r")
    if t.lstrip("+-")[:2] in ("0x", "0X"):
        try:
            return float.fromhex(t)
        except OverflowError:
            return -math.inf if t.startswith("-") else math.inf
    if t.lstrip("+-")[:3].lower() == "nan":
        return float("nan")
    return float(t)


def _lora_flag(v):
    """--lora R:ALPHA:REGEX as the reference's parser takes it (core/config.c
    fc_model_config_set_lora): what needs the model (a llama, a target that
    matches) is checked once it is known (lora_spec)."""
    bad = f"--lora {v}: expected R:ALPHA:REGEX (4:8:q_proj)"
    parts = v.split(":", 2)
    if len(parts) < 3 or not _STRTOL.fullmatch(parts[0]) or not _STRTOD.fullmatch(parts[1]) or not parts[2]:
        raise UsageError(bad)
    r = int(parts[0])
    if not -(2**63) <= r < 2**63:  # strtol's ERANGE
        raise UsageError(bad)
    if len(parts[2]) > LORA_TARGET_MAX:
        raise UsageError(f"--lora: the target regex is longer than {LORA_TARGET_MAX} characters")
    if not 1 <= r <= LORA_R_MAX:
        raise UsageError(f"--lora {v}: rank R {r} is outside 1..{LORA_R_MAX}")
    return {"r": r, "lora_alpha": _strtod(parts[1]), "target": parts[2]}


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


# How FSDP2's sets reach the trace (gather.py): "auto" has each rank write its own shards
# where every rank shares this host, "shm" and "collective" gather each set to rank 0
# (through /dev/shm files, or gloo's dist.gather)
GATHER_MODES = ("auto", "shm", "collective")


def gather_mode():
    """FSDPCHECK_GATHER, checked: a misspelt value is refused, never taken for another."""
    mode = os.environ.get("FSDPCHECK_GATHER", "auto")
    if mode not in GATHER_MODES:
        raise UsageError(f"FSDPCHECK_GATHER={mode!r}: not one of {', '.join(GATHER_MODES)}")
    return mode


# The process group's backend a device gets unless --backend says otherwise
DEFAULT_BACKEND = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl", "xla": "xla"}


# FSDP2's settings the reference writes only when set (core/config.c fc_run_config_to_json),
# what each means, and the flag that sets it
FSDP2_ONLY = {
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
    "--freeze": (True, lambda c, v: c.__setitem__("freeze", _freeze_flag(v))),
    # the adapters of the model finally chosen: applied after --model, wherever it stands (lora_flag)
    "--lora": (True, lambda c, v: c.__setitem__("_lora_flag", _lora_flag(v))),
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
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag not in RUN_FLAGS:
            raise UsageError(f"unknown flag {flag!r} (run flags: {', '.join(sorted(RUN_FLAGS))})")
        takes, apply = RUN_FLAGS[flag]
        value = None
        if takes:
            if i + 1 >= len(flags):
                raise UsageError(f"{flag} needs a value")
            value = flags[i + 1]
            i += 2
        else:
            i += 1
        if flag == "--fsdp-config":
            fsdp_config.apply_file(cfg, extras, value, device)
        else:
            apply(cfg, value)
    return cfg, extras


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
    if cfg.get("freeze") and lora_of(cfg):
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


# --freeze REGEX (DESIGN §2, frozen parameters): the reference matches it with
# POSIX regcomp (REG_EXTENDED), this adapter with Python's re.search. Where the
# two read a pattern differently they would freeze different parameters, so such
# a pattern is refused here (the rest are the same language on ASCII names).
_QUANTIFIERS = "*+?"
_SPECIAL = ".[]()*+?{}|^$\\"  # what both read as a literal when escaped
_INTERVAL = re.compile(r"\{(\d+(,\d*)?|,\d+)\}")


def freeze_syntax(rx):
    """Why Python's re and POSIX extended regular expressions read the --freeze
    pattern rx differently, as a sentence, or None where they agree."""
    if not rx.isascii() or not rx.isprintable():
        return "use printable ASCII only (POSIX regcomp reads bytes, Python's re characters)"
    i, quantifier = 0, None  # where the quantifier just read starts, None after anything else
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            nxt = rx[i + 1 : i + 2]
            if nxt not in _SPECIAL:  # \d, \w, \b, \<, \1, ...: Python's and GNU regcomp's extensions differ
                return (
                    f"\\{nxt} means different things to Python's re and POSIX regcomp (escape only one of "
                    f"{_SPECIAL}; write a bracket expression such as [0-9] for \\d)"
                )
            i, quantifier = i + 2, None
            continue
        if c == "[":
            j = i + 1
            j += rx[j : j + 1] == "^"
            j += rx[j : j + 1] == "]"  # a leading ] is a member in both
            while j < len(rx) and rx[j] != "]":
                if rx[j] == "\\":
                    return "a backslash inside [...] escapes in Python's re and is a member in POSIX: leave it out"
                if rx[j] == "[" and rx[j + 1 : j + 2] in (":", ".", "="):
                    d = rx[j + 1]
                    return f"[{d}...{d}] inside [...] is POSIX's class syntax and literal characters to Python's re"
                j += 1
            i, quantifier = j + 1, None
            continue
        if c == "(" and rx[i + 1 : i + 2] == "?":
            return "(?...) is Python's extension syntax (groups, lookarounds, flags), not POSIX"
        m = _INTERVAL.match(rx, i) if c == "{" else None
        if c in _QUANTIFIERS or m:
            end = m.end() if m else i + 1
            if quantifier is not None:
                return (
                    f"{rx[quantifier:end]} (a quantifier right after another) is non-greedy or possessive in "
                    "Python's re and a repeated repetition in POSIX"
                )
            i, quantifier = end, i
            continue
        i, quantifier = i + 1, None
    return None


def freeze_pattern(rx):
    """--freeze rx compiled by Python's re; refuses (UsageError) a pattern the
    two regex languages read differently, or that re does not compile."""
    why = freeze_syntax(rx)
    if why:
        raise UsageError(f"--freeze {rx!r}: {why}, so that the reference and torch freeze the same parameters")
    try:
        return re.compile(rx)
    except (re.error, OverflowError, RecursionError) as e:  # a repeat count too large: OverflowError
        raise UsageError(f"--freeze {rx!r} is not a regular expression Python's re compiles: {e}")


def frozen_names(rx, names):
    """The parameter names (the trace's, Hugging Face's) --freeze rx freezes,
    in order; refuses (UsageError) what the reference refuses: a pattern that
    does not compile, or that matches no parameter or every one (torch.optim
    refuses an empty list), and a pattern the two regex languages read
    differently. Whether a unit may be frozen whole is the reference's to say."""
    if not rx:
        return []
    pat = freeze_pattern(rx)
    hit = [n for n in names if pat.search(n)]
    if not hit or len(hit) == len(names):
        what = "matches no parameter" if not hit else "freezes every parameter"
        raise UsageError(f"--freeze {rx!r} {what} of the model (its names are Hugging Face's, e.g. {names[0]!r})")
    return hit


def frozen_units(frozen, units):
    """The units (trace.json's "units": name, params) every parameter of which is frozen."""
    return [u["name"] for u in units if u["params"] and all(p in frozen for p in u["params"])]


# --lora (DESIGN §2, LoRA): PEFT's adapters on llama's decoder-layer linears, every base
# parameter frozen by get_peft_model. The reference writes it into the model config
# ("fsdpcheck_lora": r, lora_alpha, target); a run --like that trace takes it from there.
LORA_WITH_FREEZE = "--freeze with --lora: LoRA freezes every base parameter itself (PEFT's default)"


def lora_of(cfg):
    """The run's LoRA ({"r", "lora_alpha", "target"}, its model config's), or None."""
    m = cfg.get("model")
    return m.get("fsdpcheck_lora") if isinstance(m, dict) else None


def lora_spec(model_cfg, where=""):
    """A model config's "fsdpcheck_lora", checked as the reference checks it
    (core/config.c: its JSON reader, then validate_lora), or None without one.
    where: the file it came from, to name in a refusal."""
    lora = model_cfg.get("fsdpcheck_lora")
    if lora is None:
        return None
    at = f"{where}: " if where else ""
    r, alpha, target = (lora.get(k) if isinstance(lora, dict) else None for k in ("r", "lora_alpha", "target"))
    if (
        not _finite(r)
        or r != int(r)
        or not 1 <= r <= LORA_R_MAX
        or isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not isinstance(target, str)
        or len(target) > LORA_TARGET_MAX
    ):
        raise UsageError(f'{at}"fsdpcheck_lora" must be {{"r": 1..4096, "lora_alpha": number, "target": regex}}')
    try:
        alpha = float(alpha)
    except OverflowError:  # an integer beyond any double: the reference's JSON reader reads inf
        alpha = math.inf
    kind = model_cfg.get("model_type")
    if kind != "llama":
        name = model_cfg.get("fsdpcheck_name", "?")
        raise UsageError(f"{at}LoRA applies to llama's decoder-layer linears; model {name} is {kind}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise UsageError(f"{at}LoRA alpha {alpha:g} must be a finite number above 0")
    # layer 0's linears, as the reference checks (every layer has the same)
    pat = _lora_pattern(target, at)
    if not any(pat.search(f"model.layers.0.{lin}") for lin in LLAMA_LINEARS):
        raise UsageError(
            f"{at}LoRA target {target!r} matches no decoder-layer linear (q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj under model.layers.N)"
        )
    return {"r": int(r), "lora_alpha": alpha, "target": target}


def _lora_pattern(rx, at=""):
    """The LoRA target compiled by Python's re. The reference matches it with
    POSIX regcomp: a target the two read differently would adapt other modules
    than the reference's, and is refused (UsageError)."""
    why = freeze_syntax(rx)
    if why:
        raise UsageError(f"{at}--lora target {rx!r}: {why}, so that the reference and torch adapt the same modules")
    try:
        return re.compile(rx)
    except (re.error, OverflowError, RecursionError) as e:
        raise UsageError(f"{at}--lora target {rx!r} is not a regular expression Python's re compiles: {e}")


def lora_modules(model_cfg, lora):
    """The module paths LoRA adapts, in registration order: every decoder-layer
    linear of every layer whose path the target matches anywhere (re.search,
    as the reference's regexec)."""
    pat = _lora_pattern(lora["target"])
    paths = (f"model.layers.{i}.{lin}" for i in range(model_cfg["num_hidden_layers"]) for lin in LLAMA_LINEARS)
    return [p for p in paths if pat.search(p)]


def lora_parameters(model_cfg, lora):
    """The adapters' parameter names (PEFT's, the trace's), in registration order."""
    return [f"{m}.lora_{ab}.default.weight" for m in lora_modules(model_cfg, lora) for ab in "AB"]


def lora_flag(cfg, model_name):
    """Applies a --lora flag (apply_flags kept it aside) to cfg's model, a
    check's: the model is known only after every flag, as in the reference."""
    lora = cfg.pop("_lora_flag", None)
    if lora is None:
        return
    cfg["model"] = dict(cfg["model"], fsdpcheck_lora=lora, fsdpcheck_name=model_name)
    lora_spec(cfg["model"])
    if cfg.get("freeze"):
        raise UsageError(LORA_WITH_FREEZE)


def frozen_of(cfg, names):
    """The parameter names the run freezes, in order: --freeze's, or with LoRA
    every parameter but the adapters (get_peft_model's default)."""
    lora = lora_of(cfg)
    if lora:
        adapters = set(lora_parameters(cfg["model"], lora))
        return [n for n in names if n not in adapters]
    return frozen_names(cfg.get("freeze", ""), names)


FROZEN_CHECKPOINT = (
    "a frozen parameter has no optimizer state in torch's checkpoints or in fsdpcheck's FULL and DCP ones, "
    "and the adapter's checkpoint import and export do not carry that absence yet"
)


def inject_refusal(inject, cfg):
    """Why the torch run cannot inject this fault into a run of cfg, as
    fsdpcheck's own validation says it, or None."""
    lora = lora_of(cfg)
    if inject == "lora_alpha" and not lora:
        return "--inject lora_alpha needs LoRA adapters: give --lora R:ALPHA:REGEX with R > 1"
    if inject == "lora_alpha" and lora["r"] == 1:
        return "--inject lora_alpha needs --lora with R > 1 (at r = 1, alpha and alpha / r agree)"
    if inject == "frozen_decay" and not cfg.get("freeze") and not lora:
        return "--inject frozen_decay needs frozen parameters: give --freeze REGEX or --lora"
    if inject == "frozen_decay" and not cfg["optimizer"]["weight_decay"] > 0:
        return "--inject frozen_decay needs a --weight-decay above 0 (there is no decay to misapply)"
    return None


def freeze_unsupported(cfg, schedule=False, checkpoint=None, api=None, whole=()):
    """Why a run of cfg with frozen parameters cannot be judged, or None.
    whole: the units it freezes whole (frozen_units), where known."""
    if lora_of(cfg):
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


def read_trace_json(directory):
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
    if isinstance(t["config"], dict):  # not an object: tracefile says so
        _check_run_config(path, t["config"])
    return t


def _finite(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an integer beyond any float
        return False


# The run settings of a reference trace's config that the run reads, beyond
# those tracefile._check_meta checks, as fsdpcheck's C reader requires them
# (core/config.c fc_run_config_from_json and its validate): key -> (valid?, what).
_RUN_CONFIG = {
    "shard_group": (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    # written by the reference only when it is an integer R (absent: 0)
    "reshard_after_forward": (lambda v: type(v) is int and v >= 0, "an integer >= 0", 0),
    "activation_checkpointing": (lambda v: v in ("none", "inside", "outside"), "none, inside or outside", "none"),
    "clip_grad_norm": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
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
    "gradient_divide_factor": (lambda v: _finite(v) and v >= 0, "a finite number >= 0", 0),
}
_OPTIMIZER = {
    "kind": (lambda v: v in OPTIMIZERS, "one of " + ", ".join(OPTIMIZERS)),
    **{k: (lambda v: _finite(v) and v >= 0, "a finite number >= 0") for k in ("lr", "weight_decay", "eps", "momentum")},
    **{k: (lambda v: _finite(v) and 0 <= v < 1, "a number in [0, 1)") for k in ("beta1", "beta2")},
    "dampening": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "nesterov": (lambda v: isinstance(v, bool), "true or false"),
}


def _check_run_config(path, c):
    """A reference trace's run settings, so that a trace.json edited by hand is
    refused here (exit 2), not by a KeyError halfway through training."""
    o = c.get("optimizer")
    fields = [(f"config.{k}", c, k, rule) for k, rule in _RUN_CONFIG.items()]
    if isinstance(o, dict):  # not an object: tracefile says so
        fields += [(f"config.optimizer.{k}", o, k, rule) for k, rule in _OPTIMIZER.items()]
    for name, obj, k, (ok, what, *default) in fields:
        if k not in obj and default:  # an optional key: traces written before it have none
            continue
        if k not in obj or not ok(obj[k]):
            raise UsageError(f'{path}: "{name}" is missing or not {what}')


def like_config(ref, flags, device="cpu"):
    """The config of a run --like the reference trace `ref` (trace.json as a
    dict), changed by flags; data-defining flags must agree with the trace."""
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
    lora_ref = lora_spec(ref["config"]["model"], "the reference trace's model")
    lora = cfg.pop("_lora_flag", None)
    if lora is not None and lora != lora_ref:
        have = (
            f"LoRA r {lora_ref['r']} alpha {lora_ref['lora_alpha']:g} on {lora_ref['target']!r}" if lora_ref else "none"
        )
        raise UsageError(
            f"--lora {lora['r']}:{lora['lora_alpha']:g}:{lora['target']}: the reference trace's adapters are {have} "
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
            "--freeze with --device xla: the XLA runner (never run here) builds its optimizer over every "
            "parameter and exports gradients as they are; frozen parameters are not wired into it"
        )
    if lora_of(cfg) and device == "xla":
        return (
            "--lora with --device xla: the XLA runner (never run here) builds the model without PEFT's adapters "
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
