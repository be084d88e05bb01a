"""What every part of one torch run reads (wrap, recording, checkpoints, loop):
the parsed arguments, the run config, the reference trace, this rank's place
in the world and the mesh's shape, the optimizer's state names and the
parameters the run freezes. Built once per run (engine.Run) after the process
group is up; nothing in it changes while the run trains."""

import torch
import torch.distributed as dist

from . import env
from .config import frozen_of, optim_state_names
from .errors import UsageError


class RunContext:
    def __init__(self, args, cfg, ref):
        self.args, self.cfg, self.ref = args, cfg, ref
        self.api = args.api
        self.rank = dist.get_rank()
        self.W = dist.get_world_size()
        self.names = ref.names
        self.state_names = optim_state_names(cfg)
        self.device = device_of(args.device)
        self.mcfg = cfg["model"]
        s = cfg["strategy"]
        self.F = (cfg["shard_group"] or self.W) if s.startswith("hybrid") else self.W
        self.R = self.W // self.F
        self.fault = args.inject
        # LoRA: the spec the reference trace was read with (tracefile.RefTrace.lora)
        self.lora = ref.lora
        # --freeze: the trace's names (Hugging Face's, the reference's registry) the pattern matches;
        # LoRA: every name but the adapters'
        self.frozen = set(frozen_of(cfg, ref.names, ref.lora))


def device_of(name):
    """The torch device of --device name, this rank's accelerator where there are several."""
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":  # pragma: no cover (cuda)
        return torch.device("cuda", env.local_rank())
    if name == "hpu":  # pragma: no cover (hpu)
        return torch.device("hpu")
    raise UsageError(f"--device {name}: not handled here")
