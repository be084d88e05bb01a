#!/usr/bin/env bash
# ci/main.sh — sets up, builds (Release) and runs the main job: a run of the
# reference on gpt2-tiny whose trace lands in out/trace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
./build/default/oracle/fsdpcheck run --strategy local --model gpt2-tiny --steps 5 --trace out/trace "$@"
ls -l out/trace
