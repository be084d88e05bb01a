"""One torch FSDP run on a reference trace: the worker `torchrun` starts.

Each rank:
  1. builds the reference's model, loads the trace's initial weights (or a
     --load checkpoint's) and wraps it with FSDP1 or FSDP2 by the run config,
     a --freeze pattern or LoRA freezing what it names (wrap.py), and builds
     the optimizer over the rest (optimizer.py);
  2. reads back what the wrapped modules do (wrap.Wrapping.read_back);
  3. trains the trace's steps on its batches (loop.py), recording every
     step's gradients, parameters, optimizer state, loss and batch into the
     trace as it goes (recording.py), through a --ckpt-at checkpoint round
     trip where asked (checkpoints.py);
  4. rank 0 writes trace.json: the config as run, and a "torch" object naming
     the API, the versions, and what was read back.
Run composes those parts over one RunContext (runctx.py).
"""

import os

import torch
import torch.distributed as dist

from . import env
from .checkpoints import Checkpoints
from .loop import Loop
from .recording import Recorder
from .runctx import RunContext
from .tracefile import write_trace_json
from .wrap import Wrapping


class Run:
    def __init__(self, args, cfg, ref):
        self.ctx = RunContext(args, cfg, ref)
        self.wrapping = Wrapping(self.ctx)
        self.recorder = Recorder(self.ctx)
        self.checkpoints = Checkpoints(self.ctx, self.wrapping, self.recorder)

    def train(self):
        x = self.ctx
        first_step = 0  # the step a --load checkpoint resumes at
        if x.args.load:
            model, optim, first_step = self.checkpoints.resume(x.args.load)
            init = self.recorder.full_params(model)  # a resumed trace starts from the loaded weights
        else:
            init = x.ref.init()
            model, optim = self.checkpoints.fresh(init)
        applied = self.wrapping.read_back(model, optim)
        out = x.args.trace
        self.recorder.begin(out, init)
        # every rank read the whole initial model; FSDP holds its own shards now, and
        # no rank keeps a full copy beyond them (gpt2-124m: 500 MB a rank)
        del init
        rec = self.wrapping.commlog
        Loop(x, self.recorder, self.checkpoints, rec).run(model, optim, first_step, out)
        peak_rss = self.recorder.peak_rss_mib()
        if rec:
            self.recorder.write_commlog(rec, out)
        if x.rank == 0:
            self.finish(out, first_step, applied, peak_rss)
        if x.fault == "abort_at_exit":
            dist.barrier()  # trace.json is written
            if x.rank == x.W - 1:
                os.abort()

    def finish(self, out, first_step, applied, peak_rss):
        """trace.json (rank 0): the config as run, and what the run was found to do."""
        x = self.ctx
        c = dict(x.cfg)
        impl = f"torch-{x.api}"
        c["impl"] = impl
        c["divide"] = self.wrapping.divide_mode(applied["reduction"])
        c["inject"] = x.fault
        c["init"] = ""
        if c.get("fsdp_version") == 2 and c.get("backward_prefetch") == "pre":
            # FSDP2's layout has no BACKWARD_PRE option: fully_shard's implicit one-unit prefetch is the reference's
            # default under --fsdp-version 2, which refuses the FSDP1 flag
            c["backward_prefetch"] = "none"
        info = {
            "api": x.api,
            "torch_version": torch.__version__,
            "transformers_version": env.installed_version("transformers"),
            "device": x.args.device,
            "backend": x.args.backend,
            "world_size": x.W,
            "shard_group": x.F,
            # read back from the wrapped modules (applied_reduction), not the flags
            "reduction": applied["reduction"],
            "gradient_divide": c["divide"],
            "checkpoint_at": x.args.ckpt_at or None,
            "checkpoint_state_dict": x.args.ckpt_state_dict if x.args.ckpt_at else None,
            "loaded_from": os.path.abspath(x.args.load) if x.args.load else None,
            "activation_checkpointing": self.wrapping.checkpointing_evidence(applied["wrappers"]),
            "frozen": applied["frozen"],
            "lora": applied["lora"],
            "optimizer_parameters": applied["optimizer_parameters"],
            "like": os.path.abspath(x.ref.dir),
            "timing_s": dict(self.recorder.timing),
            "peak_rss_mib": [round(r, 1) for r in peak_rss],
        }
        write_trace_json(out, impl, x.W, x.cfg["steps"], c, x.ref.units, info, first_step)
