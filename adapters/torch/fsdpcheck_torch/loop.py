"""The training loop of one torch run: per step, the trace's global batch, rank
r taking samples [r B/W, (r+1) B/W) in K micro-batches of B/(W K), each loss
scaled by 1/K, communicating only on the last with no_sync (FSDP1 `no_sync()`,
FSDP2 `set_requires_gradient_sync(False)`); then the gradients recorded, the
clip, the optimizer's step, and the rest of the step's trace (recording.py).
The faults that act inside a step (data_overlap, hang, segv, frozen_decay)
are put in here."""

import contextlib
import os
import time

from . import model as M
from .optimizer import clip_grad_norm, decay_frozen


class Loop:
    def __init__(self, ctx, recorder, checkpoints, commlog):
        self.ctx, self.recorder, self.checkpoints = ctx, recorder, checkpoints
        self.rec = commlog  # --comm-log: the step's schedule (commlog.py), or None
        self.token_ids = M.takes_token_ids(ctx.mcfg)  # gpt2, llama: the input is token ids (long)

    def phase(self, p):
        if self.rec:
            self.rec.set_phase(p)

    def run(self, model, optim, first_step, out):
        """Trains cfg's steps from first_step, writing each into out (a --ckpt-at
        round trip replaces the model and optimizer from its step on)."""
        x = self.ctx
        for step in range(first_step, first_step + x.cfg["steps"]):
            if x.args.ckpt_at and step == x.args.ckpt_at:
                model, optim = self.checkpoints.round_trip(model, optim, os.path.join(out, "ckpt"), step)
            self.step(model, optim, step, out)

    def step(self, model, optim, step, out):
        x, c = self.ctx, self.ctx.cfg
        K = c["grad_accum"]
        g_inp, g_tgt = x.ref.batch(step)
        inp, tgt = self.local_batch(g_inp, g_tgt)
        optim.zero_grad(set_to_none=True)
        if self.rec:
            self.rec.begin_step(step)
        loss_sum = self.forward_backward(model, inp, tgt, step)
        # the step file is laid out now (tracefile.StepFile), and every set goes into it as
        # soon as it is final: the gradients before clipping scales them, the rest after the step
        clips = c["clip_grad_norm"] > 0
        f = self.recorder.open_step_file(out, step, g_inp, g_tgt, clips)
        try:
            self.recorder.grads(f, model)
            self.phase("clip")
            grad_norm = clip_grad_norm(model, c, x.api == "fsdp1") if clips else None
            self.phase("optim")
            optim.step()
            if x.fault == "frozen_decay":
                decay_frozen(model, x.frozen, c["optimizer"])
            if self.rec:
                self.rec.optimizer_stepped()
            self.phase(None)
            self.recorder.after_step(f, model, optim)
            self.recorder.commit(f, step, loss_sum, K, inp, tgt, g_inp, g_tgt, grad_norm)
        finally:
            f.close()

    def forward_backward(self, model, inp, tgt, step):
        """The K micro-batches of this rank's share; returns the sum of their losses."""
        x, c = self.ctx, self.ctx.cfg
        K = c["grad_accum"]
        mb = inp.shape[0] // K
        loss_sum = 0.0
        for k in range(K):
            if self.rec:
                self.rec.begin_micro(k)
            xb = inp[k * mb : (k + 1) * mb].to(x.device)
            yb = tgt[k * mb : (k + 1) * mb].long().to(x.device)
            if self.token_ids:
                xb = xb.long()
            sync = not c["no_sync"] or k == K - 1
            if x.api == "fsdp1":
                ctx = model.no_sync() if not sync else contextlib.nullcontext()
            else:
                model.set_requires_gradient_sync(sync)
                model.set_is_last_backward(k == K - 1)
                ctx = contextlib.nullcontext()
            with ctx:
                self.phase("forward")
                loss = M.loss_of(model, x.mcfg, xb, yb)
                self.faults_in_backward(step)
                self.phase("backward")
                (loss / K).backward() if K > 1 else loss.backward()
                self.phase(None)
            loss_sum += float(loss.detach().float().cpu())
        return loss_sum

    def faults_in_backward(self, step):
        """--inject hang and segv: the last rank stops before its backward."""
        x = self.ctx
        if x.fault == "hang" and step == 0 and x.rank == x.W - 1:
            time.sleep(1e6)  # the others wait for it in the first collective
        if x.fault == "segv" and step == min(1, x.cfg["steps"] - 1) and x.rank == x.W - 1:
            import ctypes

            ctypes.string_at(0)  # reads address 0: SIGSEGV

    def local_batch(self, inp, tgt):
        x = self.ctx
        n = x.cfg["global_batch"] // x.W
        r = x.rank
        if x.fault == "data_overlap" and r > 0:
            r -= 1  # the bug: a rank reads its neighbour's samples
        return inp[r * n : (r + 1) * n], tgt[r * n : (r + 1) * n]
