"""`fsdpcheck-torch sweep`: drawn cases judged against the reference, the
settings an API lacks reported, JUnit XML written."""

import xml.etree.ElementTree as ET

from conftest import adapter


def test_sweep(tmp_path):
    junit = tmp_path / "sweep.xml"
    rc, out = adapter("sweep", "--cases", "3", "--world", "2", "--seed", "7", "--junit", str(junit))
    print(out)
    assert rc == 0, out
    root = ET.parse(junit).getroot()
    assert int(root.get("tests")) == 6 and int(root.get("failures")) == 0
    assert "passed" in out.splitlines()[-1]
