"""The Hugging Face Trainer path: a real `Trainer.train()` on GPT-2 or Llama with
`fsdp="full_shard auto_wrap"` and an `fsdp_config.json`, traced by a
`TrainerCallback`.

  torchrun --nproc-per-node W -m fsdpcheck_torch trainer --like REF --trace OUT
      [--fsdp "full_shard auto_wrap"] [--fsdp-config FILE] [--device cpu|cuda|hpu]

What makes the Trainer train exactly the reference's steps:
  - the model: GPT2LMHeadModel or LlamaForCausalLM from the trace's initial
    weights (model.py);
  - the data: the trace's batches as a map-style dataset read in order
    (`train_sampling_strategy="sequential"`), laid out so that Accelerate's
    batch sharding (process p takes batches p, p+W, p+2W, ... of the
    per-device batch size) hands rank r micro-batch k of step t the samples
    [r B/W + k m, r B/W + (k+1) m), m = B/(W K), exactly the reference's;
    `shift_labels` carries the targets so all T of them count;
  - the optimizer: `optim="adamw_torch"` with the trace's lr, betas, eps and a
    constant schedule. The Trainer exempts biases and LayerNorm weights from
    weight decay and the reference does not, so the reference must run with
    --weight-decay 0 (refused otherwise, exit 2);
  - clipping: `max_grad_norm=0`, and the callback clips in
    `on_pre_optimizer_step` after recording the unclipped gradients.
The callback records the full gradients (FSDP1 `summon_full_params(with_grads=True)`,
FSDP2 `full_tensor()`), then after the optimizer step the parameters and the
optimizer state, and rank 0 writes the step file (trainer_trace.py).
The command line is parsed once (parse) into a TrainerArgs.
"""

import shutil
import sys
import tempfile
from dataclasses import dataclass

from . import env
from .config import UsageError, fsdp2_only, like_config, optim_state_names, run_flags
from .errors import refuse

OWN = {"--like": True, "--trace": True, "--fsdp": True, "--device": True, "--allow-ddp": False}


@dataclass
class TrainerArgs:
    """The trainer command line, parsed once: the reference trace (ref), the run
    config --like it with the run flags (cfg) and what an fsdp_config file said
    beyond it (extras), the --fsdp words, the fsdp_config file as given (the
    Trainer reads it itself), and the command's own options."""

    ref: object
    cfg: dict
    extras: dict
    trace: str
    fsdp: str
    fsdp_config: str | None
    device: str
    allow_ddp: bool


def parse(argv, world):
    """argv -> TrainerArgs; raises UsageError for what the Trainer path cannot replay."""
    from .flags import split_args
    from .tracefile import RefTrace

    opts, flags = split_args(argv, OWN)
    for k in ("--like", "--trace"):
        if k not in opts:
            raise UsageError(f"trainer: {k} is required")
    device = opts.get("--device", "cpu")
    ref = RefTrace(opts["--like"])
    cfg, extras = like_config(ref, flags, device)
    if device == "xla":
        from .trainer_xla import refusal

        why = refusal(cfg, extras)
        if why:
            raise UsageError(why)
    if cfg["model"].get("model_type") not in ("gpt2", "llama"):
        raise UsageError(
            "trainer: the Trainer path trains Hugging Face models, gpt2 and llama "
            f"(the reference trace's model is {cfg['model'].get('model_type')})"
        )
    import dataclasses

    import transformers

    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    if "train_sampling_strategy" not in fields:
        # the data order rests on it (the module docstring): without it the
        # Trainer shuffles, and the run would not be the reference's
        raise UsageError(
            f"trainer: transformers {transformers.__version__} has no TrainingArguments.train_sampling_strategy "
            "(a sequential sampler is how the Trainer replays the reference's batches)"
        )
    if cfg.get("freeze"):
        # FSDP1 under the Trainer: the callback's summon_full_params(with_grads=True) shows the
        # gradient FSDP1 computes for a frozen parameter, and nothing here freezes by name
        raise UsageError(
            f"trainer: the reference froze parameters (--freeze {cfg['freeze']!r}); the Trainer path does not "
            "freeze them or export their gradient as none yet (use run or check)"
        )
    if ref.lora:
        # the Trainer path builds the bare model: no PEFT adapters, no base frozen
        raise UsageError(
            "trainer: the reference trace is of a LoRA model (--lora); the Trainer path does not apply PEFT's "
            "adapters or freeze the base yet (use run or check)"
        )
    fsdp2 = fsdp2_only(cfg)
    if fsdp2:
        # the Trainer wraps through Accelerate, which sets no prefetch list or divide factor
        raise UsageError(
            f"trainer: the reference trace ran {', '.join(fsdp2)} (FSDP2's module setters), which the Trainer "
            "path does not apply (use run or check)"
        )
    if cfg["optimizer"]["kind"] != "adamw":
        raise UsageError("trainer: the Trainer path uses optim=adamw_torch (the reference trace uses sgd)")
    if cfg["optimizer"]["weight_decay"] != 0:
        raise UsageError(
            "trainer: the Trainer exempts biases and LayerNorm weights from weight decay and the "
            "reference decays every parameter: run the reference with --weight-decay 0"
        )
    fsdp = opts.get("--fsdp", "full_shard auto_wrap")
    words = fsdp.split()
    strat = {
        "full_shard": "full_shard",
        "shard_grad_op": "shard_grad_op",
        "no_shard": "no_shard",
        "hybrid_shard": "hybrid_shard",
        "hybrid_shard_zero2": "hybrid_shard_zero2",
    }
    ws = [w for w in words if w in strat]
    if len(ws) != 1 or any(w not in strat and w not in ("auto_wrap", "offload") for w in words):
        raise UsageError(f"--fsdp {fsdp!r}: expected one of {', '.join(strat)} plus auto_wrap [offload]")
    if strat[ws[0]] != cfg["strategy"]:
        raise UsageError(f"--fsdp {ws[0]}: the reference trace ran {cfg['strategy']}")
    if cfg.get("activation_checkpointing", "none") == "outside":
        # Accelerate's key and TrainingArguments' checkpointing both checkpoint the block inside its unit
        raise UsageError(
            "trainer: the reference checkpointed outside each unit (checkpoint(FSDP(block))); the Trainer "
            "checkpoints inside it (fsdp_config's activation_checkpointing, or --gradient-checkpointing)"
        )
    if world is not None:
        from .config import validate

        validate(cfg, world)
    # the first --fsdp-config file among the run flags, read as apply_flags read them (it took every one in turn)
    fsdp_cfg = next((v for f, v in run_flags(flags) if f == "--fsdp-config"), None)
    return TrainerArgs(ref, cfg, extras, opts["--trace"], fsdp, fsdp_cfg, device, bool(opts.get("--allow-ddp")))


def cmd_trainer(argv):
    rank, world = env.rank(), env.world()
    env.default_threads()
    try:
        a = parse(argv, world)
    except UsageError as e:
        return refuse(rank, str(e))
    from . import failure
    from .teardown import shutdown

    if a.device == "xla":  # one process drives the XLA devices: no process group to tear down
        from .trainer_xla import train as train_xla

        return failure.guarded(rank, lambda: train_xla(a))

    def body():
        try:
            rc = train(a)
        except BaseException:
            shutdown(meet=False)  # the other ranks may never get here
            raise
        shutdown(meet=True)  # Accelerate never destroys the group it made
        return rc

    return failure.guarded(rank, body)


def train(a):
    """Trains a (TrainerArgs) with the Trainer, writing the trace; returns the exit code."""
    import torch
    from transformers import Trainer

    from . import model as M
    from .trainer_args import training_arguments
    from .trainer_trace import Replay, TraceCallback, collate, replay_samples

    torch.set_num_threads(env.threads())
    world, rank = env.world(), env.rank()
    cfg, ref = a.cfg, a.ref
    mb = cfg["global_batch"] // world // cfg["grad_accum"]
    samples = replay_samples(ref, cfg, world, mb)  # ordered for Accelerate's interleaved batch sharding
    init = ref.init()
    model = M.build(cfg["model"])
    M.load_init(model, init, ref.names)
    ac = cfg.get("activation_checkpointing", "none")
    # Accelerate applies fsdp_config's key itself; otherwise the Trainer's own
    # (TrainingArguments.activation_checkpointing, gradient_checkpointing before 5.x)
    hf_ckpt = ac == "inside" and not a.extras.get("activation_checkpointing")
    forwards = M.count_block_forwards(model, cfg["model"]) if ac != "none" else None
    cb = TraceCallback(model, cfg, ref.names, optim_state_names(cfg), init, a.trace, rank, world)
    tmp = tempfile.mkdtemp(prefix="fsdpcheck-trainer-")
    targs = training_arguments(a, mb, tmp, hf_ckpt)
    trainer = Trainer(model=model, args=targs, train_dataset=Replay(samples), data_collator=collate, callbacks=[cb])
    cb.trainer = trainer
    try:
        trainer.train()
    finally:  # the Trainer's output_dir: it saves nothing there (save_strategy "no"), and it is left nowhere
        shutil.rmtree(tmp, ignore_errors=True)
    fsdp_applied = cb.wrapped_as in ("FullyShardedDataParallel",) or cb.wrapped_as.startswith("FSDP")
    if rank == 0:
        by = "trainer" if hf_ckpt else "fsdp_config"
        evidence = None if ac == "none" else {"placement": ac, "by": by, "block_forwards": forwards[0]}
        write_trace(a, world, cb.wrapped_as, fsdp_applied, evidence)
    if not fsdp_applied:
        if rank == 0:
            print(not_fsdp(a, trainer, cb.wrapped_as, world), file=sys.stderr)
        return 0 if a.allow_ddp else 2
    return 0


def write_trace(a, world, wrapped_as, fsdp_applied, checkpointing):
    """trace.json (rank 0): the config as run, and how the Trainer wrapped the model."""
    import torch.distributed as dist

    from . import tracefile
    from .trainer_args import trainer_info

    c = dict(a.cfg)
    c["impl"] = "hf-trainer"
    c["inject"] = "none"
    c["init"] = ""
    info = {
        **trainer_info(a, world, wrapped_as),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "fsdp_applied": fsdp_applied,
        "activation_checkpointing": checkpointing,
    }
    tracefile.write_trace_json(a.trace, "hf-trainer", world, a.cfg["steps"], c, a.ref.units, info)


def not_fsdp(a, trainer, wrapped_as, world):
    """The line that says the Trainer did not wrap the model in FSDP. Accelerate
    applies fsdp=/fsdp_config only for its multi-process accelerator types
    (MULTI_GPU, MULTI_HPU, MULTI_XPU, ...); elsewhere the Trainer silently wraps
    the model in DDP (seen: MULTI_CPU on the CPU, and one GPU under torchrun
    --nproc-per-node=1). The line names the type Accelerate chose, not a guess
    at why."""
    dtype = getattr(getattr(trainer, "accelerator", None), "distributed_type", None)
    dtype = getattr(dtype, "value", dtype)
    return (
        f"fsdpcheck-torch: the Trainer wrapped the model in {wrapped_as}, not FSDP: Accelerate's "
        f"distributed type was {dtype} at world size {world} (it applies fsdp= only to multi-process "
        f"accelerator types such as MULTI_GPU); the trace in {a.trace} "
        "is of that run" + ("" if a.allow_ddp else " (--allow-ddp accepts it)")
    )
