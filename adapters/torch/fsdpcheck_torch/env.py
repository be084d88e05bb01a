"""What the adapter reads from its environment (a leaf module, no torch):
torchrun's RANK, WORLD_SIZE and LOCAL_RANK, FSDPCHECK_GATHER, and where the
fsdpcheck binary is (find_fsdpcheck: --fsdpcheck, $FSDPCHECK, PATH, then the
bin/ of the prefix this package is installed under)."""

import os
import shutil
import sys

from .errors import UsageError


def rank():
    """This process's rank as torchrun sets it (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def world():
    """The world size as torchrun sets it (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank():
    """This process's rank on its host as torchrun sets it (0 outside torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def default_threads():
    """OMP_NUM_THREADS set to 1 unless given: torchrun's ranks share the host's cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def threads():
    """The threads a torch rank uses: OMP_NUM_THREADS (default_threads sets it)."""
    return int(os.environ["OMP_NUM_THREADS"])


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


def installed_version(dist_name):
    """An installed distribution's version (importlib.metadata), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None


def _executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def installed_prefixes(package_dir=None):
    """The prefixes whose bin/ may hold an fsdpcheck installed beside this
    package: the prefix of the site-packages the package sits in
    (PREFIX/lib/pythonX.Y/site-packages/fsdpcheck_torch) first, as it is the
    one the package came with, then sys.prefix. A package run from its source
    tree has no prefix of its own: nothing above it is searched."""
    here = os.path.abspath(package_dir or os.path.dirname(__file__))
    out = []
    site = os.path.dirname(here)
    lib = os.path.dirname(os.path.dirname(site))
    if os.path.basename(site) in ("site-packages", "dist-packages") and os.path.basename(lib).startswith("lib"):
        out.append(os.path.dirname(lib))
    out.append(sys.prefix)
    return list(dict.fromkeys(out))


def find_fsdpcheck(explicit=None):
    """The fsdpcheck binary: --fsdpcheck, $FSDPCHECK, PATH, or PREFIX/bin/fsdpcheck
    of a prefix this package is installed under (installed_prefixes)."""
    if explicit and not _executable(explicit):
        raise UsageError(f"--fsdpcheck {explicit}: not an executable fsdpcheck binary")
    cands = [explicit, os.environ.get("FSDPCHECK"), shutil.which("fsdpcheck")]
    cands += [os.path.join(p, "bin", "fsdpcheck") for p in installed_prefixes()]
    for c in cands:
        if _executable(c):
            return os.path.abspath(c)
    raise UsageError(
        "cannot find the fsdpcheck binary: pass --fsdpcheck PATH, set FSDPCHECK or put fsdpcheck on PATH "
        "(build it with cmake --preset default && cmake --build --preset default: build/default/oracle/fsdpcheck)"
    )
