"""Full tensors on rank 0 from FSDP2's dim-0 shards, in one collective per set.

FSDP2 (`fully_shard`) keeps each parameter, its gradient and its optimizer
states as a DTensor: placements (Shard(0),) on a 1-D mesh of W ranks, or
(Replicate(), Shard(0)) on the (R, F) mesh of HSDP and of no_shard. Shard f of
a tensor with n rows holds rows [f c, min(n, (f + 1) c)) with c = ceil(n / F)
(torch.chunk: the last shards short or empty). `DTensor.full_tensor()` gathers
one tensor at a time to every rank: about 150 gloo all-gathers a set for
gpt2-124m, each rank receiving the whole model. Here every rank packs its local
shards, each padded to c rows, into one flat buffer [L] (L the same on every
rank) and one `dist.gather` brings them to rank 0, which cuts each tensor's
rows back out of the first F buffers (ranks 0..F-1: rank 0's shard group).

The layout is not assumed: every tensor's placements and every local row count
are checked against the rule on its rank, the ranks agree on the result (one
all-reduce), and any mismatch (another placement, a torch that shards
otherwise) takes `full_tensor()` for the whole set instead.

The buffers travel through shared memory when every rank runs on this host
with its buffer on the CPU (what `check` starts): each rank writes its buffer
to a file of its own in a /dev/shm folder rank 0 made, and rank 0 maps them,
faster than gloo's `dist.gather` (docs/measurements/check-cost.md). Elsewhere
(another host, a GPU buffer, no /dev/shm) `dist.gather` carries them.
FSDPCHECK_GATHER=collective forces `dist.gather` (the tests compare both).

A trace needs no full tensor in memory at all when the ranks share a file
system (one host): write_shards has each rank of rank 0's shard group write
its own rows of every tensor into the step file, where the full tensor's rows
go (tracefile.StepFile lays the file out before any rank writes). That is
what `recording` does for FSDP2 on one host; gather_full is what it does
elsewhere, and what FSDPCHECK_GATHER=collective or =shm asks for.
"""

import atexit
import os
import shutil
import socket
import tempfile

import torch
import torch.distributed as dist

from .env import gather_mode

_SHM = {"dir": None, "n": 0, "decided": False}


def shares_host():
    """Whether every rank runs on this host (one all-gather)."""
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, socket.gethostname())
    return all(h == seen[0] for h in seen)


def _shm_dir(buf):
    """The /dev/shm folder every rank writes to, or None: decided once, by every
    rank together, for a CPU buffer on a world that shares this host."""
    if _SHM["decided"]:
        return _SHM["dir"]
    _SHM["decided"] = True
    mine = (socket.gethostname(), os.access("/dev/shm", os.W_OK), buf.device.type == "cpu")
    allowed = gather_mode() != "collective"
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    ok = allowed and all(x == seen[0] and x[1] and x[2] for x in seen)
    d = [tempfile.mkdtemp(prefix="fsdpcheck-gather-", dir="/dev/shm") if ok and dist.get_rank() == 0 else None]
    dist.broadcast_object_list(d, src=0)
    _SHM["dir"] = d[0]
    if ok and dist.get_rank() == 0:
        atexit.register(shutil.rmtree, d[0], True)
    return _SHM["dir"]


def _gather_bufs(buf, rank):
    """Every rank's buf [L] on rank 0 (a list by rank), None elsewhere."""
    W = dist.get_world_size()
    d = _shm_dir(buf)
    if d is None:
        got = [torch.empty_like(buf) for _ in range(W)] if rank == 0 else None
        dist.gather(buf, got, dst=0)
        return got
    # a file name of its own per call: a rank writes its next buffer while rank 0 may still read this one
    _SHM["n"] += 1
    n = _SHM["n"]

    def path(f):
        return os.path.join(d, f"{n}-{f}.f32")

    if rank != 0:
        buf.numpy().tofile(path(rank))
    dist.barrier()
    if rank != 0:
        return None
    got = [buf]
    for f in range(1, W):
        got.append(torch.from_file(path(f), shared=True, size=buf.numel(), dtype=torch.float32))
        os.remove(path(f))  # the mapping stays valid until got is dropped
    return got


def dim0_rows(n, F, f):
    """Rows of shard f of F of a tensor with n rows (torch.chunk's split)."""
    c = -(-n // F)
    return max(0, min(c, n - f * c))


def _local_rows(t, F):
    """(shard index, padded rows c) of a DTensor sharded as FSDP2 shards, or
    None when its placements or local size are not that rule's."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(t, DTensor) or t.numel() == 0:
        return None
    mesh = t.device_mesh
    if tuple(t.placements) not in ((Shard(0),), (Replicate(), Shard(0))) or mesh.size(-1) != F:
        return None
    if mesh.mesh.reshape(-1, F)[0].tolist() != list(range(F)):  # rank 0's shard group: ranks 0..F-1
        return None
    f = mesh.get_coordinate()[-1]
    if t.to_local().shape[0] != dim0_rows(t.shape[0], F, f):
        return None
    return f, -(-t.shape[0] // F)


def _full_each(named):
    """The slow path: full_tensor() of every tensor, fp32 on the CPU."""
    out = {}
    for n, t in named:
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[n] = t.detach().float().cpu().clone()
    return out


def _agreed_rows(named, F):
    """Every tensor's (shard index, padded rows) by the rule, or None when any
    tensor on any rank is not sharded so (the ranks agree: one all-reduce)."""
    dev = named[0][1].to_local().device if hasattr(named[0][1], "to_local") else named[0][1].device
    rows = [_local_rows(t, F) for _, t in named]
    ok = torch.tensor([int(all(r is not None for r in rows))], dtype=torch.int32, device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return rows if ok.item() else None


def write_shards(f, prefix, named, F, rank):
    """Writes a set into the step file f (tracefile.StepFile, open on every
    rank): each rank of rank 0's shard group its own rows of every tensor,
    at their place in the full tensor, the ranks of other replicas nothing.
    Returns False, having written nothing, when the set is not sharded by
    the rule on every rank (then gather_full and rank 0 write it)."""
    if not named:
        return True
    rows = _agreed_rows(named, F)
    if rows is None:
        return False
    if rank < F:  # rank 0's shard group (_local_rows checked the mesh): one writer for each row
        for (n, t), (fi, c) in zip(named, rows):
            loc = t.to_local()
            if loc.numel():
                f.write(f"{prefix}.{n}", loc.float(), first=fi * c)
    return True


def gather_full(named, F, rank):
    """named: [(name, DTensor)] on every rank, in the same order. Returns
    {name: full fp32 CPU tensor} on rank 0 and {} elsewhere (the slow path
    returns them everywhere); F is the shard group size of the run's mesh."""
    if not named:
        return {}
    rows = _agreed_rows(named, F)
    if rows is None:
        return _full_each(named)
    parts = []
    for (_, t), (f, c) in zip(named, rows):
        width = t.numel() // t.shape[0]  # elements a row (a shard may have no rows)
        loc = t.to_local().detach().float().reshape(-1, width)
        pad = c - loc.shape[0]
        parts.append(torch.nn.functional.pad(loc, (0, 0, 0, pad)).reshape(-1) if pad else loc.reshape(-1))
    buf = torch.cat(parts)  # [L]: the same length on every rank
    got = [buf] if F == 1 else _gather_bufs(buf, rank)  # F = 1: every rank holds whole tensors, rank 0's own
    if rank != 0:
        return {}
    out, at = {}, 0
    for (n, t), (_, c) in zip(named, rows):
        shape = tuple(t.shape)
        width = t.numel() // shape[0]
        pieces = [got[f][at : at + dim0_rows(shape[0], F, f) * width] for f in range(F)]
        out[n] = torch.cat(pieces).reshape(shape).cpu()
        at += c * width
    return out
