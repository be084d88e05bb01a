#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_manifest into fuzz/corpus/manifest/.

usage: python3 fuzz/gen_manifest_corpus.py PATH/TO/fsdpcheck [MPIEXEC]

Standard library only. Saves a few tiny real checkpoints with the fsdpcheck
binary (a 3-4-2 mlp, so each seed is a few KB; and llama-micro with LoRA), then writes for each:
  - the manifest alone (seeds the parser);
  - the whole checkpoint as an "FCKA" archive (see fuzz_manifest.c), once with
    SHA-256 checking and once without, so the fuzzer starts both at the hash
    check and past it, in the structure checks;
plus a few broken manifests. Re-run after changing the checkpoint format; the
output is deterministic (fixed seeds, relative paths).
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile

MLP = '{"model_type": "fsdpcheck-mlp", "dims": [3, 4, 2]}\n'
GPT = '{"model_type": "gpt2", "vocab_size": 5, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 2}\n'


def archive(ckpt, check_hashes):
    out = b"FCKA" + bytes([1 if check_hashes else 0])
    names = sorted(os.listdir(ckpt))
    names.remove("fsdpcheck.json")
    for name in ["fsdpcheck.json"] + names:
        with open(os.path.join(ckpt, name), "rb") as f:
            data = f.read()
        out += bytes([len(name)]) + name.encode() + struct.pack("<I", len(data)) + data
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    mpiexec = sys.argv[2] if len(sys.argv) > 2 else "mpiexec"
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "corpus", "manifest")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, HWLOC_COMPONENTS="-pci,-x86")
    work = tempfile.mkdtemp()
    try:
        for name, text in (("mlp.json", MLP), ("gpt.json", GPT)):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        runs = {
            "full_adamw": ["--model", "mlp.json", "--state-dict", "full"],
            "sharded_sgd": ["--model", "mlp.json", "--optimizer", "sgd", "--state-dict", "sharded"],
            "full_gpt2": ["--model", "gpt.json", "--seq-len", "2", "--state-dict", "full"],
            # LoRA: PEFT's adapter_model.safetensors and adapter_config.json beside the FULL files
            "full_lora": ["--model", "llama-micro", "--lora", "2:4:q_proj", "--seq-len", "2", "--state-dict", "full"],
        }
        for tag, flags in runs.items():
            cmd = [binary, "run", "--quiet", "--steps", "2", "--global-batch", "2", "--save", tag] + flags
            subprocess.run(cmd, cwd=work, env=env, check=True)
        # a sharded checkpoint from two ranks (full_shard): two shard files
        subprocess.run(
            [
                mpiexec,
                "-n",
                "2",
                binary,
                "run",
                "--quiet",
                "--model",
                "mlp.json",
                "--steps",
                "1",
                "--global-batch",
                "2",
                "--strategy",
                "full_shard",
                "--save",
                "sharded_w2",
                "--state-dict",
                "sharded",
            ],
            cwd=work,
            env=env,
            check=True,
        )
        for tag in sorted(os.listdir(work)):
            ckpt = os.path.join(work, tag)
            if not os.path.isdir(ckpt):
                continue
            with open(os.path.join(ckpt, "fsdpcheck.json"), "rb") as f:
                manifest = f.read()
            seeds = {
                f"manifest_{tag}.json": manifest,
                f"ckpt_{tag}_hashed.fcka": archive(ckpt, True),
                f"ckpt_{tag}_structure.fcka": archive(ckpt, False),
            }
            for name, data in seeds.items():
                with open(os.path.join(out, name), "wb") as f:
                    f.write(data)
        broken = {
            "bad_not_json.json": b'{"format": "fsdpcheck-checkpoint", ',
            "bad_format.json": b'{"format": "something-else", "version": 1}',
            "bad_duplicate_key.json": b'{"format": "fsdpcheck-checkpoint", "format": "fsdpcheck-checkpoint"}',
            "bad_empty_archive.fcka": b"FCKA\x01",
        }
        for name, data in broken.items():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
