#!/usr/bin/env python3
"""Writes the adapter's --like cases of the bad-input corpus, tests/bad_input/torch/like/.

    FSDPCHECK=... python tests/bad_input/torch/make.py   (in the adapter's venv: torch, safetensors)

Each case is a directory of files laid over a good trace of
`fsdpcheck run --model mlp-micro --steps 2` (the same one the C corpus uses);
a file NAME.remove deletes NAME. The cases are those only the adapter reads
(its replay of a trace: the batches, the initial weights' dtype, the units);
every other broken trace, model config and fsdp_config file of the C corpus
(tests/bad_input/CASES) is fed to the adapter too, by
adapters/torch/tests/test_bad_input.py.
"""

import json
import os
import subprocess
import sys
import tempfile

from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    T = tempfile.mkdtemp() + "/T"
    subprocess.run(
        [
            os.environ["FSDPCHECK"],
            "run",
            "--model",
            "mlp-micro",
            "--steps",
            "2",
            "--trace",
            T,
            "--quiet",
        ],
        check=True,
    )
    out = os.path.join(HERE, "like")

    def case(name, fname, write):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        write(os.path.join(d, fname))

    def touch(p):
        open(p, "w").close()

    case("no_trace_json", "trace.json.remove", touch)
    case("no_step_1", "step-000001.safetensors.remove", touch)

    def step_no_batch(p):
        t = load_file(f"{T}/step-000001.safetensors")
        t.pop("batch.input")
        save_file(t, p)

    case("step_no_batch", "step-000001.safetensors", step_no_batch)
    case(
        "init_f16",
        "init.safetensors",
        lambda p: save_file({k: v.half() for k, v in load_file(f"{T}/init.safetensors").items()}, p),
    )

    def target_float(p):
        t = load_file(f"{T}/step-000000.safetensors")
        t["batch.target"] = t["batch.target"].float()
        save_file(t, p)

    case("target_float", "step-000000.safetensors", target_float)
    with open(f"{T}/trace.json") as f:
        j = json.load(f)

    def units_twice(p):
        k = json.loads(json.dumps(j))
        k["units"][1]["params"] = k["units"][0]["params"] + k["units"][1]["params"]
        with open(p, "w") as f:
            json.dump(k, f)

    def other_batch(p):
        k = json.loads(json.dumps(j))
        k["config"]["global_batch"] = 6
        with open(p, "w") as f:
            json.dump(k, f)

    case("units_twice", "trace.json", units_twice)
    case("other_world_batch", "trace.json", other_batch)


if __name__ == "__main__":
    sys.exit(main())
