"""A worker's own failure report (fsdpcheck_torch/failure.py): a UsageError
raised while running is exit 2, recorded as "usage" for `check`; reading the
report directory back skips what is not a rank's report."""

import os

from fsdpcheck_torch import failure
from fsdpcheck_torch.errors import UsageError


def test_a_usage_error_while_running_is_exit_2_and_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(failure.ENV, str(tmp_path))

    def body():
        raise UsageError("--force-sum-reduction: torch 2.7.1 has no FSDPModule.set_force_sum_reduction_for_comms")

    assert failure.guarded(0, body) == 2
    assert capsys.readouterr().err == (
        "fsdpcheck-torch: --force-sum-reduction: torch 2.7.1 has no FSDPModule.set_force_sum_reduction_for_comms\n"
    )
    (f,) = failure.collect(str(tmp_path))
    assert (f.rank, f.kind, f.what) == (
        0,
        "usage",
        "--force-sum-reduction: torch 2.7.1 has no " + "FSDPModule.set_force_sum_reduction_for_comms",
    )


def test_only_rank_0_prints_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(failure.ENV, str(tmp_path))

    def body():
        raise UsageError("bad")

    assert failure.guarded(3, body) == 2
    assert capsys.readouterr().err == ""
    assert [(f.rank, f.kind) for f in failure.collect(str(tmp_path))] == [(3, "usage")]


def test_collect_skips_what_is_not_a_report(tmp_path):
    assert failure.collect(None) == [] and failure.collect(str(tmp_path / "nosuch")) == []
    (tmp_path / "rank-0.fault").write_text("")  # armed, never written: the rank did not crash
    (tmp_path / "rank-1.error.tmp").write_text("error\nhalf written\n")
    (tmp_path / "notes.txt").write_text("error\nx\n")
    os.mkdir(tmp_path / "rank-2.error")  # unreadable as a file
    (tmp_path / "rank-10.error").write_text("error\nValueError: x\n")
    (tmp_path / "rank-3.error").write_text("oops\nsomething\n")  # an unknown kind reads as an error
    assert [(f.rank, f.kind, f.what) for f in failure.collect(str(tmp_path))] == [
        (3, "error", "something"),
        (10, "error", "ValueError: x"),
    ]
