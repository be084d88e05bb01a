"""`fsdpcheck-torch sweep`: seeded random cases over the reference sweep's
config space, each run on the torch APIs and judged against the reference.

  fsdpcheck-torch sweep --cases N [--api fsdp1|fsdp2|both] [--world W] [--seed S]
      [--junit FILE.xml] [--report FILE.md] [--fsdpcheck PATH] [--device D] [--backend B]

A case draws a model (mlp-tiny, gpt2-tiny), a world size W' <= W that divides
the global batch, a strategy (hybrid with a shard group dividing W'), backward
and forward prefetch and the limiter, a mixed-precision policy, gradient
accumulation with or without no_sync, clipping (norm 1, 2, inf), CPU offload
and the optimizer. Each API runs the case unless it lacks a setting: then the
case is reported as unsupported for that API with the reason, and the report
ends with the settings each API lacks. Exit 0 when every case that ran
passed, 1 when one failed, 2 for bad input.
"""

import random
import sys
import time
from xml.sax.saxutils import escape, quoteattr

from .config import UsageError

OWN = {
    "--cases": True,
    "--api": True,
    "--world": True,
    "-n": True,
    "--seed": True,
    "--junit": True,
    "--report": True,
    "--fsdpcheck": True,
    "--device": True,
    "--backend": True,
}


def draw(rng, max_world):
    worlds = [w for w in (1, 2, 4) if w <= max_world]
    W = rng.choice(worlds)
    model = rng.choice(["mlp-tiny", "gpt2-tiny"])
    strategies = ["full_shard", "shard_grad_op", "no_shard"] + (
        ["hybrid_shard", "hybrid_shard_zero2"] if W >= 2 else []
    )
    s = rng.choice(strategies)
    f = ["--model", model, "--strategy", s, "--steps", "2"]
    if s.startswith("hybrid"):
        f += ["--shard-group", str(rng.choice([d for d in (1, 2, 4) if d <= W and W % d == 0]))]
    sharded = s != "no_shard"
    fwd = bwd = False
    if sharded:
        bp = rng.choice(["none", "none", "pre", "post"])
        if bp != "none":
            f += ["--backward-prefetch", bp]
            bwd = True
        if rng.random() < 0.3:
            f += ["--forward-prefetch"]
            fwd = True
        if (fwd or bwd) and rng.random() < 0.3:
            f += ["--limit-all-gathers"]
    pol = rng.choice([("fp32", "fp32")] * 3 + [("bf16", "bf16"), ("bf16", "fp32"), ("fp16", "fp32")])
    if pol != ("fp32", "fp32"):
        f += ["--param-dtype", pol[0], "--reduce-dtype", pol[1]]
    per_rank = 8 // W
    if per_rank % 2 == 0 and rng.random() < 0.35:
        f += ["--grad-accum", "2"] + (["--no-sync"] if rng.random() < 0.5 else [])
    if rng.random() < 0.3:
        f += ["--clip-grad-norm", rng.choice(["0.05", "1.0"]), "--norm-type", rng.choice(["1", "2", "inf"])]
    if sharded and rng.random() < 0.1:
        f += ["--cpu-offload"]
    if rng.random() < 0.25:
        f += ["--optimizer", "sgd", "--lr", "0.05"]
    return W, f


def cmd_sweep(argv):
    from .check import parse, run_checks
    from .flags import split_args

    opts, rest = split_args(argv, OWN)
    if rest:
        raise UsageError(f"sweep: unexpected argument {rest[0]!r}")
    try:
        n = int(opts.get("--cases", "10"))
        max_world = int(opts.get("--world", opts.get("-n", "4")))
        seed = int(opts.get("--seed", "1"))
    except ValueError as e:
        raise UsageError(f"sweep: {e}")
    if n < 1 or max_world < 1:
        raise UsageError("sweep: --cases and --world must be at least 1")
    api_opt = opts.get("--api", "both")
    if api_opt not in ("fsdp1", "fsdp2", "both"):
        raise UsageError(f"--api {api_opt!r}: not fsdp1, fsdp2 or both")
    apis = ["fsdp1", "fsdp2"] if api_opt == "both" else [api_opt]
    rng = random.Random(seed)
    extra = []
    for k in ("--fsdpcheck", "--device", "--backend"):
        if k in opts:
            extra += [k, opts[k]]
    results = []  # (case index, W, flags, api, status, detail, seconds)
    pending = []
    for i in range(n):
        W, flags = draw(rng, max_world)
        for api in apis:
            argv_c = ["--api", api, "-n", str(W), "--quiet"] + extra + flags
            try:
                parse(argv_c)
            except UsageError as e:
                results.append((i, W, flags, api, "unsupported", str(e), 0.0))
                print(f"case {i} {api} W={W} {' '.join(flags)}: unsupported: {e}", flush=True)
                continue
            pending.append((i, W, flags, api, argv_c))
    t0 = time.time()
    outcomes = run_checks([p[4] for p in pending])  # torch starts once per world size
    failed = 0
    for (i, W, flags, api, _), (rc, out, t) in zip(pending, outcomes):
        if rc == 0:
            status, detail = "pass", ""
        elif rc == 1:
            status = "FAIL"
            lines = out.strip().splitlines() or [""]
            # compare's first divergence, or a crash's head and its first rank
            detail = next((ln.strip() for ln in lines if ln.startswith("first divergence")), "")
            detail = detail or " ".join(ln.strip() for ln in lines[:2])
        else:
            status, detail = "error", out.strip().splitlines()[0] if out.strip() else "error"
        dt = t.get("plan_s", 0.0) + t.get("torch_s", 0.0) + t.get("compare_s", 0.0)
        if status != "pass":
            failed += 1
        results.append((i, W, flags, api, status, detail, dt))
        print(f"case {i} {api} W={W} {' '.join(flags)}: {status} {detail}", flush=True)
    results.sort(key=lambda r: (r[0], r[3]))
    print(f"({time.time() - t0:.0f} s)")
    lacks = {}
    for r in results:
        if r[4] == "unsupported":
            lacks.setdefault(r[3], set()).add(r[5].split(": ", 1)[-1])
    ran = [r for r in results if r[4] != "unsupported"]
    print(
        f"\nsweep: {len(ran)} runs, {sum(r[4] == 'pass' for r in ran)} passed, {failed} failed, "
        f"{len(results) - len(ran)} unsupported"
    )
    for api in apis:
        for why in sorted(lacks.get(api, ())):
            print(f"  {api} lacks: {why}")
    if "--junit" in opts:
        write_junit(opts["--junit"], results)
    if "--report" in opts:
        write_report(opts["--report"], results, apis, lacks)
    print(f"{len(ran) - failed} passed, {failed} failed, {len(results) - len(ran)} skipped")
    return 1 if failed else 0


def write_junit(path, results):
    fails = sum(r[4] in ("FAIL", "error") for r in results)
    skips = sum(r[4] == "unsupported" for r in results)
    with open(path, "w") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n')
        f.write(
            f'<testsuite name="fsdpcheck-torch sweep" tests="{len(results)}" failures="{fails}" skipped="{skips}">\n'
        )
        for i, W, flags, api, status, detail, dt in results:
            name = quoteattr(f"case {i} {api} W={W} {' '.join(flags)}")
            f.write(f'  <testcase classname="fsdpcheck_torch.sweep.{api}" name={name} time="{dt:.1f}">')
            if status == "unsupported":
                f.write(f"<skipped message={quoteattr(detail)}/>")
            elif status != "pass":
                f.write(f"<failure message={quoteattr(detail or status)}>{escape(detail)}</failure>")
            f.write("</testcase>\n")
        f.write("</testsuite>\n")


def write_report(path, results, apis, lacks):
    with open(path, "w") as f:
        f.write("# fsdpcheck-torch sweep\n\n| case | API | W | flags | result | detail |\n|---|---|---|---|---|---|\n")
        f.writelines(
            f"| {i} | {api} | {W} | `{' '.join(flags)}` | {status} | {detail} |\n"
            for i, W, flags, api, status, detail, dt in results
        )
        f.write("\n## Settings each API lacks\n\n")
        for api in apis:
            f.writelines(f"- {api}: {why}\n" for why in sorted(lacks.get(api, ())) or ["(none drawn)"])


if __name__ == "__main__":
    sys.exit(cmd_sweep(sys.argv[1:]))
