#!/usr/bin/env bash
# honest.sh MPIEXEC FSDPCHECK PORT.so [W] [SEED] — the long acceptance runs of
# the hardware-like port (no false alarm on an honest port): the sweep at
# W ranks (default 2) with every knob on (1,000 cases) and with each knob
# alone (300 cases each), on seeds from SEED (default 4900) that the gate
# never uses; every case with --keep-going. Prints one line per run (cases,
# failures, seconds, and how many cases were fp32, bf16 and fp16) and exits 1
# if any failed. Label extended: about 10 minutes on two cores.
set -u
mpiexec=$1 bin=$2 port=$3 W=${4:-2} seed=${5:-4900}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
sweep() {  # sweep KNOBS CASES
  local knobs=$1 cases=$2 rep=$work/$1.xml
  seed=$((seed + 1))
  FSDPCHECK_HWLIKE=$knobs "$mpiexec" -n "$W" "$bin" sweep --impl "$port" --cases "$cases" --seed "$seed" \
    --keep-going --quiet --junit "$rep" >"$work/$knobs.out" 2>&1
  local rc=$? line fp16 bf16
  line=$(grep -E "^fsdpcheck sweep:" "$work/$knobs.out")
  bf16=$(grep -cE '<testcase .*--param-dtype bf16' "$rep")
  fp16=$(grep -cE '<testcase .*--param-dtype fp16' "$rep")
  printf '%-10s seed %-5s %s  [fp32 %d, bf16 %d, fp16 %d]\n' "$knobs" "$seed" "${line#fsdpcheck sweep: }" \
    $((cases - bf16 - fp16)) "$bf16" "$fp16"
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    grep -E "^case [0-9]+ failed|^  P[0-9]+ " "$work/$knobs.out" | head -n 20
  fi
}
sweep all 1000
for k in matmul fma compute16 ring tree avg attention norms atomics; do sweep "$k" 300; done
[ "$failed" -eq 0 ] && echo "honest.sh: no false alarm" || { echo "honest.sh: $failed runs failed"; exit 1; }
