"""Command line: run (a torchrun worker), check, sweep, trainer.

  torchrun --nproc-per-node W -m fsdpcheck_torch run --api fsdp1|fsdp2
      [--device cpu|cuda|hpu|xla] [--backend gloo|nccl|hccl|xla] [run flags]
      --like REF_TRACE --trace OUT [--inject FAULT] [--ckpt-at K [--ckpt-state-dict full|sharded]]
      [--load CKPT_DIR] [--force-sum-reduction]
  fsdpcheck-torch check --api fsdp1|fsdp2 [-n W] [run flags] [--keep DIR] ...
  fsdpcheck-torch sweep --cases N [--api fsdp1|fsdp2|both] [--world W] [--seed S] [--junit F]
  torchrun --nproc-per-node W -m fsdpcheck_torch trainer --like REF --trace OUT
      [--fsdp-config FILE] [--fsdp "full_shard auto_wrap"]
  fsdpcheck-torch ckpt import SRC DST --like REF_TRACE [--step K]

Exit codes as fsdpcheck's: 0 pass, 1 a comparison failed, 2 bad input or usage
(one line on stderr).
"""

import os
import sys

from . import env, planwait
from .config import (
    APIS,
    BACKENDS,
    DEFAULT_BACKEND,
    DEVICES,
    FAULTS,
    FROZEN_CHECKPOINT,
    UsageError,
    freeze_unsupported,
    frozen_of,
    inject_refusal,
    like_config,
    premul_refusal,
    validate,
)
from .errors import refuse
from .flags import split_args
from .freeze import frozen_units
from .xla import mesh_flag

PROG = "fsdpcheck-torch"
BACKEND_DEVICE = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",), "hccl": ("hpu",), "xla": ("xla",)}

USAGE = __doc__


# the models whose stages the comm-log recorder places (model.stage_modules:
# embedding, blocks, head), as the reference's schedule numbers them
COMM_LOG_MODELS = ("gpt2", "llama")

RUN_OWN = {
    "--api": True,
    "--device": True,
    "--backend": True,
    "--like": True,
    "--trace": True,
    "--inject": True,
    "--ckpt-at": True,
    "--ckpt-state-dict": True,
    "--load": True,
    "--force-sum-reduction": False,
    "--optim-state-offload": False,
    "--comm-log": False,
    "--xla-mesh": True,
}


def parse_run(argv, world):
    """The worker's arguments -> (args, cfg, ref); raises UsageError."""
    from .tracefile import RefTrace

    opts, flags = split_args(argv, RUN_OWN)
    api = opts.get("--api")
    if api not in APIS:
        raise UsageError("run: --api fsdp1|fsdp2 is required" if api is None else f"--api {api!r}: not fsdp1 or fsdp2")
    env.gather_mode()  # FSDPCHECK_GATHER, before anything runs
    device = opts.get("--device", "cpu")
    if device not in DEVICES:
        raise UsageError(f"--device {device!r}: not one of {', '.join(DEVICES)}")
    backend = opts.get("--backend", DEFAULT_BACKEND[device])
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}: not one of {', '.join(BACKENDS)}")
    if device not in BACKEND_DEVICE[backend]:
        raise UsageError(f"--backend {backend} does not run on --device {device}")
    if "--like" not in opts:
        raise UsageError("run: --like REF_TRACE is required (the model, initial weights and batches come from it)")
    if "--trace" not in opts:
        raise UsageError("run: --trace OUT is required")
    inject = opts.get("--inject", "none")
    if inject not in FAULTS:
        raise UsageError(f"--inject {inject!r}: this adapter injects {', '.join(FAULTS[1:])}")
    ckpt_at = 0
    if "--ckpt-at" in opts:
        try:
            ckpt_at = int(opts["--ckpt-at"])
        except ValueError:
            raise UsageError(f"--ckpt-at: not an integer: {opts['--ckpt-at']!r}")
    if inject == "ckpt_drop_optim" and not ckpt_at and "--load" not in opts:
        raise UsageError("--inject ckpt_drop_optim needs --ckpt-at K or --load DIR (a checkpoint to load)")
    if not planwait.ready():  # started beside the reference's plan, which failed: `check` says why
        raise UsageError(f"--like {opts['--like']}: the reference's plan was not written")
    ref = RefTrace(opts["--like"])
    cfg, extras = like_config(ref, flags, device)
    if extras.get("api") and extras["api"] != api:
        raise UsageError(f"--fsdp-config says FSDP version {extras['api'][-1]}, the run says --api {api}")
    if "--ckpt-at" in opts and not 1 <= ckpt_at < cfg["steps"]:
        raise UsageError(f"--ckpt-at {ckpt_at}: must be in 1..steps-1 ({cfg['steps'] - 1})")
    ckpt_sd = opts.get("--ckpt-state-dict", "full")
    if ckpt_sd not in ("full", "sharded"):
        raise UsageError(f"--ckpt-state-dict {ckpt_sd!r}: not full or sharded")
    if "--ckpt-state-dict" in opts and not ckpt_at:
        raise UsageError("--ckpt-state-dict needs --ckpt-at K")
    if ckpt_sd == "sharded" and api != "fsdp2":
        raise UsageError(
            "--ckpt-state-dict sharded: FSDP2's sharded checkpoint is DCP's (Hugging Face safetensors); "
            "FSDP1's flat-shard format is the reference's own, which torch does not write: use full with fsdp1"
        )
    load = opts.get("--load")
    if load is not None:
        load_check(load, ckpt_at, ref, cfg)
    if ckpt_sd == "sharded" or load is not None:
        from . import dcp

        why = dcp.missing() if ckpt_sd == "sharded" or dcp.kind_of(load) == "dcp" else None
        if why:
            raise UsageError(f"{'--ckpt-state-dict sharded' if ckpt_sd == 'sharded' else '--load'}: {why}")
    if world is not None and device != "xla":  # one process drives XLA's devices: xla.run validates at their count
        validate(cfg, world)
    from .config import unsupported

    why = unsupported(api, cfg, device)
    if why:
        raise UsageError(f"{api}: {why}")
    why = world and premul_refusal(api, cfg, world, backend, bool(opts.get("--force-sum-reduction")), inject)
    if why:
        raise UsageError(f"{api}: {why}")

    class A:
        pass

    a = A()
    a.api, a.device, a.backend, a.like, a.trace = api, device, backend, opts["--like"], opts["--trace"]
    a.inject, a.ckpt_at, a.force_sum_reduction = inject, ckpt_at, bool(opts.get("--force-sum-reduction"))
    a.ckpt_state_dict, a.load = ckpt_sd, load
    a.extras = extras
    a.optim_state_offload = bool(opts.get("--optim-state-offload"))
    a.comm_log = bool(opts.get("--comm-log"))
    a.xla_mesh = mesh_flag(opts, api, device)
    if a.comm_log and (ckpt_at or load):
        raise UsageError(
            f"--comm-log with {'--ckpt-at' if ckpt_at else '--load'}: the schedule is recorded for a run from its "
            "initial weights, not across a reload"
        )
    if a.comm_log and cfg["model"].get("model_type") not in COMM_LOG_MODELS:
        raise UsageError(
            f"--comm-log: recorded for {' and '.join(COMM_LOG_MODELS)} models (their stages are known to the "
            f"recorder), not {cfg['model'].get('model_type')}"
        )
    if a.comm_log:
        from .commlog import refusal

        why = refusal(api)
        if why:
            raise UsageError(why)
    whole = frozen_units(frozen_of(cfg, ref.names, ref.lora), ref.units)
    why = freeze_unsupported(cfg, a.comm_log, "--ckpt-at" if ckpt_at else "--load" if load else None, api, whole)
    why = why or inject_refusal(inject, cfg)
    if why:
        raise UsageError(why)
    return a, cfg, ref


def load_check(load, ckpt_at, ref, cfg):
    """--load DIR: a manifest whose step REF's batches continue from for the run's steps."""
    import json

    if ckpt_at:
        raise UsageError("--load with --ckpt-at: give one checkpoint per run")
    path = os.path.join(load, "fsdpcheck.json")
    try:
        with open(path) as f:
            man = json.load(f)
        step = man["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--load {load}: no readable fsdpcheck checkpoint manifest ({type(e).__name__}: {e})")
    saved = man.get("config") if isinstance(man.get("config"), dict) else {}
    if saved.get("freeze"):
        raise UsageError(
            f"--load {load}: the checkpoint froze parameters (--freeze {saved['freeze']!r}): {FROZEN_CHECKPOINT}"
        )
    if isinstance(saved.get("model"), dict) and saved["model"].get("fsdpcheck_lora"):
        raise UsageError(f"--load {load}: the checkpoint is of a LoRA model (its base frozen): {FROZEN_CHECKPOINT}")
    first, n = ref.meta["first_step"], ref.meta["steps"]
    if not isinstance(step, int) or step < first or step + cfg["steps"] > first + n:
        raise UsageError(
            f"--load {load}: resumes at step {step} for {cfg['steps']} steps, but --like {ref.dir} holds the "
            f"batches of steps {first}..{first + n - 1} (give --steps)"
        )


def cmd_run(argv):
    """The worker. `run --jobs FILE` runs a JSON list of run argument lists one
    after the other in one process group (the tests and the sweep use it to
    pay for starting torch once per world size, not once per case); a job that
    fails writes error.txt into its --trace directory and the next one runs."""
    rank, world = env.rank(), env.world()
    env.default_threads()
    jobs = None
    if argv[:1] == ["--jobs"] and len(argv) == 2:
        import json

        try:
            with open(argv[1]) as f:
                jobs = json.load(f)
        except (OSError, ValueError) as e:
            return refuse(rank, f"--jobs {argv[1]}: {e}", PROG)
    parsed = []
    try:
        for job in jobs if jobs is not None else [argv]:
            parsed.append(parse_run(job, world))
    except UsageError as e:
        from . import failure

        failure.record(rank, "usage", str(e))
        return refuse(rank, str(e), PROG)
    devices = {(a.device, a.backend) for a, _, _ in parsed}
    if len(devices) != 1:
        return refuse(rank, "--jobs: every job must use the same --device and --backend", PROG)
    args0 = parsed[0][0]
    from . import failure

    if args0.device == "xla":
        from . import xla

        return failure.guarded(rank, lambda: max(xla.run(a, c, r) for a, c, r in parsed))
    # from here a crash is the implementation's: faulthandler names the rank's
    # signal and frame in $FSDPCHECK_TORCH_REPORT, and `check` reads it
    return failure.guarded(rank, lambda: _train(parsed, jobs is not None, rank))


def _train(parsed, several, rank):
    """Trains each parsed job in one process group. With several (a --jobs
    file), a job's exception is written to its error.txt and the next runs: the
    exit code is then non-zero only for what no error.txt records (a crash, an
    abort), so `check` never has a failed exit to explain away."""
    import datetime

    import torch
    import torch.distributed as dist

    args0 = parsed[0][0]
    torch.set_num_threads(env.threads())
    if args0.device == "hpu":  # pragma: no cover (hpu)
        os.environ.setdefault("PT_HPU_LAZY_MODE", "0")  # eager mode
        import habana_frameworks.torch.core
        import habana_frameworks.torch.distributed.hccl  # noqa: F401
    if args0.device == "cuda":  # pragma: no cover (cuda)
        torch.cuda.set_device(env.local_rank())
    dist.init_process_group(args0.backend, timeout=datetime.timedelta(seconds=300))
    from .engine import Run
    from .teardown import shutdown

    finished = False
    try:
        for args, cfg, ref in parsed:
            if not several:
                Run(args, cfg, ref).train()
                continue
            try:
                Run(args, cfg, ref).train()
            except Exception as e:  # noqa: BLE001 (any failure is recorded in error.txt; the next job still runs)
                import traceback

                kind = "usage" if isinstance(e, UsageError) else "error"
                if rank == 0:
                    os.makedirs(args.trace, exist_ok=True)
                    with open(os.path.join(args.trace, "error.txt"), "w") as f:
                        what = str(e) if kind == "usage" else f"{type(e).__name__}: {e}"
                        f.write(f"{kind}\n{what}\n{traceback.format_exc()}")
                print(f"{PROG}: rank {rank}: job {args.trace} failed: {type(e).__name__}: {e}", file=sys.stderr)
            import gc

            gc.collect()
            dist.barrier()
        finished = True
    finally:
        shutdown(meet=finished)
    return 0


RUN_HELP = """torchrun --nproc-per-node W -m fsdpcheck_torch run --api fsdp1|fsdp2 --like REF_TRACE --trace OUT
    [--device cpu|cuda|hpu|xla] [--backend gloo|nccl|hccl|xla] [run flags]
    [--inject data_overlap|no_divide|ckpt_drop_optim|frozen_decay|lora_alpha] [--ckpt-at K [--ckpt-state-dict full|sharded]]
    [--load CKPT_DIR] [--force-sum-reduction] [--optim-state-offload]
torchrun --nproc-per-node W -m fsdpcheck_torch run --jobs JOBS.json

One rank of a torch FSDP run on a reference trace: the model, its initial
weights and every step's global batch come from REF_TRACE (--like); the run
flags (fsdpcheck run's: --strategy, --param-dtype, --fsdp-config FILE, ...)
change the rest; the trace is written to OUT. A --like trace of a LoRA model
(fsdpcheck run --lora R:ALPHA:REGEX; --lora here must repeat it) is built with
peft's get_peft_model on the modules the reference adapted. --jobs runs a JSON list of such
argument lists in one process group. --ckpt-at K saves a checkpoint before
step K and trains on from a fresh model loaded from it: FULL (rank 0 writes the
reference's files), or with --ckpt-state-dict sharded (fsdp2) FSDP2's sharded
one, DCP's Hugging Face safetensors with fsdpcheck's manifest, which
`fsdpcheck run --load` reads at any W. --load CKPT_DIR starts from a fsdpcheck
checkpoint (full, or dcp through torch's HuggingFaceStorageReader at this W)
and trains --steps steps from its step. --optim-state-offload reads the optimizer
state through torch.distributed.checkpoint's full state dict with
cpu_offload=True (by default FSDP1's is read with cpu_offload=False and
FSDP2's straight from optim.state).
"""


def command_help(cmd):
    """The usage text of a command (its module's docstring)."""
    if cmd == "run":
        return RUN_HELP
    if cmd == "check":
        from . import check

        return check.__doc__
    if cmd == "ckpt":
        return CKPT_HELP
    if cmd == "sweep":
        from . import sweep

        return sweep.__doc__
    from . import trainer

    return trainer.__doc__


CKPT_HELP = """fsdpcheck-torch ckpt import SRC DST --like REF_TRACE [--step K]

Converts a checkpoint torch.distributed.checkpoint wrote (SRC: its default
format, .distcp files and .metadata as dcp.save writes them, or its Hugging
Face format, HuggingFaceStorageWriter's safetensors without fsdpcheck's
manifest) into a fsdpcheck "dcp" checkpoint (DST: DCP's Hugging Face
safetensors and fsdpcheck's manifest), through torch's own readers
(dcp_to_torch_save, HuggingFaceStorageReader) and writer
(HuggingFaceStorageWriter). REF_TRACE names the run: its model and optimizer
config go into the manifest. The model's tensors are found under their model
names (at the top level or under "model."), the optimizer's as
get_optimizer_state_dict keys them ("state.<name>.<state>", under "optim." or
"optimizer." or not); --step K is the optimizer steps taken (read from AdamW's
step when not given). `fsdpcheck run --load DST` then resumes the run at any W.
"""


def cmd_ckpt(argv):
    """ckpt import: a parser plus one call (dcp.import_checkpoint)."""
    from .flags import split_args

    if argv[:1] != ["import"]:
        raise UsageError("ckpt: the subcommand is import (fsdpcheck-torch ckpt --help)")
    opts, rest = split_args(argv[1:], {"--like": True, "--step": True})
    unknown = [a for a in rest if a.startswith("--")]
    if unknown:
        raise UsageError(f"ckpt import: unknown flag {unknown[0]} (fsdpcheck-torch ckpt --help)")
    pos = rest
    if len(pos) != 2:
        raise UsageError("ckpt import: needs SRC and DST directories (and --like REF_TRACE)")
    if "--like" not in opts:
        raise UsageError("ckpt import: --like REF_TRACE is required (the run whose model and optimizer it holds)")
    step = None
    if "--step" in opts:
        try:
            step = int(opts["--step"])
        except ValueError:
            raise UsageError(f"--step: not an integer: {opts['--step']!r}")
        if step < 0:
            raise UsageError(f"--step {step}: must be >= 0")
    from . import dcp

    why = dcp.missing()
    if why:
        raise UsageError(f"ckpt import: {why}")
    step, n = dcp.import_checkpoint(pos[0], pos[1], opts["--like"], step)
    print(f"imported {pos[0]} (DCP, step {step}) to {pos[1]} (dcp: {n} tensors, Hugging Face safetensors)")
    return 0


COMMANDS = ("run", "check", "sweep", "trainer", "ckpt")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"{PROG}: unknown command {cmd!r} ({', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    if "-h" in rest or "--help" in rest:
        print(command_help(cmd).strip())
        return 0
    try:
        if cmd == "run":
            return cmd_run(rest)
        if cmd == "check":
            from .check import cmd_check

            return cmd_check(rest)
        if cmd == "sweep":
            from .sweep import cmd_sweep

            return cmd_sweep(rest)
        if cmd == "ckpt":
            return cmd_ckpt(rest)
        from .trainer import cmd_trainer

        return cmd_trainer(rest)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
