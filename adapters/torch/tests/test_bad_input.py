"""Every bad input gets one line and exit 2, never a traceback, never exit 1.

Runs the adapter's bad-input corpus (tests/bad_input/torch/CASES) and every
model config, fsdp_config and trace case of the C corpus (tests/bad_input/CASES)
through the adapter command that reads it, in this process (the commands'
own entry point, cli.main; a subprocess each would cost a torch import per
case). Each case must:
  - return 2;
  - print exactly one line on stderr, "fsdpcheck-torch: ...", naming the
    input and stating the problem (the case's two words), and nothing on stdout;
  - leave its scratch directory (where --trace points) empty: nothing half-written.
"""

import json
import os
import shlex
import shutil

import pytest
from conftest import ROOT, fsdpcheck_bin
from conftest import refused as one_line_refusal

from fsdpcheck_torch.cli import main

CORPUS = os.path.join(ROOT, "tests", "bad_input")
TORCH = os.path.join(CORPUS, "torch")

# C corpus step-file cases in tensors a replay never reads (a --like run takes
# only a step's batch): the torch run would train correctly on such a trace,
# and `fsdpcheck compare` refuses it when it judges (the C corpus's own test).
NOT_READ_BY_REPLAY = {"missing_grad", "missing_loss", "grad_wrong_shape", "loss_int"}


def read_cases(path):
    with open(path) as f:
        return [ln.rstrip("\n").split("\t") for ln in f if ln.strip() and not ln.startswith("#")]


def adapter_cases():
    for argv, names, expect in read_cases(os.path.join(TORCH, "CASES")):
        yield pytest.param(argv, names, expect, id=argv[:90])


def c_cases():
    for kind, path, names, expect in read_cases(os.path.join(CORPUS, "CASES")):
        full = os.path.join(CORPUS, path)
        if kind == "model":
            argv = f"check --api fsdp1 -n 1 --steps 1 --model {full}"
        elif kind == "fsdp":
            argv = f"check --api fsdp1 -n 1 --steps 1 --fsdp-config {full}"  # mlp-tiny, as run.sh
        elif kind == "trace":
            if os.path.basename(os.path.dirname(path)) in NOT_READ_BY_REPLAY:
                continue
            argv = f"run --api fsdp1 --like {{OVER:{os.path.dirname(full)}}} --trace {{OUT}}/t"
        else:
            continue  # init, checkpoints: files only the C commands read (the adapter never takes them)
        yield pytest.param(argv, names, expect, id=f"C:{path}")


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory):
    import subprocess

    t = tmp_path_factory.mktemp("good") / "T"
    subprocess.run(
        [fsdpcheck_bin(), "run", "--model", "mlp-micro", "--steps", "2", "--trace", str(t), "--quiet"],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return str(t)


def laid_over(good, case_dir, dest):
    """good with case_dir's files laid over it (NAME.remove deletes NAME)."""
    shutil.copytree(good, dest)
    for n in os.listdir(case_dir):
        if n.endswith(".remove"):
            os.unlink(os.path.join(dest, n[: -len(".remove")]))
        else:
            shutil.copy(os.path.join(case_dir, n), os.path.join(dest, n))
    return dest


def expand(argv, good, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    words = []
    for w in shlex.split(argv):
        w = w.replace("{T}", good).replace("{OUT}", str(out)).replace("{C}", CORPUS)
        if w.startswith("{LIKE:"):
            w = laid_over(good, os.path.join(TORCH, "like", w[6:-1]), str(tmp_path / w[6:-1]))
        elif w.startswith("{OVER:"):
            w = laid_over(good, w[6:-1], str(tmp_path / os.path.basename(w[6:-1])))
        words.append(w)
    return words, out


def refused(argv, names, expect, good, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FSDPCHECK", fsdpcheck_bin())
    words, out = expand(argv, good, tmp_path)
    rc = main(words)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2, f"exit {rc}\nstdout: {cap.out}\nstderr: {cap.err}"
    assert cap.out == "", cap.out
    assert len(err) == 1 and err[0].startswith("fsdpcheck-torch: "), cap.err
    assert names in err[0] and expect in err[0], err[0]
    assert os.listdir(out) == [], os.listdir(out)


@pytest.mark.parametrize(("argv", "names", "expect"), list(adapter_cases()))
def test_adapter_corpus(argv, names, expect, good_trace, tmp_path, capsys, monkeypatch):
    refused(argv, names, expect, good_trace, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize(("argv", "names", "expect"), list(c_cases()))
def test_c_corpus_through_the_adapter(argv, names, expect, good_trace, tmp_path, capsys, monkeypatch):
    refused(argv, names, expect, good_trace, tmp_path, capsys, monkeypatch)


def test_corpus_size():
    """The corpus the closing note counts: if a case file goes missing, this says so."""
    n = len(list(adapter_cases())) + len(list(c_cases()))
    print(f"bad-input cases through the adapter: {n}")
    assert n >= 100


def test_a_misspelt_gather_mode_is_refused(monkeypatch, capsys, tmp_path):
    """FSDPCHECK_GATHER chooses how FSDP2's sets reach the trace; a value that
    is none of its modes is refused before anything runs (no reference trace),
    not taken for one."""
    monkeypatch.setenv("FSDPCHECK_GATHER", "shared")
    argv = ["check", "--api", "fsdp2", "-n", "2", "--model", "gpt2-tiny", "--keep", str(tmp_path / "keep")]
    one_line_refusal(argv, capsys, "FSDPCHECK_GATHER='shared'", "auto, shm, collective")
    assert not (tmp_path / "keep" / "ref").exists()


def test_a_model_file_s_lora_without_r_is_refused_under_inject(tmp_path, capsys):
    """--inject lora_alpha reads the model file's r; a "fsdpcheck_lora" without
    one is the reference's to refuse (one line naming the file), not a KeyError."""
    cfg = {
        "model_type": "llama", "vocab_size": 64, "max_position_embeddings": 32, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000, "initializer_range": 0.02,
        "tie_word_embeddings": False, "hidden_act": "silu", "fsdpcheck_lora": {"lora_alpha": 16, "target": "q_proj"},
    }  # fmt: skip
    path = tmp_path / "lora_no_r.json"
    path.write_text(json.dumps(cfg))
    argv = ["check", "--api", "fsdp1", "-n", "1", "--model", str(path), "--steps", "1", "--inject", "lora_alpha"]
    one_line_refusal(argv, capsys, "lora_no_r.json", '"fsdpcheck_lora" must be')
