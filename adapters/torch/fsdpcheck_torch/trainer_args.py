"""TrainingArguments for the Trainer path (trainer.py, and trainer_xla.py on XLA devices)."""


def training_arguments(a, mb, output_dir, hf_ckpt):
    """TrainingArguments that make the Trainer train exactly the reference's steps
    (trainer.py's docstring): the trace's optimizer with a constant schedule, no
    clipping (the callback clips), the data in order, FSDP as --fsdp and the
    fsdp_config file say. On XLA the dtypes are the fsdp_config's
    xla_fsdp_settings (bf16=True would add autocast on top)."""
    import dataclasses

    from transformers import TrainingArguments

    cfg, o = a.cfg, a.cfg["optimizer"]
    ckpt_kw = {}
    if hf_ckpt:
        key = "activation_checkpointing"
        if key not in {f.name for f in dataclasses.fields(TrainingArguments)}:
            key = "gradient_checkpointing"  # its name before transformers 5
        ckpt_kw = {key: True, f"{key}_kwargs": {"use_reentrant": False}}
    return TrainingArguments(
        **ckpt_kw,
        output_dir=output_dir,
        max_steps=cfg["steps"],
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=cfg["grad_accum"],
        learning_rate=o["lr"],
        weight_decay=o["weight_decay"],
        adam_beta1=o["beta1"],
        adam_beta2=o["beta2"],
        adam_epsilon=o["eps"],
        optim="adamw_torch",
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=0.0,
        fsdp=a.fsdp,
        fsdp_config=a.fsdp_config,
        train_sampling_strategy="sequential",
        remove_unused_columns=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=a.device == "cpu",
        bf16=cfg["param_dtype"] == "bf16" and a.device != "xla",
        fp16=cfg["param_dtype"] == "fp16" and a.device != "xla",
    )


def trainer_info(a, world, wrapped_as):
    """trace.json's torch info every Trainer run records: how it was asked to wrap, the versions that
    ran, the reference it replayed and what the Trainer wrapped the model in."""
    import os

    import accelerate
    import torch

    from .env import installed_version

    return {
        "api": "hf-trainer",
        "fsdp": a.fsdp,
        "fsdp_config": a.fsdp_config,
        "torch_version": torch.__version__,
        "transformers_version": installed_version("transformers"),
        "accelerate_version": accelerate.__version__,
        "device": a.device,
        "world_size": world,
        "like": os.path.abspath(a.ref.dir),
        "wrapped_as": wrapped_as,
    }
