"""`check`'s verdict plumbing (fsdpcheck_torch/check.py) beyond the shared
`checks` run: one check as a user runs it (its printed verdict and --report),
a reference plan that fails, a torch run that hangs, how a torch run that gave
no trace is classified (bad input or a crash, naming rank and frame, and the
known bug), and the measurement behind pytorch#162338's signature."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import adapter, env, fsdpcheck_bin
from safetensors.torch import save_file

from fsdpcheck_torch import check
from fsdpcheck_torch.check import Crash, Hung, Job, UsageError
from fsdpcheck_torch.cli import main
from fsdpcheck_torch.failure import Failure

MLP = ["--model", "mlp-micro", "--steps", "1"]


def test_one_check_prints_its_verdict_and_writes_the_report(tmp_path):
    report = tmp_path / "report.md"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = ("check", "--api", "fsdp1", "-n", "1", *MLP, "--report", str(report))
    rc, out = adapter(*argv, extra_env={"TMPDIR": str(scratch)})
    assert rc == 0, out
    # nothing left in the temporary directory, the check's own nor torchrun's (its --log-dir), but
    # torch's compile cache (torchinductor_USER: one per user, reused by every run after)
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], out
    assert "PASS" in out and "fsdpcheck compare" in out, out  # compare's own text, printed (no --quiet)
    assert out.strip().splitlines()[-1].startswith("fsdpcheck-torch check: PASS (reference "), out
    text = report.read_text()
    assert "PASS" in text, text


@pytest.fixture
def failing_fsdpcheck(tmp_path):
    """An fsdpcheck whose plan fails as a broken install would (not bad input)."""
    p = tmp_path / "fsdpcheck"
    p.write_text("#!/bin/sh\necho 'fsdpcheck: cannot map init.safetensors: out of memory' >&2\nexit 4\n")
    p.chmod(0o755)
    return str(p)


def test_a_failed_reference_plan_is_exit_2_naming_it(failing_fsdpcheck, capsys):
    rc = main(["check", "--api", "fsdp1", "-n", "1", *MLP, "--fsdpcheck", failing_fsdpcheck])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "", cap
    want = (
        "fsdpcheck-torch: the reference's plan failed (exit 4): fsdpcheck: cannot map init.safetensors: out of memory"
    )
    assert cap.err.strip() == want, cap


def test_run_checks_reports_each_job_on_its_own(failing_fsdpcheck, tmp_path):
    bad = ["--api", "fsdp3"]
    assert check.run_checks([bad]) == [(2, "fsdpcheck-torch: --api 'fsdp3': not fsdp1 or fsdp2", {})]
    keep = tmp_path / "job"
    res = check.run_checks(
        [bad, ["--api", "fsdp1", "-n", "1", *MLP, "--fsdpcheck", failing_fsdpcheck, "--keep", str(keep)]]
    )
    failed = (
        "fsdpcheck-torch: the reference's plan failed (exit 4): fsdpcheck: cannot map init.safetensors: out of memory"
    )
    assert [r[:2] for r in res] == [(2, "fsdpcheck-torch: --api 'fsdp3': not fsdp1 or fsdp2"), (2, failed)], res
    assert set(res[1][2]) == {"plan_s", "torch_s", "compare_s"}, res


def test_a_torch_run_past_its_timeout_is_hung_exit_3(tmp_path):
    job = Job(["--api", "fsdp1", "-n", "1", *MLP, "--keep", str(tmp_path / "job"), "--timeout", "0.2"])
    with pytest.raises(Hung, match=r"did not finish within 0 s \(--timeout\)") as e:
        check.run_torch([job], check.env_for_runs())  # torchrun cannot even import torch in 0.2 s
    assert check.outcome(e.value)[0] == 3


def test_compare_refusing_the_traces_is_an_error(tmp_path):
    job = Job(["--api", "fsdp1", "-n", "1", *MLP, "--keep", str(tmp_path / "job")])
    with pytest.raises(RuntimeError, match=r"fsdpcheck compare refused the traces: .*cannot open trace directory"):
        check.compare(job, fsdpcheck_bin(), env())


def _job(tmp_path, *extra):
    job = Job(["--api", "fsdp1", "-n", "2", *MLP, "--keep", str(tmp_path / "job"), *extra])
    os.makedirs(job.torch_dir)
    return job


def _proc(rc, stderr=""):
    return subprocess.CompletedProcess(["torchrun"], rc, "", stderr)


def test_a_jobs_own_usage_error_is_bad_input(tmp_path):
    """A job of a --jobs file refused while running (error.txt, kind usage): exit 2, its message."""
    job = _job(tmp_path)
    (tmp_path / "job" / "torch" / "error.txt").write_text("usage\n--force-sum-reduction: torch 2.7 has no X\n")
    e = check.torch_failure(job, _proc(0), [])
    assert isinstance(e, UsageError) and str(e) == "--force-sum-reduction: torch 2.7 has no X"


def test_a_jobs_own_exception_is_a_crash_naming_its_frame(tmp_path):
    job = _job(tmp_path)
    (tmp_path / "job" / "torch" / "error.txt").write_text(
        'error\nRuntimeError: boom\nTraceback (most recent call last):\n  File "/x/engine.py", line 5, in train\n'
    )
    e = check.torch_failure(job, _proc(0), [])
    assert isinstance(e, Crash), e
    assert str(e) == "the torch run (fsdp1) failed:\n  rank 0: RuntimeError: boom at train (engine.py:5)"
    assert check.outcome(e) == (1, f"fsdpcheck-torch: FAIL: {e}")


def test_a_refusal_before_any_rank_reported_is_bad_input(tmp_path):
    job = _job(tmp_path)
    e = check.torch_failure(job, _proc(2, "noise\nfsdpcheck-torch: --device xla needs torch_xla (x)\n"), [])
    assert isinstance(e, UsageError) and str(e) == "--device xla needs torch_xla (x)"


def test_a_rank_killed_without_a_report_is_named_from_the_launcher(tmp_path):
    job = _job(tmp_path)
    banner = "  rank      : 1 (local_rank: 1)\n  exitcode  : -99 (pid: 7)\n"
    (f,) = check.launcher_failures(banner)
    assert (f.rank, f.kind, f.what) == (1, "signal", "signal 99")  # no such signal: its number
    e = check.torch_failure(job, _proc(1, banner), [])
    assert isinstance(e, Crash) and str(e) == "the torch run (fsdp1) failed with exit 1:\n  rank 1: signal 99"


def test_a_crash_with_a_known_bugs_signature_names_it(tmp_path):
    job = _job(tmp_path, "--ckpt-at", "1")
    (tmp_path / "job" / "torch" / "trace.json").write_text("{}")
    seg = Failure(1, "signal", "SIGSEGV", "param_hook (_state_dict_utils.py:331)", "... _state_dict_utils.py ...")
    e = check.torch_failure(job, _proc(1), [seg])
    lines = str(e).splitlines()
    assert isinstance(e, Crash) and lines[0] == "the torch run (fsdp1) ended with exit 1 after writing its whole trace:"
    assert lines[1].strip() == "rank 1: SIGSEGV at param_hook (_state_dict_utils.py:331)"
    assert lines[2].strip().startswith("known PyTorch bug pytorch#188989: "), lines


def _steps(job, grads_a, grads_b):
    for d, grads in ((job.ref_dir, grads_a), (job.torch_dir, grads_b)):
        os.makedirs(d, exist_ok=True)
        t = {f"grad.{k}": v for k, v in grads.items()}
        t["loss"] = torch.tensor([1.0])
        save_file(t, os.path.join(d, "step-000000.safetensors"))


def test_the_gloo_avg_signature_is_measured_from_the_step_files(tmp_path):
    job = Job(["--api", "fsdp2", "-n", "2", *MLP, "--keep", str(tmp_path / "job")])
    assert check.gloo_avg_bug(job, job.ref_dir) is None  # no step files: no signature
    a = {"w": torch.tensor([1.0, -2.0, 3.0]), "b": torch.tensor([0.5]), "z": torch.zeros(2)}
    _steps(job, a, {k: 2 * v for k, v in a.items()})  # every gradient W = 2 x the reference's
    line = check.gloo_avg_bug(job, job.ref_dir)
    assert line is not None and line.startswith("known PyTorch bug pytorch#162338: "), line
    # the all-zero gradient has no ratio: two measured
    assert line.endswith("measured: all 2 gradients of step 0 are B = 2.0000 .. 2.0000 x A (W = 2)"), line
    _steps(job, a, a)  # the right answer
    assert check.gloo_avg_bug(job, job.ref_dir) is None
    _steps(job, a, dict(a, b=torch.tensor([0.5 * 1.5])))  # one tensor 1.5 x, the others 1 x: not the bug
    assert check.gloo_avg_bug(job, job.ref_dir) is None
    # FSDP1, or FSDP2 told to sum: never this bug's signature, whatever the ratios
    _steps(job, a, {k: 2 * v for k, v in a.items()})
    for other in (["--api", "fsdp1"], ["--api", "fsdp2", "--force-sum-reduction"]):
        j = Job([*other, "-n", "2", *MLP, "--keep", str(tmp_path / "job")])
        assert not check.gloo_avg_applies(j) and check.gloo_avg_bug(j, job.ref_dir) is None


def _alive(marker):
    """Processes whose command line holds marker (a path unique to one test)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(
    os.environ.get("FSDPCHECK_TORCH_TESTS") == "quick",
    reason="not in the quick selection: 26 s of waiting for --timeout, which no torch version changes",
)
def test_a_hung_rank_is_exit_3_and_no_worker_is_left(tmp_path):
    # --inject hang: the last rank sleeps in step 0, the other waits in its
    # collective; check stops the whole run at --timeout (torchrun's workers
    # sit in sessions of their own: a signal to torchrun's group misses them)
    keep = tmp_path / "hang"
    rc, out = adapter(
        "check",
        "--api",
        "fsdp2",
        "-n",
        "2",
        *MLP,
        "--inject",
        "hang",
        "--keep",
        str(keep),
        "--timeout",
        "25",
        timeout=150,  # a worker left alive holds check's pipes open: it would never return
    )
    assert rc == 3, out
    assert "the torch run did not finish within 25 s (--timeout)" in out, out
    assert "Traceback" not in out, out
    assert _alive(str(keep)) == [], f"workers left running: {_alive(str(keep))}"


def test_a_reference_plan_past_its_timeout_is_exit_3(tmp_path):
    keep = tmp_path / "slow"
    slow = tmp_path / "fsdpcheck"  # a plan that never ends (the real one takes milliseconds here)
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    argv = ["--api", "fsdp1", "-n", "1", *MLP, "--keep", str(keep), "--timeout", "0.2", "--fsdpcheck", str(slow)]
    rc, out = adapter("check", *argv)
    assert rc == 3, out
    assert "the reference's plan did not finish within 0 s (--timeout)" in out, out
    assert "Traceback" not in out, out
    # torch, started beside the plan, stopped with it
    assert _alive(str(keep)) == [], f"left running: {_alive(str(keep))}"


def test_torch_waits_for_the_plan_it_starts_beside(tmp_path):
    """check starts torch beside the reference's plan; the ranks open the plan
    only once it is written. A plan slower than torch's start (the real one
    after 6 s of sleep) still passes, and torch's time holds the wait. Without
    the wait the ranks read a trace not yet there (exit 2)."""
    slow = tmp_path / "fsdpcheck"
    slow.write_text(f'#!/bin/sh\nif [ "$1" = plan ]; then sleep 6; fi\nexec {fsdpcheck_bin()} "$@"\n')
    slow.chmod(0o755)
    keep = tmp_path / "job"
    # FSDP1: torch 2.7 and 2.8's FSDP2 on gloo fails its own way (pytorch#162338)
    argv = ["--api", "fsdp1", "-n", "2", *MLP, "--fsdpcheck", str(slow), "--keep", str(keep), "--quiet"]
    rc, text, t = check.run_check(argv)
    assert rc == 0, text
    assert t["plan_beside"] and t["plan_s"] >= 6 and t["torch_s"] > t["plan_s"], t


def test_torch_is_stopped_when_the_plans_outcome_cannot_be_written(tmp_path, monkeypatch):
    """The ranks wait for the plan's outcome without a limit of their own: where
    check cannot write it, torch is stopped and the error goes on."""
    from fsdpcheck_torch import planwait

    def unwritable(path, ok):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(planwait, "write_outcome", unwritable)
    keep = tmp_path / "job"
    with pytest.raises(OSError, match="No space left"):
        check.run_check(["--api", "fsdp1", "-n", "2", *MLP, "--keep", str(keep), "--quiet"])
    assert _alive(str(keep)) == [], f"left running: {_alive(str(keep))}"


def test_a_rank_opens_the_plan_only_once_it_is_written(tmp_path, monkeypatch):
    """planwait: no variable, no wait; with one, the rank waits for the file
    and reads its outcome; a plan that failed is the rank's refusal, one line."""
    from fsdpcheck_torch import cli, planwait

    flag = tmp_path / "plan"
    monkeypatch.delenv(planwait.ENV, raising=False)
    assert planwait.ready()
    monkeypatch.setenv(planwait.ENV, str(flag))
    late = threading.Timer(0.3, planwait.write_outcome, (str(flag), True))
    t0 = time.monotonic()
    late.start()
    assert planwait.ready() and time.monotonic() - t0 >= 0.3
    planwait.write_outcome(str(flag), False)
    assert not planwait.ready()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # written whole: no .tmp left
    with pytest.raises(UsageError, match=r"^--like /nowhere: the reference's plan was not written$"):
        cli.parse_run(["--api", "fsdp2", "--like", "/nowhere", "--trace", str(tmp_path / "t")], 1)


def test_run_bounded_reports_the_childs_peak_resident_set():
    # a child that touches 300 MiB: its peak resident set is at least that, and the output arrives whole
    code = "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); print('done ' * 20000)"
    p = check.run_bounded([sys.executable, "-c", code], dict(os.environ), 60, "the child")
    assert p.returncode == 0 and p.stdout.count("done") == 20000, p
    assert 300 <= p.peak_rss_mib < 2000, p.peak_rss_mib


def test_plan_rss_reads_plan_s_line():
    out = "fsdpcheck plan: model mlp-micro (17 parameters, 3 units), W=2 ...\npeak RSS (MiB): 476.3\n"
    assert check.plan_rss(out) == 476.3
    assert check.plan_rss("") is None


def test_huge_pages_are_asked_for_and_a_users_choice_stands():
    assert check.with_huge_pages("") == "glibc.malloc.hugetlb=1"
    assert check.with_huge_pages("glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert check.with_huge_pages("glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"


# A tensor allocated under an environment, in /proc/self/smaps: the mapping
# that holds its data carries VM_HUGEPAGE ("hg") exactly when glibc was asked.
HG_PROBE = """
import torch
t = torch.empty(64 << 18)  # 64 MiB
t.fill_(1.0)
p = t.data_ptr() + t.numel() * 2
inside = False
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= p < hi
    elif inside and line.startswith("VmFlags:"):
        print("hg" in line.split()[1:])
        break
"""


def test_a_torch_rank_gets_its_large_tensors_advised_huge(monkeypatch):
    import platform

    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
        pytest.skip(f"{libc} {version}: glibc.malloc.hugetlb needs glibc 2.35")
    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("this kernel has no transparent huge pages")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)  # the user's own would stand (above)
    runs = check.env_for_runs()
    torch_ranks = check.env_for_torch(runs)
    seen = {}
    for name, e in (("torch", torch_ranks), ("runs", runs)):
        p = subprocess.run(
            [sys.executable, "-c", HG_PROBE], env=e, capture_output=True, text=True, timeout=300, check=False
        )
        assert p.returncode == 0, p.stderr
        seen[name] = p.stdout.strip()
    # the torch ranks ask for it; the reference and compare (env_for_runs) do not
    assert seen == {"torch": "True", "runs": "False"}, seen
