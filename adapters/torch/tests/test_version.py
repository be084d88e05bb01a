"""One version: the adapter's (fsdpcheck_torch.__version__, which pyproject.toml
reads as the package's) is the C package's, the top-level CMakeLists.txt's
project() VERSION, so the two cannot drift apart."""

import os
import re

from conftest import ROOT

import fsdpcheck_torch


def cmake_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"project\(\s*fsdpcheck\s+VERSION\s+([0-9][0-9.]*)", text)
    assert m, "no project(fsdpcheck VERSION x.y.z) in CMakeLists.txt"
    return m.group(1)


def test_the_adapter_has_the_c_package_s_version():
    assert fsdpcheck_torch.__version__ == cmake_version()


def test_the_installed_package_has_that_version_too():
    """The distribution's metadata (pyproject.toml's dynamic version) says the same."""
    from importlib.metadata import version

    assert version("fsdpcheck-torch") == fsdpcheck_torch.__version__
