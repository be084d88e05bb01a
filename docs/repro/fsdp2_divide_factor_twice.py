"""FSDP2: set_gradient_divide_factor(F) with force-sum reduction on a one-rank shard group divides by F twice.

A gradient divide factor F means the reduced gradient is the sum of the ranks' gradients divided by F
(instead of by the data-parallel size). On a one-rank shard group (W = 1 here; HSDP with a shard group
of one rank behaves the same) with set_force_sum_reduction_for_comms(True), the gradient comes out
divided by F twice. Run on the CPU with gloo, no GPU needed:

  torchrun --nproc-per-node 1 fsdp2_divide_factor_twice.py
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

F = 2.0


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    model = copy.deepcopy(plain)
    fully_shard(model)
    model.set_gradient_divide_factor(F)
    model.set_force_sum_reduction_for_comms(True)
    x = torch.randn(6, 4)
    plain(x).sum().backward()
    model(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        expected = q.grad / F  # one rank's gradient, divided by F once
        got = p.grad.full_tensor()
        ratio = (got * expected).sum() / (expected * expected).sum()
        print(f"{name}: gradient / expected = {ratio.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
