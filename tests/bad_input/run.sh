#!/usr/bin/env bash
# tests/bad_input/run.sh FSDPCHECK MPIEXEC [KIND...] — feeds every malformed
# file of the corpus (tests/bad_input/CASES, written by make_corpus.py) to the
# command that reads it, and requires of each command:
#   - exit status 2 (not 0 or 1, not a signal, not a timeout);
#   - exactly one line on stderr, "fsdpcheck: ...", naming the file and
#     stating the problem (the CASES columns `names` and `expect`), so no
#     sanitizer report or MPI abort either; nothing on stdout (no partial
#     result);
#   - nothing half-written: the command runs in an empty directory with its
#     outputs (--trace, --save, --report, ckpt convert's DST) pointing into it,
#     and that directory must still be empty afterwards; the inputs are
#     unchanged.
#
# kinds and commands (T, C, C2: good trace/checkpoints written here first; a
# case of a directory is that directory with the case's files laid over it):
#   model    run --model FILE --steps 1 --trace t --save s
#   fsdp     run --fsdp-config FILE --steps 1 --trace t --save s
#   init     run --model mlp-micro --init FILE --steps 1 --trace t --save s
#   trace    compare T CASE --report r.md                      (trace.json, init, step file)
#   ckpt     ckpt verify CASE; ckpt convert CASE d --to sharded;
#            run --model mlp-micro --load CASE --steps 1 --trace t --save s
#   ckpt_w2  ckpt verify CASE; ckpt convert CASE d --to full;
#            mpiexec -n 2 run --model mlp-micro --strategy full_shard --load CASE --steps 1 ...
# Each good input first passes the same commands (exit 0), so every refusal
# here is the case's doing.
set -u
bin=$(realpath "$1") mpiexec=$2
shift 2
kinds=" ${*:-model fsdp init trace ckpt ckpt_w2} "
here=$(cd "$(dirname "$0")" && pwd)
export HWLOC_COMPONENTS=-pci,-x86
work=$(mktemp -d "${TMPDIR:-/tmp}/fc_bad_input.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
MICRO=(--model mlp-micro)  # the model of the good trace and checkpoints (make_corpus.py)
"$bin" run "${MICRO[@]}" --steps 2 --trace "$work/T" --quiet >/dev/null </dev/null ||
  { echo "FAIL: cannot write the good trace"; exit 1; }
"$bin" run "${MICRO[@]}" --steps 2 --save "$work/C" --quiet >/dev/null </dev/null ||
  { echo "FAIL: cannot write the good checkpoint"; exit 1; }
"$mpiexec" -n 2 "$bin" run "${MICRO[@]}" --strategy full_shard --steps 2 --save "$work/C2" --state-dict sharded \
  --quiet >/dev/null </dev/null || { echo "FAIL: cannot write the good sharded checkpoint"; exit 1; }

n=0 failed=0
fail() {
  echo "FAIL $label: $*"
  failed=$((failed + 1))
}

# try LABEL NAMES EXPECT WANT_RC CMD...: runs CMD in an empty directory out/
# and checks the contract (WANT_RC 0: the good input, which must pass).
try() {
  label=$1 names=$2 expect=$3 want=$4
  shift 4
  n=$((n + 1))
  rm -rf "$work/out" && mkdir "$work/out"
  (cd "$work/out" && timeout 120 "$@" </dev/null >"$work/stdout" 2>"$work/stderr")
  local rc=$? lines
  lines=$(wc -l <"$work/stderr")
  if [ "$want" -eq 0 ]; then
    [ $rc -eq 0 ] || fail "the good input fails (exit $rc): $(head -c 2000 "$work/stderr")"
    return
  fi
  local line
  line=$(head -n 1 "$work/stderr")
  if [ $rc -ne 2 ]; then
    fail "exit $rc, want 2; stderr: $(head -c 2000 "$work/stderr")"
  elif [ "$lines" -ne 1 ] || [ "$(tail -c 1 "$work/stderr" | od -An -c | tr -d ' ')" != '\n' ]; then
    fail "stderr is $lines lines, want one: $(head -c 2000 "$work/stderr")"
  elif [ "${line#fsdpcheck: }" = "$line" ]; then
    fail "the line does not start with 'fsdpcheck: ': $line"
  elif [[ "$line" != *"$names"* ]]; then
    fail "the line does not name $names: $line"
  elif [[ "$line" != *"$expect"* ]]; then
    fail "the line does not say '$expect': $line"
  elif [ -s "$work/stdout" ]; then
    fail "printed on stdout (a partial result): $(head -c 2000 "$work/stdout")"
  elif [ -n "$(ls -A "$work/out")" ]; then
    fail "left output behind: $(cd "$work/out" && find . | head -20 | tr '\n' ' ')"
  else
    echo "ok   $label: $line"
  fi
}

# the outputs of a refused run, in its empty directory
RUN_OUT=(--steps 1 --trace t --save s)

# a directory case: the good directory with the case's files over it; the
# copy is checked unchanged after each command
overlay() {  # overlay GOOD CASE_DIR -> $work/case
  rm -rf "$work/case" && cp -r "$1" "$work/case" && cp "$2"/* "$work/case/"
}
unchanged() {
  local now
  now=$(cd "$work/case" && find . -type f -exec sha256sum {} + | sort)
  [ "$now" = "$snapshot" ] || fail "the input directory changed"
}
snap() { snapshot=$(cd "$work/case" && find . -type f -exec sha256sum {} + | sort); }

# the good inputs pass
if [[ $kinds == *" model "* || $kinds == *" fsdp "* || $kinds == *" init "* ]]; then
  try "good init" "" "" 0 "$bin" run "${MICRO[@]}" --init "$work/T/init.safetensors" "${RUN_OUT[@]}"
fi
if [[ $kinds == *" trace "* ]]; then
  try "good trace" "" "" 0 "$bin" compare "$work/T" "$work/T" --report r.md
fi
if [[ $kinds == *" ckpt "* ]]; then
  try "good ckpt verify" "" "" 0 "$bin" ckpt verify "$work/C"
  try "good ckpt load" "" "" 0 "$bin" run "${MICRO[@]}" --load "$work/C" "${RUN_OUT[@]}"
fi
if [[ $kinds == *" ckpt_w2 "* ]]; then
  try "good ckpt_w2 verify" "" "" 0 "$bin" ckpt verify "$work/C2"
  try "good ckpt_w2 load" "" "" 0 "$mpiexec" -n 2 "$bin" run "${MICRO[@]}" --strategy full_shard --load "$work/C2" "${RUN_OUT[@]}"
fi

while IFS=$'\t' read -r kind path names expect; do
  case $kind in '#'* | '') continue ;; esac
  [[ $kinds == *" $kind "* ]] || continue
  src=$here/$path
  case $kind in
    model) try "$path" "$names" "$expect" 2 "$bin" run --model "$src" "${RUN_OUT[@]}" ;;
    fsdp) try "$path" "$names" "$expect" 2 "$bin" run --fsdp-config "$src" "${RUN_OUT[@]}" ;;
    init) try "$path" "$names" "$expect" 2 "$bin" run "${MICRO[@]}" --init "$src" "${RUN_OUT[@]}" ;;
    trace)
      overlay "$work/T" "$(dirname "$src")" && snap
      try "$path" "$names" "$expect" 2 "$bin" compare "$work/T" "$work/case" --report r.md
      unchanged
      ;;
    ckpt | ckpt_w2)
      good=$work/C to=sharded
      [ "$kind" = ckpt_w2 ] && good=$work/C2 to=full
      overlay "$good" "$(dirname "$src")" && snap
      try "$path (verify)" "$names" "$expect" 2 "$bin" ckpt verify "$work/case"
      try "$path (convert)" "$names" "$expect" 2 "$bin" ckpt convert "$work/case" d --to $to
      if [ "$kind" = ckpt ]; then
        try "$path (run --load)" "$names" "$expect" 2 "$bin" run "${MICRO[@]}" --load "$work/case" "${RUN_OUT[@]}"
      else
        try "$path (run --load, W=2)" "$names" "$expect" 2 "$mpiexec" -n 2 "$bin" run "${MICRO[@]}" --strategy full_shard \
          --load "$work/case" "${RUN_OUT[@]}"
      fi
      unchanged
      ;;
    *) fail "unknown kind $kind in CASES" ;;
  esac
done <"$here/CASES"
if [ $failed -eq 0 ]; then
  echo "bad_input:$kinds: $n commands, every malformed file refused with exit 2 and one line; No Errors"
  exit 0
fi
echo "bad_input:$kinds: $failed of $n commands broke the contract"
exit 1
