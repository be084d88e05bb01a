#!/usr/bin/env bash
# ci/valgrind-one.sh TEST_BINARY [ARGS...] — runs one Criterion test binary under
# valgrind memcheck and fails on any memory error or definite/indirect leak.
#
# Criterion runs every test in a forked worker and ignores valgrind's
# --error-exitcode (Snaipe/Criterion#137), so valgrind follows the children and
# writes one log per process, and this script reads every log's summary.
set -uo pipefail
bin=$1; shift
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
# MPICH's hwloc probes PCI and x86 topology, which valgrind reports as a leak.
export HWLOC_COMPONENTS=-pci,-x86
# FC_VALGRIND_SKIP: children not to follow (the CLI tests spawn fsdpcheck
# dozens of times; memcheck.fsdpcheck checks the binary itself, once per command).
valgrind --trace-children=yes ${FC_VALGRIND_SKIP:+--trace-children-skip=$FC_VALGRIND_SKIP} --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --track-origins=no \
  --log-file="$logdir/vg.%p.log" "$bin" "$@"
rc=$?
bad=0
nlogs=0
for f in "$logdir"/vg.*.log; do
  [ -e "$f" ] || continue
  nlogs=$((nlogs + 1))
  # definite and indirect leaks count as errors (--errors-for-leak-kinds). A
  # log with no summary at all is a child that exec()ed a program valgrind
  # was told not to follow (FC_VALGRIND_SKIP): nothing ran under it.
  if grep -q "ERROR SUMMARY: [1-9]" "$f" || grep -qE "Invalid (read|write|free)|uninitialised" "$f"; then
    echo "valgrind found errors in $(basename "$f"):"
    cat "$f"
    bad=1
  fi
done
summary=$(grep -h "ERROR SUMMARY" "$logdir"/vg.*.log | sed 's/==[0-9]*== //' | sort | uniq -c | tr -s ' ')
echo "valgrind: $nlogs processes checked:$summary; test exit $rc"
[ $rc -eq 0 ] && [ $bad -eq 0 ]
