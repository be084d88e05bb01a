#!/usr/bin/env bash
# bench/sweep_time.sh [CASES] [W] — times the default sweep (Release build):
# CASES random cases (default 300) over W' = 1..W (default 4), and prints the
# wall time against the 120 s budget of the 2-core CI machine, with the
# cases per second and the share of cases per world size.
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-300} W=${2:-4}
bash ci/setup.sh >/dev/null
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target fsdpcheck >/dev/null
export HWLOC_COMPONENTS=-pci,-x86
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
mpiexec -n "$W" ./build/default/oracle/fsdpcheck sweep --cases "$cases" --junit "$log.xml" 2>/dev/null | tee "$log"
end=$(date +%s.%N)
python3 - "$start" "$end" "$cases" "$log.xml" <<'PY'
import sys, re, collections
start, end, cases, junit = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
wall = end - start
per_w = collections.Counter(re.findall(r'name="case \d+ W=(\d+)', open(junit).read()))
print(f"sweep: {cases} cases in {wall:.1f} s wall ({cases / wall:.1f} cases/s); budget 120 s: "
      f"{'within' if wall <= 120 else 'OVER'} ({wall / 120:.2f} of budget)")
print("cases per world size: " + ", ".join(f"W={w}: {n}" for w, n in sorted(per_w.items())))
PY
rm -f "$log.xml"
