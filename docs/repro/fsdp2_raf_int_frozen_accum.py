"""FSDP2: an integer reshard_after_forward, a frozen module and set_is_last_backward(False) crash the next forward.

fully_shard(module, reshard_after_forward=2) on 4 ranks keeps each parameter sharded over 2 ranks
after forward. A module whose parameters are all frozen gets no backward of its own; the root's
post-backward callback reshards it. When that backward was not the last (set_is_last_backward(False),
gradient accumulation's micro-batches before the last), the next forward's all-gather of the frozen
module copies out with the post-forward shards' split sizes and fails on every rank:

  RuntimeError: split_with_sizes expects split_sizes to sum exactly to 10 (input tensor's size at
  dimension 1), but got split_sizes=[16, 4]

It runs with reshard_after_forward=True, with no frozen module, at a world size of 2 (where 2 is the
whole group), and when every backward is the last. Run on the CPU with gloo, no GPU needed:

  torchrun --nproc-per-node 4 fsdp2_raf_int_frozen_accum.py
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)  # a frozen first layer: no backward runs through it
    for layer in model:
        fully_shard(layer, reshard_after_forward=2)
    fully_shard(model, reshard_after_forward=2)
    x = torch.randn(2, 4)
    for k in range(2):  # two micro-batches of one step, accumulated
        model.set_is_last_backward(k == 1)
        try:
            model(x[k : k + 1]).sum().backward()
        except RuntimeError as e:
            print(f"rank {rank}: micro-batch {k} FAILED: {e}", flush=True)
            os._exit(1)
        print(f"rank {rank}: micro-batch {k} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
