"""The coverage gate (ci/torch.sh: >= 90% of the adapter's lines) leaves out
only code that names the device it needs: `# pragma: no cover (cuda)` (or
hpu, xla) on a line, or a `# pragma: no cover (xla) from here` ... `to here`
region. A bare `# pragma: no cover` must not hide a CPU path: the package
may not contain one, and the configuration (pyproject.toml) must not honour
one."""

import os
import re

import pytest
from conftest import ROOT

PKG = os.path.join(ROOT, "adapters", "torch", "fsdpcheck_torch")
PYPROJECT = os.path.join(ROOT, "adapters", "torch", "pyproject.toml")
ANY = re.compile(r"pragma\s*:?\s*no\s*cover", re.IGNORECASE)
NAMED = re.compile(r"# pragma: no cover \((cuda|hpu|xla)\)( from here| to here)?(?=$|[ :])")


def pragmas():
    for name in sorted(os.listdir(PKG)):
        if name.endswith(".py"):
            with open(os.path.join(PKG, name)) as f:
                for i, line in enumerate(f, 1):
                    if ANY.search(line):
                        yield f"{name}:{i}", line.rstrip("\n")


def test_every_pragma_names_its_device():
    bad = [f"{at}: {line.strip()}" for at, line in pragmas() if not NAMED.search(line)]
    assert not bad, "a coverage pragma that names no device (cuda, hpu, xla):\n" + "\n".join(bad)


def test_regions_are_closed_on_the_same_device():
    open_at = None
    for at, line in pragmas():
        m = NAMED.search(line)
        if not m or not m.group(2):
            continue
        if m.group(2) == " from here":
            assert open_at is None, f"{at}: a region opened inside the one opened at {open_at[0]}"
            open_at = (at, m.group(1))
        else:
            assert open_at is not None, f"{at}: 'to here' closes no region"
            assert open_at[0].split(":")[0] == at.split(":")[0], f"{at}: closes {open_at[0]} of another file"
            assert m.group(1) == open_at[1], f"{at}: closes a ({open_at[1]}) region as ({m.group(1)})"
            open_at = None
    assert open_at is None, f"{open_at[0]}: a region never closed"


def excluded(text):
    """The lines (1-based) the configured exclude patterns match, as coverage
    applies them: one regex, the patterns joined in order, over the whole file."""
    coverage = pytest.importorskip("coverage")
    pats = coverage.Coverage(config_file=PYPROJECT).config.get_option("report:exclude_lines")
    rx = "|".join(f"(?:{p})" for p in pats)
    lines = set()
    for m in re.finditer(rx, text, flags=re.MULTILINE):
        first = text.count("\n", 0, m.start()) + 1
        lines.update(range(first, first + text.count("\n", m.start(), m.end()) + 1))
    return lines


def test_the_configuration_honours_only_named_pragmas():
    assert excluded("x = 1  # pragma: no cover\n") == set()
    assert excluded("x = 1  # pragma: no cover (tpu)\n") == set()  # not a device this adapter knows
    assert excluded("a = 1\nb = 2  # pragma: no cover (cuda)\n") == {2}
    assert excluded("a = 1  # pragma: no cover (hpu)\nb = 2  # pragma: no cover (xla)\n") == {1, 2}
    region = "a = 1\nb = 2  # pragma: no cover (xla) from here\nc = 3\nd = 4  # pragma: no cover (xla) to here\ne = 5\n"
    assert excluded(region) == {2, 3, 4}
