#!/usr/bin/env bash
# tests/watchdog/watchdog.sh MPIEXEC FSDPCHECK HANG_PLUGIN.so — a hung rank
# never hangs the job (core/watchdog.h): with --timeout 5, every live rank
# must exit 3 within 5 + 10 s, and exactly one line must name where the job
# hung and the ranks that did not arrive:
#   1. run at W=2, one rank stopped with SIGSTOP (a deadlocked port looks so);
#   2. the same at W=4;
#   3. check of a plugin whose step blocks in a collective on rank 0;
#   4. sweep of that plugin: the hung case fails as a timeout in the JUnit XML;
#   5. the "shrink it:" line the sweep printed, run (tools/fsdpcheck-shrink-timeout,
#      --timeout 2): the plugin hangs on a second step with a peer, so the
#      smallest hanging case is W=2, 2 steps, the smallest model, fp32.
# Each case is bounded by an outer `timeout`, so this test itself cannot hang.
set -u
mpiexec=$1 bin=$2 plugin=$3
export HWLOC_COMPONENTS=-pci,-x86
tmp=$(mktemp -d)
# In the coverage build libgcov reports on stderr ("libgcov profiling error:
# ...gcda: ...", seen here after a rebuild; a rank killed by the abort while
# it writes its .gcda leaves one torn), which expect() would count against
# the one-line rule: libgcov writes to this file instead (other builds ignore
# the variable).
export GCOV_ERROR_FILE=$tmp/gcov-errors
trap 'pkill -KILL -f "fsdpcheck-watchdog-test-$$" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect NAME OUT ERR RC SECONDS PATTERN: exit 3, in time, one line on stderr
# matching PATTERN. The job ends by MPI_Abort, after which MPICH adds its own
# prefix line (its message is suppressed): "Abort(3) on node N (rank R in comm C): "
# is the launcher's, allowed; any other line is not.
expect() {
  local name=$1 out=$2 err=$3 rc=$4 secs=$5 pat=$6
  local lines ours others
  lines=$(grep -c '' "$err")
  ours=$(grep -c '^fsdpcheck: ' "$err")
  others=$(grep -v '^fsdpcheck: ' "$err" | grep -cvE '^Abort\(3\) on node [0-9]+ \(rank [0-9]+ in comm [0-9]+\): *$')
  echo "$name: exit $rc after ${secs} s; stderr ($lines lines):"
  cat "$err"
  [ "$rc" -eq 3 ] || fail "$name: exit $rc, want 3"
  [ "$secs" -le 15 ] || fail "$name: took $secs s, want at most timeout + 10 = 15"
  [ "$ours" -eq 1 ] || fail "$name: $ours 'fsdpcheck: ' lines on stderr, want one"
  [ "$others" -eq 0 ] || fail "$name: $others other lines on stderr"
  grep -qE "$pat" "$err" || fail "$name: the line does not match /$pat/"
}

stop_one() {  # stop_one W: run at W, SIGSTOP the last rank once all watch
  local W=$1 tag="fsdpcheck-watchdog-test-$$-$1"
  # the seed names this job's processes for pgrep
  timeout 60 "$mpiexec" -n "$W" "$bin" run --model gpt2-tiny --strategy full_shard --steps 1000000 --quiet \
    --timeout 5 --seed $(( $$ * 10 + W )) >"$tmp/out$W" 2>"$tmp/err$W" &
  local job=$!
  # Stop a rank only once every rank runs its watchdog thread ("fc-watchdog",
  # started collectively in fc_watchdog_start): a rank stopped before that,
  # in MPI_Init on a slow machine, would hang its peers where no watchdog
  # watches yet, and the case would measure nothing (a fixed sleep raced it).
  # (The pattern also matches timeout's and mpiexec's command lines; only
  # the ranks have the thread.)
  local p ranks=() i
  for ((i = 0; i < 300; i++)); do
    ranks=()
    for p in $(pgrep -f "fsdpcheck run .*--seed $(( $$ * 10 + W ))\$" | sort -n); do
      grep -qx fc-watchdog /proc/"$p"/task/*/comm 2>/dev/null && ranks+=("$p")
    done
    [ "${#ranks[@]}" -eq "$W" ] && break
    sleep 0.1
  done
  if [ "${#ranks[@]}" -ne "$W" ]; then
    fail "W=$W: ${#ranks[@]} of $W ranks started their watchdog within 30 s"
    kill $job; wait $job; return
  fi
  local victim=${ranks[$((W - 1))]}
  local t0=$SECONDS
  kill -STOP "$victim"
  wait $job
  local rc=$?
  expect "SIGSTOP at W=$W" "$tmp/out$W" "$tmp/err$W" $rc $((SECONDS - t0)) \
    "timeout: no rank made progress for 5 s.*did not arrive:.* \(no heartbeat for"
  unset tag
}
stop_one 2
stop_one 4

t0=$SECONDS
timeout 60 "$mpiexec" -n 2 "$bin" check --impl "$plugin" --model gpt2-tiny --strategy full_shard --steps 4 \
  --timeout 5 >"$tmp/outc" 2>"$tmp/errc"
expect "check of a plugin blocked in a collective" "$tmp/outc" "$tmp/errc" $? $((SECONDS - t0)) \
  "timeout: no rank made progress for 5 s.*step 1"

t0=$SECONDS
timeout 90 "$mpiexec" -n 2 "$bin" sweep --impl "$plugin" --cases 3 --quiet --timeout 5 --junit "$tmp/j.xml" \
  >"$tmp/outs" 2>"$tmp/errs"
rc=$?
secs=$((SECONDS - t0))
echo "sweep of that plugin: exit $rc after $secs s; stdout:"; cat "$tmp/outs"; echo "stderr:"; cat "$tmp/errs"
[ "$rc" -eq 3 ] || fail "sweep: exit $rc, want 3"
grep -q "timed out" "$tmp/outs" || fail "sweep: no 'timed out' line"
grep -q "<failure" "$tmp/j.xml" 2>/dev/null && grep -q "timeout" "$tmp/j.xml" || fail "sweep: the JUnit XML has no timeout failure"

line=$(grep "^shrink it: fsdpcheck-shrink-timeout " "$tmp/outs")
echo "the sweep's shrink line: $line"
if [ -z "$line" ]; then
  fail "sweep: no 'shrink it:' line"
else
  shrinker=$(cd "$(dirname "$0")/../../tools" && pwd)/fsdpcheck-shrink-timeout
  # the printed command, with the shrinker of this tree and a 2 s timeout
  eval "set -- ${line#shrink it: fsdpcheck-shrink-timeout }"
  W=$1 spec=$2; shift 3
  t0=$SECONDS
  FSDPCHECK=$bin MPIEXEC=$mpiexec timeout 600 "$shrinker" "$W" "$spec" 2 "$@" >"$tmp/outk" 2>"$tmp/errk"
  rc=$?
  echo "shrinking the timed-out case: exit $rc after $((SECONDS - t0)) s; stdout:"; cat "$tmp/outk"
  echo "stderr:"; cat "$tmp/errk"
  [ "$rc" -eq 0 ] || fail "shrink: exit $rc, want 0"
  final=$(grep "^minimal timed-out case (W=" "$tmp/outk")
  [[ $final == *"(W=2,"* ]] || fail "shrink: not down to W=2: $final"
  [[ $final == *"--steps 2 "* ]] || fail "shrink: not down to 2 steps: $final"
  [[ $final == *"-micro "* ]] || fail "shrink: not down to the micro model: $final"
  [[ $final != *"bf16"* && $final != *"fp16"* ]] || fail "shrink: not down to fp32: $final"
  # a case that does not hang is refused: exit 1
  FSDPCHECK=$bin MPIEXEC=$mpiexec timeout 120 "$shrinker" 1 "--model mlp-micro --steps 2 --global-batch 2" 2 \
    "$@" >/dev/null 2>"$tmp/errn"
  rc=$?
  [ "$rc" -eq 1 ] || fail "shrink of a case that does not hang: exit $rc, want 1"
  grep -q "does not time out" "$tmp/errn" || fail "shrink of a case that does not hang: $(cat "$tmp/errn")"
fi

if [ $fails -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; exit 1; fi
