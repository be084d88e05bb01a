#!/usr/bin/env bash
# tests/crash/ckpt_crash.sh FSDPCHECK MPIEXEC [TRIALS] [SEED] — crash safety of
# checkpoints (docs/contract.md §6): kill -9 the writer at random points, many times.
#
# A gpt2 of n_embd 256, n_layer 4 (3.4M parameters: a 40 MB checkpoint, so a
# save takes long enough to be interrupted anywhere) trains one step and saves
# into B, over and over: FULL from one process, SHARDED from full_shard at W=2
# (mpiexec; a random rank is killed, and MPI takes the other down), with two
# data seeds taking turns, so consecutive saves into B hold different bytes of
# the same sizes (a torn mix of two saves would show). Each trial
# kills the writer with SIGKILL at a random moment: mostly a random delay after
# the save has visibly begun (B's directory listing changed), sometimes at a
# random moment of the whole run. Then:
#   - checkpoint A, saved complete before the trials, must still verify
#     (every trial) and load (every 10th);
#   - B must be either complete and valid (`ckpt verify` exit 0 and every file
#     byte-identical to the reference checkpoint of its kind and seed: nothing
#     partial or mixed was accepted; `run --load` exit 0, checked on every 4th valid B) or
#     refused (`ckpt verify` and `run --load` both exit 2 with one line on
#     stderr); anything else (a crash, another exit code, a valid checkpoint
#     with different bytes) fails the test.
# The outcomes are counted and printed.
set -u
bin=$1 mpiexec=$2 trials=${3:-40} seed=${4:-20261121}
RANDOM=$seed
export HWLOC_COMPONENTS=-pci,-x86
work=$(mktemp -d "${TMPDIR:-/tmp}/fc_ckpt_crash_XXXXXX")
writer=""
cleanup() {
  if [ -n "$writer" ]; then kill -9 "$writer" 2>/dev/null; wait "$writer" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

cfg=$work/gpt2-256x4.json
echo '{"model_type": "gpt2", "vocab_size": 1024, "n_positions": 32, "n_embd": 256, "n_layer": 4, "n_head": 4}' >"$cfg"
base=(--model "$cfg" --steps 1 --global-batch 2 --seq-len 8)
common=("${base[@]}" --quiet)
A=$work/A B=$work/B
SEEDS=(1234 4321)

# one line on stderr, exit 2
expect_refused() {  # what rc errfile
  local lines; lines=$(wc -l <"$3")
  [ "$2" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q '^fsdpcheck: ' "$3" ||
    fail "$1: exit $2 with $lines stderr lines (want exit 2, one line): $(cat "$3")"
}

# the checkpoints every trial is judged against, and how long runs and saves take
save_ms() { sed -n 's/^checkpoint .* saved to .* (\([0-9]*\)\.[0-9] ms)$/\1/p' "$work/out"; }
for s in "${SEEDS[@]}"; do
  t0=$(ms)
  "$bin" run "${base[@]}" --seed "$s" --save "$work/ref-full-$s" >"$work/out" || fail "saving a reference"
  t_full=$(( $(ms) - t0 )) s_full=$(save_ms)
  t0=$(ms)
  "$mpiexec" -n 2 "$bin" run "${base[@]}" --seed "$s" --strategy full_shard --save "$work/ref-sharded-$s" \
    --state-dict sharded >"$work/out" || fail "saving a sharded reference"
  t_sharded=$(( $(ms) - t0 )) s_sharded=$(save_ms)
done
cp -r "$work/ref-full-${SEEDS[0]}" "$A"
"$bin" ckpt verify "$A" >/dev/null || fail "A does not verify"
echo "reference runs: full (W=1) $t_full ms (save $s_full ms), sharded (W=2) $t_sharded ms (save $s_sharded ms);" \
  "checkpoint $(du -sh "$A" | cut -f1)"
shopt -s nullglob

valid=0 refused=0 killed=0 finished=0 mid_save=0 leftovers=0
for ((t = 1; t <= trials; t++)); do
  if (( t % 2 )); then kind=full; else kind=sharded; fi
  s=${SEEDS[$(( (t / 2) % 2 ))]}
  snap=("$B"/*)
  before="${snap[*]}"
  if [ "$kind" = full ]; then
    "$bin" run "${common[@]}" --seed "$s" --save "$B" --state-dict full >/dev/null 2>&1 &
  else
    "$mpiexec" -n 2 "$bin" run "${common[@]}" --seed "$s" --strategy full_shard --save "$B" --state-dict sharded \
      >/dev/null 2>&1 &
  fi
  writer=$!
  # when to kill: 3 trials in 4 a random delay after the save visibly began,
  # else a random moment of the whole run
  if (( RANDOM % 4 )); then
    how="save+"
    while kill -0 "$writer" 2>/dev/null; do
      snap=("$B"/*)
      [ "${snap[*]}" != "$before" ] && break
      sleep 0.001
    done
    [ "$kind" = full ] && span=$s_full || span=$s_sharded
    delay=$(( RANDOM % (span * 5 / 4 + 1) ))
  else
    how="run+"
    [ "$kind" = full ] && span=$t_full || span=$t_sharded
    delay=$(( RANDOM % (span + 200) ))
  fi
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  victim=$writer
  if [ "$kind" = sharded ]; then  # a random rank: mpiexec -> proxy -> ranks
    ranks=()
    for proxy in $(pgrep -P "$writer" 2>/dev/null); do ranks+=($(pgrep -P "$proxy" 2>/dev/null)); done
    if [ ${#ranks[@]} -gt 0 ]; then victim=${ranks[$((RANDOM % ${#ranks[@]}))]}; fi
  fi
  kill -9 "$victim" 2>/dev/null
  { wait "$writer"; } 2>/dev/null  # no "Killed" job notice
  rc=$?
  writer=""
  if [ "$rc" -eq 0 ]; then finished=$((finished + 1)); state=finished; else killed=$((killed + 1)); state="killed (exit $rc)"; fi
  [ "$how" = "save+" ] && [ "$rc" -ne 0 ] && mid_save=$((mid_save + 1))
  tmps=("$B"/*.tmp.*)
  [ ${#tmps[@]} -gt 0 ] && leftovers=$((leftovers + 1))

  # B: complete and valid, or refused
  "$bin" ckpt verify "$B" >"$work/out" 2>"$work/err"
  vrc=$?
  if [ "$vrc" -eq 0 ]; then
    sd=$(sed -n 's/.*: valid fsdpcheck checkpoint: \([a-z]*\) state dict.*/\1/p' "$work/out")
    bs=$(sed -n 's/^\t\t"seed":\t"\([0-9]*\)",*$/\1/p' "$B/fsdpcheck.json")
    ref=$work/ref-$sd-$bs
    [ -d "$ref" ] || fail "trial $t: B verifies but holds seed '$bs', which no save used"
    for f in "$ref"/*; do
      cmp -s "$f" "$B/$(basename "$f")" ||
        fail "trial $t: B verifies but $(basename "$f") differs from the reference ($sd, seed $bs)"
    done
    valid=$((valid + 1)); outcome="B valid ($sd, seed $bs)"
    if (( valid % 4 == 1 )); then  # the bytes are the reference's; loading them takes time
      "$bin" run "${common[@]}" --load "$B" >/dev/null 2>"$work/err" ||
        fail "trial $t: B verifies but does not load: $(cat "$work/err")"
      outcome="$outcome, loaded"
    fi
  else
    expect_refused "trial $t: ckpt verify B" "$vrc" "$work/err"
    reason=$(cat "$work/err")
    "$bin" run "${common[@]}" --load "$B" >/dev/null 2>"$work/err"
    expect_refused "trial $t: run --load B" "$?" "$work/err"
    refused=$((refused + 1)); outcome="B refused: ${reason#fsdpcheck: }"
  fi
  # A is untouched by all of it
  "$bin" ckpt verify "$A" >/dev/null 2>"$work/err" || fail "trial $t: A no longer verifies: $(cat "$work/err")"
  if (( t % 10 == 0 )); then
    "$bin" run "${common[@]}" --load "$A" >/dev/null 2>"$work/err" || fail "trial $t: A no longer loads: $(cat "$work/err")"
  fi
  printf 'trial %2d: %-7s seed %s, kill -9 at %s%d ms: writer %s; %s\n' "$t" "$kind" "$s" "$how" "$delay" "$state" \
    "$outcome"
done
echo "ckpt crash test: $trials trials (seed $seed): writer killed $killed times ($mid_save after the save began), finished $finished times"
echo "  B complete and valid: $valid; B refused (exit 2, one line): $refused; trials leaving temporaries behind: $leftovers"
echo "  A verified after every trial and loaded every 10th: ok"
echo " No Errors"
