"""Checkpoints of one torch run: --ckpt-at K saves before step K and trains on
from a fresh model and optimizer loaded from it; --load DIR starts from one.

FULL (the reference's files, through torch.distributed.checkpoint's full
state dicts): rank 0 writes model.safetensors (model names) and
optimizer.safetensors (<state>.<name>, step); every rank reads the full files
and set_*_state_dict shards them. "dcp" (FSDP2's sharded one, --ckpt-state-dict
sharded, or a --load of one): DCP's Hugging Face safetensors with fsdpcheck's
manifest (dcp.py). A fresh model comes from Wrapping.build, its optimizer
from optimizer.trainable_optimizer.
"""

import os

import torch
import torch.distributed as dist

from . import dcp
from .errors import UsageError
from .optimizer import trainable_optimizer


class Checkpoints:
    def __init__(self, ctx, wrapping, recorder):
        self.ctx, self.wrapping, self.recorder = ctx, wrapping, recorder

    def fresh(self, weights):
        """A model built with weights ({name: tensor}) and its optimizer, unstepped."""
        model = self.wrapping.build(weights)
        return model, trainable_optimizer(model, self.ctx.cfg["optimizer"])

    def round_trip(self, model, optim, directory, step):
        """--ckpt-at: saves (FULL, or FSDP2's sharded one: DCP's, dcp.py) and
        returns a fresh model and optimizer loaded from it."""
        x = self.ctx
        if x.args.ckpt_state_dict != "sharded":
            self.save(model, optim, directory, step)
            del model, optim
            return self.load(directory)
        dcp.save(x, model, optim, directory, step)
        del model, optim
        model, optim = self.fresh(x.ref.init())  # every tensor is overwritten by the load
        dcp.load(x, model, optim, directory, x.fault)
        return model, optim

    def resume(self, directory):
        """--load: a model and optimizer from a fsdpcheck checkpoint (FULL, or
        "dcp" through torch's reader), and the step it resumes at."""
        x = self.ctx
        man = dcp.manifest_of(directory) or {}
        kind = man.get("state_dict")
        if kind == "dcp":
            model, optim = self.fresh(x.ref.init())
            return model, optim, dcp.load(x, model, optim, directory, x.fault)
        if kind != "full":
            raise UsageError(f"--load {directory}: a {kind!r} checkpoint (this adapter loads full and dcp ones)")
        model, optim = self.load(directory)
        return model, optim, man["step"]

    def save(self, model, optim, directory, step):
        """FULL_STATE_DICT checkpoint through torch.distributed.checkpoint's
        full state dicts: rank 0 writes model.safetensors (model names) and
        optimizer.safetensors (<state>.<name>, step)."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        x = self.ctx
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=opts)
        states, _osd = self.recorder.dcp_optim_state(model, optim)
        if x.rank == 0:
            os.makedirs(directory, exist_ok=True)
            save_file(
                {n: msd[n].float().contiguous() for n in x.names},
                os.path.join(directory, "model.safetensors"),
                metadata={"format": "pt"},
            )
            t = {f"{s}.{n}": states[s][n].contiguous() for s in x.state_names for n in x.names}
            t["step"] = torch.tensor(step, dtype=torch.int64)
            save_file(t, os.path.join(directory, "optimizer.safetensors"))
        dist.barrier()

    def load(self, directory):
        """A fresh model and optimizer, loaded from the FULL checkpoint (every rank
        reads the full files; set_*_state_dict shards them)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        x = self.ctx
        model, optim = self.fresh(load_file(os.path.join(directory, "model.safetensors")))
        if x.fault == "ckpt_drop_optim":
            return model, optim  # the bug: the optimizer state is never restored
        o = load_file(os.path.join(directory, "optimizer.safetensors"))
        step = float(o["step"].item())
        state = {n: dict({s: o[f"{s}.{n}"] for s in x.state_names}, step=torch.tensor(step)) for n in x.names}
        if x.cfg["optimizer"]["kind"] == "sgd":
            for n in x.names:
                state[n].pop("step")
        groups = [dict({k: v for k, v in g.items() if k != "params"}, params=list(x.names)) for g in optim.param_groups]
        set_optimizer_state_dict(
            model, optim, {"state": state, "param_groups": groups}, options=StateDictOptions(full_state_dict=True)
        )
        return model, optim
