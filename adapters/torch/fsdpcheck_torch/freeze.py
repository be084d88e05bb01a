"""--freeze REGEX (docs/contract.md §2, frozen parameters): the reference matches it with
POSIX regcomp (REG_EXTENDED), this adapter with Python's re.search. Where the
two read a pattern differently they would freeze different parameters, so such
a pattern is refused here (the rest are the same language on ASCII names).
posix_pattern is the check LoRA's target regex gets too (lora.py)."""

import re

from .errors import UsageError

# the longest --freeze the reference keeps (core/config.h: char freeze[256])
FREEZE_MAX = 255


def freeze_flag(v):
    """--freeze REGEX as the reference's parser takes it (oracle/cli.c)."""
    if not v:
        raise UsageError("--freeze: give a regex of parameter names")
    if len(v) > FREEZE_MAX:
        raise UsageError(f"--freeze: regex longer than {FREEZE_MAX} characters")
    return v


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


def posix_pattern(rx, name, alike):
    """rx compiled by Python's re; refuses (UsageError) a pattern the two regex
    languages read differently (freeze_syntax), or that re does not compile.
    name: the flag a refusal names ("--freeze"); alike: what the reference and
    torch then do the same ("freeze the same parameters")."""
    why = freeze_syntax(rx)
    if why:
        raise UsageError(f"{name} {rx!r}: {why}, so that the reference and torch {alike}")
    try:
        return re.compile(rx)
    except (re.error, OverflowError, RecursionError) as e:  # a repeat count too large: OverflowError
        raise UsageError(f"{name} {rx!r} is not a regular expression Python's re compiles: {e}")


def freeze_pattern(rx):
    """--freeze rx compiled by Python's re (posix_pattern)."""
    return posix_pattern(rx, "--freeze", "freeze the same parameters")


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
