"""What FSDP1 (use_orig_params=True) and FSDP2 keep for a frozen parameter in a sharded unit.

The measurement behind P11's formulas for frozen parameters (README, "Frozen
parameters"). One unit, nn.Sequential(Linear(6, 5), Linear(5, 3)), whose first
weight is frozen (requires_grad=False) beside three trainable tensors, sharded
over the ranks of a gloo group on the CPU; AdamW over the trainable parameters,
as a user builds it. Each rank prints, for FSDP1 and for FSDP2, every
parameter's local shard and gradient, the flat gradient FSDP1 keeps and how
much of it is non-zero, and the optimizer state elements after one step.

    torchrun --nproc-per-node 2 tools/frozen_memory.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard


def model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    m[0].weight.requires_grad_(False)
    return m


def state_elements(opt):
    n = 0
    for state in opt.state.values():
        for t in state.values():
            if torch.is_tensor(t) and t.dim() > 0:
                n += (t.to_local() if hasattr(t, "to_local") else t).numel()
    return n


def show(tag, rank, text):
    print(f"{tag} rank {rank}: {text}", flush=True)


def main():
    dist.init_process_group("gloo")
    r = dist.get_rank()
    x = torch.randn(4, 6)

    m = FSDP(model(), use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    m(x).sum().backward()
    for name, p in m.named_parameters():
        g = "None" if p.grad is None else p.grad.numel()
        show("FSDP1", r, f"{name} requires_grad={p.requires_grad} local {p.numel()} grad {g}")
    flat = m._handle.flat_param
    nz = 0 if flat.grad is None else int((flat.grad != 0).sum())
    show("FSDP1", r, f"flat_param shard {flat.numel()}, its gradient {flat.grad.numel()}, non-zero {nz}")
    opt.step()
    show("FSDP1", r, f"optimizer state elements {state_elements(opt)}")

    m2 = model()
    fully_shard(m2)
    opt2 = torch.optim.AdamW([p for p in m2.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    m2(x).sum().backward()
    for name, p in m2.named_parameters():
        g = "None" if p.grad is None else tuple(p.grad.to_local().shape)
        show("FSDP2", r, f"{name} requires_grad={p.requires_grad} local {tuple(p.to_local().shape)} grad {g}")
    opt2.step()
    show("FSDP2", r, f"optimizer state elements {state_elements(opt2)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
