"""Frozen parameters (`--freeze REGEX`, docs/contract.md §2) under real FSDP1
(`use_orig_params=True`) and FSDP2, judged by `fsdpcheck compare`, which holds
every frozen tensor bitwise: its gradient and optimizer state zeros, its value
the initial one.

The torch side freezes as a user does: requires_grad=False on the matched
parameters (Hugging Face's names, before FSDP wraps the model), the optimizer
over the parameters that train, torch's own clipping over those with a
gradient. Patterns whose meaning differs between Python's re and the
reference's POSIX regcomp, and what the adapter cannot yet run with frozen
parameters (FSDP2's comm log, checkpoints, the Trainer, XLA), are refused with
one line. The checks are registered at collection and run with the rest
(conftest `checks`: one torchrun per world size).
"""

import json
import subprocess

import pytest
from conftest import (
    assert_verdict,
    expected_bug,
    first_divergence,
    fsdpcheck_bin,
    reference_trace,
    refused,
    refuses_trainer_and_ckpt_import,
    register,
)
from safetensors.torch import load_file

from fsdpcheck_torch.freeze import freeze_syntax

GPT2 = ["--model", "gpt2-tiny", "--steps", "2", "--strategy", "full_shard"]
LLAMA = ["--model", "llama-tiny", "--steps", "2", "--strategy", "full_shard"]
WTE = ["--freeze", "wte"]  # the tied embedding: the LM head freezes with it
MIXED = ["--freeze", "ln_1|c_fc.bias"]  # a part of every block, beside its trainable parameters
CLIP = ["--clip-grad-norm", "0.05"]  # clips every step: the norm leaves the frozen gradient out
PASS = "PASS: 2 steps agree within the policy"

# the parameters a pattern freezes, written out (a unit's: every parameter the trace lists for it)
EMBED = ["transformer.wte.weight"]
GPT2_MIXED = [f"transformer.h.{i}.{p}" for i in (0, 1) for p in ("ln_1.weight", "ln_1.bias", "mlp.c_fc.bias")]
LLAMA_MIXED = ["model.embed_tokens.weight", *(f"model.layers.{i}.input_layernorm.weight" for i in (0, 1))]

# name -> (api, W, flags, the parameters the pattern freezes, or "unit NAME")
CASES = {
    "freeze-fsdp1-W1-gpt2-wte": ("fsdp1", 1, [*GPT2, *WTE], EMBED),
    "freeze-fsdp2-W1-gpt2-wte": ("fsdp2", 1, [*GPT2, *WTE], EMBED),
    # FSDP1's comm log too: it reduces the frozen gradient with its FlatParameter, as the theory says
    "freeze-fsdp1-W2-gpt2-wte": ("fsdp1", 2, [*GPT2, *WTE, *CLIP, "--schedule"], EMBED),
    "freeze-fsdp2-W2-gpt2-wte": ("fsdp2", 2, [*GPT2, *WTE, *CLIP], EMBED),
    "freeze-fsdp2-W2-llama-embed": ("fsdp2", 2, [*LLAMA, "--freeze", "embed_tokens"], ["model.embed_tokens.weight"]),
    # the embedding beside llama-tiny's untied head (FSDP1's state dict has no state for it, and
    # the head's, of the same shape, is not its), and a norm inside every layer
    "freeze-fsdp1-W2-llama-mixed": ("fsdp1", 2, [*LLAMA, "--freeze", "embed_tokens|input_layernorm"], LLAMA_MIXED),
    "freeze-fsdp2-W2-gpt2-mixed": ("fsdp2", 2, [*GPT2, *MIXED, *CLIP], GPT2_MIXED),
}


def reference_freezes_a_whole_unit():
    """Whether this fsdpcheck runs a pattern that freezes every parameter of one
    unit (FSDP then reduces nothing for it) or refuses it (exit 2): the
    reference's to say, and it has said both."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        argv = [fsdpcheck_bin(), "run", *GPT2[:2], "--steps", "1", "--freeze", r"h\.1\.", "--trace", d, "--quiet"]
        p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    assert p.returncode in (0, 2), p
    return p.returncode == 0


WHOLE_UNIT = reference_freezes_a_whole_unit()
if WHOLE_UNIT:  # the last block frozen whole: a FlatParameter that needs no gradient, reduced by none
    CASES["freeze-fsdp1-W2-gpt2-unit"] = ("fsdp1", 2, [*GPT2, "--freeze", r"h\.1\."], "unit transformer.h.1")
for _name, (_api, _w, _flags, _) in CASES.items():
    register(_name, "--api", _api, "-n", str(_w), *_flags)
# the torch run decays the frozen embedding as AdamW decays the rest (an optimizer loop
# over every parameter): by 1 - lr wd = 1 - 1e-5 a step, far inside the tolerance of a
# trained tensor, and caught because a frozen one is judged bit for bit
register("freeze-fault-frozen_decay", "--api", "fsdp1", "-n", "2", *GPT2, *WTE, "--inject", "frozen_decay")


def verdict_lines(out):
    """compare's rows (step, kind, ..., of tol, result) and its verdict, as printed."""
    keep = ("PASS", "FAIL", "first divergence", "fsdpcheck schedule: ")
    return "\n".join(ln for ln in out.splitlines() if ln.lstrip()[:1].isdigit() or ln.startswith(keep))


@pytest.mark.parametrize("name", list(CASES))
def test_frozen_run_matches_reference(checks, name):
    rc, out, keep = checks[name]
    api, w, flags, frozen = CASES[name]
    print(f"{name}:\n{verdict_lines(out)}")
    if assert_verdict(rc, out, expected_bug(api, w, flags)):
        return  # this torch's FSDP2 on gloo: the verdict names its known bug
    assert PASS in out, out
    if "--schedule" in flags:
        assert f"fsdpcheck schedule: PASS (0 of {w} rank(s) with violations)" in out, out
    meta = json.loads((keep / "torch" / "trace.json").read_text())
    if isinstance(frozen, str):
        frozen = next(u["params"] for u in meta["units"] if u["name"] == frozen.split()[1])
    info = meta["torch"]
    assert meta["config"]["freeze"] == flags[flags.index("--freeze") + 1]
    # read back from the wrapped model and the optimizer: exactly these frozen, the rest stepped
    assert info["frozen"] == sorted(frozen), info["frozen"]
    n = sum(len(u["params"]) for u in meta["units"])
    assert info["optimizer_parameters"] == n - len(frozen), info
    # the frozen tensors themselves (compare judged them bitwise; here plainly)
    init = load_file(str(keep / "torch" / "init.safetensors"))
    for step in range(2):
        t = load_file(str(keep / "torch" / f"step-{step:06d}.safetensors"))
        for p in frozen:
            assert not t[f"grad.{p}"].any() and not t[f"optim.exp_avg.{p}"].any(), p
            assert t[f"param.{p}"].equal(init[p]), p
        assert "grad_norm" in t or "--clip-grad-norm" not in flags


def test_decayed_frozen_parameter_is_caught(checks):
    rc, out, keep = checks["freeze-fault-frozen_decay"]
    div = first_divergence(out)
    print(f"freeze-fault-frozen_decay:\n{verdict_lines(out)}")
    assert rc == 1 and div.startswith("first divergence: step 0, tensor param.transformer.wte.weight"), out
    assert json.loads((keep / "torch" / "trace.json").read_text())["config"]["inject"] == "frozen_decay"


# ----------------------------------------------------------------- refusals


CHECK = ["check", "--api", "fsdp1", "-n", "2", *GPT2]


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (r"h\.\d\.ln_1", r"\d means different things to Python's re and POSIX regcomp"),
        (r"\bwte", r"\b means different things"),
        (r"\<wte", r"\< means different things"),  # GNU regcomp's word start; Python's literal <
        ("(?:wte)", "(?...) is Python's extension syntax"),
        ("(?<=h)", "(?...) is Python's extension syntax"),
        ("h.*?ln_1", "*? (a quantifier right after another) is non-greedy"),
        ("h.+?ln_1", "+? (a quantifier right after another)"),
        ("ln_[12]{1}?", "{1}? (a quantifier right after another)"),
        (r"ln_[\d]", "a backslash inside [...]"),
        ("ln_[[:digit:]]", "[:...:] inside [...] is POSIX's class syntax"),
        ("wté", "printable ASCII only"),
    ],
)
def test_patterns_read_differently_are_refused(pattern, needle, capsys):
    assert freeze_syntax(pattern)
    line = refused([*CHECK, "--freeze", pattern], capsys, needle)
    assert "so that the reference and torch freeze the same parameters" in line


def test_patterns_both_read_alike_pass_the_syntax_check():
    for p in ("wte", "ln_1|c_fc.bias", r"h\.[0-9]+\.attn\.c_attn\.(weight|bias)$", "^transformer[.]wte", "ln_{1}"):
        assert freeze_syntax(p) is None, p


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--freeze", "wte", "--schedule"], ["--freeze with the comm log", "FSDP2 reduce-scatters only"]),
        (["--freeze", "wte", "--steps", "3", "--ckpt-at", "1"], ["--freeze with --ckpt-at", "no optimizer state"]),
        (["--inject", "frozen_decay"], ["--inject frozen_decay needs frozen parameters"]),
        (["--freeze", "wte", "--weight-decay", "0", "--inject", "frozen_decay"], ["needs a --weight-decay above 0"]),
        (["--freeze", ""], ["--freeze: give a regex"]),
        (["--freeze", "w" * 256], ["--freeze: regex longer than 255"]),
        (["--freeze", "wte("], ["is not a regular expression Python's re compiles"]),
    ],
)
def test_check_refuses_what_it_cannot_judge(extra, needles, capsys):
    refused(["check", "--api", "fsdp2", "-n", "2", *GPT2, *extra], capsys, *needles)


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        ("nosuch", "matches no parameter of model gpt2-tiny"),
        ("transformer", "freezes every parameter of model gpt2-tiny"),
    ],
)
def test_the_reference_refusals_reach_check_as_one_line(pattern, needle, capsys, monkeypatch):
    monkeypatch.setenv("FSDPCHECK", fsdpcheck_bin())
    refused([*CHECK, "--steps", "1", "--freeze", pattern], capsys, "the reference refused the config", needle)


def test_a_unit_frozen_whole(tmp_path, capsys, monkeypatch):
    """Where the reference refuses it, check says so in one line. Where it runs
    it, the numbers are judged (freeze-fsdp1-W2-gpt2-unit) but not FSDP1's comm
    log, which neither the recorder nor the theory places for such a unit yet."""
    monkeypatch.setenv("FSDPCHECK", fsdpcheck_bin())
    if not WHOLE_UNIT:
        line = refused([*CHECK, "--steps", "1", "--freeze", r"h\.1\."], capsys, "the reference refused the config")
        assert "freezes every parameter of unit 'transformer.h.1'" in line
        return
    ref = reference_trace(tmp_path / "ref", *GPT2, "--freeze", r"h\.1\.")
    out = tmp_path / "out"
    argv = ["run", "--api", "fsdp1", "--like", ref, "--trace", str(out), "--comm-log"]
    refused(argv, capsys, "freezes every parameter of unit 'transformer.h.1', which FSDP1 schedules in backward")
    assert not out.exists()


@pytest.fixture(scope="module")
def frozen_ref(tmp_path_factory):
    return reference_trace(tmp_path_factory.mktemp("freeze") / "ref", *GPT2, *WTE, "--weight-decay", "0")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        # the adapter's own check of a pattern the reference never saw, as the reference makes it
        (["--freeze", "nosuch"], ["--freeze 'nosuch' matches no parameter of the model"]),
        (["--freeze", "transformer"], ["--freeze 'transformer' freezes every parameter of the model"]),
        (["--freeze", "ln_1"], ["the reference trace froze other parameters ('wte', 1 of them)"]),
        (["--ckpt-at", "1"], ["--freeze with --ckpt-at"]),
        (["--device", "xla", "--api", "fsdp2"], ["--freeze with --device xla"]),
    ],
)
def test_run_refuses_what_it_cannot_honour(frozen_ref, extra, needles, tmp_path, capsys):
    out = tmp_path / "out"
    refused(["run", "--api", "fsdp1", "--like", frozen_ref, "--trace", str(out), *extra], capsys, *needles)
    assert not out.exists()


def test_run_refuses_to_load_a_checkpoint_with_frozen_parameters(frozen_ref, tmp_path, capsys):
    """fsdpcheck's checkpoints hold zero optimizer state for a frozen parameter,
    torch's none: a frozen run loads no checkpoint, and no run loads a frozen one."""
    ckpt = {}
    for name, freeze in (("frozen", WTE), ("trained", [])):
        ckpt[name] = tmp_path / name
        reference_trace(tmp_path / f"{name}-trace", *GPT2, *freeze, "--save", str(ckpt[name]), "--save-at", "1")
    plain = reference_trace(tmp_path / "plain", *GPT2)
    out = tmp_path / "out"
    run = ["run", "--api", "fsdp1", "--trace", str(out), "--steps", "1", "--load"]
    refused([*run, str(ckpt["frozen"]), "--like", plain], capsys, "the checkpoint froze parameters (--freeze 'wte')")
    refused(
        [*run, str(ckpt["trained"]), "--like", frozen_ref],
        capsys,
        "--freeze with --load: a frozen parameter has no optimizer state",
    )
    assert not out.exists()


def test_run_refuses_fsdp2s_comm_log(frozen_ref, tmp_path, capsys):
    from fsdpcheck_torch.commlog import refusal

    if refusal("fsdp2"):
        pytest.skip(refusal("fsdp2"))  # this torch's FSDP2 schedule is refused whatever the run
    out = tmp_path / "out"
    argv = ["run", "--api", "fsdp2", "--like", frozen_ref, "--trace", str(out), "--comm-log"]
    refused(argv, capsys, "--freeze with the comm log (--schedule, --comm-log) under FSDP2")
    assert not out.exists()


def test_run_accepts_another_pattern_for_the_same_parameters(frozen_ref, tmp_path):
    from fsdpcheck_torch.cli import parse_run

    _, cfg, ref = parse_run(
        ["--api", "fsdp2", "--like", frozen_ref, "--trace", str(tmp_path / "o"), "--freeze", "^transformer[.]wte"], 2
    )
    assert cfg["freeze"] == "^transformer[.]wte" and ref.config["freeze"] == "wte"


def test_run_refuses_a_reference_pattern_python_reads_otherwise(tmp_path, capsys):
    """A reference run straight from fsdpcheck with a POSIX-only pattern: the
    adapter cannot freeze what it froze, and says so."""
    ref = reference_trace(tmp_path / "ref", "--model", "gpt2-tiny", "--steps", "1", "--freeze", "ln_[[:digit:]]")
    out = tmp_path / "out"
    refused(["run", "--api", "fsdp1", "--like", ref, "--trace", str(out)], capsys, "the reference trace's --freeze")
    assert not out.exists()


def test_trainer_and_ckpt_import_refuse_a_frozen_run(frozen_ref, tmp_path, capsys):
    out = tmp_path / "out"
    refuses_trainer_and_ckpt_import(
        frozen_ref, out, tmp_path, capsys, "trainer: the reference froze parameters", "the run froze parameters"
    )
    assert not out.exists()


def test_compare_refuses_traces_that_froze_different_parameters(frozen_ref, tmp_path):
    """The C side's own refusal, which the adapter's --freeze check mirrors."""
    other = reference_trace(tmp_path / "other", *GPT2, "--freeze", "wpe", "--weight-decay", "0")
    p = subprocess.run(
        [fsdpcheck_bin(), "compare", frozen_ref, other],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert p.returncode == 2 and "froze different parameters" in p.stderr, p
