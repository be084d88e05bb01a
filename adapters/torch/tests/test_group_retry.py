"""check.run_checks starts torch once per world size for many checks; a run that fails there leaves the
others of its torchrun waiting in a collective and fails the torchrun, so each check that did not pass
runs again (check.run_isolating): the first without a whole trace alone, the rest together. The torch runs and the judging are stood in for: the
case is the bookkeeping, which no real crash can be made to exercise in seconds."""

import types

from fsdpcheck_torch import check

ARGV = ["--api", "fsdp2", "-n", "2", "--model", "mlp-tiny", "--steps", "1"]


def test_a_crash_in_a_shared_torchrun_runs_the_others_again_alone(tmp_path, monkeypatch):
    runs = []

    def run_torch(jobs, env, beside=None):
        runs.append(len(jobs))
        crashed = len(jobs) > 1 or jobs[0].work.endswith("b")  # check b fails alone too
        return types.SimpleNamespace(returncode=1 if crashed else 0), {}

    def judge(job, p, fails, fsdpcheck, env):
        if p.returncode:
            raise check.Crash("rank 1: RuntimeError")
        return 0, "PASS\n"

    monkeypatch.setattr(check, "run_torch", run_torch)
    monkeypatch.setattr(check, "judge", judge)
    monkeypatch.setattr(check, "plan_reference", lambda job, fsdpcheck, env: None)
    monkeypatch.setattr(check, "find_fsdpcheck", lambda path: "fsdpcheck")
    argvs = [[*ARGV, "--keep", str(tmp_path / name)] for name in ("a", "b", "c")]
    results = check.run_checks(argvs)
    assert [r[0] for r in results] == [0, 1, 0], results
    # the shared torchrun; a, the first without a whole trace, alone; b and c together, which fails again;
    # b alone (it fails); c alone
    assert runs == [3, 1, 2, 1, 1], runs


def test_a_clean_shared_torchrun_is_not_run_again(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setattr(
        check,
        "run_torch",
        lambda jobs, env, beside=None: runs.append(len(jobs)) or (types.SimpleNamespace(returncode=0), {}),
    )
    # a failed comparison in a clean torchrun is its own verdict, not a neighbour's crash
    monkeypatch.setattr(check, "judge", lambda job, p, fails, fsdpcheck, env: (1, "FAIL\n"))
    monkeypatch.setattr(check, "plan_reference", lambda job, fsdpcheck, env: None)
    monkeypatch.setattr(check, "find_fsdpcheck", lambda path: "fsdpcheck")
    results = check.run_checks([[*ARGV, "--keep", str(tmp_path / name)] for name in ("a", "b")])
    assert [r[0] for r in results] == [1, 1] and runs == [2], (results, runs)
