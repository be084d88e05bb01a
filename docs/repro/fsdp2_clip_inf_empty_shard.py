"""FSDP2: torch.nn.utils.clip_grad_norm_(..., norm_type=inf) raises on a rank whose shard is empty.

fully_shard splits a parameter's rows over the ranks with torch.chunk: a weight with fewer rows than
ranks leaves the last rank an empty local tensor. clip_grad_norm_ with norm_type=inf then fails on
that rank (the other ranks wait in the norm's all-reduce until the gloo timeout):

  RuntimeError: _foreach_norm cannot compute the infinity norm on an empty tensor because the
  operation does not have an identity

norm_type=2 works on the same model, and so does norm_type=inf when every rank holds rows.
Run on the CPU with gloo, no GPU needed:

  torchrun --nproc-per-node 3 fsdp2_clip_inf_empty_shard.py
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # 2 output rows over 3 ranks: torch.chunk gives rows [1, 1, 0]
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model)
    x = torch.randn(6, 4)
    model(x).sum().backward()
    for p in model.parameters():
        print(f"rank {rank}: {tuple(p.shape)} local {tuple(p.to_local().shape)}", flush=True)
    norm2 = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=2.0)
    print(f"rank {rank}: norm_type=2 total norm {norm2.full_tensor().item():.6f}", flush=True)
    try:
        norm_inf = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float("inf"))
        print(f"rank {rank}: norm_type=inf total norm {norm_inf.full_tensor().item():.6f}", flush=True)
    except RuntimeError as e:
        print(f"rank {rank}: norm_type=inf FAILED: {e}", flush=True)
        os._exit(1)  # the other ranks are left in the norm's collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
