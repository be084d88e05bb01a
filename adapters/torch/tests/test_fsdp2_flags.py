"""FSDP2-only flags as the reference takes them (check.versioned_flags): an integer
reshard_after_forward alone needs --fsdp-version 2, and `--backward-prefetch pre`, FSDP1's option,
is dropped beside FSDP2's lists (fully_shard's implicit one-unit prefetch is the reference's default
there). Each is planned by the real fsdpcheck, which refuses either mistake, and one is run whole."""

import subprocess

from conftest import adapter, fsdpcheck_bin

from fsdpcheck_torch.check import Job, reference_flags, versioned_flags


def plan(job, tmp_path):
    cmd = [fsdpcheck_bin(), "plan", "--world", str(job.world), *reference_flags(job), "--trace", str(tmp_path / "p")]
    return subprocess.run(cmd, check=False, capture_output=True, text=True)


def test_an_integer_reshard_after_forward_alone_plans_under_fsdp2(tmp_path):
    argv = ["--api", "fsdp2", "-n", "4", "--model", "mlp-tiny", "--reshard-after-forward", "2", "--steps", "1"]
    job = Job([*argv, "--keep", str(tmp_path / "k")])
    assert versioned_flags(job)[-2:] == ["--fsdp-version", "2"]
    p = plan(job, tmp_path)
    assert p.returncode == 0, p.stderr


def test_backward_prefetch_pre_beside_fsdp2_lists_is_dropped_for_the_reference(tmp_path):
    argv = ["--api", "fsdp2", "-n", "2", "--model", "mlp-tiny", "--backward-prefetch", "pre"]
    job = Job([*argv, "--forward-prefetch-units", "2", "--steps", "1", "--keep", str(tmp_path / "k")])
    flags = versioned_flags(job)
    assert "--backward-prefetch" not in flags and flags[-2:] == ["--fsdp-version", "2"]
    p = plan(job, tmp_path)
    assert p.returncode == 0, p.stderr
    # without lists nothing is versioned, and FSDP1's flag stays (the reference's FSDP1 layout takes it)
    job = Job([*argv, "--steps", "1", "--keep", str(tmp_path / "k2")])
    assert versioned_flags(job) == job.flags and "--backward-prefetch" in job.flags


def test_the_torch_trace_of_such_a_run_is_judged(tmp_path):
    # the torch trace's config must say what the reference's FSDP2 layout takes too, or compare refuses it
    argv = ["check", "--api", "fsdp2", "-n", "1", "--model", "mlp-micro", "--backward-prefetch", "pre"]
    rc, out = adapter(*argv, "--forward-prefetch-units", "2", "--steps", "1")
    assert rc == 0, out


def test_the_fsdp2_sweeps_draws_are_planned_by_the_reference(tmp_path):
    # parse() accepting a draw is not enough: the reference's own plan must take its flags as check passes them
    import random

    from fsdpcheck_torch.sweep import RELOAD, draw_fsdp2, without

    for seed in range(60):
        W, f = draw_fsdp2(random.Random(seed), 4)
        job = Job(["--api", "fsdp2", "-n", str(W), *without(f, RELOAD), "--keep", str(tmp_path / f"k{seed}")])
        p = plan(job, tmp_path / f"p{seed}")
        assert p.returncode == 0, (f, p.stderr)
