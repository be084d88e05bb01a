"""--lora (docs/contract.md §2, LoRA): PEFT's adapters on llama's decoder-layer linears,
every base parameter frozen by get_peft_model. The reference writes it into the
model config ("fsdpcheck_lora": r, lora_alpha, target); a run --like that trace
takes it from there.

The spec is parsed and checked once where it enters a process (parse_flag, then
LoraSpec.check_model, for check's --lora; parse for a trace's model config,
tracefile.RefTrace.lora), and the LoraSpec is passed along from there.
"""

import math
import re
from dataclasses import dataclass

from .errors import UsageError
from .freeze import posix_pattern
from .strictjson import finite

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


LORA_WITH_FREEZE = "--freeze with --lora: LoRA freezes every base parameter itself (PEFT's default)"


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA spec as the reference keeps it: rank r, lora_alpha, and the
    target regex the decoder-layer linears' module paths are matched against."""

    r: int
    lora_alpha: float
    target: str

    def as_json(self):
        """The model config's "fsdpcheck_lora", as the reference writes it."""
        return {"r": self.r, "lora_alpha": self.lora_alpha, "target": self.target}

    def check_model(self, model_cfg, at=""):
        """What needs the model, checked as the reference checks it (core/config.c
        validate_lora): a llama, an alpha above 0, a target that matches a linear.
        at: "FILE: ", to name in a refusal."""
        kind = model_cfg.get("model_type")
        if kind != "llama":
            name = model_cfg.get("fsdpcheck_name", "?")
            raise UsageError(f"{at}LoRA applies to llama's decoder-layer linears; model {name} is {kind}")
        if not (math.isfinite(self.lora_alpha) and self.lora_alpha > 0):
            raise UsageError(f"{at}LoRA alpha {self.lora_alpha:g} must be a finite number above 0")
        # layer 0's linears, as the reference checks (every layer has the same)
        pat = target_pattern(self.target, at)
        if not any(pat.search(f"model.layers.0.{lin}") for lin in LLAMA_LINEARS):
            raise UsageError(
                f"{at}LoRA target {self.target!r} matches no decoder-layer linear (q_proj, k_proj, v_proj, o_proj, "
                "gate_proj, up_proj, down_proj under model.layers.N)"
            )

    def modules(self, model_cfg):
        """The module paths LoRA adapts, in registration order: every decoder-layer
        linear of every layer whose path the target matches anywhere (re.search,
        as the reference's regexec)."""
        pat = target_pattern(self.target)
        paths = (f"model.layers.{i}.{lin}" for i in range(model_cfg["num_hidden_layers"]) for lin in LLAMA_LINEARS)
        return [p for p in paths if pat.search(p)]

    def parameters(self, model_cfg):
        """The adapters' parameter names (PEFT's, the trace's), in registration order."""
        return [f"{m}.lora_{ab}.default.weight" for m in self.modules(model_cfg) for ab in "AB"]


def parse_flag(v):
    """--lora R:ALPHA:REGEX as the reference's parser takes it (core/config.c
    fc_model_config_set_lora): what needs the model (a llama, a target that
    matches) is checked once it is known (LoraSpec.check_model)."""
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
    return LoraSpec(r, _strtod(parts[1]), parts[2])


def has_lora(cfg):
    """Whether the run config's model config holds adapters ("fsdpcheck_lora",
    checked where the config entered: parse)."""
    m = cfg.get("model")
    return bool(m.get("fsdpcheck_lora")) if isinstance(m, dict) else False


def parse(model_cfg, where=""):
    """A model config's "fsdpcheck_lora" as a LoraSpec, checked as the reference
    checks it (core/config.c: its JSON reader, then validate_lora), or None
    without one. where: the file it came from, to name in a refusal."""
    lora = model_cfg.get("fsdpcheck_lora")
    if lora is None:
        return None
    at = f"{where}: " if where else ""
    r, alpha, target = (lora.get(k) if isinstance(lora, dict) else None for k in ("r", "lora_alpha", "target"))
    if (
        not finite(r)
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
    spec = LoraSpec(int(r), alpha, target)
    spec.check_model(model_cfg, at)
    return spec


def target_pattern(rx, at=""):
    """The LoRA target compiled by Python's re. The reference matches it with
    POSIX regcomp: a target the two read differently would adapt other modules
    than the reference's, and is refused (UsageError, posix_pattern)."""
    return posix_pattern(rx, f"{at}--lora target", "adapt the same modules")
