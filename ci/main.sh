#!/usr/bin/env bash
# ci/main.sh — sets up, builds (Release) and runs the main job: a run of the
# reference on gpt2-tiny, once local (out/trace) and once FULL_SHARD at W=2
# (out/trace-full_shard-W2, with its comm log).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
./build/default/oracle/fsdpcheck run --strategy local --model gpt2-tiny --steps 5 --trace out/trace "$@"
export HWLOC_COMPONENTS=-pci,-x86
mpiexec -n 2 ./build/default/oracle/fsdpcheck run --strategy full_shard --model gpt2-tiny --steps 5 \
  --backward-prefetch pre --trace out/trace-full_shard-W2 --comm-log out/comm-full_shard-W2.jsonl
ls -l out out/trace out/trace-full_shard-W2
