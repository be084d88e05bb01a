"""transformers.LlamaForCausalLM (eager attention, fp32, CPU/gloo) under real
FSDP1 and FSDP2, judged by `fsdpcheck compare` against the reference's llama.

llama-tiny has an untied LM head and head_dim 6 != hidden / heads (16 / 4),
grouped-query attention (4 heads, 2 kv heads); llama-micro ties its head to
embed_tokens and has one kv head. Both run at the default --seq-len 16, beyond
llama-micro's max_position_embeddings 8: RoPE has no position table, and
neither side bounds T by it. The checks are registered at collection and run
with the rest (conftest `checks`: one torchrun per world size).
"""

import json
import subprocess

import pytest
from conftest import (
    assert_verdict,
    expected_bug,
    first_divergence,
    fsdpcheck_bin,
    hf_loss_tool,
    reference_trace,
    register,
)

from fsdpcheck_torch.dcp import missing

TINY = ["--model", "llama-tiny", "--steps", "2", "--strategy", "full_shard"]
MICRO = ["--model", "llama-micro", "--steps", "2", "--strategy", "full_shard"]
PASS = "PASS: 2 steps agree within the policy"

# (api, W, flags): both models under both APIs at W = 2, FSDP2 at W = 4, both APIs at
# W = 1 (where torch 2.7/2.8's FSDP2 on gloo has no pytorch#162338 to hide the numbers)
CASES = {
    "llama-fsdp1-W1-micro": ("fsdp1", 1, MICRO),
    "llama-fsdp2-W1-tiny": ("fsdp2", 1, TINY),
    # the comm log too (the recorder's stages: embed_tokens, the layers, model.norm), and the recorded norm
    "llama-fsdp1-W2-tiny": ("fsdp1", 2, [*TINY, "--clip-grad-norm", "1.0", "--schedule"]),
    # the recompute inside each unit: every layer's self_attn runs twice
    "llama-fsdp1-W2-micro": ("fsdp1", 2, [*MICRO, "--activation-checkpointing", "inside"]),
    "llama-fsdp2-W2-tiny": ("fsdp2", 2, TINY),
    "llama-fsdp2-W2-micro": ("fsdp2", 2, MICRO),
    "llama-fsdp2-W4-tiny": ("fsdp2", 4, TINY),
}
for _name, (_api, _w, _flags) in CASES.items():
    register(_name, "--api", _api, "-n", str(_w), *_flags)
# checkpoint round trips before step 1 of 3 (a fresh model and optimizer loaded from it):
# FULL on the tied model; FSDP2's sharded one (DCP's Hugging Face safetensors) on the
# untied one, registered only where torch has it (a refused job would refuse its whole torchrun)
THREE = ["--steps", "3", "--ckpt-at", "1"]  # a later --steps wins
CKPT = {"llama-fsdp2-W1-micro-ckpt-full": [*MICRO, *THREE]}
DCP_MISSING = missing()
if DCP_MISSING is None:
    CKPT["llama-fsdp2-W1-tiny-ckpt-sharded"] = [*TINY, *THREE, "--ckpt-state-dict", "sharded"]
for _name, _flags in CKPT.items():
    register(_name, "--api", "fsdp2", "-n", "1", *_flags)
# FSDP1 with its divide factors set to 1: gradients summed over the ranks, not averaged
register("llama-fault-no_divide", "--api", "fsdp1", "-n", "2", *TINY, "--inject", "no_divide")


@pytest.mark.parametrize("name", list(CASES))
def test_llama_matches_reference(checks, name):
    rc, out, _ = checks[name]
    api, w, flags = CASES[name]
    print(out)
    if assert_verdict(rc, out, expected_bug(api, w, flags)):
        return  # this torch's FSDP2 on gloo: the verdict names its known bug
    assert PASS in out, out
    assert "model llama-" in out and ("untied head" if "llama-tiny" in flags else "tied head") in out, out
    if "--schedule" in flags:
        assert f"fsdpcheck schedule: PASS (0 of {w} rank(s) with violations)" in out, out


@pytest.mark.parametrize("name", ["llama-fsdp2-W1-micro-ckpt-full", "llama-fsdp2-W1-tiny-ckpt-sharded"])
def test_llama_checkpoint_round_trip(checks, name):
    if name not in CKPT:
        pytest.skip(f"--ckpt-state-dict sharded: {DCP_MISSING}")
    rc, out, keep = checks[name]
    print(out)
    assert rc == 0 and "PASS: 3 steps agree within the policy" in out, out
    info = json.loads((keep / "torch" / "trace.json").read_text())["torch"]
    assert info["checkpoint_at"] == 1 and info["checkpoint_state_dict"] == ("sharded" if "sharded" in name else "full")


def test_llama_recompute_ran(checks):
    rc, out, keep = checks["llama-fsdp1-W2-micro"]
    assert rc == 0, out
    info = json.loads((keep / "torch" / "trace.json").read_text())["torch"]["activation_checkpointing"]
    # 2 steps x 1 micro-batch x 1 layer, each forward run twice
    assert info == {"placement": "inside", "wrappers": 1, "block_forwards": 4}, info


def test_llama_summed_gradients_are_caught(checks):
    rc, out, _ = checks["llama-fault-no_divide"]
    div = first_divergence(out)
    print(div)
    assert rc == 1 and div.startswith("first divergence: step 0, tensor grad."), out


@pytest.mark.parametrize(("model", "tied"), [("llama-tiny", False), ("llama-micro", True)])
def test_full_checkpoint_loads_in_from_pretrained(tmp_path, capsys, model, tied):
    """The reference's FULL checkpoint after step 2 of 3, read by
    LlamaForCausalLM.from_pretrained (tools/hf_loss.py), gives the loss the
    trace recorded for step 2 (run on exactly those parameters)."""
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace"
    subprocess.run(
        [fsdpcheck_bin(), "run", "--model", model, "--strategy", "full_shard", "--steps", "3", "--save-at", "2"]
        + ["--save", str(ckpt), "--state-dict", "full", "--trace", str(trace), "--quiet"],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    assert json.loads((ckpt / "config.json").read_text())["tie_word_embeddings"] is tied
    rc = hf_loss_tool().main([str(ckpt), str(trace)])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and out.startswith(f"hf_loss: PASS LlamaForCausalLM.from_pretrained({ckpt}) step 2: "), out


@pytest.fixture(scope="module")
def micro_ref(tmp_path_factory):
    return reference_trace(tmp_path_factory.mktemp("llama") / "ref", *MICRO)


def test_llama_model_is_built_as_the_trace_says(micro_ref):
    """The tie, eager attention, RoPE's theta, and a config the reference's
    llama is not (rope_scaling) refused by name."""
    import torch
    import transformers

    from fsdpcheck_torch import model as M
    from fsdpcheck_torch.tracefile import RefTrace

    ref = RefTrace(micro_ref)
    m = ref.config["model"]
    model = M.build(m)
    M.load_init(model, ref.init(), ref.names)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config._attn_implementation == "eager" and model.config.head_dim == m["head_dim"]
    inv = model.model.rotary_emb.inv_freq
    want = 1.0 / m["rope_theta"] ** (torch.arange(0, m["head_dim"], 2, dtype=torch.float32) / m["head_dim"])
    assert torch.equal(inv, want), (inv, want)
    assert [type(u).__name__ for u in M.unit_modules(model, m)] == ["LlamaDecoderLayer"] * m["num_hidden_layers"]
    # the fsdp_config's wrap class names each Hugging Face model's unit (model.HF)
    from fsdpcheck_torch.fsdp_config import WRAP_CLASSES

    assert all(WRAP_CLASSES[k] == h.block for k, h in M.HF.items())
    with pytest.raises(ValueError, match="llama rope_scaling"):
        M.build(dict(m, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    # hidden 10 over 4 heads of head_dim 4: the reference and transformers 4.x build it,
    # transformers 5's config validation refuses it (bad input, by its own words)
    odd = dict(m, hidden_size=10, num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    if int(transformers.__version__.split(".")[0]) >= 5:
        with pytest.raises(ValueError, match=r"refuses this llama config: .*not a multiple of the number of"):
            M.build_meta(odd)
    else:
        assert M.build_meta(odd).model.layers[0].self_attn.q_proj.weight.shape == (16, 10)
    untied = M.build(dict(m, tie_word_embeddings=False))
    with pytest.raises(AssertionError, match="the LM head is tied"):  # a model whose head is not what it says
        untied.lm_head.weight = untied.model.embed_tokens.weight
        M.load_init(untied, {**ref.init()}, ref.names)


def test_llama_refusals_name_the_models(micro_ref, tmp_path, capsys):
    """The comm-log recorder's refusal names the models it records (the XLA runner runs llama:
    tests/test_xla.py)."""
    from fsdpcheck_torch.cli import main

    out = tmp_path / "out"
    mlp = reference_trace(tmp_path / "mlp", "--model", "mlp-micro", "--strategy", "full_shard", "--steps", "1")
    rc = main(["run", "--api", "fsdp1", "--like", mlp, "--trace", str(out), "--comm-log"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "--comm-log: recorded for gpt2 and llama models" in err[-1], err
    assert not out.exists()
