#!/usr/bin/env bash
# tests/watchdog/watchdog.sh MPIEXEC FSDPCHECK HANG_PLUGIN.so — a hung rank
# never hangs the job (core/watchdog.h): with --timeout 5, every live rank
# must exit 3 within 5 + 10 s, and exactly one line must name where the job
# hung and the ranks that did not arrive:
#   1. run at W=2, one rank stopped with SIGSTOP (a deadlocked port looks so);
#   2. the same at W=4;
#   3. check of a plugin whose step blocks in a collective on rank 0;
#   4. sweep of that plugin: the hung case fails as a timeout in the JUnit XML.
# Each case is bounded by an outer `timeout`, so this test itself cannot hang.
set -u
mpiexec=$1 bin=$2 plugin=$3
export HWLOC_COMPONENTS=-pci,-x86
tmp=$(mktemp -d)
trap 'pkill -KILL -f "fsdpcheck-watchdog-test-$$" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect NAME OUT ERR RC SECONDS PATTERN: exit 3, in time, one line on stderr matching PATTERN
expect() {
  local name=$1 out=$2 err=$3 rc=$4 secs=$5 pat=$6
  local lines; lines=$(grep -c '' "$err")
  echo "$name: exit $rc after ${secs} s; stderr ($lines line):"
  cat "$err"
  [ "$rc" -eq 3 ] || fail "$name: exit $rc, want 3"
  [ "$secs" -le 15 ] || fail "$name: took $secs s, want at most timeout + 10 = 15"
  [ "$lines" -eq 1 ] || fail "$name: $lines lines on stderr, want one"
  grep -qE "$pat" "$err" || fail "$name: the line does not match /$pat/"
}

stop_one() {  # stop_one W: run at W, SIGSTOP the last rank after 2 s
  local W=$1 tag="fsdpcheck-watchdog-test-$$-$1"
  # the seed names this job's processes for pgrep
  timeout 60 "$mpiexec" -n "$W" "$bin" run --model gpt2-tiny --strategy full_shard --steps 1000000 --quiet \
    --timeout 5 --seed $(( $$ * 10 + W )) >"$tmp/out$W" 2>"$tmp/err$W" &
  local job=$!
  sleep 2
  local pids; pids=$(pgrep -f "fsdpcheck run .*--seed $(( $$ * 10 + W ))\$" | sort -n)
  local victim; victim=$(echo "$pids" | tail -1)
  [ -n "$victim" ] || { fail "W=$W: no rank process found"; kill $job; return; }
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

if [ $fails -eq 0 ]; then echo " No Errors"; else echo " Found $fails errors"; exit 1; fi
