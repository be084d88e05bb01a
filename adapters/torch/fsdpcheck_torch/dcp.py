"""FSDP2's SHARDED_STATE_DICT checkpoints as torch writes them: what
`torch.distributed.checkpoint` saves with its Hugging Face storage
(`HuggingFaceStorageWriter(save_distributed=True)`), with fsdpcheck's manifest
beside it (docs/contract.md §6, "FSDP2 SHARDED checkpoint").

A checkpoint directory:
  shard-SSSSS-model-00001-of-00001.safetensors  torch's files, one per rank that
      holds tensors: the model's (model names, the tied LM head once) and the
      optimizer's as `get_optimizer_state_dict(flatten_optimizer_state_dict=True)`
      names them, "state.<name>.<state>" and AdamW's "state.<name>.step";
  config.json, fsdpcheck.json  written by rank 0 after torch's save returns:
      the model, the run config, the step and every file's size and SHA-256, so
      that `fsdpcheck run --load DIR` verifies and loads it at any W.

What DCP's Hugging Face storage cannot carry: the optimizer's param_groups
(lr, betas, weight decay). They are not tensors, and the writer puts a
non-tensor's bytes in front of the safetensors header, where no reader finds
them (measured with torch 2.15: the file no longer opens). They are saved
nowhere here; the manifest's config holds them and a loading run rebuilds
them from its own config.

save(run, model, optim, directory, step)    every rank
load(run, model, optim, directory) -> step  every rank; loads in place
import_checkpoint(src, dst, like, step)     one process: a DCP checkpoint in
    torch's default format (.distcp files and .metadata), read by torch's own
    FileSystemReader, written as the above
"""

import hashlib
import json
import os

import torch

from .config import FROZEN_CHECKPOINT, UsageError, optim_state_names
from .fileio import write_whole
from .model import clean_name

MANIFEST = "fsdpcheck.json"
CONFIG = "config.json"
FORMAT = "fsdpcheck-checkpoint"
SHARD_PREFIX = "shard-"
SUFFIX = ".safetensors"


def missing():
    """Why this torch cannot write or read FSDP2's sharded checkpoints, or None:
    HuggingFaceStorageWriter(save_distributed=...) came with torch 2.9."""
    import inspect

    try:
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed.checkpoint.hf_storage (DCP's Hugging Face storage)"
    if "save_distributed" not in inspect.signature(HuggingFaceStorageWriter.__init__).parameters:
        return f"torch {torch.__version__}'s HuggingFaceStorageWriter cannot save per-rank shards (save_distributed)"
    return None


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare_dir(directory):
    """The old manifest goes first, then the old checkpoint's files: a
    directory that a save did not finish never verifies (one process)."""
    os.makedirs(directory, exist_ok=True)
    man = os.path.join(directory, MANIFEST)
    if os.path.exists(man):
        os.unlink(man)
        for name in os.listdir(directory):
            if name == CONFIG or (name.startswith(SHARD_PREFIX) and name.endswith(SUFFIX)):
                os.unlink(os.path.join(directory, name))


def write_manifest(directory, cfg, step, world, strategy):
    """config.json, then the manifest over every file torch wrote (one process,
    after the save). cfg is the run config as a trace records it."""
    write_whole(os.path.join(directory, CONFIG), json.dumps(cfg["model"], indent=1), durable=True)
    names = sorted(n for n in os.listdir(directory) if n.startswith(SHARD_PREFIX) and n.endswith(SUFFIX))
    if not names:
        raise RuntimeError(f"{directory}: torch's save wrote no {SHARD_PREFIX}*{SUFFIX} file")
    files = []
    for n in [CONFIG, *names]:
        p = os.path.join(directory, n)
        files.append({"name": n, "bytes": os.path.getsize(p), "sha256": _sha256(p)})
    c = dict(cfg)
    c["inject"] = "none"  # a fault of the saving run is not part of the checkpoint
    c["init"] = ""
    man = {
        "format": FORMAT,
        "version": 1,
        "state_dict": "dcp",
        "step": step,
        "data_position": step,
        "world_size": world,
        "strategy": strategy,
        "model": cfg["model"].get("fsdpcheck_name", "model"),
        "optimizer": {"kind": cfg["optimizer"]["kind"], "state": optim_state_names(cfg)},
        "config": c,
        "files": files,
    }
    write_whole(os.path.join(directory, MANIFEST), json.dumps(man, indent=1), durable=True)


def manifest_of(directory):
    """A checkpoint's manifest as a dict, or None where there is no readable one."""
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            man = json.load(f)
    except (OSError, ValueError):
        return None
    return man if isinstance(man, dict) else None


def kind_of(directory):
    """The "state_dict" a checkpoint's manifest names, or None."""
    return (manifest_of(directory) or {}).get("state_dict")


def read_manifest(directory, cfg):
    """The manifest of a "dcp" checkpoint, every listed file's size and
    SHA-256 checked, for a run of cfg: returns its step. Raises UsageError."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a checkpoint manifest ({e})")
    if not isinstance(man, dict) or man.get("format") != FORMAT or man.get("state_dict") != "dcp":
        raise UsageError(f'{path}: not a "dcp" fsdpcheck checkpoint (FSDP2\'s sharded state dict)')
    for f in man.get("files", []):
        p = os.path.join(directory, os.path.basename(str(f.get("name"))))
        if not os.path.isfile(p) or os.path.getsize(p) != f.get("bytes") or _sha256(p) != f.get("sha256"):
            raise UsageError(f"{p}: missing, truncated or corrupted (its size or SHA-256 is not the manifest's)")
    saved = man.get("config", {})
    if (
        saved.get("model", {}).get("n_embd") != cfg["model"].get("n_embd")
        or saved.get("optimizer", {}).get("kind") != cfg["optimizer"]["kind"]
    ):
        raise UsageError(f"{path}: saved from another model or optimizer than this run's")
    step = man.get("step")
    if not isinstance(step, int) or step < 0:
        raise UsageError(f'{path}: "step" is not an integer >= 0')
    return step


def model_tensors(model, names):
    """The model's tensors by model name (sharded DTensors under FSDP2;
    clean_name strips wrapper prefixes), the tied LM head once (safetensors
    refuses two names of one storage)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    msd = {clean_name(k): v for k, v in get_model_state_dict(model).items()}
    missing = [n for n in names if n not in msd]
    if missing:
        raise RuntimeError(f"parameters {missing} missing from the model's state dict")
    return {n: msd[n] for n in names}


def optim_tensors(model, optim, names, state_names):
    """The optimizer's tensors under DCP's flattened names (AdamW's steps
    included), and the whole flattened state dict (for set_optimizer_state_dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(flatten_optimizer_state_dict=True))
    want = [f"state.{n}.{s}" for n in names for s in state_names]
    if state_names and state_names[0] == "exp_avg":
        want += [f"state.{n}.step" for n in names]
    missing = [k for k in want if k not in osd]
    if missing:
        raise RuntimeError(f"optimizer state {missing[:3]} missing from the flattened optimizer state dict")
    return {k: osd[k] for k in want}, osd


def save(run, model, optim, directory, step):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    if run.rank == 0:
        prepare_dir(directory)
    dist.barrier()
    sd = model_tensors(model, run.names)
    sd.update(optim_tensors(model, optim, run.names, run.state_names)[0])
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(directory, save_distributed=True))
    if run.rank == 0:  # the manifest last: only now is this a checkpoint
        write_manifest(directory, run.cfg, step, run.W, run.cfg["strategy"])
    dist.barrier()


def load(run, model, optim, directory, fault=None):
    """Loads a "dcp" checkpoint into model and optim in place through
    HuggingFaceStorageReader (torch reshards the rows to this W); returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    step = read_manifest(directory, run.cfg)
    msd = model_tensors(model, run.names)
    dcp.load(msd, storage_reader=HuggingFaceStorageReader(directory))
    # strict=False: the tied LM head is the embedding, loaded once under its name
    set_model_state_dict(model, msd, options=StateDictOptions(strict=False))
    if fault == "ckpt_drop_optim":
        return step  # the bug: the optimizer state is never restored
    tensors, osd = optim_tensors(model, optim, run.names, run.state_names)
    if tensors:
        dcp.load(tensors, storage_reader=HuggingFaceStorageReader(directory))
        osd.update(tensors)
        set_optimizer_state_dict(model, optim, osd, options=StateDictOptions(flatten_optimizer_state_dict=True))
    return step


# ---------------------------------------------------------------------- import
def _flatten(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


# where users keep the model and the optimizer in the state dict they save
PREFIXES = ("", "model.", "optim.", "optimizer.")


def _find(flat, key, what):
    hits = [p + key for p in PREFIXES if p + key in flat and torch.is_tensor(flat[p + key])]
    if len(hits) != 1:
        raise UsageError(
            f"{what} {key}: {'not found' if not hits else 'found twice'} in the checkpoint"
            + (
                ""
                if hits or not key.startswith("state.")
                else " (save the optimizer with get_optimizer_state_dict: its state is keyed by parameter name)"
            )
        )
    return flat[hits[0]]


def _pick(flat, names, state_names):
    """Model and optimizer tensors from a flattened state dict, under DCP's
    flattened names: the parameters, "state.<name>.<state>" and AdamW's steps."""
    out = {n: _find(flat, n, "parameter") for n in names}
    steps = ["step"] if state_names[:1] == ["exp_avg"] else []
    for n in names:
        for s in [*state_names, *steps]:
            out[f"state.{n}.{s}"] = _find(flat, f"state.{n}.{s}", "optimizer state")
    return out


class _quiet:
    """torch logs its fallbacks with tracebacks on the root logger
    (state_dict_loader.py) and warns; a refusal is one line."""

    def __enter__(self):
        import logging
        import warnings

        self.log = logging.getLogger()
        self.level = self.log.level
        self.log.setLevel(logging.CRITICAL)
        self.warn = warnings.catch_warnings()
        self.warn.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self.warn.__exit__(*exc)
        self.log.setLevel(self.level)
        return False


def _refused(src, e):
    why = [x.strip() for x in str(e).splitlines() if x.strip()]
    return UsageError(f"{src}: torch's DCP reader refuses it: {(why[-1] if why else type(e).__name__)[:300]}")


def _read_distcp(src, tmp):
    """DCP's default format (.distcp, .metadata), every tensor full."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    try:
        with _quiet():
            dcp_to_torch_save(src, os.path.join(tmp, "sd.pt"))
    # whatever torch's reader raises on a broken checkpoint (CheckpointException is a BaseException)
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        raise _refused(src, e)
    return torch.load(os.path.join(tmp, "sd.pt"), weights_only=True)


def _read_hf(src, names, state_names, init):
    """DCP's Hugging Face format written by torch without fsdpcheck's manifest:
    the model's and the optimizer's tensors under DCP's flattened names, full."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    sd = {n: torch.empty_like(init[n]) for n in names}
    for n in names:
        for s in state_names:
            sd[f"state.{n}.{s}"] = torch.empty_like(init[n])
        if state_names[:1] == ["exp_avg"]:
            sd[f"state.{n}.step"] = torch.zeros(())
    try:
        with _quiet():
            dcp.load(sd, storage_reader=HuggingFaceStorageReader(src))
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        raise _refused(src, e)
    return sd


def import_checkpoint(src, dst, like, step=None):
    """A DCP checkpoint torch wrote -> a "dcp" fsdpcheck checkpoint at W=1,
    through torch's own readers (dcp_to_torch_save for the default format,
    HuggingFaceStorageReader for the Hugging Face one) and writer
    (HuggingFaceStorageWriter), in one process."""
    import tempfile

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    from .tracefile import RefTrace

    hf = os.path.isdir(src) and any(n.endswith(SUFFIX) for n in os.listdir(src))
    if not os.path.isfile(os.path.join(src, ".metadata")) and not hf:
        raise UsageError(
            f"{src}: neither .metadata nor *.safetensors: not a checkpoint torch.distributed.checkpoint wrote"
        )
    ref = RefTrace(like)
    cfg = ref.meta["config"]
    if cfg.get("freeze"):
        raise UsageError(f"--like {like}: the run froze parameters (--freeze {cfg['freeze']!r}): {FROZEN_CHECKPOINT}")
    if ref.lora:
        raise UsageError(f"--like {like}: the run is of a LoRA model (its base frozen): {FROZEN_CHECKPOINT}")
    state_names = optim_state_names(cfg)
    init = ref.init()
    if os.path.isfile(os.path.join(src, ".metadata")):
        with tempfile.TemporaryDirectory() as tmp:
            picked = _pick(_flatten(_read_distcp(src, tmp)), ref.names, state_names)
    else:
        picked = _read_hf(src, ref.names, state_names, init)
    for n in ref.names:
        if tuple(picked[n].shape) != tuple(init[n].shape):
            raise UsageError(f"parameter {n}: shape {tuple(picked[n].shape)}, the model's is {tuple(init[n].shape)}")
    steps = {float(v) for k, v in picked.items() if k.endswith(".step")}
    if step is None:
        if len(steps) != 1:
            raise UsageError("--step K is needed: the checkpoint holds no single AdamW step count")
        step = int(steps.pop())
    elif steps and steps != {float(step)}:
        raise UsageError(f"--step {step}: the checkpoint's AdamW steps are {sorted(steps)}")
    tensors = {k: v.detach().float().contiguous() for k, v in picked.items()}
    if os.path.realpath(src) == os.path.realpath(dst):
        raise UsageError(f"{dst}: the destination is the source; import into another directory")
    prepare_dir(dst)
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(dst, save_distributed=True))
    write_manifest(dst, cfg, step, 1, "full_shard")
    return step, len(tensors)
