"""The Trainer path's data and trace (trainer.py imports it once torch and
transformers are wanted): the reference's batches laid out for Accelerate's
batch sharding, and the TrainerCallback that records each step.

The callback records the full gradients before the optimizer step (FSDP1
`summon_full_params(with_grads=True)`, FSDP2 `full_tensor()`) and clips them
(the Trainer runs with max_grad_norm=0), then after the step the parameters
and the optimizer state, and rank 0 writes the step file.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import TrainerCallback

from . import tracefile
from .model import clean_name
from .optimizer import clip_grad_norm


def replay_samples(ref, cfg, world, mb):
    """The trace's samples in the order Accelerate's interleaved batch sharding
    (process p takes batches p, p+W, p+2W, ... of the per-device batch size)
    hands rank r micro-batch k of step t the reference's samples
    [r B/W + k m, r B/W + (k+1) m), m = mb = B/(W K), the micro-batch size."""
    B, K, steps = cfg["global_batch"], cfg["grad_accum"], cfg["steps"]
    samples = []
    batches = [ref.batch(t) for t in range(steps)]
    for t in range(steps):
        inp, tgt = batches[t]
        for k in range(K):
            for r in range(world):
                lo = r * (B // world) + k * mb
                for i in range(lo, lo + mb):
                    samples.append((inp[i].long(), tgt[i].long()))
    return samples


class Replay(Dataset):
    """The samples as the causal-LM batch the Trainer feeds the model:
    `shift_labels` carries the targets so all T of them count."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        x, y = self.samples[i]
        return {"input_ids": x, "labels": y, "shift_labels": y}


def collate(items):
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def full_tensors(m, grads):
    """The wrapped model's full parameters (grads: their gradients, a missing one
    zeros) by trace name, and whether it is FSDP1's."""
    res = {}
    fsdp1 = hasattr(m, "_fsdp_wrapped_module") or type(m).__name__ == "FullyShardedDataParallel"
    if fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(m, writeback=False, with_grads=grads):
            for n, p in m.named_parameters():
                t = (p.grad if p.grad is not None else torch.zeros_like(p)) if grads else p
                res[clean_name(n)] = t.detach().float().cpu().clone()
    else:
        for n, p in m.named_parameters():
            t = (p.grad if p.grad is not None else torch.zeros_like(p)) if grads else p
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            res[clean_name(n)] = t.detach().float().cpu().clone()
    return res, fsdp1


class TraceCallback(TrainerCallback):
    """Records each optimizer step of the Trainer into the trace at out.
    model: the unwrapped model (its forward hook sees every micro-batch);
    init: the initial weights rank 0 writes when training begins."""

    def __init__(self, model, cfg, names, state_names, init, out, rank, world):
        self.model, self.cfg, self.init, self.out = model, cfg, init, out
        self.names, self.state_names, self.rank, self.world = names, state_names, rank, world
        self.losses, self.grads, self.inputs, self.grad_norm = [], None, [], None
        self.wrapped_as, self.trainer = "?", None

    def on_train_begin(self, args, state, control, **kw):
        def hook(module, a, kwargs, output):
            y = kwargs["shift_labels"]
            lg = output.logits.detach().float()
            self.losses.append(float(F.cross_entropy(lg.view(-1, lg.shape[-1]), y.view(-1))))
            self.inputs.append((kwargs["input_ids"].detach().cpu(), y.detach().cpu()))

        self.model.register_forward_hook(hook, with_kwargs=True)
        if self.rank == 0:
            tracefile.write_init(self.out, {n: self.init[n] for n in self.names})

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self.wrapped_as = type(self.trainer.model_wrapped).__name__
        self.grads, fsdp1 = full_tensors(model, True)
        self.grad_norm = clip_grad_norm(model, self.cfg, fsdp1) if self.cfg["clip_grad_norm"] > 0 else None

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        params, _ = full_tensors(model, False)
        opt = getattr(optimizer, "optimizer", optimizer)
        # cpu_offload=False on the CPU: see recording.Recorder.dcp_optim_state (FSDP1 aliasing)
        osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        step = state.global_step  # steps done before this one
        lt = torch.tensor([sum(self.losses) / len(self.losses)], dtype=torch.float64)
        dist.all_reduce(lt)
        xs = torch.cat([x for x, _ in self.inputs])
        ys = torch.cat([y for _, y in self.inputs])
        px = [torch.empty_like(xs) for _ in range(self.world)]
        py = [torch.empty_like(ys) for _ in range(self.world)]
        dist.all_gather(px, xs)
        dist.all_gather(py, ys)
        if self.rank == 0:
            st = osd["state"]
            states = {s: {n: st[n][s] for n in self.names} for s in self.state_names}
            # rank r's K micro-batches in order are its B/W samples in order
            loss = float(lt.item()) / self.world
            inp, tgt = torch.cat(px).to(torch.int32), torch.cat(py).to(torch.int32)
            tracefile.write_step(
                self.out, step, loss, inp, tgt, self.grads, params, states, self.names, self.state_names, self.grad_norm
            )
            print(f"step {step}: loss {loss:.6f}", flush=True)
        self.losses, self.inputs = [], []
