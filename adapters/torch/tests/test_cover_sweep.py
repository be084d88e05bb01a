"""`fsdpcheck-torch sweep` (fsdpcheck_torch/sweep.py) without running torch:
what it draws (every case a config the reference accepts, the whole space
drawn, FSDP2's draw over every feature it hunts), how it classifies and reports
outcomes (pass, a divergence, a crash, an error, a setting an API lacks) in its
summary, JUnit and Markdown, its coverage table, and the reload of a DCP
checkpoint at another world size (reshard.py)."""

import itertools
import os
import random
import xml.etree.ElementTree as ET

from fsdpcheck_torch import check, reshard, sweep
from fsdpcheck_torch.config import UsageError
from fsdpcheck_torch.sweep import FEATURES, RELOAD, cmd_sweep, draw, draw_fsdp2, value, without


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


DIVERGED = (
    "fsdpcheck compare\n  A: ref\nfirst divergence: step 0, tensor grad.layers.0.weight\n"
    "signature: B = W x A (W = 2): the gradients summed, never divided\nFAIL: 1 of 1 steps\n"
    "known PyTorch bug pytorch#162338: FSDP2 on gloo ... Workaround: ..."
)
CRASHED = (
    "fsdpcheck-torch: FAIL: the torch run (fsdp2) failed with exit 1:\n  rank 1: SIGSEGV at f (x.py:1)\n"
    "  known PyTorch bug pytorch#188989: FSDP1's full state dict ... Workaround: ..."
)


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
    assert ": FAIL first divergence: step 0, tensor grad.layers.0.weight; signature: B = W x A (W = 2)" in out, out
    assert "; known PyTorch bug pytorch#162338\n" in out, out
    assert (
        ": FAIL fsdpcheck-torch: FAIL: the torch run (fsdp2) failed with exit 1: rank 1: SIGSEGV at f (x.py:1)"
        "; known PyTorch bug pytorch#188989" in out
    )
    assert ": error fsdpcheck-torch: boom" in out, out
    assert "  fsdp2 lacks: FSDP2 has no all-gather rate limiter" in out, out

    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("8", "3", "3")
    msgs = [f.get("message") for f in root.iter("failure")]
    assert msgs[1].startswith("fsdpcheck-torch: FAIL: the torch run") and msgs[2] == "fsdpcheck-torch: boom", msgs

    md = report.read_text().splitlines()
    cases = md[: md.index("## Settings each API lacks")]
    rows = [ln for ln in cases if ln.startswith("| ") and not ln.startswith("| case")]
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
    md = report.read_text()
    assert md[: md.index("## Coverage")].rstrip().endswith("- fsdp2: (none drawn)"), md
    assert capsys.readouterr().out.strip().endswith("1 passed, 0 failed, 0 skipped")


# FSDP2's draw (--api fsdp2): the features the sweep hunts over, and the ones it has no way to draw there
FSDP1_ONLY = {"--backward-prefetch post", "--limit-all-gathers"}


def test_fsdp2_draws_only_configs_check_accepts():
    for seed in range(400):
        W, f = draw_fsdp2(random.Random(seed), 4)
        assert W in (1, 2, 3, 4), W
        assert W != 3 or value(f, "--global-batch") in ("6", "12"), f  # W = 3 divides the batch
        check.parse(["--api", "fsdp2", "-n", str(W), *without(f, RELOAD)])
        if RELOAD in f:  # the checkpoint is DCP's, and the flags hold at the other world size too
            W2 = int(value(f, RELOAD))
            assert W2 != W and value(f, "--ckpt-state-dict") == "sharded", f
            check.parse(["--api", "fsdp2", "-n", str(W2), *without(f, RELOAD)])
        assert not ("--freeze" in f and "--lora" in f), f
        assert not (value(f, "--model").startswith("llama") and value(f, "--param-dtype") == "fp16"), f  # known open
        assert not ("--ckpt-at" in f and ("--freeze" in f or "--lora" in f)), f


def test_fsdp2_does_not_draw_the_open_empty_shard_crash():
    """docs/repro/fsdp2-clip-inf-empty-shard.md: no infinity norm where a rank's shard is empty, at
    W >= 3 or beside LoRA's A of r < W rows (without that rule seed 600 draws inf with r = 1 at W = 2)."""
    for seed in range(2000):
        W, f = draw_fsdp2(random.Random(seed), 4)
        if value(f, "--norm-type") == "inf":
            assert W < 3 and ("--lora" not in f or int(value(f, "--lora").split(":")[0]) >= W), (seed, f)


class FirstChoice:
    """An rng that draws every probability as taken and every choice as the first."""

    def random(self):
        return 0.0

    def choice(self, seq):
        return seq[0]


def test_fsdp2_does_not_draw_the_open_frozen_unit_crash():
    """docs/repro/fsdp2-raf-int-frozen-accum.md: --freeze layers.0 (FREEZE's first for mlp-tiny) is
    dropped beside an integer reshard_after_forward and accumulation, and drawn without either."""
    for others, freezes in (([], True), (["--grad-accum", "2"], True), (["--reshard-after-forward", "2"], True)):
        f = ["--model", "mlp-tiny", *others]
        sweep._frozen(FirstChoice(), f, "mlp-tiny")
        assert ("--freeze" in f) == freezes and (not freezes or value(f, "--freeze") == "layers.0"), f
    f = ["--model", "mlp-tiny", "--reshard-after-forward", "2", "--grad-accum", "2"]
    sweep._frozen(FirstChoice(), f, "mlp-tiny")
    assert "--freeze" not in f, f


def test_fsdp2_draws_every_feature():
    """Within 400 draws, every feature of the table but FSDP1's own; --cpu-offload off the CPU only."""
    seen = {name: 0 for name, _ in FEATURES}
    for seed in range(400):
        W, f = draw_fsdp2(random.Random(seed), 4, "cuda")
        check.parse(["--api", "fsdp2", "-n", str(W), "--device", "cuda", *without(f, RELOAD)])
        for name, has in FEATURES:
            seen[name] += has(W, f)
    assert {n for n, k in seen.items() if k == 0} == FSDP1_ONLY, seen
    assert all(k >= 5 for n, k in seen.items() if n not in FSDP1_ONLY), seen
    assert not any("--cpu-offload" in draw_fsdp2(random.Random(s), 4)[1] for s in range(400))  # on the CPU
    assert all(draw_fsdp2(random.Random(s), 2)[0] <= 2 for s in range(100))  # --world bounds it


def test_fsdp2_sweep_reports_coverage(tmp_path, monkeypatch, capsys):
    """Seed 3, 12 cases: the coverage table counts each run with a feature, passed and failed,
    on stdout and in the report; a reload's verdict replaces its check's."""
    monkeypatch.setattr(check, "run_checks", lambda argvs: [(0, "PASS", {"torch_s": 1.0}) for _ in argvs])
    reloads = []

    def fake_reloads(items):
        reloads.extend(items)
        return [(1, "reloaded at W=4: ...\nfirst divergence: step 1, tensor grad.x", {"torch_s": 2.0}) for _ in items]

    monkeypatch.setattr(reshard, "run_reloads", fake_reloads)
    report = tmp_path / "s.md"
    rng = random.Random(3)
    cases = [draw_fsdp2(rng, 4) for _ in range(12)]
    rc = cmd_sweep(["--cases", "12", "--seed", "3", "--api", "fsdp2", "--report", str(report)])
    out = capsys.readouterr().out
    n_reload = sum(RELOAD in f for _, f in cases)
    assert n_reload >= 1 and len(reloads) == n_reload, (cases, reloads)
    assert all("--keep" in argv and W2 != int(argv[argv.index("-n") + 1]) for argv, W2 in reloads), reloads
    assert rc == 1 and f"{12 - n_reload} passed, {n_reload} failed, 0 skipped" in out, out
    md = report.read_text()
    for name, has in FEATURES:
        runs = [f for W, f in cases if has(W, f)]
        fails = sum(RELOAD in f for f in runs)
        row = f"| {name} | {len(runs)} | {len(runs) - fails} | {fails} | 0 |"
        assert row in out and row in md, (row, out)
    assert "## Coverage" in md and "first divergence: step 1, tensor grad.x" in md


def test_a_reload_is_judged_against_the_saving_run(tmp_path, monkeypatch):
    """reshard.run_reloads without torch: what the resumed run is given, and each way it can end."""
    keep = tmp_path / "k"
    argv = ["--api", "fsdp2", "-n", "2", "--model", "gpt2-tiny", "--steps", "3", "--ckpt-at", "1"]
    argv += ["--ckpt-state-dict", "sharded", "--force-sum-reduction", "--device", "cpu", "--keep", str(keep)]
    job = reshard.Reload(argv, 4)
    a = job.torch_args()
    assert a[:6] == ["run", "--api", "fsdp2", "--device", "cpu", "--force-sum-reduction"], a
    assert a[-6:] == [
        "--like",
        str(keep / "ref"),
        "--load",
        str(keep / "torch" / "ckpt"),
        "--trace",
        str(keep / "reload-W4"),
    ]
    assert value(a, "--steps") == "2" and "--ckpt-at" not in a, a
    assert job.ref_dir == str(keep / "torch") and "fsdpcheck compare" in job.command()

    monkeypatch.setattr(check, "find_fsdpcheck", lambda p: "/x/fsdpcheck")

    class P:
        returncode = 0
        stderr = ""

    def fake_run_torch(jobs, env):
        for j in jobs:  # the first resumed run writes its trace, the second does not
            if j.world == 4:
                os.makedirs(j.torch_dir)
                open(os.path.join(j.torch_dir, "trace.json"), "w").close()
        return P(), []

    monkeypatch.setattr(check, "run_torch", fake_run_torch)
    monkeypatch.setattr(check, "compare", lambda job, b, env: (0, "PASS: 2 steps agree\n"))
    bad = argv[: argv.index("--ckpt-state-dict")] + ["--keep", str(keep)]  # a FULL checkpoint: no reload
    res = reshard.run_reloads([(argv, 4), (argv, 1), (bad, 4)])
    assert res[0][0] == 0 and res[0][1].startswith("reloaded at W=4: torchrun "), res[0]
    assert res[1][0] == 1 and "the torch run (fsdp2) failed" in res[1][1], res[1]
    assert res[2][0] == 2 and "a reload needs" in res[2][1], res[2]

    def hung(jobs, env):
        raise check.Hung("the torch run did not finish")

    monkeypatch.setattr(check, "run_torch", hung)
    assert reshard.run_reloads([(argv, 1)])[0][0] == 3
    assert reshard.run_reloads([(bad, 4)])[0][0] == 2  # nothing to run: no torch, no fsdpcheck
