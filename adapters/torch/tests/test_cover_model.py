"""The model's own guards (fsdpcheck_torch/model.py) and the trace writer's
start (fsdpcheck_torch/tracefile.py): a model config or initial weights that
do not fit are refused by name, and a run writing into an old trace
directory leaves none of the old steps behind."""

import pytest
import torch
from conftest import reference_trace
from safetensors.torch import load_file
from torch import nn

from fsdpcheck_torch import model as M
from fsdpcheck_torch import tracefile

MLP = {"model_type": "fsdpcheck-mlp", "dims": [3, 2, 2]}


def init_of(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def test_an_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="unsupported model_type 'bert'"):
        M.build({"model_type": "bert"})


def test_initial_weights_must_name_every_parameter():
    m = M.build(MLP)
    init = init_of(m)
    names = list(init)
    M.load_init(m, {k: torch.full_like(v, 0.5) for k, v in init.items()}, names)
    assert all(bool((p == 0.5).all()) for p in m.parameters())
    with pytest.raises(ValueError, match=r"missing \['nosuch'\], extra \['" + names[-1].replace(".", r"\.")):
        M.load_init(m, init, [*names[:-1], "nosuch"])


def test_initial_weights_must_have_the_models_shapes():
    m = M.build(MLP)
    init = init_of(m)
    first = next(iter(init))
    init[first] = torch.zeros(7)
    with pytest.raises(ValueError, match=rf"{first}: shape \(7,\) in the trace, \({init_of(m)[first].shape[0]}, "):
        M.load_init(m, init, list(init))


def test_write_init_clears_an_old_trace(tmp_path):
    for n in ("step-000000.safetensors", "step-000007.safetensors", "trace.json", "notes.txt"):
        (tmp_path / n).write_text("old")
    tracefile.write_init(str(tmp_path), {"w": torch.ones(2, dtype=torch.float64)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.safetensors", "notes.txt"]
    t = load_file(str(tmp_path / "init.safetensors"))
    assert list(t) == ["w"] and t["w"].dtype == torch.float32 and t["w"].tolist() == [1.0, 1.0]


def tensors_of(m):
    """Every parameter and buffer (persistent or not) by name, a tie under both names."""
    return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers(remove_duplicate=False))}


def tied(m):
    """The parameter names that name one tensor (a tied LM head), grouped."""
    by = {}
    for n, p in m.named_parameters(remove_duplicate=False):
        by.setdefault(id(p), []).append(n)
    return sorted(ns for ns in by.values() if len(ns) > 1)


@pytest.mark.parametrize(
    "flags",
    [
        ["--model", "gpt2-tiny"],
        ["--model", "llama-micro"],
        ["--model", "llama-micro", "--lora", "4:8:q_proj|v_proj"],
        ["--model", "mlp-micro"],
    ],
    ids=["gpt2", "llama", "lora", "mlp"],
)
def test_build_loaded_is_build_then_load_init(tmp_path, flags):
    """The model the torch ranks train, built without the random draws load_init
    overwrites (none is made), is build()'s and load_init()'s: every parameter,
    every buffer (RoPE's inv_freq, the causal mask) bit for bit, the same ties."""
    ref = tracefile.RefTrace(reference_trace(tmp_path / "ref", *flags, "--steps", "1", "--strategy", "full_shard"))
    cfg = ref.config["model"]
    want = M.build(cfg, ref.lora)
    M.load_init(want, ref.init(), ref.names)
    rng = torch.get_rng_state()
    got = M.build_loaded(cfg, ref.init(), ref.names, ref.lora)
    assert torch.equal(rng, torch.get_rng_state()), "build_loaded drew random numbers"
    a, b = tensors_of(want), tensors_of(got)
    assert list(a) == list(b)
    for n in a:
        assert a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]), n
    assert tied(want) == tied(got)


class DrawnBuffer(nn.Module):
    """A module whose buffer is a random draw: what build_loaded cannot skip."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))
        nn.init.normal_(self.w)
        self.register_buffer("noise", torch.empty(64).normal_())


def test_build_loaded_draws_a_random_buffer(monkeypatch):
    """A random fill that lands on a buffer (no load overwrites it) is made:
    the model is built again with every draw, as build() draws them."""
    monkeypatch.setattr(M, "build", lambda cfg, lora: DrawnBuffer())
    torch.manual_seed(7)
    want = DrawnBuffer()
    torch.manual_seed(7)
    got = M.build_loaded({}, {"w": torch.ones(3)}, ["w"])
    assert torch.equal(got.noise, want.noise)
    assert got.w.tolist() == [1.0, 1.0, 1.0]
