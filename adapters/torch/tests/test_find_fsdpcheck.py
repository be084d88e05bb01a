"""Where the adapter finds the fsdpcheck binary (fsdpcheck_torch/env.py
find_fsdpcheck): --fsdpcheck, then $FSDPCHECK, then PATH, then bin/ of the
prefix the package is installed under; never by walking up a source tree.
Nothing found is bad input: one line, exit 2."""

import os
import sys

import pytest
from conftest import ROOT, refused

from fsdpcheck_torch import env
from fsdpcheck_torch.errors import UsageError


def fake(directory, name="fsdpcheck"):
    """An executable file named fsdpcheck in directory; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return str(path)


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No FSDPCHECK, an empty PATH, a sys.prefix without bin/fsdpcheck, and a
    source tree that does hold build/default/oracle/fsdpcheck, with the working
    directory and the package both inside it: a walk up from either finds it,
    so any walk-up fails these tests wherever they run."""
    monkeypatch.delenv("FSDPCHECK", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    tree = tmp_path / "tree"
    fake(tree / "build" / "default" / "oracle")
    (tree / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tree / "a" / "b")
    package = tree / "adapters" / "torch" / "fsdpcheck_torch"
    package.mkdir(parents=True)
    monkeypatch.setattr(env, "__file__", str(package / "env.py"))
    return tmp_path


def test_nothing_found_is_one_line_and_exit_2(nowhere, capsys):
    line = refused(["check", "--api", "fsdp1", "-n", "1", "--model", "mlp-micro", "--steps", "1"], capsys)
    assert "cannot find the fsdpcheck binary: pass --fsdpcheck PATH, set FSDPCHECK or put fsdpcheck on PATH" in line


def test_a_bad_explicit_binary_is_refused(nowhere):
    with pytest.raises(UsageError, match=r"--fsdpcheck .*/none: not an executable fsdpcheck binary"):
        env.find_fsdpcheck(str(nowhere / "none"))


def test_the_order_is_flag_environment_path_prefix(nowhere, monkeypatch):
    prefixed = fake(nowhere / "prefix" / "bin")
    assert env.find_fsdpcheck() == prefixed
    on_path = fake(nowhere / "empty-path")
    assert env.find_fsdpcheck() == on_path
    named = fake(nowhere / "named")
    monkeypatch.setenv("FSDPCHECK", named)
    assert env.find_fsdpcheck() == named
    given = fake(nowhere / "given")
    assert env.find_fsdpcheck(given) == given
    # a FSDPCHECK that names no executable is passed over, as before
    monkeypatch.setenv("FSDPCHECK", str(nowhere / "missing"))
    assert env.find_fsdpcheck() == on_path


def test_the_installed_prefix_is_the_site_packages_one(tmp_path):
    pkg = tmp_path / "opt" / "lib" / "python3.11" / "site-packages" / "fsdpcheck_torch"
    assert env.installed_prefixes(str(pkg)) == [str(tmp_path / "opt"), sys.prefix]
    # the package's own prefix first, then sys.prefix, each once
    same = os.path.join(sys.prefix, "lib", "python3.11", "site-packages", "fsdpcheck_torch")
    assert env.installed_prefixes(same) == [sys.prefix]
    # run from its source tree, the package has no prefix of its own: nothing above it is searched
    assert env.installed_prefixes(os.path.join(ROOT, "adapters", "torch", "fsdpcheck_torch")) == [sys.prefix]
