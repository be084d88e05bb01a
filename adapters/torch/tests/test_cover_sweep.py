"""`fsdpcheck-torch sweep` (fsdpcheck_torch/sweep.py) without running torch:
what it draws (every case a config the reference accepts, the whole space
drawn), and how it classifies and reports outcomes (pass, a divergence, a
crash, an error, a setting an API lacks) in its summary, JUnit and Markdown."""

import itertools
import random
import xml.etree.ElementTree as ET

from fsdpcheck_torch import check
from fsdpcheck_torch.config import UsageError
from fsdpcheck_torch.sweep import cmd_sweep, draw


def test_every_drawn_case_is_a_config_the_reference_accepts():
    seen = set()
    for seed in range(300):
        W, f = draw(random.Random(seed), 4)
        assert W in (1, 2, 4), W
        seen.update(a for a in f if a.startswith("--"))
        seen.update(
            f"{a} {b}" for a, b in itertools.pairwise(f) if a in ("--strategy", "--backward-prefetch", "--norm-type")
        )
        try:
            check.parse(["--api", "fsdp1", "-n", str(W), *f])  # the reference's checks (validate) and FSDP1's
        except UsageError as e:
            assert "--cpu-offload needs an accelerator" in str(e), (seed, f, e)  # the one FSDP1 lacks on the CPU
    want = {
        "--strategy full_shard",
        "--strategy shard_grad_op",
        "--strategy no_shard",
        "--strategy hybrid_shard",
        "--strategy hybrid_shard_zero2",
        "--shard-group",
        "--backward-prefetch pre",
        "--backward-prefetch post",
        "--forward-prefetch",
        "--limit-all-gathers",
        "--param-dtype",
        "--reduce-dtype",
        "--grad-accum",
        "--no-sync",
        "--clip-grad-norm",
        "--norm-type 1",
        "--norm-type 2",
        "--norm-type inf",
        "--cpu-offload",
        "--optimizer",
    }
    assert want <= seen, want - seen


DIVERGED = "fsdpcheck compare\n  A: ref\nfirst divergence: step 0, tensor grad.layers.0.weight\nFAIL: 1 of 1 steps"
CRASHED = "fsdpcheck-torch: FAIL: the torch run (fsdp2) failed with exit 1:\n  rank 1: SIGSEGV at f (x.py:1)"


def test_outcomes_are_classified_and_reported(tmp_path, monkeypatch, capsys):
    """Seed 1, 4 cases at W <= 2: 5 runs and 3 settings an API lacks (FSDP1's
    --cpu-offload on the CPU, FSDP2's BACKWARD_POST and limiter)."""
    seen = []
    canned = [(0, "PASS", {}), (1, DIVERGED, {}), (1, CRASHED, {}), (2, "fsdpcheck-torch: boom", {}), (0, "PASS", {})]

    def fake_run_checks(argvs):
        seen.extend(argvs)
        return [(rc, out, {"plan_s": 1.0, "torch_s": 2.0}) for rc, out, _ in canned[: len(argvs)]]

    monkeypatch.setattr(check, "run_checks", fake_run_checks)
    junit, report = tmp_path / "s.xml", tmp_path / "s.md"
    argv = ["--cases", "4", "--world", "2", "--seed", "1", "--fsdpcheck", "/x/fsdpcheck"]
    rc = cmd_sweep([*argv, "--junit", str(junit), "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 1, out  # a case failed
    assert len(seen) == 5 and all(a[a.index("--fsdpcheck") + 1] == "/x/fsdpcheck" for a in seen), seen
    assert "sweep: 5 runs, 2 passed, 3 failed, 3 unsupported" in out, out
    assert out.strip().splitlines()[-1] == "2 passed, 3 failed, 3 skipped", out
    assert ": FAIL first divergence: step 0, tensor grad.layers.0.weight" in out, out
    assert (
        ": FAIL fsdpcheck-torch: FAIL: the torch run (fsdp2) failed with exit 1: rank 1: SIGSEGV at f (x.py:1)" in out
    )
    assert ": error fsdpcheck-torch: boom" in out, out
    assert "  fsdp2 lacks: FSDP2 has no all-gather rate limiter" in out, out

    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("8", "3", "3")
    msgs = [f.get("message") for f in root.iter("failure")]
    assert msgs[1].startswith("fsdpcheck-torch: FAIL: the torch run") and msgs[2] == "fsdpcheck-torch: boom", msgs

    md = report.read_text().splitlines()
    rows = [ln for ln in md if ln.startswith("| ") and not ln.startswith("| case")]
    assert len(rows) == 8, md
    assert sorted(r.split(" | ")[4] for r in rows) == sorted(
        ["pass"] * 2 + ["FAIL"] * 2 + ["error"] + ["unsupported"] * 3
    )
    lacks = md[md.index("## Settings each API lacks") :]
    assert any(ln.startswith("- fsdp1: --cpu-offload needs an accelerator") for ln in lacks), lacks
    assert any(ln.startswith("- fsdp2: FSDP2 has no BACKWARD_POST prefetch") for ln in lacks), lacks


def test_an_api_with_nothing_lacking_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check, "run_checks", lambda argvs: [(0, "PASS", {}) for _ in argvs])
    report = tmp_path / "s.md"
    assert cmd_sweep(["--cases", "1", "--world", "1", "--seed", "6", "--api", "fsdp2", "--report", str(report)]) == 0
    assert report.read_text().rstrip().endswith("- fsdp2: (none drawn)"), report.read_text()
    assert capsys.readouterr().out.strip().endswith("1 passed, 0 failed, 0 skipped")
