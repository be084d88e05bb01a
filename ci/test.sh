#!/usr/bin/env bash
# ci/test.sh — sets up, builds and runs the whole default test suite:
#   1. Debug + ASan/UBSan build: unit, mpi and property tests (not the sweeps);
#   2. Release build: the conformance gate (label gate: the default sweep per W,
#      the fault catalogue, the out-of-tree plugin), then the unit suite under valgrind (memcheck);
#   3. clang ASan/UBSan build: the unit suite again, and each libFuzzer harness
#      for a short time (label fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
JOBS=$(nproc)
export HWLOC_COMPONENTS=-pci,-x86

echo "== debug (ASan+UBSan): unit, mpi, property"
cmake --preset debug >/dev/null
cmake --build --preset debug -j "$JOBS"
ctest --preset debug -j "$JOBS"

echo "== release: the conformance gate (sweep per W, fault catalogue)"
cmake --preset default >/dev/null
cmake --build --preset default -j "$JOBS"
ctest --preset gate

echo "== release: memcheck (valgrind)"
ctest --preset memcheck -j "$JOBS"

if command -v clang >/dev/null 2>&1; then
  echo "== clang (ASan+UBSan): unit, fuzz"
  cmake --preset clang >/dev/null
  cmake --build --preset clang -j "$JOBS"
  ctest --preset clang -j "$JOBS"
else
  echo "== clang: skipped (no clang)"
fi
echo "ci/test.sh: all stages passed"
