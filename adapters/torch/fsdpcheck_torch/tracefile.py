"""fsdpcheck traces (docs/contract.md §6).

Reading, through the `safetensors` package: a reference trace's trace.json,
init.safetensors and the batches of its step files. Writing (StepFile, below:
several ranks write one file): the same layout oracle/trace.c writes, so
`fsdpcheck compare` reads it unchanged: trace.json (format, version,
implementation, world size, first step, steps, config, units, plus a "torch"
object naming the API, torch version, device and backend), init.safetensors
(model names, F32) and step-NNNNNN.safetensors (loss, grad_norm when the run
clips (F64: what clip_grad_norm_ returned), batch.input, batch.target,
grad.<name>, param.<name>, optim.<state>.<name>).
"""

import json
import os

import torch
from safetensors import SafetensorError, safe_open

from . import lora as L
from . import strictjson, tracejson
from .errors import UsageError
from .fileio import write_whole

FORMAT = "fsdpcheck-trace"


def header(path):
    """A safetensors file's header (name -> {dtype, shape, data_offsets}),
    read with duplicate names refused: the safetensors package keeps one of
    two tensors of one name without a word, and the C reader refuses it."""

    try:
        with open(path, "rb") as f:
            n = f.read(8)
            if len(n) < 8:
                raise UsageError(f"{path}: shorter than the 8-byte header length (not a safetensors file)")
            size = int.from_bytes(n, "little")
            data = os.path.getsize(path) - 8 - size
            if data < 0:
                raise UsageError(f"{path}: header length {size} runs past the end of the file")
            raw = f.read(size)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}")
    try:
        h = strictjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: the header is not JSON ({e})")
    if not isinstance(h, dict):
        raise UsageError(f"{path}: the header is not a JSON object")
    h.pop("__metadata__", None)
    for k, v in h.items():
        offsets = v.get("data_offsets") if isinstance(v, dict) else None
        end = offsets[-1] if isinstance(offsets, list) and offsets else 0  # a malformed one: safetensors' to refuse
        if isinstance(end, int) and end > data:
            raise UsageError(f"{path}: tensor {k} runs past the end of the file ({end} > {data} bytes of data)")
    # the rest (offsets, sizes, dtypes) is safetensors' own check, at open
    try:
        with safe_open(path, "pt") as f:
            f.keys()
    except (OSError, SafetensorError) as e:  # safetensors raises its own error type
        raise UsageError(f"{path}: not a valid safetensors file ({e})")
    return h


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class RefTrace:
    """A reference trace opened for replay. Everything the run will read is
    checked here, before any rank starts: trace.json, init.safetensors and
    every step file's batch, so a broken trace is bad input (exit 2), never a
    failure halfway through training."""

    def __init__(self, directory):
        self.dir = directory
        self.meta = tracejson.read(directory)
        self.config = self.meta["config"]
        self.units = self.meta["units"]
        # model parameter names in registry order (the units list them all)
        self.names = [n for u in self.units for n in u["params"]]
        path, h = self._check_init()
        # the LoRA spec (a LoraSpec, None without), parsed once here and passed along from here;
        # one the reference would refuse is named before the model is built
        self.lora = L.parse(self.config["model"], os.path.join(directory, "trace.json"))
        self._check_model(path, h)
        self.shapes = {n: tuple(h[n]["shape"]) for n in self.names}  # checked against the model just built
        for step in range(self.meta["first_step"], self.meta["first_step"] + self.meta["steps"]):
            self._check_step(step)

    def _check_init(self):
        """init.safetensors against trace.json's units; returns its path and header."""
        path = os.path.join(self.dir, "init.safetensors")
        if not os.path.exists(path):
            raise UsageError(f"{path}: missing (an incomplete trace)")
        h = header(path)
        unit_names = set(self.names)
        if len(unit_names) != len(self.names):
            raise UsageError(f'{os.path.join(self.dir, "trace.json")}: a parameter is listed twice in "units"')
        missing = [n for n in self.names if n not in h]
        if missing:
            raise UsageError(f"{path}: parameter {missing[0]} is missing")
        extra = sorted(set(h) - unit_names)
        if extra:
            raise UsageError(f"{path}: tensor {extra[0]} is not a parameter trace.json lists")
        for u in self.units:
            got = sum(_numel(h[n]["shape"]) for n in u["params"])
            if got != u["numel"]:
                raise UsageError(f"{path}: unit {u['name']} has {got} elements, trace.json says numel {u['numel']}")
        for n in self.names:
            if h[n]["dtype"] != "F32":
                raise UsageError(f"{path}: {n} is {h[n]['dtype']}, a trace's initial weights are F32")
        return path, h

    def _check_model(self, path, h):
        """The model config.model describes, built on the meta device (no
        memory), with its adapters (self.lora): it must build, and have exactly
        the parameters init holds, each of its shape (the run loads init into it)."""
        from . import model as M

        where = os.path.join(self.dir, "trace.json")
        try:
            # PEFT's names (a LoRA model) as the trace writes them
            built = {M.trace_name(n): p for n, p in M.build_meta(self.config["model"], self.lora).named_parameters()}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RuntimeError) as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]  # torch's messages run over lines
            raise UsageError(f'{where}: "config.model" does not describe a model this adapter builds ({why})')
        for n in self.names:
            if n not in built:
                raise UsageError(f"{where}: parameter {n} is not in the model config.model describes")
            if list(built[n].shape) != list(h[n]["shape"]):
                raise UsageError(
                    f"{path}: {n} has shape {h[n]['shape']}, the model config.model describes has {list(built[n].shape)}"
                )
        extra = sorted(set(built) - set(self.names))
        if extra:
            raise UsageError(f"{where}: the model config.model describes has {extra[0]}, which the trace lacks")

    def _check_step(self, step):
        path = os.path.join(self.dir, f"step-{step:06d}.safetensors")
        if not os.path.exists(path):
            raise UsageError(f"{path}: missing (an incomplete trace)")
        h = header(path)
        B = self.config["global_batch"]
        for k in ("batch.input", "batch.target"):
            if k not in h:
                raise UsageError(f"{path}: no {k}")
            shape = h[k]["shape"]
            if not shape or shape[0] != B:
                raise UsageError(f"{path}: {k} has shape {shape}, the config's global batch is {B}")
        if h["batch.target"]["dtype"] not in ("I32", "I64"):
            raise UsageError(f"{path}: batch.target is {h['batch.target']['dtype']}, token ids are integers")

    def init(self):
        path = os.path.join(self.dir, "init.safetensors")
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)

    def batch(self, step):
        path = os.path.join(self.dir, f"step-{step:06d}.safetensors")
        try:
            with safe_open(path, "pt") as f:
                return f.get_tensor("batch.input"), f.get_tensor("batch.target")
        except (OSError, SafetensorError) as e:
            raise UsageError(f"{path}: cannot read the batch ({e})")


# safetensors' dtype names, and each dtype's element size
_DTYPES = {
    torch.float64: ("F64", 8),
    torch.int64: ("I64", 8),
    torch.float32: ("F32", 4),
    torch.int32: ("I32", 4),
}


class StepFile:
    """A safetensors file laid out before its tensors exist, so that several
    ranks can write their own rows of it: FSDP2's ranks each write their
    dim-0 shards where the full tensor's rows go (gather.write_shards), with
    no gather and no copy of the whole set on one rank.

    The safetensors package writes a file from whole tensors in one process
    (`save_file`), so the layout is made here, as the format defines it
    (github.com/huggingface/safetensors, README "Format"): an 8-byte
    little-endian header length N, N bytes of JSON (padded with spaces so
    the data starts 8-byte aligned) mapping each name to its dtype, shape and
    [begin, end) byte offsets in the data, which the tensors fill end to end.
    The 8-byte dtypes come first and every tensor starts aligned to its element
    size; the float32 tensors follow in the order given (a set's tensors in
    layout order, unit by unit: one contiguous [numel] image of the full flat
    buffer, as oracle/trace.c writes it).
    The package's own reader (`safe_open`: tests/gather_worker.py) and
    fsdpcheck's (every check) read the files made here.

    entries: [(name, dtype, shape)]. Rank 0 calls create(), the others open()
    after it (a barrier between); every rank write()s its parts; rank 0
    commit()s after the last write (a barrier before): the file appears under
    its name only then."""

    def __init__(self, path, entries, metadata):
        self.path, self.tmp = path, path + ".tmp"
        order = sorted(range(len(entries)), key=lambda i: -_DTYPES[entries[i][1]][1])  # stable: 8-byte ones first
        head, self.at, at = {"__metadata__": dict(metadata)}, {}, 0
        for i in order:
            name, dtype, shape = entries[i]
            code, size = _DTYPES[dtype]
            end = at + size * _numel(shape)
            head[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, end]}
            self.at[name] = (at, end, dtype)
            at = end
        raw = json.dumps(head, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.header = len(raw).to_bytes(8, "little") + raw
        self.size = len(self.header) + at
        self.fd = None

    def create(self):
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pwrite(self.header, 0)
        os.ftruncate(self.fd, self.size)

    def open(self):
        self.fd = os.open(self.tmp, os.O_RDWR)

    def write(self, name, t, first=0):
        """Writes t (contiguous rows of the tensor `name`, as its dtype) from
        row `first` on."""
        begin, end, dtype = self.at[name]
        t = t.detach().to("cpu", dtype).contiguous()
        data = memoryview(t.numpy()).cast("B") if t.numel() else b""
        rows = t.shape[0] if t.dim() else 1
        off = begin + (first * len(data) // rows if rows else 0)
        if off + len(data) > end:
            raise ValueError(f"{name}: rows {first}..{first + rows} run past the tensor in {self.path}")
        self._pwrite(data, len(self.header) + off)

    def _pwrite(self, data, off):
        while len(data):  # a write may be partial (Linux caps one at 2 GiB)
            n = os.pwrite(self.fd, data, off)
            data, off = data[n:], off + n

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def commit(self):
        self.close()
        os.replace(self.tmp, self.path)


def write_init(directory, tensors):
    os.makedirs(directory, exist_ok=True)
    for n in os.listdir(directory):
        if (n.startswith("step-") and n.endswith(".safetensors")) or n == "trace.json":
            os.unlink(os.path.join(directory, n))
    entries = [(k, torch.float32, tuple(v.shape)) for k, v in tensors.items()]
    f = StepFile(os.path.join(directory, "init.safetensors"), entries, {"format": FORMAT, "content": "init"})
    f.create()
    for k, v in tensors.items():
        f.write(k, v)
    f.commit()


def step_entries(names, shapes, state_names, batch_input, batch_target, clips):
    """What a step file holds, in its order: the scalars, the batch, then the
    gradient, parameter and optimizer state sets, each in layout order (names:
    the units' parameters, unit by unit)."""
    e = [("loss", torch.float32, ())]
    if clips:
        e.append(("grad_norm", torch.float64, ()))
    e += [("batch.input", batch_input.dtype, tuple(batch_input.shape))]
    e += [("batch.target", batch_target.dtype, tuple(batch_target.shape))]
    for prefix in ["grad", "param"] + [f"optim.{s}" for s in state_names]:
        e += [(f"{prefix}.{n}", torch.float32, tuple(shapes[n])) for n in names]
    return e


def step_file(directory, step, entries):
    path = os.path.join(directory, f"step-{step:06d}.safetensors")
    return StepFile(path, entries, {"format": FORMAT, "step": str(step)})


def write_scalars(f, loss, batch_input, batch_target, grad_norm):
    f.write("loss", torch.tensor(loss, dtype=torch.float32))
    if grad_norm is not None:
        f.write("grad_norm", torch.tensor(grad_norm, dtype=torch.float64))
    f.write("batch.input", batch_input)
    f.write("batch.target", batch_target)


def write_step(directory, step, loss, batch_input, batch_target, grads, params, states, names, state_names, grad_norm):
    """One process's step file from full tensors. grad_norm: the total norm
    clip_grad_norm_ returned (a float), or None when the run does not clip (a
    clipping run's trace must carry it)."""
    shapes = {n: tuple(params[n].shape) for n in names}
    f = step_file(
        directory, step, step_entries(names, shapes, state_names, batch_input, batch_target, grad_norm is not None)
    )
    f.create()
    try:
        write_scalars(f, loss, batch_input, batch_target, grad_norm)
        for n in names:
            f.write(f"grad.{n}", grads[n])
            f.write(f"param.{n}", params[n])
            for s in state_names:
                f.write(f"optim.{s}.{n}", states[s][n])
        f.commit()
    finally:
        f.close()


def write_trace_json(directory, implementation, world, steps, config, units, torch_info, first_step=0):
    j = {
        "format": FORMAT,
        "version": 1,
        "implementation": implementation,
        "world_size": world,
        "first_step": first_step,
        "steps": steps,
        "config": config,
        "units": units,
        "torch": torch_info,
    }
    path = os.path.join(directory, "trace.json")
    write_whole(path, json.dumps(j, indent=1))
