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
optimizer state, and rank 0 writes the step file.
"""

import os
import shutil
import sys
import tempfile

from .config import UsageError, fsdp2_only, like_config, lora_of, optim_state_names
from .errors import refuse

OWN = {"--like": True, "--trace": True, "--fsdp": True, "--device": True, "--allow-ddp": False}


def parse(argv, world):
    from .flags import split_args
    from .tracefile import RefTrace

    opts, flags = split_args(argv, OWN)
    for k in ("--like", "--trace"):
        if k not in opts:
            raise UsageError(f"trainer: {k} is required")
    device = opts.get("--device", "cpu")
    ref = RefTrace(opts["--like"])
    cfg, extras = like_config(ref.meta, flags, device)
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
    if lora_of(cfg):
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
    return opts, cfg, ref, extras, fsdp


def cmd_trainer(argv):
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        opts, cfg, ref, extras, fsdp = parse(argv, world)
    except UsageError as e:
        return refuse(rank, str(e))
    from . import failure
    from .teardown import shutdown

    def body():
        try:
            rc = train(opts, cfg, ref, extras, fsdp, argv)
        except BaseException:
            shutdown(meet=False)  # the other ranks may never get here
            raise
        shutdown(meet=True)  # Accelerate never destroys the group it made
        return rc

    return failure.guarded(rank, body)


def _fsdp_config_for_trainer(argv):
    """The fsdp_config file as given (the Trainer reads it itself)."""
    for i, a in enumerate(argv):
        if a == "--fsdp-config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def train(opts, cfg, ref, extras, fsdp, argv):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from . import model as M
    from . import tracefile
    from .engine import clean_name, clip_grad_norm

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    B, K, steps = cfg["global_batch"], cfg["grad_accum"], cfg["steps"]
    mb = B // world // K
    names = ref.names
    state_names = optim_state_names(cfg)
    out = opts["--trace"]

    # the data, ordered for Accelerate's interleaved batch sharding
    samples = []
    batches = [ref.batch(t) for t in range(steps)]
    for t in range(steps):
        inp, tgt = batches[t]
        for k in range(K):
            for r in range(world):
                lo = r * (B // world) + k * mb
                for i in range(lo, lo + mb):
                    samples.append((inp[i].long(), tgt[i].long()))

    class Replay(Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            x, y = samples[i]
            return {"input_ids": x, "labels": y, "shift_labels": y}

    def collate(items):
        return {k: torch.stack([it[k] for it in items]) for k in items[0]}

    init = ref.init()
    model = M.build(cfg["model"])
    M.load_init(model, init, names)
    ac = cfg.get("activation_checkpointing", "none")
    # Accelerate applies fsdp_config's key itself; otherwise the Trainer's own
    # (TrainingArguments.activation_checkpointing, gradient_checkpointing before 5.x)
    hf_ckpt = ac == "inside" and not extras.get("activation_checkpointing")
    forwards = M.count_block_forwards(model, cfg["model"]) if ac != "none" else None

    class TraceCallback(TrainerCallback):
        def __init__(self):
            self.losses, self.grads, self.inputs, self.grad_norm = [], None, [], None
            self.wrapped_as, self.trainer = "?", None

        def on_train_begin(self, args, state, control, **kw):
            def hook(module, a, kwargs, output):
                y = kwargs["shift_labels"]
                lg = output.logits.detach().float()
                self.losses.append(float(F.cross_entropy(lg.view(-1, lg.shape[-1]), y.view(-1))))
                self.inputs.append((kwargs["input_ids"].detach().cpu(), y.detach().cpu()))

            model.register_forward_hook(hook, with_kwargs=True)
            if rank == 0:
                tracefile.write_init(out, {n: init[n] for n in names})

        def _full(self, m, grads):
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

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.wrapped_as = type(self.trainer.model_wrapped).__name__
            self.grads, fsdp1 = self._full(model, True)
            self.grad_norm = clip_grad_norm(model, cfg, fsdp1) if cfg["clip_grad_norm"] > 0 else None

        def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kw):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            params, _ = self._full(model, False)
            opt = getattr(optimizer, "optimizer", optimizer)
            # cpu_offload=False on the CPU: see engine.full_optim_state (FSDP1 aliasing)
            osd = get_optimizer_state_dict(
                model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=False)
            )
            step = state.global_step  # steps done before this one
            lt = torch.tensor([sum(self.losses) / len(self.losses)], dtype=torch.float64)
            dist.all_reduce(lt)
            xs = torch.cat([x for x, _ in self.inputs])
            ys = torch.cat([y for _, y in self.inputs])
            px = [torch.empty_like(xs) for _ in range(world)]
            py = [torch.empty_like(ys) for _ in range(world)]
            dist.all_gather(px, xs)
            dist.all_gather(py, ys)
            if rank == 0:
                st = osd["state"]
                states = {s: {n: st[n][s] for n in names} for s in state_names}
                # rank r's K micro-batches in order are its B/W samples in order
                tracefile.write_step(
                    out,
                    step,
                    float(lt.item()) / world,
                    torch.cat(px).to(torch.int32),
                    torch.cat(py).to(torch.int32),
                    self.grads,
                    params,
                    states,
                    names,
                    state_names,
                    self.grad_norm,
                )
                print(f"step {step}: loss {float(lt.item()) / world:.6f}", flush=True)
            self.losses, self.inputs = [], []

    o = cfg["optimizer"]
    tmp = tempfile.mkdtemp(prefix="fsdpcheck-trainer-")
    fsdp_cfg = _fsdp_config_for_trainer(argv)
    ckpt_kw = {}
    if hf_ckpt:
        import dataclasses

        key = "activation_checkpointing"
        if key not in {f.name for f in dataclasses.fields(TrainingArguments)}:
            key = "gradient_checkpointing"  # its name before transformers 5
        ckpt_kw = {key: True, f"{key}_kwargs": {"use_reentrant": False}}
    targs = TrainingArguments(
        **ckpt_kw,
        output_dir=tmp,
        max_steps=steps,
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=K,
        learning_rate=o["lr"],
        weight_decay=o["weight_decay"],
        adam_beta1=o["beta1"],
        adam_beta2=o["beta2"],
        adam_epsilon=o["eps"],
        optim="adamw_torch",
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=0.0,
        fsdp=fsdp,
        fsdp_config=fsdp_cfg,
        train_sampling_strategy="sequential",
        remove_unused_columns=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=opts.get("--device", "cpu") == "cpu",
        bf16=cfg["param_dtype"] == "bf16",
        fp16=cfg["param_dtype"] == "fp16",
    )
    cb = TraceCallback()
    trainer = Trainer(model=model, args=targs, train_dataset=Replay(), data_collator=collate, callbacks=[cb])
    cb.trainer = trainer
    try:
        trainer.train()
    finally:  # the Trainer's output_dir: it saves nothing there (save_strategy "no"), and it is left nowhere
        shutil.rmtree(tmp, ignore_errors=True)
    fsdp_applied = cb.wrapped_as in ("FullyShardedDataParallel",) or cb.wrapped_as.startswith("FSDP")
    if rank == 0:
        from importlib.metadata import version

        c = dict(cfg)
        c["impl"] = "hf-trainer"
        c["inject"] = "none"
        c["init"] = ""
        import accelerate

        info = {
            "api": "hf-trainer",
            "fsdp": fsdp,
            "fsdp_config": fsdp_cfg,
            "torch_version": torch.__version__,
            "transformers_version": version("transformers"),
            "accelerate_version": accelerate.__version__,
            "device": opts.get("--device", "cpu"),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "world_size": world,
            "like": os.path.abspath(ref.dir),
            "wrapped_as": cb.wrapped_as,
            "fsdp_applied": fsdp_applied,
            "activation_checkpointing": None
            if ac == "none"
            else {"placement": ac, "by": "trainer" if hf_ckpt else "fsdp_config", "block_forwards": forwards[0]},
        }
        tracefile.write_trace_json(out, "hf-trainer", world, steps, c, ref.units, info)
    if not fsdp_applied:
        # Accelerate applies fsdp=/fsdp_config only for its multi-process
        # accelerator types (MULTI_GPU, MULTI_HPU, MULTI_XPU, ...); elsewhere the
        # Trainer silently wraps the model in DDP. Seen: MULTI_CPU on the CPU,
        # and on one H200 under torchrun --nproc-per-node=1 (2026-11-25). The
        # line names the type Accelerate chose, not a guess at why.
        if rank == 0:
            dtype = getattr(getattr(trainer, "accelerator", None), "distributed_type", None)
            dtype = getattr(dtype, "value", dtype)
            print(
                f"fsdpcheck-torch: the Trainer wrapped the model in {cb.wrapped_as}, not FSDP: Accelerate's "
                f"distributed type was {dtype} at world size {world} (it applies fsdp= only to multi-process "
                f"accelerator types such as MULTI_GPU); the trace in {out} "
                "is of that run" + ("" if opts.get("--allow-ddp") else " (--allow-ddp accepts it)"),
                file=sys.stderr,
            )
        return 0 if opts.get("--allow-ddp") else 2
    return 0
