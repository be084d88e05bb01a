"""A crash or abort of the implementation under test is a verdict on it
(exit 1, naming the rank, its signal and where), never bad input (2) and
never hidden by a trace already on disk; known upstream bugs are named.

The crashes are real: `--inject segv` makes the last rank read address 0 in
step 1's backward, `--inject abort_at_exit` makes it abort after the whole
trace is written (the failure a run_checks that trusted trace.json missed)."""

import os
import subprocess
import sys

import pytest
from conftest import check, env

from fsdpcheck_torch import failure, known_bugs
from fsdpcheck_torch.check import launcher_failures, run_checks

MLP = ["--model", "mlp-tiny", "--steps", "2", "--strategy", "full_shard"]


def test_segv_is_a_verdict_naming_rank_and_frame():
    rc, out = check("--api", "fsdp2", "-n", "2", *MLP, "--inject", "segv")
    assert rc == 1, out
    assert "rank 1: SIGSEGV at string_at (" in out, out  # the innermost frame: ctypes reading address 0
    assert "fsdpcheck-torch check: FAIL" in out and "ChildFailedError" not in out, out


def test_abort_after_the_whole_trace_is_still_a_failure():
    rc, out = check("--api", "fsdp1", "-n", "2", *MLP, "--inject", "abort_at_exit")
    assert rc == 1, out
    assert "after writing its whole trace" in out and "rank 1: SIGABRT" in out, out


def test_run_checks_never_ignores_a_failed_exit(tmp_path):
    """Two jobs in one torchrun, the second aborting at its end: the first
    wrote a whole trace too, but the process group's exit code failed, so
    neither verdict is taken from it. Each runs again in its own torchrun
    (check.run_isolating): the first passes there, the second aborts again."""
    os.environ.update({k: v for k, v in env().items() if k not in os.environ or k == "FSDPCHECK"})
    res = run_checks(
        [
            ["--api", "fsdp1", "-n", "2", *MLP, "--quiet", "--keep", str(tmp_path / "a")],
            ["--api", "fsdp1", "-n", "2", *MLP, "--inject", "abort_at_exit", "--quiet", "--keep", str(tmp_path / "b")],
        ]
    )
    assert [r[0] for r in res] == [0, 1], res
    assert "SIGABRT" in res[1][1] and "SIGABRT" not in res[0][1], res


def test_exception_is_recorded_with_its_innermost_frame(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.ENV, str(tmp_path))

    def boom():
        return {}["missing"]

    assert failure.guarded(3, boom) == 1
    (f,) = failure.collect(str(tmp_path))
    assert (f.rank, f.kind, f.what) == (3, "error", "KeyError: 'missing'")
    assert f.where.startswith("boom (test_verdicts.py:"), f.where


def test_faulthandler_report_of_a_real_segfault(tmp_path):
    code = "from fsdpcheck_torch import failure; failure.arm(5); import ctypes; ctypes.string_at(0)"
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **{failure.ENV: str(tmp_path)}), check=False)
    assert p.returncode < 0
    (f,) = failure.collect(str(tmp_path))
    assert (f.rank, f.kind, f.what) == (5, "signal", "SIGSEGV"), f
    assert "string_at" in f.where, f.where


def test_launcher_summary_fallback():
    banner = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_10:00:00\n  host      : h\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 77)\n  error_file: <N/A>\n"
    )
    (f,) = launcher_failures(banner)
    assert (f.rank, f.what) == (1, "SIGKILL")


@pytest.mark.parametrize("W", [2, 4])
def test_gloo_avg_signature(W):
    exact = [(float(W), 1e-7)] * 5
    assert known_bugs.match_gloo_avg("fsdp2", "gloo", W, False, exact) is known_bugs.GLOO_AVG
    # not the bug: a right answer, one tensor off, FSDP1, another backend, the workaround on
    assert known_bugs.match_gloo_avg("fsdp2", "gloo", W, False, [(1.0, 1e-7)] * 5) is None
    assert known_bugs.match_gloo_avg("fsdp2", "gloo", W, False, [*exact, (1.0, 1e-7)]) is None
    assert known_bugs.match_gloo_avg("fsdp1", "gloo", W, False, exact) is None
    assert known_bugs.match_gloo_avg("fsdp2", "nccl", W, False, exact) is None
    assert known_bugs.match_gloo_avg("fsdp2", "gloo", W, True, exact) is None


def test_fsdp1_state_dict_segv_signature():
    seg = failure.Failure(0, "signal", "SIGSEGV", "param_hook (_state_dict_utils.py:331)", "... _state_dict_utils.py")
    assert known_bugs.match_crash("fsdp1", "cpu", "1", [seg]) is known_bugs.FSDP1_OFFLOAD_SEGV
    assert known_bugs.match_crash("fsdp2", "cpu", "1", [seg]) is None
    assert known_bugs.match_crash("fsdp1", "cpu", None, [seg]) is None
    other = failure.Failure(0, "signal", "SIGSEGV", "train (engine.py:1)", "engine.py")
    assert known_bugs.match_crash("fsdp1", "cpu", "1", [other]) is None


def test_known_bug_version_ranges():
    # measured: #188989 on 2.7.1, 2.8.0 and 2.11.0, gone in 2.15.0; versions between are
    # unmeasured (None); a patch release inside the measured range counts as present
    segv = known_bugs.FSDP1_OFFLOAD_SEGV
    assert [segv.present_on(v) for v in [(2, 7, 1), (2, 9, 1), (2, 11, 0), (2, 13, 0), (2, 15, 0), (2, 16, 0)]] == [
        True,
        True,
        True,
        None,
        False,
        False,
    ]
    # the issue numbers inside clean_on ("fixed by pytorch#188990") are not versions
    assert known_bugs._versions(segv.clean_on) == [(2, 15, 0)]
    assert known_bugs.GLOO_AVG.present_on((2, 8, 1)) is None and known_bugs.GLOO_AVG.present_on((2, 9, 0)) is False


@pytest.mark.parametrize("cmd", ["run", "check", "sweep", "trainer"])
def test_help_on_every_command(cmd, capsys):
    from fsdpcheck_torch.cli import main

    assert main([cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert cmd in out and "--" in out, out
