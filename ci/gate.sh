#!/usr/bin/env bash
# ci/gate.sh — the conformance gate a backend port's CI calls:
#
#   bash ci/gate.sh --impl ./libmyport.so [--world W] [--cases N] [--seed S]
#                   [--junit FILE.xml] [--report FILE.md]
#
# Sets up and builds fsdpcheck (Release), runs the default sweep of the port
# against the reference under `mpiexec -n W` (default 4, covering W' = 1..W),
# and exits with the sweep's code: 0 pass, 1 a property failed (the minimal
# failing case and a reproducer are printed), 2 bad input. JUnit XML goes to
# FILE.xml (default gate-junit.xml) for the CI system to read.
set -uo pipefail
cd "$(dirname "$0")/.."
impl="" world=4 cases=300 seed=1 junit="gate-junit.xml" report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --impl) impl=$2; shift 2 ;;
    --world) world=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --junit) junit=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    *) echo "ci/gate.sh: unknown argument $1 (see the header of ci/gate.sh)" >&2; exit 2 ;;
  esac
done
if [ -z "$impl" ]; then echo "ci/gate.sh: --impl PATH.so (or reference) is required" >&2; exit 2; fi
case "$impl" in reference|/*) ;; *) impl="$(cd "$(dirname "$impl")" && pwd)/$(basename "$impl")" ;; esac
bash ci/setup.sh >/dev/null || exit 2
cmake --preset default >/dev/null && cmake --build --preset default -j "$(nproc)" >/dev/null || exit 2
export HWLOC_COMPONENTS=-pci,-x86
args=(sweep --impl "$impl" --cases "$cases" --seed "$seed" --junit "$junit")
[ -n "$report" ] && args+=(--report "$report")
mpiexec -n "$world" ./build/default/oracle/fsdpcheck "${args[@]}"
rc=$?
echo "ci/gate.sh: exit $rc, JUnit XML in $junit"
exit $rc
