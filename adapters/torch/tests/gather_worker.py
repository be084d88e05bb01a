"""One rank of test_gather.py (started by torchrun, gloo on the CPU): for every
mesh a world of W ranks can have in the adapter ((W,) FSDP, (W/F, F) HSDP and
(W, 1) FSDP2 no_shard), fully_shard a module whose parameters have 7, 5, 3 and
1 rows (so shards are uneven or empty), and check that gather_full gives rank 0
exactly full_tensor()'s bits and the other ranks nothing. A tensor sharded on
dim 1 must take the full_tensor() path and still be exact. write_shards, each
rank writing its rows into one step file (tracefile.StepFile), must give a file
whose every tensor safetensors' own reader reads back as full_tensor()'s bits,
and must refuse (write nothing) a set with a dim-1 tensor. Each rank counts its
failures; the counts are summed, and the run exits 1 if any rank failed."""

import os
import sys

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from fsdpcheck_torch import gather, tracefile
from fsdpcheck_torch.gather import dim0_rows, gather_full, write_shards
from fsdpcheck_torch.teardown import shutdown


def meshes(W):
    yield (W,), ("shard",)
    yield (W, 1), ("replicate", "shard")
    if W % 2 == 0 and W > 2:
        yield (W // 2, 2), ("replicate", "shard")


def check_write_shards(shape, mesh, named, full, F, rank, expect):
    """Two sets (the parameters, and their doubles) written by every rank's
    shards into one file (in the working directory, which every rank shares)."""
    doubled = [(n, p * 2) for n, p in named]
    entries = [("loss", torch.float32, ())] + [
        (f"{s}.{n}", torch.float32, tuple(p.shape)) for s in ("a", "b") for n, p in named
    ]
    path = f"shards-{'x'.join(map(str, shape))}.safetensors"
    f = tracefile.StepFile(path, entries, {"format": "test"})
    if rank == 0:
        f.create()
    dist.barrier()
    if rank != 0:
        f.open()
    wrote = [write_shards(f, "a", named, F, rank), write_shards(f, "b", doubled, F, rank)]
    expect(wrote == [True, True], f"mesh {shape}: write_shards refused FSDP2's own layout")
    x = torch.arange(15.0).reshape(3, 5)
    odd = distribute_tensor(x, mesh, [Shard(1)] if len(shape) == 1 else [Replicate(), Shard(1)])
    expect(not write_shards(f, "a", [*named, ("odd", odd)], F, rank), f"mesh {shape}: a dim-1 tensor was written")
    if rank == 0:
        f.write("loss", torch.tensor(1.5))
    dist.barrier()
    if rank == 0:
        f.commit()
        with safe_open(path, "pt") as r:
            expect(sorted(r.keys()) == sorted(e[0] for e in entries), f"mesh {shape}: names {sorted(r.keys())}")
            for n, want in full.items():
                expect(torch.equal(r.get_tensor(f"a.{n}"), want), f"mesh {shape}: a.{n} written by the shards")
                expect(torch.equal(r.get_tensor(f"b.{n}"), want * 2), f"mesh {shape}: b.{n} written by the shards")
        os.unlink(path)
    else:
        f.close()
    dist.barrier()


def main():
    dist.init_process_group("gloo")
    W, rank = dist.get_world_size(), dist.get_rank()
    fails = 0

    def expect(ok, what):
        nonlocal fails
        if not ok:
            fails += 1
            print(f"rank {rank}: FAIL {what}", file=sys.stderr, flush=True)

    # torch.chunk's split, which FSDP2 shards by
    for n in range(9):
        for F in range(1, 5):
            want = [c.shape[0] for c in torch.arange(n).chunk(F)] if n else []
            want += [0] * (F - len(want))
            expect([dim0_rows(n, F, f) for f in range(F)] == want, f"dim0_rows({n}, {F})")
    for shape, names in meshes(W):
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        F = shape[-1]
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Embedding(7, 3), torch.nn.Linear(3, 5), torch.nn.Linear(5, 1))
        fully_shard(m, mesh=mesh)
        named = [(n, p) for n, p in m.named_parameters()]
        full = {n: p.full_tensor() for n, p in named}
        got = gather_full(named, F, rank)
        if rank == 0:
            expect(sorted(got) == sorted(full), f"mesh {shape}: names {sorted(got)}")
            for n, want in full.items():
                g = got.get(n)
                expect(g is not None and g.dtype == torch.float32 and torch.equal(g, want), f"mesh {shape}: {n}")
        else:
            expect(got == {}, f"mesh {shape}: rank {rank} got tensors")
        # dim 1: not FSDP2's rule, so every tensor of the set goes through full_tensor()
        x = torch.arange(15.0).reshape(3, 5)
        odd = distribute_tensor(x, mesh, [Shard(1)] if len(shape) == 1 else [Replicate(), Shard(1)])
        got = gather_full([*named, ("odd", odd)], F, rank)
        expect("odd" in got and torch.equal(got["odd"], x), f"mesh {shape}: the dim-1 tensor")
        expect(all(torch.equal(got[n], full[n]) for n in full), f"mesh {shape}: the set beside the dim-1 tensor")
        check_write_shards(shape, mesh, named, full, F, rank, expect)
    # the transport taken, and no buffer file left behind in its /dev/shm folder
    shm = gather._SHM["dir"]
    if rank == 0 and shm:
        expect(os.listdir(shm) == [], f"files left in {shm}: {os.listdir(shm)}")
    total = torch.tensor([fails])
    dist.all_reduce(total)
    if rank == 0:
        print(f"gather_worker W={W}: transport {'shm' if shm else 'collective'}", flush=True)
        print(f"gather_worker W={W}: {int(total.item())} failures", flush=True)
    # the adapter's own teardown (teardown.py): destroy_process_group alone can let gloo's
    # threads outlive the interpreter ("terminate called without an active exception")
    shutdown(meet=True)
    return 1 if total.item() else 0


if __name__ == "__main__":
    sys.exit(main())
