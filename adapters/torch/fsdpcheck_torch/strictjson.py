"""JSON as fsdpcheck's C reader takes it (a leaf module): a key given twice
is an error, not "the last one wins" as Python's json module has it, so a
file both readers accept means the same thing to both."""

import json
import math


def _no_duplicates(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r}")
        seen.add(k)
    return dict(pairs)


def loads(text):
    """json.loads, refusing duplicate keys (ValueError), and text nested
    deeper than Python can recurse (ValueError, not RecursionError)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load(f):
    return loads(f.read())


def finite(v):
    """Whether a JSON value is a finite number (true and false are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an integer beyond any float
        return False
