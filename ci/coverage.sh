#!/usr/bin/env bash
# ci/coverage.sh [--keep-going] [--preset NAME] [--labels REGEX] [--skip-labels REGEX]
#                [--exclude REGEX] — line and branch coverage of core/, reference/ and oracle/
# by the test suite.
#
#   1. builds the preset NAME (default coverage: Debug, gcc --coverage -O0; CI uses
#      debug-coverage, the same with ASan and UBSan, so that its sanitizer run and its
#      coverage run are one run) in its build directory;
#   2. clears old counters and runs ctest -L 'unit|mpi|property|gate' -LE
#      extended (the unit tests, the MPI programs at W = 1..4, the bad-input
#      corpus, the conformance gate: sweeps, fault catalogue, checkpoint crash
#      trials, the out-of-tree plugin), or the labels given with --labels,
#      less those of --skip-labels (-LE; default extended) and the tests whose
#      names match --exclude;
#   3. captures the counters with lcov, writes the HTML report to
#      <build>/html (index.html) and prints line and branch coverage for
#      each of core/, reference/ and oracle/.
#
# JOBS (default: the cores) sets the build's jobs, CTEST_JOBS (default: twice JOBS) ctest's.
#
# Exit 1 when any of the three folders is below FC_COVERAGE_MIN_LINES percent
# of lines (default 90), or when a test failed (the report is written anyway:
# the numbers then describe the tests that ran). A build failure stops the
# script at once, unless --keep-going: then what builds is tested and every
# test whose program did not build counts as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
labels='unit|mpi|property|gate'
skip_labels='extended'
exclude=''
preset=coverage
keep_going=0
while [ $# -gt 0 ]; do
  case $1 in
    --keep-going) keep_going=1 ;;
    --labels) labels=$2; shift ;;
    --skip-labels) skip_labels=$2; shift ;;
    --preset) preset=$2; shift ;;
    --exclude) exclude=$2; shift ;;
    *) echo "usage: ci/coverage.sh [--keep-going] [--preset NAME] [--labels REGEX] [--skip-labels REGEX] [--exclude REGEX]" >&2; exit 2 ;;
  esac
  shift
done
min=${FC_COVERAGE_MIN_LINES:-90}
JOBS=${JOBS:-$(nproc)}
# ctest's slots: twice the cores by default. Under ASan and gcov these tests are mostly
# process start-up, mpiexec and counter writes, not arithmetic, so more slots than cores
# finish sooner (docs/measurements/ci-time.md). A test that takes more cores says so (PROCESSORS), and ctest honours it.
CTEST_JOBS=${CTEST_JOBS:-$((2 * JOBS))}
bash ci/setup.sh >/dev/null
export HWLOC_COMPONENTS=-pci,-x86
root=$PWD
B=$root/build/$preset
out=$B/lcov
start=$(date +%s)

echo "== coverage: build (preset $preset)"
cmake --preset "$preset" >/dev/null
grep -q '^FC_COVERAGE:BOOL=ON' "$B/CMakeCache.txt" || { echo "ci/coverage.sh: preset $preset does not build with FC_COVERAGE" >&2; exit 2; }
if [ $keep_going -eq 1 ]; then
  cmake --build --preset "$preset" -j "$JOBS" -- -k || echo "coverage: some targets did not build (--keep-going)"
else
  cmake --build --preset "$preset" -j "$JOBS"
fi

echo "== coverage: tests (-L '$labels' -LE '$skip_labels'${exclude:+ -E '$exclude'})"
find "$B" -name '*.gcda' -delete
rm -rf "$out"
mkdir -p "$out"
tests_ok=1
ctest --test-dir "$B" -L "$labels" -LE "$skip_labels" ${exclude:+-E "$exclude"} -j "$CTEST_JOBS" --output-on-failure \
  --timeout 3600 >"$out/ctest.log" 2>&1 || tests_ok=0
sed -n '/tests passed/,$p' "$out/ctest.log"
# a failure's own output, so that CI's log says why (the passes are left out)
[ $tests_ok -eq 1 ] || grep -vE 'Test +#[0-9]+: .* Passed' "$out/ctest.log" | tail -n 400

echo "== coverage: lcov"
rc=(--rc lcov_branch_coverage=1)
lcov -q "${rc[@]}" --capture --directory "$B" --output-file "$out/all.info" 2>"$out/lcov.err" ||
  { cat "$out/lcov.err"; exit 1; }
lcov -q "${rc[@]}" --extract "$out/all.info" "$root/core/*" "$root/reference/*" "$root/oracle/*" \
  --output-file "$out/project.info"
genhtml -q "${rc[@]}" --branch-coverage --legend --title "fsdpcheck" --prefix "$root" \
  --output-directory "$B/html" "$out/project.info" >/dev/null
low=0
printf '%-11s %8s %17s %8s %17s\n' folder lines "" branches ""
for d in core reference oracle; do
  lcov -q "${rc[@]}" --extract "$out/project.info" "$root/$d/*" --output-file "$out/$d.info"
  s=$(lcov "${rc[@]}" --summary "$out/$d.info" 2>&1)
  l=$(awk '/lines\.\.\.\.\.\.:/ {print $2, $3, $5}' <<<"$s" | tr -d '(%')
  b=$(awk '/branches\.\.\.:/ {print $2, $3, $5}' <<<"$s" | tr -d '(%')
  read -r lp lh lt <<<"$l"
  read -r bp bh bt <<<"${b:-0 0 0}"
  printf '%-11s %7s%% %17s %7s%% %17s\n' "$d/" "$lp" "($lh of $lt)" "$bp" "($bh of $bt)"
  if awk -v p="$lp" -v m="$min" 'BEGIN { exit !(p < m) }'; then
    echo "coverage: $d/ has $lp% of lines covered, below $min%"
    low=1
  fi
done
echo "coverage: HTML report in $B/html/index.html ($(( $(date +%s) - start )) s)"
[ $tests_ok -eq 1 ] || echo "coverage: some tests failed (see $out/ctest.log)"
[ $tests_ok -eq 1 ] && [ $low -eq 0 ]
