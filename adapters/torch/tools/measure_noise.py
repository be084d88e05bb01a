#!/usr/bin/env python3
"""Measures how far one fsdpcheck trace is from another, per tensor kind,
relative to each tensor's scale: the numbers a tolerance model needs.

  measure_noise.py REF_DIR OTHER_DIR [REF_DIR OTHER_DIR ...] [--per-tensor] [--markdown]

For every pair (REF is the expected side) and every kind (loss, grad, param,
optim) over all steps both traces hold:
  max_abs     max |a - b| over every element of the kind
  max_rel     max over tensors of  max|a - b| / max|a|   (error against the tensor's scale)
  ulp@scale   max over tensors of  max|a - b| / ulp(max|a|)  (fp32 ulps at the tensor's scale)
  worst       the tensor (and step) with the largest max_rel
A row is labelled from the second trace's trace.json: implementation, model,
strategy, W, param/reduce dtype, grad accumulation, clip.
"""

import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file

KINDS = ("loss", "grad", "param", "optim")


def kind_of(name):
    if name == "loss":
        return "loss"
    head = name.split(".", 1)[0]
    return head if head in KINDS else None


def ulp32(x):
    x = np.float32(abs(x))
    if x == 0:
        return float(np.finfo(np.float32).tiny)
    return float(np.spacing(x))


def label(d):
    with open(os.path.join(d, "trace.json")) as f:
        t = json.load(f)
    c = t["config"]
    parts = [
        t["implementation"],
        c["model"].get("fsdpcheck_name", "?"),
        c["strategy"],
        f"W={t['world_size']}",
        f"{c['param_dtype']}/{c['reduce_dtype']}",
    ]
    if c.get("shard_group"):
        parts.append(f"F={c['shard_group']}")
    if c["grad_accum"] > 1:
        parts.append(f"K={c['grad_accum']}" + (" no_sync" if c["no_sync"] else ""))
    if c["clip_grad_norm"]:
        parts.append(f"clip={c['clip_grad_norm']:g}")
    if c["optimizer"]["kind"] != "adamw":
        parts.append(c["optimizer"]["kind"])
    return " ".join(parts), t


def measure(ref, other):
    with open(os.path.join(ref, "trace.json")) as f:
        tr = json.load(f)
    _, to = label(other)
    lo = max(tr["first_step"], to["first_step"])
    hi = min(tr["first_step"] + tr["steps"], to["first_step"] + to["steps"])
    res = {k: {"max_abs": 0.0, "max_rel": 0.0, "ulp": 0.0, "worst": "-"} for k in KINDS}
    per_tensor = []
    for s in range(lo, hi):
        a = load_file(os.path.join(ref, f"step-{s:06d}.safetensors"))
        b = load_file(os.path.join(other, f"step-{s:06d}.safetensors"))
        for n in sorted(a):
            k = kind_of(n)
            if k is None or n not in b:
                continue
            x, y = a[n].astype(np.float64), b[n].astype(np.float64)
            err = float(np.max(np.abs(x - y))) if x.size else 0.0
            scale = float(np.max(np.abs(x))) if x.size else 0.0
            rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
            ulp = err / ulp32(scale)
            per_tensor.append((s, n, err, scale, rel, ulp))
            r = res[k]
            r["max_abs"] = max(r["max_abs"], err)
            r["ulp"] = max(r["ulp"], ulp)
            if rel > r["max_rel"]:
                r["max_rel"] = rel
                r["worst"] = f"step {s} {n}"
    return res, per_tensor, (lo, hi)


def main(argv):
    per = "--per-tensor" in argv
    md = "--markdown" in argv
    dirs = [a for a in argv if not a.startswith("--")]
    if len(dirs) < 2 or len(dirs) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for i in range(0, len(dirs), 2):
        ref, other = dirs[i], dirs[i + 1]
        lab, _ = label(other)
        res, pt, (lo, hi) = measure(ref, other)
        for k in KINDS:
            r = res[k]
            rows.append((lab, f"{lo}..{hi - 1}", k, r["max_abs"], r["max_rel"], r["ulp"], r["worst"]))
        if per:
            for s, n, err, scale, rel, ulp in sorted(pt, key=lambda t: -t[4])[:15]:
                print(f"  {lab}: step {s} {n}: max_abs {err:.3g} scale {scale:.3g} rel {rel:.3g} ulp@scale {ulp:.1f}")
    if md:
        print("| run | steps | kind | max abs err | max err / max|ref| | ulps at scale | worst tensor |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3g} | {r[4]:.3g} | {r[5]:.1f} | {r[6]} |")
    else:
        for r in rows:
            print(f"{r[0]:<60} {r[1]:>5} {r[2]:<6} abs {r[3]:9.3g}  rel {r[4]:9.3g}  ulp@scale {r[5]:8.1f}  {r[6]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
