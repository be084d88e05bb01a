"""FSDP2's sharded checkpoints (DCP's Hugging Face safetensors) between real
torch and the reference, both ways, and the import of DCP's default format:

  torch FSDP2 W=4 --ckpt-at 2 --ckpt-state-dict sharded   (dcp.save, HuggingFaceStorageWriter)
      -> fsdpcheck ckpt verify; every tensor, converted to full by fsdpcheck, is
         bit for bit what torch trained (its trace's step-1 parameters and state)
      -> fsdpcheck run --load at W=2: its continuation passes compare against
         torch's own continuation (P7)
  reference W=2 --save --state-dict sharded
      -> torch's HuggingFaceStorageReader (one process) reads every tensor bit
         for bit; FSDP2 W=4 --load continues it and passes compare; the same load
         that drops the optimizer state (ckpt_drop_optim) fails compare
  torch FSDP2 W=4 dcp.save(checkpoint_id=...)  (.distcp, tests/distcp_worker.py)
      -> fsdpcheck-torch ckpt import -> bit for bit, and the reference resumes it
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
from conftest import env, fsdpcheck_bin, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
REF = ["--model", "gpt2-tiny", "--strategy", "full_shard", "--fsdp-version", "2", "--steps", "4"]


def _hf_ok():
    from fsdpcheck_torch.dcp import missing

    return missing()


pytestmark = pytest.mark.skipif(_hf_ok() is not None, reason=f"{_hf_ok()}")


def sh(cmd, timeout=600):
    p = subprocess.run(
        cmd, check=False, capture_output=True, text=True, env=env(), timeout=timeout, stdin=subprocess.DEVNULL
    )
    return p.returncode, p.stdout + p.stderr


def fsdpcheck(*args, W=1):
    cmd = [fsdpcheck_bin(), *args]
    if W > 1:
        cmd = ["mpiexec", "-n", str(W), *cmd]
    return sh(cmd)


def torchrun_sh(W, *args):
    with tempfile.TemporaryDirectory(prefix="torchrun-log-") as log:
        return sh(torchrun(W, *args, log_dir=log))


def worker(W, *args):
    return torchrun_sh(W, "-m", "fsdpcheck_torch", "run", "--api", "fsdp2", *args)


def load_st(path):
    from safetensors.torch import load_file

    return load_file(path)


def assert_bitwise_full(full_dir, trace_dir, step):
    """A FULL checkpoint's tensors are the trace's parameters and optimizer
    state after `step`, bit for bit."""
    import torch

    m = load_st(os.path.join(full_dir, "model.safetensors"))
    o = load_st(os.path.join(full_dir, "optimizer.safetensors"))
    s = load_st(os.path.join(trace_dir, f"step-{step:06d}.safetensors"))
    assert len(m) == 28 and len(o) == 57
    bad = [k for k in m if not torch.equal(m[k], s[f"param.{k}"])]
    bad += [k for k in o if k != "step" and not torch.equal(o[k], s[f"optim.{k}"])]
    assert not bad, bad
    assert int(o["step"]) == step + 1


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp")
    rc, out = fsdpcheck("run", *REF, "--trace", str(d / "ref"), "--quiet", W=2)
    assert rc == 0, out
    return d


@pytest.fixture(scope="module")
def torch_saved(ref):
    """Real FSDP2 at W=4 trains 2 steps, saves DCP's files, reloads them into a
    fresh model and trains on (the adapter's round trip)."""
    rc, out = worker(
        4, "--like", str(ref / "ref"), "--trace", str(ref / "t4"), "--ckpt-at", "2", "--ckpt-state-dict", "sharded"
    )
    assert rc == 0, out[-3000:]
    return ref / "t4"


def test_torch_checkpoint_files_are_dcps(torch_saved):
    ck = torch_saved / "ckpt"
    names = sorted(os.listdir(ck))
    assert names == ["config.json", "fsdpcheck.json"] + [
        f"shard-0000{r}-model-00001-of-00001.safetensors" for r in range(1, 5)
    ], names
    rc, out = fsdpcheck("ckpt", "verify", str(ck))
    assert rc == 0 and "dcp state dict, step 2" in out, out


def test_torch_w4_checkpoint_loads_in_reference_w2(torch_saved, tmp_path):
    ck = torch_saved / "ckpt"
    rc, out = fsdpcheck("ckpt", "convert", str(ck), str(tmp_path / "full"), "--to", "full")
    assert rc == 0, out
    assert_bitwise_full(tmp_path / "full", torch_saved, 1)  # torch's state after step 1 is what it saved
    rc, out = fsdpcheck("run", *REF[:6], "--steps", "2", "--load", str(ck), "--trace", str(tmp_path / "r2"), W=2)
    assert rc == 0 and "loaded checkpoint" in out, out
    rc, out = fsdpcheck("compare", str(torch_saved), str(tmp_path / "r2"))
    assert rc == 0 and "PASS: 2 steps agree" in out, out


def test_reference_w2_checkpoint_loads_in_torch_w4(ref, tmp_path):
    import torch
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    ck = tmp_path / "ck"
    rc, out = fsdpcheck(
        "run", *REF, "--save", str(ck), "--save-at", "2", "--state-dict", "sharded", "--trace", str(tmp_path / "r"), W=2
    )
    assert rc == 0 and "dcp state dict" in out, out
    # torch's own reader, one process: every tensor is what the reference trained
    s = load_st(os.path.join(tmp_path / "r", "step-000001.safetensors"))
    sd = {k[6:]: torch.empty_like(v) for k, v in s.items() if k.startswith("param.")}
    names = list(sd)
    for n in names:
        for st in ("exp_avg", "exp_avg_sq"):
            sd[f"state.{n}.{st}"] = torch.empty_like(sd[n])
        sd[f"state.{n}.step"] = torch.tensor(0.0)
    load(sd, storage_reader=HuggingFaceStorageReader(str(ck)))
    bad = [n for n in names if not torch.equal(sd[n], s[f"param.{n}"])]
    bad += [
        n
        for n in names
        for st in ("exp_avg", "exp_avg_sq")
        if not torch.equal(sd[f"state.{n}.{st}"], s[f"optim.{st}.{n}"])
    ]
    bad += [n for n in names if float(sd[f"state.{n}.step"]) != 2.0]
    assert not bad, bad
    # real FSDP2 at W=4 resumes it (the reader reshards 2-way rows to 4-way)
    rc, out = worker(
        4, "--like", str(tmp_path / "r"), "--trace", str(tmp_path / "t"), "--load", str(ck), "--steps", "2"
    )
    assert rc == 0, out[-3000:]
    rc, out = fsdpcheck("compare", str(tmp_path / "r"), str(tmp_path / "t"))
    assert rc == 0 and "PASS: 2 steps agree" in out, out
    # the same load with the optimizer state dropped must fail: compare can see it
    rc, out = worker(
        4,
        "--like",
        str(tmp_path / "r"),
        "--trace",
        str(tmp_path / "t2"),
        "--load",
        str(ck),
        "--steps",
        "2",
        "--inject",
        "ckpt_drop_optim",
    )
    assert rc == 0, out[-3000:]
    rc, out = fsdpcheck("compare", str(tmp_path / "r"), str(tmp_path / "t2"))
    assert rc == 1 and "optim.exp_avg" in out, out


def test_distcp_import(torch_saved, ref, tmp_path):
    rc, out = torchrun_sh(
        4, os.path.join(HERE, "distcp_worker.py"), str(ref / "ref"), str(torch_saved / "ckpt"), str(tmp_path / "distcp")
    )
    assert rc == 0 and "saved step 2 as .distcp" in out, out[-3000:]
    assert any(n.endswith(".distcp") for n in os.listdir(tmp_path / "distcp"))
    rc, out = sh(
        [
            sys.executable,
            "-m",
            "fsdpcheck_torch",
            "ckpt",
            "import",
            str(tmp_path / "distcp"),
            str(tmp_path / "imp"),
            "--like",
            str(ref / "ref"),
        ]
    )
    assert rc == 0 and "step 2" in out, out
    rc, out = fsdpcheck("ckpt", "convert", str(tmp_path / "imp"), str(tmp_path / "full"), "--to", "full")
    assert rc == 0, out
    assert_bitwise_full(tmp_path / "full", torch_saved, 1)
    rc, out = fsdpcheck(
        "run", *REF[:6], "--steps", "2", "--load", str(tmp_path / "imp"), "--trace", str(tmp_path / "r"), W=2
    )
    assert rc == 0, out
    rc, out = fsdpcheck("compare", str(torch_saved), str(tmp_path / "r"))
    assert rc == 0, out


def test_hf_import(torch_saved, ref, tmp_path):
    """torch's Hugging Face files without fsdpcheck's manifest (as a user's own
    training script writes them) import bit for bit through HuggingFaceStorageReader."""
    import shutil

    src = tmp_path / "hf"
    src.mkdir()
    for n in os.listdir(torch_saved / "ckpt"):
        if n.endswith(".safetensors"):
            shutil.copy(torch_saved / "ckpt" / n, src / n)
    rc, out = sh([sys.executable, "-m", "fsdpcheck_torch", "ckpt", "import", str(src), str(tmp_path / "imp"),
                  "--like", str(ref / "ref")])  # fmt: skip
    assert rc == 0 and "step 2" in out, out
    rc, out = fsdpcheck("ckpt", "convert", str(tmp_path / "imp"), str(tmp_path / "full"), "--to", "full")
    assert rc == 0, out
    assert_bitwise_full(tmp_path / "full", torch_saved, 1)
    os.remove(src / "shard-00003-model-00001-of-00001.safetensors")  # rows of every tensor gone
    rc, out = sh([sys.executable, "-m", "fsdpcheck_torch", "ckpt", "import", str(src), str(tmp_path / "imp2"),
                  "--like", str(ref / "ref")])  # fmt: skip
    assert rc == 2 and "torch's DCP reader refuses it" in out, out


def test_import_refusals(ref, tmp_path):
    def imp(*a):
        return sh([sys.executable, "-m", "fsdpcheck_torch", "ckpt", "import", *a])

    rc, out = imp(str(tmp_path), str(tmp_path / "x"), "--like", str(ref / "ref"))
    assert rc == 2 and "neither .metadata nor *.safetensors" in out, out
    rc, out = imp(str(tmp_path), str(tmp_path / "x"))
    assert rc == 2 and "--like REF_TRACE is required" in out, out
    rc, out = imp(str(tmp_path), str(tmp_path / "x"), "--like", str(ref / "ref"), "--bogus")
    assert rc == 2 and "unknown flag --bogus" in out, out
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ".metadata").write_bytes(b"not a pickle")
    rc, out = imp(str(tmp_path / "bad"), str(tmp_path / "x"), "--like", str(ref / "ref"))
    assert rc == 2 and "torch's DCP reader refuses it" in out and len(out.strip().splitlines()) == 1, out


def test_sharded_round_trip_refusals(ref, tmp_path):
    def run(api, *flags):
        like = ["--like", str(ref / "ref"), "--trace", str(tmp_path / "t")]
        return sh([sys.executable, "-m", "fsdpcheck_torch", "run", "--api", api, *like, *flags])

    rc, out = run("fsdp1", "--ckpt-at", "1", "--ckpt-state-dict", "sharded")
    assert rc == 2 and "FSDP2's sharded checkpoint is DCP's" in out, out
    rc, out = run("fsdp2", "--load", str(tmp_path))
    assert rc == 2 and "no readable fsdpcheck checkpoint manifest" in out, out
    rc, out = run("fsdp2", "--ckpt-state-dict", "sharded")
    assert rc == 2 and "--ckpt-state-dict needs --ckpt-at K" in out, out


def test_manifest_and_pick_refusals(torch_saved, tmp_path):
    """dcp.py's checks without torchrun: a manifest whose files do not match,
    one of another kind, one of another model; the import's search for tensors."""
    import shutil

    import torch

    from fsdpcheck_torch import dcp
    from fsdpcheck_torch.config import UsageError
    from fsdpcheck_torch.tracefile import RefTrace

    cfg = RefTrace(str(torch_saved.parent / "ref")).meta["config"]
    ck = tmp_path / "ck"
    shutil.copytree(torch_saved / "ckpt", ck)
    assert dcp.kind_of(str(ck)) == "dcp" and dcp.kind_of(str(tmp_path)) is None
    assert dcp.read_manifest(str(ck), cfg) == 2
    other = json.loads(json.dumps(cfg))
    other["model"]["n_embd"] += 1
    with pytest.raises(UsageError, match="another model or optimizer"):
        dcp.read_manifest(str(ck), other)
    shard = ck / "shard-00002-model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(UsageError, match="corrupted"):
        dcp.read_manifest(str(ck), cfg)
    man = json.loads((ck / "fsdpcheck.json").read_text())
    (ck / "fsdpcheck.json").write_text(json.dumps(dict(man, state_dict="full")))
    with pytest.raises(UsageError, match='not a "dcp" fsdpcheck checkpoint'):
        dcp.read_manifest(str(ck), cfg)
    # a new save into the directory removes the old checkpoint's files, manifest first
    (ck / "fsdpcheck.json").write_text(json.dumps(man))
    (ck / "unrelated.txt").write_text("kept")
    dcp.prepare_dir(str(ck))
    assert sorted(os.listdir(ck)) == ["unrelated.txt"]
    # the import's search: under a prefix, twice, or keyed by index
    t = torch.zeros(2)
    assert dcp._pick({"model.a": t, "optim.state.a.momentum_buffer": t}, ["a"], ["momentum_buffer"])
    with pytest.raises(UsageError, match="found twice"):
        dcp._pick({"a": t, "model.a": t}, ["a"], [])
    with pytest.raises(UsageError, match="keyed by parameter name"):
        dcp._pick({"a": t, "optimizer.state.0.momentum_buffer": t}, ["a"], ["momentum_buffer"])
