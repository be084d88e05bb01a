#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_safetensors into fuzz/corpus/safetensors/.

Standard library only. The seeds are small: a few valid files in the layout
the Python safetensors package writes (8-byte little-endian header length,
JSON header padded with spaces to 8-byte alignment, raw data), and a few that
are each broken in one interesting way, so the fuzzer starts next to both
sides of every check. Re-run after changing it; the output is deterministic.
"""

import json
import os
import struct

DTYPE_SIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def image(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape); data is a simple byte pattern."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        size = numel(shape) * DTYPE_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return raw(json.dumps(header, separators=(",", ":")), offset, pad)


def raw(header_text, data_len, pad=True, length=None):
    h = header_text.encode("utf-8")
    if pad:
        h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + bytes((i * 7 + 1) % 256 for i in range(data_len))


def entry(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def seeds():
    yield "valid_two_tensors", image([("w", "F32", [2, 2]), ("b", "BF16", [3])], metadata={"format": "pt"})
    yield (
        "valid_scalar_and_empty",
        image([("z0", "F32", [0, 4]), ("s", "F32", []), ("h", "F16", [2]), ("z1", "I8", [0])]),
    )
    yield (
        "valid_all_dtypes",
        image([(f"t.{d.lower()}", d, [2]) for d in DTYPE_SIZE], metadata={"step": "3", "note": "all dtypes"}),
    )
    yield "valid_empty", image([])
    # data order differs from header order; no padding (also allowed)
    yield (
        "valid_reordered",
        raw(
            json.dumps({"c": entry("U8", [2], 6, 8), "a": entry("U16", [2], 2, 6), "b": entry("U8", [2], 0, 2)}),
            8,
            pad=False,
        ),
    )
    yield "bad_overlap", raw(json.dumps({"a": entry("F32", [4], 0, 16), "b": entry("F32", [2], 8, 16)}), 16)
    yield "bad_hole", raw(json.dumps({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}), 20)
    yield "bad_size_mismatch", raw(json.dumps({"a": entry("F32", [2, 2], 0, 12)}), 12)
    yield "bad_header_len", raw(json.dumps({"a": entry("U8", [1], 0, 1)}), 1, length=4096)
    yield "bad_trailing_garbage", raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}x', 1)
    yield (
        "bad_duplicate_name",
        raw(
            '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
            2,
        ),
    )
    yield "bad_metadata", raw(json.dumps({"__metadata__": {"k": 1}, "a": entry("U8", [1], 0, 1)}), 1)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
