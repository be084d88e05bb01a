#!/usr/bin/env bash
# ci/bench.sh [STEPS] — step times of the reference (Release build), side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target fsdpcheck_bench
./build/default/bench/fsdpcheck_bench "$@"
