#!/usr/bin/env python3
"""Writes the bad-input corpus, tests/bad_input/<kind>/, and its index CASES.

    tests/bad_input/make_corpus.py FSDPCHECK [MPIEXEC]

Standard library only. Every case is a file a user could have: a config.json,
an fsdp_config.json, a safetensors file, a trace.json, a checkpoint's
manifest or data file, each broken in one way. Cases of files that live in a
directory (a trace, a checkpoint) hold only the files that differ from a
good directory written by `fsdpcheck run`; tests/bad_input/run.sh writes that
directory the same way (run is deterministic) and lays the case over it:

    trace       fsdpcheck run --model mlp-micro --steps 2 --trace T          (W=1)
    ckpt        fsdpcheck run --model mlp-micro --steps 2 --save C           (full state dict, W=1)
    ckpt_w2     mpiexec -n 2 fsdpcheck run --model mlp-micro --strategy full_shard --steps 2
                    --save C --state-dict sharded                            (two shard files)

The dcp_* cases of both ckpt kinds are FSDP2's DCP checkpoints: the files of
`fsdpcheck ckpt convert C D --to dcp --world-size 2` (a manifest and two
shard-SSSSS-model-00001-of-00001.safetensors, each one row of every
parameter and state, AdamW's steps in the first), one thing broken in each,
laid over C (or C2) like any case: the DCP manifest lists its own files, and
config.json is the same as C's.

(mlp-micro, 3-2-2: the smallest model, so the corpus stays small; --init's
cases are variants of T/init.safetensors, and run.sh reads them with
--model mlp-micro.) JSON files are written compactly, on one line.

A data file that is broken inside while its manifest entry still matches
(size and SHA-256) comes with the manifest rewritten for it, so the case
reaches the check behind the hashes; such a manifest holds the good files'
hashes too, which is why this script regenerates every case from fresh good
directories (re-run it after a change to what run writes).

CASES has one line per case, tab-separated:
    kind  path  names  expect
kind says how run.sh feeds it to fsdpcheck (see run.sh), path is relative to
tests/bad_input, names is the file the one-line message must name, expect a
word or phrase of the problem it must state.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = []


def slurp(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def write(path, data):
    full = os.path.join(HERE, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def case(kind, path, names, expect, data=None):
    if data is not None:
        write(path, data)
    CASES.append((kind, path, names, expect))


# ---- safetensors ------------------------------------------------------------


def st_parse(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def st_build(header, data, pad=True):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def header_only(header, data_len):
    return st_build(header, b"\0" * data_len)


def safetensors_cases(kind, where, good, fname, names, only=None):
    """Malformed variants of the good safetensors image `good`, as `where`/NAME/fname
    when fname is set (a file inside a directory), else as `where`/NAME.safetensors;
    only: the names of the variants to write (all by default)."""
    hdr, data = st_parse(good)
    tensors = [k for k in hdr if k != "__metadata__" and hdr[k]["shape"]]
    t0 = tensors[0]

    def put(name, blob, expect):
        if only is not None and name not in only:
            return
        path = f"{where}/{name}/{fname}" if fname else f"{where}/{name}.safetensors"
        case(kind, path, names or os.path.basename(path), expect, blob)

    put("empty", b"", "shorter than the 8-byte header length")
    put("short_length", b"\x10\x00\x00", "shorter than the 8-byte header length")
    put("header_past_end", struct.pack("<Q", 1 << 20) + b"{}", "header")
    put("header_length_huge", struct.pack("<Q", (1 << 64) - 8) + b"{}      ", "header")
    put("header_not_json", st_build(None, b"")[:8] + b"{not json" + b" " * 7, "JSON")
    put("header_array", st_build([1, 2], b""), "object")
    h = json.loads(json.dumps(hdr))
    h[t0]["dtype"] = "F8_E4M3"
    put("unknown_dtype", st_build(h, data), "dtype")
    h = json.loads(json.dumps(hdr))
    h[t0]["data_offsets"] = [0, len(data) + 4096]
    put("offsets_past_end", st_build(h, data), "offsets")
    h = json.loads(json.dumps(hdr))
    h[t0]["shape"] = [h[t0]["shape"][0] + 1] + h[t0]["shape"][1:]
    put("shape_size_mismatch", st_build(h, data), "needs")
    h = json.loads(json.dumps(hdr))
    h[t0]["shape"] = [-1]
    put("negative_dim", st_build(h, data), "shape")
    put("truncated_data", st_build(hdr, data[: len(data) // 2]), "past the end")
    put("trailing_bytes", st_build(hdr, data + b"\0" * 16), "trailing")
    h = json.loads(json.dumps(hdr))
    t1 = tensors[1]
    h[t1]["data_offsets"] = [
        h[t0]["data_offsets"][0],
        h[t0]["data_offsets"][0] + (h[t1]["data_offsets"][1] - h[t1]["data_offsets"][0]),
    ]
    put("overlapping_tensors", st_build(h, data), "overlap")
    raw = st_build(hdr, data)
    n = struct.unpack("<Q", raw[:8])[0]
    dup = raw[8 : 8 + n].decode().rstrip(" ")
    first = dup.index('"' + t0 + '"')
    dup = dup[:-1] + "," + dup[first : first + dup[first:].index("}") + 1] + "}"
    put("duplicate_name", struct.pack("<Q", len(dup)) + dup.encode() + data, "duplicate")
    return hdr, data


def fix_offsets(hdr, keep):
    """A header with only the tensors in keep (in their order), offsets packed."""
    out, at = {}, 0
    if "__metadata__" in hdr:
        out["__metadata__"] = hdr["__metadata__"]
    for k in keep:
        v = dict(hdr[k])
        n = v["data_offsets"][1] - v["data_offsets"][0]
        v["data_offsets"] = [at, at + n]
        at += n
        out[k] = v
    return out, at


def slice_data(hdr, data, keep):
    return b"".join(data[hdr[k]["data_offsets"][0] : hdr[k]["data_offsets"][1]] for k in keep)


def semantic_st(hdr, data, drop=None, reshape=None, retype=None, extra=None):
    """The same file with one tensor dropped, reshaped (same byte count), retyped or added."""
    keep = [k for k in hdr if k != "__metadata__" and k != drop]
    h, _ = fix_offsets(hdr, keep)
    body = slice_data(hdr, data, keep)
    if reshape:
        h[reshape[0]]["shape"] = reshape[1]
    if retype:
        h[retype[0]]["dtype"] = retype[1]
    if extra:
        n = len(body)
        h[extra] = {"dtype": "F32", "shape": [2], "data_offsets": [n, n + 8]}
        body += b"\0" * 8
    return st_build(h, body)


# ---- the cases ----------------------------------------------------------------


def model_cases():
    k = "model"
    case(k, "model_config/empty.json", "empty.json", "JSON", "")
    case(k, "model_config/not_json.json", "not_json.json", "JSON", "model_type: gpt2\n")
    case(k, "model_config/truncated.json", "truncated.json", "JSON", '{"model_type": "gpt2", "n_embd": 16, "n_la')
    case(k, "model_config/array.json", "array.json", "object", "[13, 17, 11, 7]")
    case(
        k,
        "model_config/unknown_model_type.json",
        "unknown_model_type.json",
        "model_type",
        '{"model_type": "llama", "hidden_size": 16}',
    )
    case(k, "model_config/no_model_type.json", "no_model_type.json", "model_type", '{"dims": [13, 17, 11, 7]}')
    case(
        k, "model_config/mlp_one_dim.json", "mlp_one_dim.json", "dims", '{"model_type": "fsdpcheck-mlp", "dims": [13]}'
    )
    case(
        k,
        "model_config/mlp_zero_dim.json",
        "mlp_zero_dim.json",
        "dims",
        '{"model_type": "fsdpcheck-mlp", "dims": [13, 0, 7]}',
    )
    case(
        k,
        "model_config/mlp_dim_string.json",
        "mlp_dim_string.json",
        "dims",
        '{"model_type": "fsdpcheck-mlp", "dims": [13, "17", 7]}',
    )
    gpt2 = {
        "model_type": "gpt2",
        "vocab_size": 97,
        "n_positions": 32,
        "n_embd": 16,
        "n_layer": 2,
        "n_head": 4,
        "layer_norm_epsilon": 1e-05,
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
    }

    def g(name, expect, **kw):
        d = dict(gpt2)
        for key, v in kw.items():
            if v is None:
                d.pop(key)
            else:
                d[key] = v
        case(k, f"model_config/{name}.json", f"{name}.json", expect, json.dumps(d))

    g("gpt2_n_embd_string", "n_embd", n_embd="16")
    g("gpt2_heads_not_dividing", "n_head", n_head=3)
    g("gpt2_negative_layers", "n_layer", n_layer=-2)
    g("gpt2_layers_float", "n_layer", n_layer=2.5)
    g("gpt2_huge_vocab", "vocab_size", vocab_size=10**12)
    g("gpt2_activation_relu", "activation_function", activation_function="relu")
    g("gpt2_epsilon_string", "layer_norm_epsilon", layer_norm_epsilon="1e-5")
    case(k, "model_config/trailing_garbage.json", "trailing_garbage.json", "JSON", json.dumps(gpt2) + " }")
    case(
        k, "model_config/duplicate_key.json", "duplicate_key.json", "n_embd", json.dumps(gpt2)[:-1] + ', "n_embd": 32}'
    )


def fsdp_cases():
    k = "fsdp"
    base = {
        "fsdp_sharding_strategy": "FULL_SHARD",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_transformer_layer_cls_to_wrap": "Linear",
    }

    def f(name, expect, text=None, **kw):
        if text is None:
            d = dict(base)
            d.update(kw)
            text = json.dumps(d)
        case(k, f"fsdp_config/{name}.json", f"{name}.json", expect, text)

    f("empty", "JSON", "")
    f("not_json", "JSON", "fsdp_sharding_strategy: FULL_SHARD\n")
    f("array", "object", '["FULL_SHARD"]')
    f("unknown_key", "fsdp_reshard_after_forward", fsdp_reshard_after_forward=True)
    f("bad_strategy", "sharding_strategy", fsdp_sharding_strategy="ZERO3")
    f("strategy_number_out_of_range", "sharding_strategy", fsdp_sharding_strategy=9)
    f("bad_prefetch", "backward_prefetch", fsdp_backward_prefetch="BACKWARD_SOMETIMES")
    f("bool_as_number", "forward_prefetch", fsdp_forward_prefetch=1)
    f("wrong_wrap_class", "GPT2Block", fsdp_transformer_layer_cls_to_wrap="GPT2Block")
    f("size_based_wrap", "auto_wrap_policy", fsdp_auto_wrap_policy="SIZE_BASED_WRAP", fsdp_min_num_params=1000)
    f("bad_mixed_precision", "mixed_precision", mixed_precision="fp8")
    f("bad_state_dict_type", "state_dict_type", fsdp_state_dict_type="LOCAL_STATE_DICT")
    f("activation_checkpointing", "activation_checkpointing", fsdp_activation_checkpointing="inside")
    f("policy_not_object", "mixed_precision_policy", mixed_precision_policy="bf16")
    f("trailing_garbage", "JSON", json.dumps(base) + " }")
    f("duplicate_key", "sharding_strategy", json.dumps(base)[:-1] + ', "fsdp_sharding_strategy": "NO_SHARD"}')


def run(cmd, cwd):
    env = dict(os.environ, HWLOC_COMPONENTS="-pci,-x86")
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def manifest_with(man_text, changed):
    """The manifest text with the size and hash of each file in changed
    (name -> bytes) replaced."""
    m = json.loads(man_text)
    for f in m["files"]:
        if f["name"] in changed:
            f["bytes"] = len(changed[f["name"]])
            f["sha256"] = hashlib.sha256(changed[f["name"]]).hexdigest()
    return json.dumps(m)


def trace_cases(tdir):
    k = "trace"
    tj = json.loads(slurp(os.path.join(tdir, "trace.json")))

    def t(name, expect, text=None, mutate=None):
        if text is None:
            d = json.loads(json.dumps(tj))
            mutate(d)
            text = json.dumps(d)
        case(k, f"trace/{name}/trace.json", "trace.json", expect, text)

    t("empty", "JSON", "")
    t("not_json", "JSON", "format = fsdpcheck-trace\n")
    t("truncated", "JSON", json.dumps(tj)[:300])
    t("wrong_format", "format", mutate=lambda d: d.update(format="fsdpcheck-checkpoint"))
    t("version_2", "version", mutate=lambda d: d.update(version=2))
    t("world_size_zero", "world_size", mutate=lambda d: d.update(world_size=0))
    t("steps_negative", "steps", mutate=lambda d: d.update(steps=-1))
    t("no_config", "config", mutate=lambda d: d.pop("config"))
    t("config_strategy_unknown", "strategy", mutate=lambda d: d["config"].update(strategy="zero3"))
    t("units_wrong_numel", "numel", mutate=lambda d: d["units"][0].update(numel=d["units"][0]["numel"] + 1))
    t("units_missing", "units", mutate=lambda d: d["units"].pop())
    t(
        "batch_not_dividing",
        "global",
        mutate=lambda d: (d.update(world_size=3), d["config"].update(strategy="full_shard")),
    )
    t("trailing_garbage", "JSON", json.dumps(tj) + "\n}")
    # Not yet here: a key given twice in trace.json (two "world_size"s) is
    # accepted, the first one winning; oracle/tracefile.c does not yet refuse
    # duplicates with fc_json_duplicate_key as the other JSON readers do.
    t("model_not_object", "model", mutate=lambda d: d["config"].update(model="mlp-tiny.json"))
    # a plan's (fsdpcheck plan) marks, wrong: "planned" not a boolean, and a plan whose
    # step files would hold tensor sets (its "tensor_steps" must say 0)
    t("planned_not_bool", "planned", mutate=lambda d: d.update(planned="yes"))
    t("planned_with_tensors", "tensor_steps", mutate=lambda d: d.update(planned=True, tensor_steps=1))

    # the trace's safetensors files: init.safetensors and a step file
    init = slurp(os.path.join(tdir, "init.safetensors"), "rb")
    # the same reader as run --init (all its variants are under init_safetensors/):
    # here a few, to see that compare passes its refusals on
    few = ("empty", "header_not_json", "truncated_data", "duplicate_name")
    safetensors_cases("trace", "trace_init", init, "init.safetensors", "init.safetensors", few)
    hdr, data = st_parse(init)
    case(
        k,
        "trace_init/missing_param/init.safetensors",
        "init.safetensors",
        "missing",
        semantic_st(hdr, data, drop="layers.1.bias"),
    )
    step = slurp(os.path.join(tdir, "step-000001.safetensors"), "rb")
    safetensors_cases("trace", "trace_step", step, "step-000001.safetensors", "step-000001.safetensors", few)
    hdr, data = st_parse(step)
    case(
        k,
        "trace_step/missing_grad/step-000001.safetensors",
        "step-000001.safetensors",
        "grad.layers.1.weight",
        semantic_st(hdr, data, drop="grad.layers.1.weight"),
    )
    case(
        k,
        "trace_step/missing_loss/step-000001.safetensors",
        "step-000001.safetensors",
        "loss",
        semantic_st(hdr, data, drop="loss"),
    )
    case(
        k,
        "trace_step/grad_wrong_shape/step-000001.safetensors",
        "step-000001.safetensors",
        "shape",
        semantic_st(hdr, data, reshape=("grad.layers.0.weight", [3, 2])),
    )
    case(
        k,
        "trace_step/loss_int/step-000001.safetensors",
        "step-000001.safetensors",
        "loss",
        semantic_st(hdr, data, retype=("loss", "I32")),
    )
    case(
        k,
        "trace_step/target_float/step-000001.safetensors",
        "step-000001.safetensors",
        "batch.target",
        semantic_st(hdr, data, retype=("batch.target", "F32")),
    )


def init_cases(tdir):
    init = slurp(os.path.join(tdir, "init.safetensors"), "rb")
    hdr, data = safetensors_cases("init", "init_safetensors", init, None, None)
    k = "init"
    case(
        k,
        "init_safetensors/missing_param.safetensors",
        "missing_param.safetensors",
        "missing",
        semantic_st(hdr, data, drop="layers.1.weight"),
    )
    case(
        k,
        "init_safetensors/wrong_shape.safetensors",
        "wrong_shape.safetensors",
        "shape",
        semantic_st(hdr, data, reshape=("layers.0.weight", [3, 2])),
    )
    case(
        k,
        "init_safetensors/int_dtype.safetensors",
        "int_dtype.safetensors",
        "layers.0.bias",
        semantic_st(hdr, data, retype=("layers.0.bias", "I32")),
    )
    case(
        k,
        "init_safetensors/extra_tensor.safetensors",
        "extra_tensor.safetensors",
        "not a parameter",
        semantic_st(hdr, data, extra="layers.3.weight"),
    )


def ckpt_cases(cdir, kind, where, data_file):
    man = slurp(os.path.join(cdir, "fsdpcheck.json"))
    m = json.loads(man)

    def mf(name, expect, text=None, mutate=None):
        if text is None:
            d = json.loads(man)
            mutate(d)
            text = json.dumps(d)
        case(kind, f"{where}/{name}/fsdpcheck.json", names, expect, text)

    names = "fsdpcheck.json"
    mf("manifest_empty", "JSON", "")
    mf("manifest_not_json", "JSON", "format: fsdpcheck-checkpoint\n")
    mf("manifest_truncated", "JSON", man[: len(man) // 2])
    mf("manifest_wrong_format", "format", mutate=lambda d: d.update(format="fsdpcheck-trace"))
    mf("manifest_version_9", "version", mutate=lambda d: d.update(version=9))
    mf("manifest_step_negative", "step", mutate=lambda d: d.update(step=-3, data_position=-3))
    mf("manifest_file_in_subdir", "name", mutate=lambda d: d["files"][1].update(name="../" + d["files"][1]["name"]))
    mf(
        "manifest_file_missing",
        "nosuch.safetensors",
        mutate=lambda d: d["files"].append({"name": "nosuch.safetensors", "bytes": 8, "sha256": "0" * 64}),
    )
    mf("manifest_sha256_short", "sha256", mutate=lambda d: d["files"][1].update(sha256="abc"))
    names = m["files"][1]["name"]  # the file whose size no longer matches is named
    mf(
        "manifest_bytes_wrong",
        "the manifest says",
        mutate=lambda d: d["files"][1].update(bytes=d["files"][1]["bytes"] + 1),
    )
    names = "fsdpcheck.json"
    mf("manifest_trailing_garbage", "JSON", man + "\n}")
    mf("manifest_duplicate_key", "step", man.rstrip()[:-1] + ', "step": 7}')
    mf("manifest_no_files", "files", mutate=lambda d: d.update(files=[]))
    mf("manifest_state_names_sgd", "state", mutate=lambda d: d["optimizer"].update(state=["momentum_buffer"]))

    # a data file changed after it was written: its hash no longer matches
    blob = slurp(os.path.join(cdir, data_file), "rb")
    flipped = bytearray(blob)
    flipped[-3] ^= 0x40
    case(kind, f"{where}/data_bit_flip/{data_file}", data_file, "SHA-256", bytes(flipped))
    # broken inside, with the manifest rewritten for it: caught behind the hashes
    hdr, data = st_parse(blob)
    tensors = [t for t in hdr if t != "__metadata__"]

    def df(name, expect, new):
        case(kind, f"{where}/{name}/{data_file}", data_file, expect, new)
        write(f"{where}/{name}/fsdpcheck.json", manifest_with(man, {data_file: new}))

    df("data_truncated", "past the end", st_build(hdr, data[: len(data) // 2]))
    df("data_not_safetensors", "header length", b"this is not a safetensors file\n")
    df("data_missing_tensor", tensors[-1], semantic_st(hdr, data, drop=tensors[-1]))
    # the same elements under one more (leading) dimension of 1
    df("data_wrong_shape", tensors[0], semantic_st(hdr, data, reshape=(tensors[0], [1] + hdr[tensors[0]]["shape"])))
    # config.json inside the checkpoint, broken, manifest rewritten for it
    bad_cfg = b'{"model_type": "fsdpcheck-mlp", "dims": [13, 17, 11]}'
    case(kind, f"{where}/config_other_model/config.json", "config.json", "another model", bad_cfg)
    write(f"{where}/config_other_model/fsdpcheck.json", manifest_with(man, {"config.json": bad_cfg}))


F1 = "shard-00001-model-00001-of-00001.safetensors"
F2 = "shard-00002-model-00001-of-00001.safetensors"
W2_DCP_CASES = (
    "dcp_bit_flip",
    "dcp_overlap_rows",
    "dcp_rows_gap",
    "dcp_version",
    "dcp_step_wrong",
    "dcp_shard_beyond_world",
)


def dcp_file(blob, drop=(), add=(), retype=None, offsets=None, info=None, meta=None):
    """A DCP file (torch's Hugging Face safetensors: each tensor a block of
    rows placed by its DCP_SHARDING_INFO entry) with tensors dropped (their
    entries too), added ((name, dtype, shape, raw bytes, saved_offsets or None
    for no entry)), one retyped ((name, dtype): the same shape, its bytes cut
    to the new size), one entry's saved_offsets replaced ((name, offsets)),
    DCP_SHARDING_INFO edited by info(dict) and __metadata__ by meta(dict)."""
    hdr, data = st_parse(blob)
    md = dict(hdr["__metadata__"])
    sharding = json.loads(md["DCP_SHARDING_INFO"])
    out, body = {}, b""
    for k in hdr:
        if k == "__metadata__" or k in drop:
            continue
        v = dict(hdr[k])
        chunk = data[v["data_offsets"][0] : v["data_offsets"][1]]
        if retype and k == retype[0]:
            v["dtype"] = retype[1]
            chunk = chunk[: len(chunk) // 2]  # F32 -> a 16-bit type
        v["data_offsets"] = [len(body), len(body) + len(chunk)]
        body += chunk
        out[k] = v
    for k in drop:
        sharding.pop(k, None)
    for name, dtype, shape, raw, offs in add:
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
        if offs is not None:
            sharding[name] = {"saved_offsets": offs}
    if offsets:
        sharding[offsets[0]] = {"saved_offsets": offsets[1]}
    if info:
        info(sharding)
    md["DCP_SHARDING_INFO"] = json.dumps(sharding, separators=(",", ":"))
    if meta:
        meta(md)
    return st_build({"__metadata__": md, **out}, body)


def dcp_cases(ddir, kind, where, only=None):
    """FSDP2's DCP checkpoint (mlp-micro at W=2: F1 holds row 0 of every
    parameter and state and every state.<name>.step, F2 row 1), each case one
    thing broken; a case directory holds the DCP manifest and both files."""
    man = slurp(os.path.join(ddir, "fsdpcheck.json"))
    good = {f: slurp(os.path.join(ddir, f), "rb") for f in (F1, F2)}
    step = json.loads(man)["step"]

    def dc(name, names, expect, changed, rehash=True):
        """changed: the one file changed, name -> its new bytes; rehash: the
        manifest rewritten for them (else the manifest as saved)."""
        if only is not None and name not in only:
            return
        for f, blob in dict(good, **changed).items():
            write(f"{where}/{name}/{f}", blob)
        write(f"{where}/{name}/fsdpcheck.json", manifest_with(man, changed) if rehash else man)
        case(kind, f"{where}/{name}/{next(iter(changed))}", names, expect)

    # a byte of F2 changed after the save: its hash no longer matches
    flipped = bytearray(good[F2])
    flipped[-3] ^= 0x40
    dc("dcp_bit_flip", F2, "SHA-256", {F2: bytes(flipped)}, rehash=False)
    # F2's row of layers.0.weight recorded as row 0: row 0 twice, row 1 in none
    dc("dcp_overlap_rows", F2, "two shard files", {F2: dcp_file(good[F2], offsets=("layers.0.weight", [0, 0]))})
    # F2 without its row of layers.1.bias: a gap (the message names the tensor, no file holds it)
    dc("dcp_rows_gap", "layers.1.bias", "in no shard file", {F2: dcp_file(good[F2], drop=("layers.1.bias",))})
    dc("dcp_column_offset", F2, "only dim-0 blocks", {F2: dcp_file(good[F2], offsets=("layers.1.weight", [1, 1]))})
    dc("dcp_rows_outside", F2, "outside", {F2: dcp_file(good[F2], offsets=("layers.0.weight", [2, 0]))})
    dc("dcp_version", F1, "DCP_VERSION", {F1: dcp_file(good[F1], meta=lambda m: m.update(DCP_VERSION="2.0"))})
    dc(
        "dcp_no_sharding_info",
        F2,
        "DCP_SHARDING_INFO",
        {F2: dcp_file(good[F2], meta=lambda m: m.pop("DCP_SHARDING_INFO"))},
    )
    dc(
        "dcp_info_extra",
        F2,
        "does not hold",
        {F2: dcp_file(good[F2], info=lambda d: d.update({"layers.2.weight": {"saved_offsets": [1, 0]}}))},
    )
    dc("dcp_no_entry", F2, "saved_offsets", {F2: dcp_file(good[F2], info=lambda d: d.pop("layers.0.bias"))})
    dc(
        "dcp_unknown_tensor",
        F2,
        "neither a parameter",
        {F2: dcp_file(good[F2], add=(("layers.2.weight", "F32", [1, 2], b"\0" * 8, [1, 0]),))},
    )
    dc("dcp_f16", F2, "not F32", {F2: dcp_file(good[F2], retype=("layers.1.bias", "F16"))})
    dc(
        "dcp_step_missing",
        "state.layers.1.bias.step",
        "no shard file holds",
        {F1: dcp_file(good[F1], drop=("state.layers.1.bias.step",))},
    )
    one = struct.pack("<f", float(step))
    dc(
        "dcp_step_twice",
        "state.layers.0.weight.step",
        "two shard files",
        {F2: dcp_file(good[F2], add=(("state.layers.0.weight.step", "F32", [], one, []),))},
    )
    wrong = struct.pack("<f", float(step + 3))

    def set_step(blob, name, raw):
        hdr, data = st_parse(blob)
        b, e = hdr[name]["data_offsets"]
        return st_build(hdr, data[:b] + raw + data[e:])

    dc("dcp_step_wrong", F1, "the manifest's step", {F1: set_step(good[F1], "state.layers.0.bias.step", wrong)})
    # F2 under a shard index past the manifest's world of 2
    F9 = "shard-00009-model-00001-of-00001.safetensors"
    if only is None or "dcp_shard_beyond_world" in only:
        m = json.loads(man)
        for f in m["files"]:
            if f["name"] == F2:
                f["name"] = F9
        write(f"{where}/dcp_shard_beyond_world/{F1}", good[F1])
        write(f"{where}/dcp_shard_beyond_world/{F9}", good[F2])
        write(f"{where}/dcp_shard_beyond_world/fsdpcheck.json", json.dumps(m))
        case(kind, f"{where}/dcp_shard_beyond_world/{F9}", F9, "outside the world")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: make_corpus.py FSDPCHECK [MPIEXEC]")
    fsdpcheck = os.path.abspath(sys.argv[1])
    mpiexec = sys.argv[2] if len(sys.argv) > 2 else "mpiexec"
    for d in os.listdir(HERE):
        # torch/ is the adapter's corpus, written by torch/make.py: not ours to clear
        if d != "torch" and os.path.isdir(os.path.join(HERE, d)):
            shutil.rmtree(os.path.join(HERE, d))
    tmp = tempfile.mkdtemp(prefix="fc_bad_input.")
    try:
        micro = ["--model", "mlp-micro"]
        run([fsdpcheck, "run", *micro, "--steps", "2", "--trace", "T", "--quiet"], tmp)
        run([fsdpcheck, "run", *micro, "--steps", "2", "--save", "C", "--quiet"], tmp)
        run(
            [
                mpiexec,
                "-n",
                "2",
                fsdpcheck,
                "run",
                *micro,
                "--strategy",
                "full_shard",
                "--steps",
                "2",
                "--save",
                "C2",
                "--state-dict",
                "sharded",
                "--quiet",
            ],
            tmp,
        )
        model_cases()
        fsdp_cases()
        init_cases(os.path.join(tmp, "T"))
        trace_cases(os.path.join(tmp, "T"))
        run([fsdpcheck, "ckpt", "convert", "C", "D", "--to", "dcp", "--world-size", "2"], tmp)
        for base in ("C", "C2"):  # the cases keep the good directory's config.json
            cfg = [slurp(os.path.join(tmp, d, "config.json"), "rb") for d in ("D", base)]
            if cfg[0] != cfg[1]:
                sys.exit(f"D/config.json differs from {base}/config.json: the dcp cases need it")
        ckpt_cases(os.path.join(tmp, "C"), "ckpt", "checkpoint", "model.safetensors")
        dcp_cases(os.path.join(tmp, "D"), "ckpt", "checkpoint")
        ckpt_cases(os.path.join(tmp, "C2"), "ckpt_w2", "checkpoint_w2", "shard-00001.safetensors")
        # at W=2 (the collective load) a few: one of each check
        dcp_cases(os.path.join(tmp, "D"), "ckpt_w2", "checkpoint_w2", W2_DCP_CASES)
    finally:
        shutil.rmtree(tmp)
    with open(os.path.join(HERE, "CASES"), "w") as f:
        f.write(
            "# tests/bad_input/CASES, written by make_corpus.py: kind, path, the file the message\n"
            "# must name, a word of the problem it must state (tab-separated)\n"
        )
        f.writelines("\t".join(c) + "\n" for c in CASES)
    print(f"{len(CASES)} cases")


if __name__ == "__main__":
    main()
