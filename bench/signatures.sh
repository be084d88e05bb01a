#!/usr/bin/env bash
# bench/signatures.sh BUILD_DIR [OUT.md] — regenerates docs/measurements/signatures.md's tables:
#   1. every fault of the catalogue injected into the reference's sweep at W = 4 (as the
#      property.fault.* tests run it): the property that caught it and the signature of its
#      minimal case;
#   2. tests/mpi/signature.sh, the same faults under `check` on a config where each shows;
#   3. clean sweeps, where nothing may fail and so no signature may be printed: 1,000 cases of the
#      hardware-like port with every knob (W = 2) and 1,000 of the reference (W = 3).
# Prints Markdown to stdout (or OUT.md).
set -u
build=${1:?usage: bench/signatures.sh BUILD_DIR [OUT.md]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/oracle/fsdpcheck port=$build/ports/libfsdpcheck_hwlike.so
export HWLOC_COMPONENTS=-pci,-x86
[ $# -ge 2 ] && exec >"$2"
faults=$(sed -n '/^set(FC_FAULTS/,/)/p' "$ROOT/tests/CMakeLists.txt" | sed 's/^set(FC_FAULTS//; s/)//' | tr -s ' \n' '\n' | grep .)
echo "## The catalogue's sweeps (W = 4, the property.fault.* tests)"
echo
echo "| fault | caught by | signature of the minimal case |"
echo "|---|---|---|"
for f in $faults; do
  out=$(mpiexec -n 4 "$bin" sweep --inject "$f" --quiet 2>&1)
  caught=$(printf '%s\n' "$out" | grep -m1 -oE '^caught by P[0-9]+' | cut -d' ' -f3)
  sig=$(printf '%s\n' "$out" | grep -m1 '^signature: ' | cut -d' ' -f2-)
  echo "| $f | ${caught:-?} | ${sig:-(none printed: the failure is not in a step of numbers)} |"
done
echo
echo "## Under check (tests/mpi/signature.sh)"
echo
echo '```'
bash "$ROOT/tests/mpi/signature.sh" mpiexec "$bin" 2>&1 | grep -vE '^(first divergence|  )'
echo '```'
echo
echo "## Clean sweeps"
echo
for run in "hwlike 2 5100 $port" "reference 3 5200 reference"; do
  set -- $run
  t0=$SECONDS
  out=$(FSDPCHECK_HWLIKE=all mpiexec -n "$2" "$bin" sweep --impl "$4" --cases 1000 --seed "$3" --keep-going --quiet 2>&1)
  echo "- $1, W = $2, seed $3: $(printf '%s\n' "$out" | grep -m1 '^fsdpcheck sweep:' | cut -d: -f2-); signature lines: $(printf '%s\n' "$out" | grep -c '^signature: ') ($((SECONDS - t0)) s)"
done
