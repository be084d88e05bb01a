#!/usr/bin/env bash
# bench/torch_fsdp2_sweep.sh [CHUNKS] [CASES] [OUT] — the hunt over real FSDP2: CHUNKS x CASES
# random cases of `fsdpcheck-torch sweep --api fsdp2` (default 8 x 250 = 2000), one chunk at a
# time under `nice -n 10`, chunk k with --seed k (FIRST_SEED=S starts elsewhere), each judged
# against the reference. Every chunk writes OUT/chunk-K.log, .xml (JUnit) and .md (report with
# its coverage table) into OUT (default out/fsdp2-sweep); a chunk whose .xml exists is not run
# again, so a stopped hunt resumes where it stopped. fsdpcheck ($FSDPCHECK, else
# build/default) is copied to OUT/fsdpcheck first, so a rebuild during the hunt changes nothing.
# Ends with the totals: cases, time, failures (each failing case's flags), coverage summed.
# Exits 1 if a case failed. FSDPCHECK_TORCH_VENV picks the venv (default .venv-torch).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHUNKS=${1:-8}
CASES=${2:-250}
OUT=${3:-$ROOT/out/fsdp2-sweep}
FIRST=${FIRST_SEED:-1}
PY=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch}/bin/python
FC=${FSDPCHECK:-$ROOT/build/default/oracle/fsdpcheck}
export HWLOC_COMPONENTS=-pci,-x86 OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$OUT"
if [ ! -x "$OUT/fsdpcheck" ]; then
  cp "$FC" "$OUT/fsdpcheck.tmp" && mv "$OUT/fsdpcheck.tmp" "$OUT/fsdpcheck" || { echo "no fsdpcheck at $FC"; exit 2; }
fi
"$PY" -c 'import torch; print("torch", torch.__version__)'
"$OUT/fsdpcheck" --version
echo "$CHUNKS chunks x $CASES cases, seeds $FIRST..$((FIRST + CHUNKS - 1)), into $OUT"
for k in $(seq "$FIRST" $((FIRST + CHUNKS - 1))); do
  if [ -s "$OUT/chunk-$k.xml" ]; then
    echo "chunk $k: done before, kept"
    continue
  fi
  t0=$SECONDS
  nice -n 10 "$PY" -m fsdpcheck_torch sweep --cases "$CASES" --api fsdp2 --seed "$k" --fsdpcheck "$OUT/fsdpcheck" \
    --junit "$OUT/chunk-$k.xml.part" --report "$OUT/chunk-$k.md" >"$OUT/chunk-$k.log" 2>&1 </dev/null
  rc=$?
  [ -f "$OUT/chunk-$k.xml.part" ] && mv "$OUT/chunk-$k.xml.part" "$OUT/chunk-$k.xml"
  echo "$((SECONDS - t0))" >"$OUT/chunk-$k.seconds"
  echo "chunk $k: exit $rc, $((SECONDS - t0)) s: $(tail -n 1 "$OUT/chunk-$k.log")"
done
"$PY" - "$OUT" "$FIRST" "$CHUNKS" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET

out, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tests = fails = skips = secs = 0
bad, cov, order = [], {}, []
for k in range(first, first + n):
    x = os.path.join(out, f"chunk-{k}.xml")
    if not os.path.exists(x):
        print(f"chunk {k}: no JUnit file (see chunk-{k}.log)")
        continue
    root = ET.parse(x).getroot()
    tests += int(root.get("tests"))
    fails += int(root.get("failures"))
    skips += int(root.get("skipped"))
    with open(os.path.join(out, f"chunk-{k}.seconds")) as f:
        secs += int(f.read())
    for tc in root.iter("testcase"):
        for f in tc.iter("failure"):
            bad.append(f"seed {k}, {tc.get('name')}: {f.get('message')}")
    md = open(os.path.join(out, f"chunk-{k}.md")).read()
    for line in md[md.index("## Coverage") :].splitlines()[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5:
            if cells[0] not in cov:
                order.append(cells[0])
                cov[cells[0]] = [0, 0, 0, 0]
            cov[cells[0]] = [a + int(b) for a, b in zip(cov[cells[0]], cells[1:])]
ran = tests - skips
rate = f", {secs / ran:.1f} s a run" if ran else ""
print(f"\ntotal: {tests} cases, {ran} ran, {ran - fails} passed, {fails} failed, {skips} unsupported; {secs} s{rate}")
for b in bad:
    print("  FAIL " + b)
print("\n| feature | runs | passed | failed | unsupported |\n|---|---|---|---|---|")
for name in order:
    print(f"| {name} | " + " | ".join(map(str, cov[name])) + " |")
sys.exit(1 if fails else 0)
EOF
