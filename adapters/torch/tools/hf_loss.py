#!/usr/bin/env python3
"""A FULL checkpoint read by its real reader: the Hugging Face class its
config.json's model_type names (GPT2LMHeadModel, LlamaForCausalLM), through
from_pretrained.

  hf_loss.py CKPT_DIR TRACE_DIR [--device cpu|cuda] [--rtol R]

CKPT_DIR is `fsdpcheck run --save DIR --state-dict full` (model.safetensors and
config.json); its manifest fsdpcheck.json says the data position S it was saved
at. The trace of the same run holds step S's batch and the loss the saved
parameters gave on it (step S ran on exactly those parameters). This loads the
checkpoint with transformers, computes the loss on step S's batch in fp32, and
prints both; exits 1 if they differ by more than R relative (default 1e-4: fp32
forward of the same parameters on two code paths differs in summation order
only; measured |rel| on gpt2-tiny on the CPU: see bench/gpu/run.sh scale).
A LoRA model's checkpoint also holds PEFT's adapter_model.safetensors and
adapter_config.json: the base is read as above and the adapters by
peft.PeftModel.from_pretrained, as a user resumes a PEFT run.
Exit 2 on bad input, one line on stderr.
"""

import json
import os
import sys

import torch

from fsdpcheck_torch.config import UsageError
from fsdpcheck_torch.model import HF, loss_of
from fsdpcheck_torch.tracefile import RefTrace


def main(argv):
    args, device, rtol = [], "cpu", 1e-4
    it = iter(argv)
    for a in it:
        if a == "--device":
            device = next(it, None)
        elif a == "--rtol":
            rtol = float(next(it, "nan"))
        else:
            args.append(a)
    if len(args) != 2 or device not in ("cpu", "cuda") or not rtol > 0:
        raise UsageError("usage: hf_loss.py CKPT_DIR TRACE_DIR [--device cpu|cuda] [--rtol R]")
    ckpt, trace = args
    try:
        with open(os.path.join(ckpt, "fsdpcheck.json")) as f:
            step = int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{ckpt}/fsdpcheck.json: not a checkpoint manifest ({e})")
    try:
        with open(os.path.join(ckpt, "config.json")) as f:
            mtype = json.load(f)["model_type"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{ckpt}/config.json: not a Hugging Face model config ({e})")
    if mtype not in HF:
        raise UsageError(f"{ckpt}/config.json: model_type {mtype!r} (this reads {', '.join(HF)})")
    ref = RefTrace(trace)
    inp, target = ref.batch(step)
    path = os.path.join(trace, f"step-{step:06d}.safetensors")
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        want = float(f.get_tensor("loss"))
    cls = HF[mtype].model_class()
    model = cls.from_pretrained(ckpt, torch_dtype=torch.float32)
    reader = f"{cls.__name__}.from_pretrained({ckpt})"
    if os.path.exists(os.path.join(ckpt, "adapter_config.json")):
        import peft

        # model.safetensors holds the adapters too (FSDP's full state dict of the PeftModel):
        # from_pretrained leaves them out of the base, and PEFT reads its own file
        model = peft.PeftModel.from_pretrained(model, ckpt)
        reader = f"PeftModel.from_pretrained({reader}, {ckpt})"
    model = model.to(device).eval()
    with torch.no_grad():
        got = float(loss_of(model, {"model_type": mtype}, inp.long().to(device), target.long().to(device)))
    rel = abs(got - want) / abs(want)
    verdict = "PASS" if rel <= rtol else "FAIL"
    print(f"hf_loss: {verdict} {reader} step {step}: loss {got:.7f}, trace {want:.7f}, |rel| {rel:.2e} (rtol {rtol:g})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as e:
        print(f"hf_loss.py: {e}", file=sys.stderr)
        sys.exit(2)
