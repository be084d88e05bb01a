"""fsdpcheck traces through the `safetensors` package (DESIGN §6).

Reading: a reference trace's trace.json, init.safetensors and the batches of
its step files. Writing: the same layout oracle/trace.c writes, so
`fsdpcheck compare` reads it unchanged: trace.json (format, version,
implementation, world size, first step, steps, config, units, plus a "torch"
object naming the API, torch version, device and backend), init.safetensors
(model names, F32) and step-NNNNNN.safetensors (loss, batch.input,
batch.target, grad.<name>, param.<name>, optim.<state>.<name>).
"""

import json
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import UsageError, read_trace_json

FORMAT = "fsdpcheck-trace"


class RefTrace:
    """A reference trace opened for replay."""

    def __init__(self, directory):
        self.dir = directory
        self.meta = read_trace_json(directory)
        self.config = self.meta["config"]
        self.units = self.meta["units"]
        # model parameter names in registry order (the units list them all)
        self.names = [n for u in self.units for n in u["params"]]
        self._check_init()

    def _check_init(self):
        path = os.path.join(self.dir, "init.safetensors")
        if not os.path.exists(path):
            raise UsageError(f"{path}: missing (an incomplete trace)")
        try:
            with safe_open(path, "pt") as f:
                keys = list(f.keys())
        except (OSError, SafetensorError) as e:  # safetensors raises its own error type
            raise UsageError(f"{path}: not a valid safetensors file ({e})")
        unit_names = {n for u in self.units for n in u["params"]}
        if set(keys) != unit_names:
            raise UsageError(f"{path}: its tensors are not the parameters trace.json lists")

    def init(self):
        path = os.path.join(self.dir, "init.safetensors")
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)

    def batch(self, step):
        path = os.path.join(self.dir, f"step-{step:06d}.safetensors")
        if not os.path.exists(path):
            raise UsageError(f"{path}: missing (an incomplete trace)")
        try:
            with safe_open(path, "pt") as f:
                return f.get_tensor("batch.input"), f.get_tensor("batch.target")
        except (OSError, SafetensorError) as e:
            raise UsageError(f"{path}: cannot read the batch ({e})")


def write_init(directory, tensors):
    os.makedirs(directory, exist_ok=True)
    for n in os.listdir(directory):
        if (n.startswith("step-") and n.endswith(".safetensors")) or n == "trace.json":
            os.unlink(os.path.join(directory, n))
    save_file(
        {k: v.detach().float().contiguous() for k, v in tensors.items()},
        os.path.join(directory, "init.safetensors"),
        metadata={"format": FORMAT, "content": "init"},
    )


def write_step(directory, step, loss, batch_input, batch_target, grads, params, states, names, state_names):
    t = {
        "loss": torch.tensor(loss, dtype=torch.float32),
        "batch.input": batch_input.contiguous(),
        "batch.target": batch_target.contiguous(),
    }
    for n in names:
        t[f"grad.{n}"] = grads[n].detach().float().contiguous()
        t[f"param.{n}"] = params[n].detach().float().contiguous()
        for s in state_names:
            t[f"optim.{s}.{n}"] = states[s][n].detach().float().contiguous()
    path = os.path.join(directory, f"step-{step:06d}.safetensors")
    tmp = path + ".tmp"
    save_file(t, tmp, metadata={"format": FORMAT, "step": str(step)})
    os.replace(tmp, path)


def write_trace_json(directory, implementation, world, steps, config, units, torch_info):
    j = {
        "format": FORMAT,
        "version": 1,
        "implementation": implementation,
        "world_size": world,
        "first_step": 0,
        "steps": steps,
        "config": config,
        "units": units,
        "torch": torch_info,
    }
    path = os.path.join(directory, "trace.json")
    with open(path + ".tmp", "w") as f:
        json.dump(j, f, indent=1)
    os.replace(path + ".tmp", path)
