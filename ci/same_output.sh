#!/usr/bin/env bash
# ci/same_output.sh BIN_A BIN_B [OUT] — shows that two builds of fsdpcheck behave the same,
# for a change that means to alter none of it (a refactor): the traces of a gpt2-tiny, a
# llama-tiny and an FSDP2 run byte for byte (diff -r), and the text of compare's verdicts,
# a sweep, a fault the sweep catches and the whole bad-input corpus (timings and temporary
# paths scrubbed; stdout and stderr apart, since mpiexec forwards them separately). Prints one line per item and exits 1 if any differs.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: ci/same_output.sh BIN_A BIN_B [OUT]" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
A=$(realpath "$1") B=$(realpath "$2")
out=${3:-$(mktemp -d "${TMPDIR:-/tmp}/fc_same.XXXXXX")}
mkdir -p "$out"
export HWLOC_COMPONENTS=-pci,-x86
MPIEXEC=${MPIEXEC:-mpiexec}
# the timings, thread counts and temporary directories a run prints are not behaviour
scrub() { sed -E -e "s#$out/[ab]#OUT#g" -e 's/[0-9]+(\.[0-9]+)? ?(s|ms|MiB)\b/T/g' -e 's#/tmp/[A-Za-z0-9_.]+#TMP#g'; }
runs=(
  "gpt2|2|run --model gpt2-tiny --strategy full_shard --steps 3 --quiet"
  "llama|2|run --model llama-tiny --strategy hybrid_shard --shard-group 1 --param-dtype bf16 --steps 2 --quiet"
  "fsdp2|2|run --model gpt2-tiny --fsdp-version 2 --strategy full_shard --forward-prefetch --grad-accum 2 --steps 2 --quiet"
  "mlp-w3|3|run --model mlp-tiny --strategy full_shard --clip-grad-norm 0.5 --global-batch 6 --steps 3 --quiet"
)
bad=0
for side in a b; do
  bin=$A; [ $side = b ] && bin=$B
  d=$out/$side && rm -rf "$d" && mkdir -p "$d"
  for r in "${runs[@]}"; do
    IFS='|' read -r name w flags <<<"$r"
    # shellcheck disable=SC2086
    "$MPIEXEC" -n "$w" "$bin" $flags --trace "$d/$name" >"$d/$name.out" 2>"$d/$name.err" || echo "exit $?" >>"$d/$name.out"
  done
  "$bin" compare "$d/gpt2" "$d/fsdp2" >"$d/compare.txt" 2>"$d/compare.err"; echo "exit $?" >>"$d/compare.txt"
  "$bin" compare "$d/gpt2" "$d/gpt2" --report "$d/compare.md" >"$d/compare_same.txt" 2>"$d/compare_same.err"; echo "exit $?" >>"$d/compare_same.txt"
  "$bin" sensitivity "$d/gpt2" "$d/gpt2" >"$d/sensitivity.txt" 2>"$d/sensitivity.err"; echo "exit $?" >>"$d/sensitivity.txt"
  "$MPIEXEC" -n 2 "$bin" sweep --cases 30 --seed 7 --report "$d/sweep.md" >"$d/sweep.txt" 2>"$d/sweep.err"; echo "exit $?" >>"$d/sweep.txt"
  "$MPIEXEC" -n 2 "$bin" sweep --cases 30 --seed 7 --inject no_divide >"$d/inject.txt" 2>"$d/inject.err"; echo "exit $?" >>"$d/inject.txt"
  bash "$here/tests/bad_input/run.sh" "$bin" "$MPIEXEC" >"$d/bad_input.txt" 2>"$d/bad_input.err"; echo "exit $?" >>"$d/bad_input.txt"
  for f in "$d"/*.txt "$d"/*.out "$d"/*.err "$d"/*.md; do scrub <"$f" >"$f.s"; done
done
for r in "${runs[@]}"; do
  name=${r%%|*}
  if diff -r "$out/a/$name" "$out/b/$name" >/dev/null; then echo "same  trace $name ($(ls "$out/a/$name" | wc -l) files)"
  else echo "DIFF  trace $name"; bad=1; fi
done
for f in "$out"/a/*.s; do
  n=$(basename "$f")
  if cmp -s "$f" "$out/b/$n"; then echo "same  ${n%.s} ($(wc -l <"$f") lines)"
  else echo "DIFF  ${n%.s}: diff $f $out/b/$n"; bad=1; fi
done
[ $bad -eq 0 ] && echo "same_output: the two builds behave the same ($out)"
exit $bad
