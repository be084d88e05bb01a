"""SPMD FSDPv2's layout and XLA's compiled collectives, held against the reference's theory.

Three questions about a `check --api fsdp2 --device xla` run, answered from files alone (no torch,
no torch_xla): did every parameter get FSDPv2's sharding (its largest dimension along "fsdp",
`_prepare_spmd_partition_spec(param, shard_maximal=True)`), read back into the trace's info
(`sharding_findings`); which collectives did XLA compile (`collectives`, from the HLO text that
XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text" writes); and how do the training graph's
collectives compare, per unit and pass, with the bytes the reference's FSDP2 layout moves (its
`run --comm-log`), which is the theory (`report`).

Bytes are counted per device and as the comm log counts them: the whole tensor a collective
covers (an all-gather's result, an all-reduce's operand, a reduce-scatter's operand).

`python -m fsdpcheck_torch.xla_layout DUMP_DIR TRACE_DIR COMMLOG` prints the report.
"""

import json
import math
import os
import re
import sys

from .errors import UsageError

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
DTYPE_BYTES.update({"s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16})
PASSES = ("forward_gather", "backward_gather", "grad_reduce")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_SPEC = re.compile(r"\{devices=\[([0-9,]+)\]([^ }]*)((?: [a-z_]+)*)\}")
# trivial ops an all-gather's operand may pass through on its way from an entry parameter
_PASS_THROUGH = ("bitcast", "copy", "reshape")


# ---- FSDPv2's sharding rule and XLA's sharding strings


def fsdpv2_dim(shape):
    """The dimension FSDPv2 shards along "fsdp": the largest, the first of equals; None for a 0-d tensor."""
    shape = list(shape)
    return shape.index(max(shape)) if shape else None


def fsdpv2_spec(shape, mesh_shape, axis_names, device_ids=None):
    """The HLO sharding string XLA reads back for a parameter of `shape` marked by FSDPv2's rule on the
    mesh (mesh_shape, axis_names, its device ids in mesh order, default 0..n-1): the largest dimension
    tiled along "fsdp", the other mesh axes of size > 1 replicated in one last tile dimension."""
    ids = list(device_ids) if device_ids is not None else list(range(math.prod(mesh_shape)))
    f = list(axis_names).index("fsdp")
    dim = fsdpv2_dim(shape)
    if dim is None or mesh_shape[f] == 1:
        return "{replicated}"
    rest = [a for a in range(len(mesh_shape)) if a != f and mesh_shape[a] > 1]
    tiles = [1] * len(shape)
    tiles[dim] = mesh_shape[f]
    if rest:
        tiles.append(math.prod(mesh_shape[a] for a in rest))
    # the mesh's device array transposed to (fsdp, the replicated axes in mesh order), flattened
    order = [f] + rest + [a for a in range(len(mesh_shape)) if a != f and a not in rest]
    strides = [math.prod(mesh_shape[a + 1 :]) for a in range(len(mesh_shape))]
    devs = []
    for idx in _indices([mesh_shape[a] for a in order]):
        devs.append(ids[sum(i * strides[a] for i, a in zip(idx, order))])
    tail = " last_tile_dim_replicate" if rest else ""
    return "{devices=[" + ",".join(map(str, tiles)) + "]" + ",".join(map(str, devs)) + tail + "}"


def _indices(dims):
    """Every index tuple of an array of `dims`, in row-major order."""
    out = [()]
    for d in dims:
        out = [i + (j,) for i in out for j in range(d)]
    return out


def parse_spec(spec):
    """An HLO sharding string as {"tiles": [..] or None (replicated), "replicate_last": bool,
    "devices": the device list or the iota text}; None for a form this does not read."""
    spec = spec.strip()
    if spec in ("{replicated}", "{}", ""):
        return {"tiles": None, "replicate_last": False, "devices": None}
    m = _SPEC.fullmatch(spec)
    if not m:
        return None
    devs = m.group(2)
    devices = [int(x) for x in devs.split(",")] if re.fullmatch(r"[0-9]+(,[0-9]+)*", devs) else devs
    return {
        "tiles": [int(x) for x in m.group(1).split(",")],
        "replicate_last": "last_tile_dim_replicate" in m.group(3),
        "devices": devices,
    }


def sharded_dims(spec, ndim):
    """The tensor dimensions an HLO sharding string tiles (more than one tile), or None when it is
    not a form parse_spec reads."""
    p = parse_spec(spec)
    if p is None:
        return None
    return [d for d, t in enumerate((p["tiles"] or [])[:ndim]) if t > 1]


def sharding_findings(info, shapes):
    """One line per parameter whose read-back sharding (trace.json's torch info: mesh, sharding) is
    not FSDPv2's rule for its shape (shapes: name -> shape); empty when every one is."""
    mesh = info.get("mesh")
    if not mesh or not isinstance(info.get("sharding"), dict):
        return ["the trace's info has no mesh or sharding: not an SPMD FSDPv2 run"]
    out = []
    for name, got in info["sharding"].items():
        if name not in shapes:
            out.append(f"{name}: read back {got}, but the trace has no shape for it")
            continue
        shape = list(shapes[name])
        want = fsdpv2_spec(shape, mesh["shape"], mesh["axes"])
        gd, wd = sharded_dims(got, len(shape)), sharded_dims(want, len(shape))
        if gd is None:
            out.append(f"{name} {shape}: read back {got}, a sharding this does not read; FSDPv2's rule gives {want}")
        elif gd != wd:
            out.append(
                f"{name} {shape}: sharded along {_dims_text(gd)} ({got}), FSDPv2's rule shards "
                f"{_dims_text(wd)} (its largest) ({want})"
            )
        elif got != want:
            out.append(f"{name} {shape}: read back {got}, FSDPv2's rule gives {want} (same dims, other devices)")
    return out


def _dims_text(dims):
    """'dim 1', 'dims 0, 1' or 'no dim (replicated)'."""
    if not dims:
        return "no dim (replicated)"
    return ("dim " if len(dims) == 1 else "dims ") + ", ".join(map(str, dims))


# ---- HLO text


def parse_shape(text):
    """The arrays of an HLO shape (an array or a tuple, nested or not) as [(dtype, [dims])]."""
    text = re.sub(r"/\*.*?\*/", "", text)
    return [(dt, [int(x) for x in re.findall(r"[0-9]+", dims)]) for dt, dims in _ARRAY.findall(text)]


def _closing(text, i):
    """The index just past the bracket that closes the one at text[i]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for j in range(i, len(text)):
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    return len(text)


def _split_top(text):
    """text split at its commas outside brackets."""
    out, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:j].strip())
            start = j + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def parse_instruction(line):
    """One HLO instruction line as {name, shape (the text), opcode, operands: [(name, shape text or
    None)], attrs: {key: text}}; None for a line that is not one."""
    m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    i = m.end()
    if line[i : i + 1] == "(":
        end = _closing(line, i)
    else:
        end = i + len(line[i:].split(" ", 1)[0])
    shape, rest = line[i:end], line[end:].lstrip()
    op = re.match(r"([a-z][\w\-]*)\(", rest)
    if not op:
        return None
    close = _closing(rest, op.end() - 1)
    operands = []
    for piece in _split_top(rest[op.end() : close - 1]):
        words = piece.split()
        operands.append((words[-1].lstrip("%"), " ".join(words[:-1]) or None))
    attrs = {}
    for a in _split_top(rest[close:].lstrip(", ")):
        k, _, v = a.partition("=")
        attrs[k.strip()] = v.strip()
    return {"name": m.group(1), "shape": shape, "opcode": op.group(1), "operands": operands, "attrs": attrs}


def parse_module(text):
    """An HLO module's text as {instructions: [every instruction, in order, with its computation],
    by_name, roots: computation -> its root's opcode, entry: the entry computation's name}."""
    insts, roots, comp, entry = [], {}, None, None
    for line in text.splitlines():
        head = re.match(r"(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            comp = head.group(2)
            entry = comp if head.group(1) else entry
            continue
        inst = parse_instruction(line)
        if inst is None:
            continue
        inst["computation"] = comp
        insts.append(inst)
        if line.lstrip().startswith("ROOT"):
            roots[comp] = inst["opcode"]
    return {"instructions": insts, "by_name": {i["name"]: i for i in insts}, "roots": roots, "entry": entry}


def replica_groups(text):
    """An HLO replica_groups attribute, {{0,1},{2,3}} or the iota form [G,S]<=[dims]T(perm), as lists."""
    if not text:
        return []
    if text.startswith("{"):
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", text[1:-1])]
    m = re.fullmatch(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", text)
    if not m:
        return []
    g, s = (int(x) for x in m.group(1).split(","))
    dims = [int(x) for x in m.group(2).split(",")]
    perm = [int(x) for x in m.group(3).split(",")] if m.group(3) else list(range(len(dims)))
    strides = [math.prod(dims[a + 1 :]) for a in range(len(dims))]
    flat = [sum(i * strides[a] for i, a in zip(idx, perm)) for idx in _indices([dims[a] for a in perm])]
    return [flat[k * s : (k + 1) * s] for k in range(g)]


def _arrays_bytes(arrays):
    """(elements, bytes) of a list of (dtype, dims)."""
    n = sum(math.prod(d) for _, d in arrays)
    return n, sum(math.prod(d) * DTYPE_BYTES.get(t, 0) for t, d in arrays)


def _collective(inst, mod):
    """A collective instruction as the record `collectives` lists; the result of an async -start is
    its -done's (the start's own shape holds its operands as well)."""
    base = inst["opcode"].removesuffix("-start")
    result = parse_shape(inst["shape"])
    if inst["opcode"].endswith("-start"):
        done = [i for i in mod["instructions"] if i["opcode"] == base + "-done" and i["operands"][0][0] == inst["name"]]
        result = parse_shape(done[0]["shape"]) if done else result[len(result) // 2 :]
    operands = []
    for name, shape in inst["operands"]:
        src = mod["by_name"].get(name)
        operands.append(parse_shape(shape) if shape else parse_shape(src["shape"]) if src else [])
    flat_ops = [a for o in operands for a in o]
    attrs = inst["attrs"]
    dims = attrs.get("dimensions")
    rec = {
        "op": base,
        "name": inst["name"],
        "async": inst["opcode"].endswith("-start"),
        "dtype": result[0][0] if result else None,
        "result": [d for _, d in result],
        "operands": [d for _, d in flat_ops],
        "operand_names": [n for n, _ in inst["operands"]],
        "dimensions": [int(x) for x in re.findall(r"[0-9]+", dims)] if dims else [],
        "replica_groups": replica_groups(attrs.get("replica_groups", "")),
        "source_target_pairs": replica_groups(attrs.get("source_target_pairs", "")),
        "combined": len(result) > 1,
        "reduction": mod["roots"].get(attrs.get("to_apply", "").lstrip("%")),
    }
    rec["result_elements"], rec["result_bytes"] = _arrays_bytes(result)
    rec["operand_elements"], rec["operand_bytes"] = _arrays_bytes(flat_ops)
    # the whole tensor it covers, as the comm log counts: an all-gather's result, else its operand
    rec["bytes"] = rec["result_bytes"] if base == "all-gather" else rec["operand_bytes"]
    return rec


def module_collectives(text):
    """The collectives of one HLO module's text, in its (scheduled) order; an async pair once."""
    mod = parse_module(text)
    wanted = set(COLLECTIVES) | {c + "-start" for c in COLLECTIVES}
    return [_collective(i, mod) for i in mod["instructions"] if i["opcode"] in wanted]


def hlo_files(dump_dir):
    """The after-optimizations HLO text files of a dump directory, sorted."""
    return sorted(f for f in os.listdir(dump_dir) if f.startswith("module_") and f.endswith("after_optimizations.txt"))


def collectives(dump_dir):
    """File name -> the collectives of each HLO module XLA dumped after optimizations."""
    out = {}
    for f in hlo_files(dump_dir):
        with open(os.path.join(dump_dir, f)) as fh:
            out[f] = module_collectives(fh.read())
    return out


# ---- the training graph's collectives against the reference's theory


def _entry_params(mod):
    """name -> (full padded dims, tiles) of each sharded entry parameter: its shard's dims times the
    tiles of its sharding."""
    out = {}
    for i in mod["instructions"]:
        if i["computation"] != mod["entry"] or i["opcode"] != "parameter" or "sharding" not in i["attrs"]:
            continue
        arrays = parse_shape(i["shape"])
        spec = parse_spec(i["attrs"]["sharding"])
        if len(arrays) != 1 or spec is None:
            continue
        dims = arrays[0][1]
        tiles = (spec["tiles"] or [1] * len(dims))[: len(dims)]
        out[i["name"]] = (tuple(d * t for d, t in zip(dims, tiles)), tuple(tiles))
    return out


def _source(mod, name):
    """The instruction a value comes from, through bitcasts, copies and reshapes."""
    inst = mod["by_name"].get(name)
    while inst is not None and inst["opcode"] in _PASS_THROUGH and len(inst["operands"]) == 1:
        inst = mod["by_name"].get(inst["operands"][0][0])
    return inst


def _hops_to_root(mod, name, limit):
    """Whether the value reaches the entry computation's ROOT within `limit` uses, through no dot,
    convolution, call or collective (a gradient on its way out of the graph does)."""
    entry = [i for i in mod["instructions"] if i["computation"] == mod["entry"]]
    users = {}
    for i in entry:
        for n, _ in i["operands"]:
            users.setdefault(n, []).append(i)
    stop = {"dot", "convolution", "call"} | set(COLLECTIVES) | {c + "-start" for c in COLLECTIVES}
    front, seen = [name], {name}
    for _ in range(limit):
        nxt = []
        for cur in front:
            for u in users.get(cur, []):
                if u is entry[-1]:
                    return True
                if u["opcode"] not in stop and u["name"] not in seen:
                    seen.add(u["name"])
                    nxt.append(u["name"])
        front = nxt
    return False


def _classify(text, params):
    """The collectives of one training graph, each piece of a combined one on its own, sorted into
    parameter all-gathers (the operand an entry parameter of a parameter's padded shape and tiles),
    gradient reductions (an all-reduce or reduce-scatter of a parameter's whole shape on its way out
    of the graph) and the rest. params: name -> {"key": (padded dims, tiles), "shape": [..]}."""
    mod = parse_module(text)
    entry = _entry_params(mod)
    keys = {p["key"] for p in params.values()}
    whole = {tuple(p["shape"]) for p in params.values()} | {p["key"][0] for p in params.values()}
    gathers, grads, other = [], [], []
    for c in module_collectives(text):
        pieces = list(zip(c["operand_names"], c["operands"], c["result"])) if c["combined"] else [None]
        matched = [_match_piece(mod, entry, keys, whole, c, p, gathers, grads) for p in pieces]  # every piece
        if not all(matched):
            other.append(c)
    return gathers, grads, other, len(entry)


def _match_piece(mod, entry, keys, whole, c, piece, gathers, grads):
    """Files one array of a collective (piece: operand name, operand dims, result dims; None for the
    whole of a single one) as a parameter gather or a gradient reduction; False when it is neither."""
    name, operand, result = piece or (c["operand_names"][0], c["operands"][0], c["result"][0])
    if c["op"] == "all-gather":
        src = _source(mod, name)
        key = entry.get(src["name"]) if src else None
        if key in keys:
            gathers.append({"key": key, "param": src["name"], "bytes": _piece_bytes(c, result)})
            return True
    reduce = c["op"] in ("all-reduce", "reduce-scatter") and operand and tuple(operand) in whole
    if reduce and _hops_to_root(mod, c["name"], 2):
        grads.append({"shape": tuple(operand), "op": c["op"], "bytes": _piece_bytes(c, operand)})
        return True
    return False


def _piece_bytes(c, dims):
    """Bytes of one array of a collective's dtype."""
    return math.prod(dims) * DTYPE_BYTES.get(c["dtype"], 0)


def theory(commlog):
    """unit -> {pass: bytes} of rank 0's first step in a reference comm log (JSON lines), and the
    bytes of its other collectives by op (a norm's all-reduce)."""
    events = []
    try:
        with open(commlog) as f:
            for line in f:
                if line.strip():
                    events.append(json.loads(line))
    except (OSError, ValueError) as e:
        raise UsageError(f"{commlog}: not a readable comm log ({e})")
    mine = [e for e in events if isinstance(e, dict) and e.get("rank") == 0]
    if not mine:
        raise UsageError(f"{commlog}: no event of rank 0")
    step = min(e.get("step", 0) for e in mine)
    units, other = {}, {}
    for e in mine:
        if e.get("step") != step or e.get("op") not in ("all_gather", "reduce_scatter", "all_reduce"):
            continue
        if e["op"] == "all_gather":
            p = "forward_gather" if e.get("phase") == "forward" else "backward_gather"
        elif e.get("unit", -1) >= 0:
            p = "grad_reduce"
        else:
            other[e["op"]] = other.get(e["op"], 0) + e["bytes"]
            continue
        u = units.setdefault(e["unit"], dict.fromkeys(PASSES, 0))
        u[p] += e["bytes"]
    return units, other


def load_trace(trace_dir):
    """(trace.json, name -> shape) of an XLA run's trace: TRACE_DIR or TRACE_DIR/torch (check --keep's)."""
    if os.path.isfile(os.path.join(trace_dir, "torch", "trace.json")):
        trace_dir = os.path.join(trace_dir, "torch")
    try:
        with open(os.path.join(trace_dir, "trace.json")) as f:
            tj = json.load(f)
        with open(os.path.join(trace_dir, "init.safetensors"), "rb") as f:
            head = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    except (OSError, ValueError) as e:
        raise UsageError(f"{trace_dir}: not a readable XLA trace ({e})")
    info = tj.get("torch") if isinstance(tj, dict) else None
    if not isinstance(info, dict) or not info.get("mesh") or not isinstance(tj.get("units"), list):
        raise UsageError(f"{trace_dir}: trace.json has no torch mesh or units (not a check --api fsdp2 --device xla)")
    head.pop("__metadata__", None)
    return tj, {k: v["shape"] for k, v in head.items()}


def _params(tj, shapes):
    """name -> {unit, shape, spec, key: (XLA's padded dims, tiles)} of every parameter the trace read back."""
    out = {}
    for u, unit in enumerate(tj["units"]):
        for name in unit.get("params", []):
            spec = tj["torch"]["sharding"].get(name, "{replicated}")
            shape = list(shapes.get(name, []))
            p = parse_spec(spec) or {"tiles": None}
            tiles = tuple((p["tiles"] or [1] * len(shape))[: len(shape)])
            padded = tuple(-(-d // t) * t for d, t in zip(shape, tiles))
            out[name] = {"unit": u, "shape": shape, "spec": spec, "key": (padded, tiles)}
    return out


def _attribute(params, gathers, grads):
    """Each parameter's bytes per pass, and per class of parameters alike in padded shape and tiles
    what the HLO did to them. A gather is its entry parameter's (each one's first forward, any later
    backward); a class's members share its bytes evenly, marked approximate where its members are in
    more than one unit and the HLO treats them unalike (it names no parameter)."""
    per_entry = {}
    for g in gathers:
        per_entry.setdefault((g["key"], g["param"]), []).append(g["bytes"])
    for p in params.values():
        p.update(bytes=dict.fromkeys(PASSES, 0.0), approx=dict.fromkeys(PASSES, False))
    classes = []
    for key in sorted({p["key"] for p in params.values()}):
        members = [p for p in params.values() if p["key"] == key]
        spread = len({m["unit"] for m in members}) > 1
        pats = [b for (k, _), b in per_entry.items() if k == key]
        mine = [g for g in grads if g["shape"] in (key[0], tuple(members[0]["shape"]))]
        uneven = len(pats) not in (0, len(members)) or len({tuple(b) for b in pats}) > 1
        shares = {
            "forward_gather": sum(b[0] for b in pats),
            "backward_gather": sum(sum(b[1:]) for b in pats),
            "grad_reduce": sum(g["bytes"] for g in mine),
        }
        for p in members:
            for k in PASSES:
                p["bytes"][k] += shares[k] / len(members)
            for k in ("forward_gather", "backward_gather"):
                p["approx"][k] = uneven and spread and shares[k] > 0
            p["approx"]["grad_reduce"] = len(mine) % len(members) != 0 and spread
        classes.append(
            {
                "shape": members[0]["shape"],
                "spec": members[0]["spec"],
                "padded": list(key[0]),
                "members": len(members),
                "gathered_once": sum(1 for b in pats if len(b) == 1),
                "gathered_more": sum(1 for b in pats if len(b) > 1),
                "grad_reductions": len(mine),
                "bytes": shares,
            }
        )
    return classes


def _graphs(dump_dir):
    """(training graph files and their text, the read-back modules' collective count and bytes): a
    graph is a module with collectives other than ReplicateShardedData (the host's reads)."""
    graphs, readback = [], {"modules": 0, "collectives": 0, "bytes": 0}
    for f, cs in collectives(dump_dir).items():
        if not cs:
            continue
        if "ReplicateShardedData" in f:
            readback["modules"] += 1
            readback["collectives"] += len(cs)
            readback["bytes"] += sum(c["bytes"] for c in cs)
            continue
        with open(os.path.join(dump_dir, f)) as fh:
            graphs.append((f, fh.read()))
    return graphs, readback


def report(dump_dir, trace_dir, commlog):
    """The training graphs' collectives against the reference's theory, per unit and pass, as a dict
    (format_report prints it)."""
    for path, what in ((dump_dir, "XLA dump directory"), (trace_dir, "trace directory")):
        if not os.path.isdir(path):
            raise UsageError(f"{path}: no such {what}")
    tj, shapes = load_trace(trace_dir)
    th_units, th_other = theory(commlog)
    params = _params(tj, shapes)
    graphs, readback = _graphs(dump_dir)
    if not graphs:
        raise UsageError(f"{dump_dir}: no HLO module after optimizations with a collective (XLA_FLAGS --xla_dump_to)")
    gathers, grads, other, entries = [], [], [], 0
    for _, text in graphs:
        g, r, o, n = _classify(text, params)
        gathers, grads, other, entries = gathers + g, grads + r, other + o, entries + n
    classes = _attribute(params, gathers, grads)
    units = []
    for u, unit in enumerate(tj["units"]):
        mine = [p for p in params.values() if p["unit"] == u]
        numel = sum(math.prod(p["shape"]) for p in mine)
        th = th_units.get(u, dict.fromkeys(PASSES, 0))
        units.append(
            {
                "unit": u,
                "name": unit.get("name") or "(root)",
                "params": len(mine),
                "theory": th,
                "hlo": {k: sum(p["bytes"][k] for p in mine) for k in PASSES},
                "approx": {k: any(p["approx"][k] for p in mine) for k in PASSES},
                # padding: the theory's, what its gather moves beyond the elements; XLA's, its padded shapes'
                "padding": {
                    "theory": th["forward_gather"] - 4 * numel if th["forward_gather"] else None,
                    "xla": 4 * sum(math.prod(p["key"][0]) - math.prod(p["shape"]) for p in mine),
                },
            }
        )
    d = {
        "world": tj.get("world_size"),
        "mesh": tj["torch"]["mesh"],
        "graphs": [f for f, _ in graphs],
        "sharded_entry_parameters": entries,
        "readback": readback,
        "sharding_findings": sharding_findings(tj["torch"], shapes),
        "units": units,
        "params": params,
        "classes": classes,
        "grad_ops": sorted({g["op"] for g in grads}),
        "other": _other(other),
        "theory_other": th_other,
    }
    d["notes"] = _notes(d, other)
    return d


def _other(other):
    """The collectives no parameter explains, by op: count, bytes, how many are combined (tuple-shaped)
    and how many are scalars (a loss's or a norm's)."""
    out = {}
    for c in other:
        o = out.setdefault(c["op"], {"count": 0, "bytes": 0, "combined": 0, "scalar": 0})
        o["count"] += 1
        o["bytes"] += c["bytes"]
        o["combined"] += c["combined"]
        o["scalar"] += all(not r for r in c["result"])
    return out


def _notes(d, other):
    """What matches the theory and what XLA does differently, in plain lines."""
    notes = []
    for u in d["units"]:
        for k in PASSES:
            if u["theory"][k] and u["theory"][k] == u["hlo"][k] and not u["approx"][k]:
                notes.append(f"matches: unit {u['unit']} {u['name']} {k.replace('_', ' ')}, {u['theory'][k]} B")
    if d["grad_ops"] and "reduce-scatter" not in d["grad_ops"]:
        notes.append(
            "differs: gradients are reduced by " + ", ".join(d["grad_ops"]) + " of the whole gradient (every device "
            "ends with all of it), where FSDP2 reduce-scatters (each rank its shard)"
        )
    never = [c for c in d["classes"] if c["gathered_once"] + c["gathered_more"] < c["members"]]
    if never:
        notes.append(
            "differs: parameters XLA never all-gathers, computing with their shards and moving activations "
            "instead: "
            + "; ".join(
                f"{c['members'] - c['gathered_once'] - c['gathered_more']} of {c['members']} {c['shape']} {c['spec']}"
                for c in never
            )
        )
    once = sum(c["gathered_once"] for c in d["classes"])
    if once and any(u["theory"]["backward_gather"] for u in d["units"]):
        notes.append(
            f"differs: {once} parameters are all-gathered once, in forward, and kept for backward (the theory "
            "gathers every non-root unit again in backward)"
        )
    for u in d["units"]:
        pad = u["padding"]
        if pad["theory"] is not None and pad["theory"] == pad["xla"] and pad["xla"]:
            notes.append(f"matches: unit {u['unit']} {u['name']} padding, {pad['xla']} B")
        elif pad["theory"] is not None and pad["theory"] != pad["xla"]:
            notes.append(
                f"differs: unit {u['unit']} {u['name']} padding: the theory's gather pads {pad['theory']} B "
                f"(dim-0 rows), XLA's padded shapes {pad['xla']} B (the largest dim)"
            )
    off0 = sorted({f"{c['shape']} along dim {fsdpv2_dim(c['shape'])}" for c in d["classes"] if fsdpv2_dim(c["shape"])})
    if off0:
        notes.append("differs: sharded along a dim other than 0 (FSDPv2's largest): " + "; ".join(off0))
    combined = {op: o["combined"] for op, o in d["other"].items() if o["combined"]}
    if combined:
        notes.append(
            "combined (tuple-shaped) collectives: "
            + ", ".join(f"{op} {n} of {d['other'][op]['count']}" for op, n in combined.items())
        )
    acts = {op: o for op, o in d["other"].items() if o["count"] > o["scalar"]}
    if acts:
        notes.append(
            "activations moved (no parameter's shape): "
            + ", ".join(f"{op} {o['count'] - o['scalar']} ({o['bytes']} B)" for op, o in acts.items())
        )
    scalars = sum(o["scalar"] for o in d["other"].values())
    if scalars:
        notes.append(f"scalar all-reduces (the loss's and its terms'): {scalars}")
    if d["readback"]["modules"]:
        rb = d["readback"]
        notes.append(
            f"not training: {rb['modules']} ReplicateShardedData modules ({rb['collectives']} all-gathers, "
            f"{rb['bytes']} B) read tensors back to the host for the trace"
        )
    return notes


def _b(x, approx):
    """Bytes for the table: whole where whole, '~' before an approximate (evenly shared) value."""
    return ("~" if approx else "") + (f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}")


def format_report(d):
    """The report's printable lines: the per-unit table, the other collectives, the findings, the notes."""
    lines = [
        (
            f"XLA SPMD FSDPv2, W={d['world']}, mesh {d['mesh']['shape']} {d['mesh']['axes']}: "
            f"{', '.join(d['graphs'])} ({d['sharded_entry_parameters']} sharded entry parameters)"
        ),
        (
            "bytes per device, the whole tensor each collective covers (as the comm log counts); "
            "~: shared evenly among parameters alike in shape (the HLO names none)"
        ),
        f"{'unit':<5} {'name':<18} {'pass':<16} {'theory B':>9} {'XLA B':>9}  verdict",
    ]
    tot = {k: [0, 0.0] for k in PASSES}
    for u in d["units"]:
        for k in PASSES:
            th, hl = u["theory"][k], u["hlo"][k]
            tot[k][0] += th
            tot[k][1] += hl
            verdict = "match" if th == hl and not u["approx"][k] else "differs"
            lines.append(
                f"{u['unit']:<5} {u['name'][:18]:<18} {k.replace('_', ' '):<16} {th:>9} "
                f"{_b(hl, u['approx'][k]):>9}  {verdict}"
            )
    for k in PASSES:
        verdict = "match" if tot[k][0] == tot[k][1] else "differs"
        lines.append(
            f"{'all':<5} {'':<18} {k.replace('_', ' '):<16} {tot[k][0]:>9} {_b(tot[k][1], False):>9}  {verdict}"
        )
    lines.append("gradient reductions: " + (", ".join(d["grad_ops"]) or "none matched"))
    lines.append(
        "per parameter class (alike in shape and sharding): members, gathered once / more, gradient reductions"
    )
    for c in d["classes"]:
        lines.append(
            f"  {c['shape']!s:<10} {c['spec']:<26} padded {c['padded']!s:<10} {c['members']:>3} "
            f"{c['gathered_once']:>3} / {c['gathered_more']}  {c['grad_reductions']:>3}"
        )
    lines.append("other collectives in the training graph(s):")
    for op, o in sorted(d["other"].items()):
        lines.append(f"  {op:<19} {o['count']:>4} x, {o['bytes']:>8} B, {o['combined']} combined, {o['scalar']} scalar")
    for op, b in sorted(d["theory_other"].items()):
        lines.append(f"theory's other collectives: {op} {b} B")
    lines += [f"sharding: {f}" for f in d["sharding_findings"]] or ["sharding: every parameter as FSDPv2's rule"]
    return lines + [f"- {n}" for n in d["notes"]]


USAGE = "usage: python -m fsdpcheck_torch.xla_layout DUMP_DIR TRACE_DIR COMMLOG"


def main(argv=None):
    """Prints the report; exit 2 with one line on a missing or bad path."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        d = report(*argv)
    except UsageError as e:
        print(f"xla_layout: {e}", file=sys.stderr)
        return 2
    print("\n".join(format_report(d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
