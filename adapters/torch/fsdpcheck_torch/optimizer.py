"""The optimizer as the reference runs it, and the clipping before its step:
torch.optim.AdamW or SGD over the parameters that train, FSDP1's or torch's
clip_grad_norm_, and --inject frozen_decay's decay of the frozen parameters.
Shared by the run (engine), the Trainer path and the XLA runner."""

import torch

from .model import clean_name

NORM = {"1": 1.0, "2": 2.0, "inf": float("inf")}


def build_optimizer(params, o):
    """The config's optimizer (o: its "optimizer" object) over params, as the reference runs it."""
    if o["kind"] == "adamw":
        # floats: a trace may say 0 for a beta, and torch refuses betas of mixed types
        betas = (float(o["beta1"]), float(o["beta2"]))
        return torch.optim.AdamW(params, lr=o["lr"], betas=betas, eps=o["eps"], weight_decay=o["weight_decay"])
    return torch.optim.SGD(
        params,
        lr=o["lr"],
        momentum=o["momentum"],
        dampening=o["dampening"],
        weight_decay=o["weight_decay"],
        nesterov=o["nesterov"],
    )


def trainable_optimizer(model, o):
    """build_optimizer over the parameters that train, as a user builds it (torch.optim
    refuses an empty list)."""
    return build_optimizer([p for p in model.parameters() if p.requires_grad], o)


def clip_grad_norm(model, c, fsdp1):
    """Clips as a training loop does (FSDP1's own clip_grad_norm_, else torch's
    over the parameters: DTensors under FSDP2) and returns the total norm it
    returned, as the trace records it: a Python float (a DTensor's full value)."""
    if fsdp1:
        total = model.clip_grad_norm_(c["clip_grad_norm"], norm_type=NORM[c["norm_type"]])
    else:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip_grad_norm"], norm_type=NORM[c["norm_type"]])
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return float(total.item())


def decay_frozen(model, frozen, o):
    """--inject frozen_decay: AdamW's decoupled weight decay, p *= 1 - lr wd,
    applied to the frozen parameters as well (an optimizer loop that decays
    every parameter it was given, frozen or not); on each rank's shard."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if clean_name(n) in frozen:
                p.mul_(1.0 - o["lr"] * o["weight_decay"])
