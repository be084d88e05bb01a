"""One rank of test_dcp.py's import test (torchrun, gloo on the CPU): builds the
reference trace's model as FSDP2 (fully_shard on every unit, then the root),
loads a fsdpcheck "dcp" checkpoint into it through the adapter's loader
(HuggingFaceStorageReader), and saves it again as users save with
torch.distributed.checkpoint's default storage: .distcp files and .metadata,
{"model": get_model_state_dict, "optim": get_optimizer_state_dict}.

    torchrun --nproc-per-node W distcp_worker.py REF_TRACE DCP_DIR OUT_DIR
"""

import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from fsdpcheck_torch import dcp as fdcp
from fsdpcheck_torch import model as M
from fsdpcheck_torch.config import optim_state_names
from fsdpcheck_torch.optimizer import build_optimizer
from fsdpcheck_torch.tracefile import RefTrace


class Shim:
    """What fsdpcheck_torch.dcp.load reads of a run."""

    def __init__(self, ref):
        self.cfg, self.names = ref.meta["config"], ref.names
        self.state_names = optim_state_names(self.cfg)


def main():
    ref_dir, src, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    ref = RefTrace(ref_dir)
    run = Shim(ref)
    model = M.build(run.cfg["model"])
    M.load_init(model, ref.init(), ref.names)
    for unit in M.unit_modules(model, run.cfg["model"]):
        fully_shard(unit)
    fully_shard(model)
    optim = build_optimizer(model.parameters(), run.cfg["optimizer"])
    step = fdcp.load(run, model, optim, src)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    dcp.save(state, checkpoint_id=out)
    if dist.get_rank() == 0:
        print(f"saved step {step} as .distcp into {out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
