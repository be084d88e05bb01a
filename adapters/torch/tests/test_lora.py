"""LoRA (`--lora R:ALPHA:REGEX`, docs/contract.md §2) through the real `peft` package,
under real FSDP1 (`use_orig_params=True`) and FSDP2, judged by `fsdpcheck
compare`: the adapters by the policy, every frozen base parameter bitwise.

The torch side applies LoRA as a user does: `peft.get_peft_model` on the
LlamaForCausalLM with a LoraConfig of the reference's r and alpha on the
module paths the reference adapted, the reference's initial values (adapters
included) loaded under PEFT's names, then FSDP around the PeftModel. PEFT
freezes the base; the adapter reads back what it froze, which layers it
adapted and the scaling they apply (trace.json's "torch"). A fault of PEFT's
scaling (alpha, not alpha / r) must be caught; what the adapter cannot judge
with LoRA, and every malformed spec, is refused with one line. The checks
are registered at collection and run with the rest (conftest `checks`: one
torchrun per world size).
"""

import json
import os
import shutil

import pytest
from conftest import (
    assert_verdict,
    env,
    expected_bug,
    first_divergence,
    fsdpcheck_bin,
    hf_loss_tool,
    reference_trace,
    refused,
    refuses_trainer_and_ckpt_import,
    register,
)
from safetensors.torch import load_file

from fsdpcheck_torch import check

R, ALPHA, TARGET = 4, 8, "q_proj|v_proj"
LORA = ["--lora", f"{R}:{ALPHA}:{TARGET}"]
LLAMA = ["--model", "llama-tiny", "--steps", "2", "--strategy", "full_shard"]
PASS = "PASS: 2 steps agree within the policy"

# llama-tiny has 2 layers: the modules TARGET adapts, and their adapters (PEFT's names, the trace's)
MODULES = [f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")]
ADAPTERS = [f"{m}.lora_{ab}.default.weight" for m in MODULES for ab in "AB"]

# the oldest pair's compatibility run (FSDPCHECK_TORCH_TESTS=quick) takes FSDP1 at W=2 and
# the fault, which share one torchrun
QUICK = os.environ.get("FSDPCHECK_TORCH_TESTS") == "quick"
CASES = {"lora-fsdp1-W2": ("fsdp1", 2)}
if not QUICK:
    CASES |= {"lora-fsdp2-W2": ("fsdp2", 2), "lora-fsdp2-W1": ("fsdp2", 1)}
for _name, (_api, _w) in CASES.items():
    register(_name, "--api", _api, "-n", str(_w), *LLAMA, *LORA)
register("lora-fault-lora_alpha", "--api", "fsdp1", "-n", "2", *LLAMA, *LORA, "--inject", "lora_alpha")


def verdict_lines(out):
    """compare's rows (step, kind, ..., of tol, result) and its verdict, as printed."""
    keep = ("PASS", "FAIL", "first divergence", "  model ")
    return "\n".join(ln for ln in out.splitlines() if ln.lstrip()[:1].isdigit() or ln.startswith(keep))


def meta_of(d):
    return json.loads((d / "trace.json").read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_lora_run_matches_reference(checks, name):
    rc, out, keep = checks[name]
    api, w = CASES[name]
    print(f"{name}:\n{verdict_lines(out)}")
    assert f"LoRA r {R} alpha {ALPHA} on '{TARGET}'" in out, out  # compare read both traces as LoRA models
    if assert_verdict(rc, out, expected_bug(api, w, LLAMA)):
        return  # this torch's FSDP2 on gloo: the verdict names its known bug
    assert PASS in out, out
    meta = meta_of(keep / "torch")
    assert meta["config"]["model"]["fsdpcheck_lora"] == {"r": R, "lora_alpha": ALPHA, "target": TARGET}
    info = meta["torch"]
    # read back from the wrapped model: the layers PEFT adapted, the scaling they apply, what it froze
    assert info["lora"]["modules"] == MODULES and info["lora"]["scaling"] == [ALPHA / R], info["lora"]
    names = [p for u in meta["units"] for p in u["params"]]
    frozen = [n for n in names if n not in ADAPTERS]
    assert info["frozen"] == sorted(frozen) and info["optimizer_parameters"] == len(ADAPTERS), info
    # each adapter right after its base weight, in the base weight's unit (the reference's registry)
    for m in MODULES:
        unit = next(u["params"] for u in meta["units"] if f"{m}.weight" in u["params"])
        i = unit.index(f"{m}.weight")
        assert unit[i + 1 : i + 3] == [f"{m}.lora_A.default.weight", f"{m}.lora_B.default.weight"], unit
    init = load_file(str(keep / "torch" / "init.safetensors"))
    steps = [load_file(str(keep / "torch" / f"step-{s:06d}.safetensors")) for s in range(2)]
    for t in steps:  # the base as it started: no gradient, no state, no decay
        for p in frozen:
            assert not t[f"grad.{p}"].any() and not t[f"optim.exp_avg.{p}"].any(), p
            assert t[f"param.{p}"].equal(init[p]), p
    # and the adapters trained: B (zeros at first) has a gradient from step 0, A once B is not 0
    for m in MODULES:
        assert not init[f"{m}.lora_B.default.weight"].any()
        assert steps[0][f"grad.{m}.lora_B.default.weight"].any() and steps[1][f"grad.{m}.lora_A.default.weight"].any()


def test_lora_alpha_fault_is_caught(checks):
    """PEFT's scaling set to alpha, not alpha / r: every adapter's gradient r
    times the reference's, from step 0's lora_B on."""
    rc, out, keep = checks["lora-fault-lora_alpha"]
    print(f"lora-fault-lora_alpha:\n{verdict_lines(out)}")
    div = first_divergence(out)
    assert rc == 1 and div.startswith("first divergence: step 0, tensor grad.model.layers.0.self_attn."), out
    assert ".lora_B.default.weight" in div, div
    meta = meta_of(keep / "torch")
    assert meta["config"]["inject"] == "lora_alpha" and meta["torch"]["lora"]["scaling"] == [float(ALPHA)]
    # the measured effect: the torch run's step-0 lora_B gradients are R times the
    # reference's own step 0 at W = 2 (the check plans: its ref holds no tensors)
    job = check.Job(["--api", "fsdp1", "-n", "2", *LLAMA, *LORA, "--keep", str(keep)])
    ref0 = check.reference_step0(job, fsdpcheck_bin(), "mpiexec", env())
    assert ref0 is not None
    ref = load_file(os.path.join(ref0, "step-000000.safetensors"))
    got = load_file(str(keep / "torch" / "step-000000.safetensors"))
    for m in MODULES:
        a, b = ref[f"grad.{m}.lora_B.default.weight"].double(), got[f"grad.{m}.lora_B.default.weight"].double()
        assert (b - R * a).abs().max() <= 1e-4 * (R * a).abs().max(), m


# ----------------------------------------------------------------- refusals

CHECK = ["check", "--api", "fsdp1", "-n", "2", *LLAMA]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("4:8", "--lora 4:8: expected R:ALPHA:REGEX (4:8:q_proj)"),
        ("4:8:", "expected R:ALPHA:REGEX"),
        ("x:8:q_proj", "expected R:ALPHA:REGEX"),
        ("4:eight:q_proj", "expected R:ALPHA:REGEX"),
        ("4.5:8:q_proj", "expected R:ALPHA:REGEX"),
        ("99999999999999999999:8:q_proj", "expected R:ALPHA:REGEX"),  # strtol's overflow
        ("0:8:q_proj", "--lora 0:8:q_proj: rank R 0 is outside 1..4096"),
        ("4097:8:q_proj", "rank R 4097 is outside 1..4096"),
        ("4:0:q_proj", "LoRA alpha 0 must be a finite number above 0"),
        ("4:-1:q_proj", "LoRA alpha -1 must be a finite number above 0"),
        ("4:inf:q_proj", "LoRA alpha inf must be a finite number above 0"),
        ("4:nan:q_proj", "LoRA alpha nan must be a finite number above 0"),
        ("4:0x1p99999:q_proj", "LoRA alpha inf must be a finite number above 0"),  # strtod's overflow
        ("4:8:" + "q" * 128, "--lora: the target regex is longer than 127 characters"),
        ("4:8:lm_head", "LoRA target 'lm_head' matches no decoder-layer linear"),
        ("4:8:q_proj(", "is not a regular expression Python's re compiles"),
        (r"4:8:\bq_proj", r"\b means different things to Python's re and POSIX regcomp"),
        ("4:8:(?:q|v)_proj", "(?...) is Python's extension syntax"),
    ],
)
def test_check_refuses_a_bad_spec(spec, needle, capsys):
    refused([*CHECK, "--lora", spec], capsys, needle)


def test_check_accepts_the_specs_the_reference_parses():
    """What C's strtol and strtod take (white space, a sign, hexadecimal
    floats), read as the reference reads it."""
    from fsdpcheck_torch.lora import LoraSpec, parse_flag

    assert parse_flag(" +2:0x1p3:mlp:x") == LoraSpec(2, 8.0, "mlp:x")
    assert parse_flag("4:2.5e0:[qv]_proj") == LoraSpec(4, 2.5, "[qv]_proj")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--model", "gpt2-tiny", *LORA], ["LoRA applies to llama's decoder-layer linears; model gpt2-tiny is gpt2"]),
        ([*LORA, "--freeze", "embed_tokens"], ["--freeze with --lora: LoRA freezes every base parameter itself"]),
        (["--freeze", "embed_tokens", *LORA], ["--freeze with --lora"]),
        ([*LORA, "--schedule"], ["--lora with the comm log (--schedule, --comm-log)"]),
        ([*LORA, "--steps", "3", "--ckpt-at", "1"], ["--lora with --ckpt-at", "no optimizer state"]),
        (["--inject", "lora_alpha"], ["--inject lora_alpha needs LoRA adapters: give --lora R:ALPHA:REGEX"]),
        (["--lora", "1:8:q_proj", "--inject", "lora_alpha"], ["(at r = 1, alpha and alpha / r agree)"]),
        ([*LORA, "--weight-decay", "0", "--inject", "frozen_decay"], ["needs a --weight-decay above 0"]),
    ],
)
def test_check_refuses_what_it_cannot_judge(extra, needles, capsys):
    refused([*CHECK, *extra], capsys, *needles)


@pytest.fixture(scope="module")
def lora_ref(tmp_path_factory):
    return reference_trace(tmp_path_factory.mktemp("lora") / "ref", *LLAMA, *LORA)


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (
            ["--lora", "4:8:q_proj"],
            ["--lora 4:8:q_proj: the reference trace's adapters are LoRA r 4 alpha 8 on 'q_proj|v_proj'"],
        ),
        (["--lora", "2:8:q_proj|v_proj"], ["the reference trace's adapters are"]),
        (["--freeze", "embed_tokens"], ["--freeze with --lora"]),
        (["--ckpt-at", "1"], ["--lora with --ckpt-at"]),
        (["--comm-log"], ["--lora with the comm log"]),
        (["--device", "xla", "--api", "fsdp2"], ["--lora with --device xla"]),
    ],
)
def test_run_refuses_what_it_cannot_honour(lora_ref, extra, needles, tmp_path, capsys):
    out = tmp_path / "out"
    refused(["run", "--api", "fsdp1", "--like", lora_ref, "--trace", str(out), *extra], capsys, *needles)
    assert not out.exists()


def test_run_accepts_the_trace_s_own_spec(lora_ref, tmp_path):
    from fsdpcheck_torch.cli import parse_run

    _, cfg, _ = parse_run(["--api", "fsdp2", "--like", lora_ref, "--trace", str(tmp_path / "o"), *LORA], 2)
    assert cfg["model"]["fsdpcheck_lora"] == {"r": R, "lora_alpha": ALPHA, "target": TARGET}


def edited(src, dst, edit):
    """A copy of trace src whose trace.json edit(meta) changed."""
    shutil.copytree(src, dst)
    meta = meta_of(dst)
    edit(meta)
    (dst / "trace.json").write_text(json.dumps(meta))
    return str(dst)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        # PEFT then adapts q_proj only: the trace's v_proj adapters are in no model it builds
        (
            lambda m: m["config"]["model"]["fsdpcheck_lora"].update(target="q_proj"),
            "parameter model.layers.0.self_attn.v_proj.lora_A.default.weight is not in the model",
        ),
        # a rank of 2: PEFT's lora_A is [2, 16], the trace's [4, 16]
        (lambda m: m["config"]["model"]["fsdpcheck_lora"].update(r=2), "has shape [4, 16], the model config.model"),
        (lambda m: m["config"]["model"]["fsdpcheck_lora"].update(r="4"), '"fsdpcheck_lora" must be {"r": 1..4096'),
        (lambda m: m["config"]["model"]["fsdpcheck_lora"].update(target=r"\dq"), r"\d means different things"),
    ],
)
def test_run_refuses_a_trace_whose_adapters_peft_does_not_build(lora_ref, edit, needle, tmp_path, capsys):
    from pathlib import Path

    like = edited(Path(lora_ref), tmp_path / "like", edit)
    out = tmp_path / "out"
    line = refused(["run", "--api", "fsdp1", "--like", like, "--trace", str(out)], capsys, needle)
    assert f"{like}/" in line, line  # names the file
    assert not out.exists()


def test_a_peft_scaling_other_than_the_reference_s_is_refused(lora_ref, monkeypatch):
    """Where PEFT scales otherwise (here rsLoRA's alpha / sqrt(r), as a PEFT
    default could change), the model is refused, not judged."""
    import peft

    from fsdpcheck_torch import model as M
    from fsdpcheck_torch.tracefile import RefTrace

    ref = RefTrace(lora_ref)
    config = peft.LoraConfig
    monkeypatch.setattr(peft, "LoraConfig", lambda **kw: config(**kw, use_rslora=True))
    with pytest.raises(ValueError, match=r"scales model.layers.0.self_attn.q_proj's adapter by 4.0, the reference by"):
        M.build_meta(ref.config["model"], ref.lora)
    with pytest.raises(ValueError, match=r'"fsdpcheck_lora" is built with its LoraSpec'):
        M.build_meta(ref.config["model"])  # the spec is parsed once (RefTrace.lora) and passed along


def test_trainer_ckpt_import_and_load_refuse_a_lora_run(lora_ref, tmp_path, capsys):
    out = tmp_path / "out"
    refuses_trainer_and_ckpt_import(
        lora_ref, out, tmp_path, capsys, "trainer: the reference trace is of a LoRA", "the run is of a LoRA model"
    )
    # the reference's own checkpoint of the LoRA model, loaded by a run --like a plain llama
    ckpt = tmp_path / "ckpt"
    reference_trace(tmp_path / "saving", *LLAMA, *LORA, "--save", str(ckpt), "--save-at", "1")
    plain = reference_trace(tmp_path / "plain", *LLAMA)
    run = ["run", "--api", "fsdp1", "--trace", str(out), "--steps", "1", "--load", str(ckpt), "--like", plain]
    refused(run, capsys, "the checkpoint is of a LoRA model")
    assert not out.exists()


def _transformers_major():
    import transformers

    return int(transformers.__version__.split(".")[0])


# transformers 4.56's from_pretrained takes a directory that holds adapter_config.json for a PEFT
# adapter and looks its base model (base_model_name_or_path) up on the Hub: measured on the oldest
# pair (LocalEntryNotFoundError offline); transformers 5 loads the base from the directory
@pytest.mark.skipif(_transformers_major() < 5, reason="transformers < 5 looks a PEFT directory's base up on the Hub")
def test_full_checkpoint_loads_in_peft_from_pretrained(tmp_path, capsys):
    """The reference's FULL checkpoint of a LoRA model after step 2 of 3 holds
    what PEFT writes beside FSDP's state dict: adapter_model.safetensors under
    PEFT's names and adapter_config.json. PeftModel.from_pretrained on
    LlamaForCausalLM.from_pretrained (tools/hf_loss.py) gives the loss the trace
    recorded for step 2, and the base alone does not (the adapters were read)."""
    import subprocess

    import peft
    import torch
    from safetensors import safe_open

    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace"
    subprocess.run(
        [fsdpcheck_bin(), "run", *LLAMA[:2], *LORA, "--strategy", "full_shard", "--steps", "3", "--save-at", "2"]
        + ["--save", str(ckpt), "--state-dict", "full", "--trace", str(trace), "--quiet"],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    conf = peft.LoraConfig.from_pretrained(str(ckpt))
    assert (conf.r, conf.lora_alpha, conf.lora_dropout, conf.bias) == (R, ALPHA, 0.0, "none")
    assert sorted(conf.target_modules) == [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qv"]
    with safe_open(str(ckpt / "adapter_model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        assert f.metadata() == {"format": "pt"}
        b = f.get_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
    assert keys == sorted(
        f"base_model.model.model.layers.{i}.self_attn.{p}_proj.lora_{ab}.weight"
        for i in (0, 1)
        for p in "qv"
        for ab in "AB"
    )
    assert b.abs().max() > 0  # two steps moved lora_B off its zeros: the adapters change the loss
    # rtol 1e-6: PEFT's loss was the trace's to the bit here (|rel| 0 with torch 2.15 on the CPU), while
    # the base without its adapters is 3.7e-5 away after two steps, under hf_loss's default 1e-4
    hf, rtol = hf_loss_tool(), ["--rtol", "1e-6"]
    rc = hf.main([str(ckpt), str(trace), *rtol])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and out.startswith(
        f"hf_loss: PASS PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained({ckpt})"
    ), out
    # the base without PEFT's file: another loss, so the PASS above read the adapters
    (ckpt / "adapter_config.json").rename(tmp_path / "adapter_config.json")
    assert hf.main([str(ckpt), str(trace), *rtol]) == 1
    verdicts = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hf_loss: ")]
    assert verdicts[-1].startswith("hf_loss: FAIL LlamaForCausalLM.from_pretrained("), (verdicts, torch.__version__)
