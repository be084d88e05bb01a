#!/usr/bin/env bash
# ci/main.sh — sets up, builds (Release) and runs the main job: the default
# sweep of the reference (300 random cases over W' = 1..4, every property),
# with its Markdown/SVG report and JUnit XML in out/, then one traced
# FULL_SHARD run at W=2 (out/trace-full_shard-W2, with its comm log).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
mkdir -p out
export HWLOC_COMPONENTS=-pci,-x86
mpiexec -n 4 ./build/default/oracle/fsdpcheck sweep --cases 300 --report out/sweep-report.md \
  --junit out/sweep-junit.xml "$@"
mpiexec -n 2 ./build/default/oracle/fsdpcheck run --strategy full_shard --model gpt2-tiny --steps 5 \
  --backward-prefetch pre --trace out/trace-full_shard-W2 --comm-log out/comm-full_shard-W2.jsonl
ls -l out
