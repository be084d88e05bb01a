"""The model's own guards (fsdpcheck_torch/model.py) and the trace writer's
start (fsdpcheck_torch/tracefile.py): a model config or initial weights that
do not fit are refused by name, and a run writing into an old trace
directory leaves none of the old steps behind."""

import pytest
import torch
from safetensors.torch import load_file

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
