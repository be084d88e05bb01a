#!/usr/bin/env bash
# ci/torch.sh — the PyTorch adapter stage (adapters/torch):
#   1. a virtual environment with the pinned packages of adapters/torch/requirements.lock
#      (reused while the lock's hash matches; FSDPCHECK_TORCH_VENV moves it, e.g. to a
#      cache directory that outlives the clone), and the adapter installed in it;
#   2. the Release fsdpcheck binary: $FSDPCHECK, or build/default's (built if missing),
#      exported as FSDPCHECK, which is how the tests and the adapter's checks find it;
#   3. the adapter's tests with pytest on the CPU with gloo, at W = 1, 2 and 4, for
#      FSDP1 and FSDP2, each judged by `fsdpcheck compare` under the default policy;
#      JUnit XML in out/torch-junit-<lock name>.xml;
#   4. on the pinned lock's full suite, the adapter's own coverage (coverage.py, configured
#      in adapters/torch/pyproject.toml): every Python process the tests start is measured
#      (python -m fsdpcheck_torch, the torchrun workers), the data combined, the report
#      printed and written to out/torch-coverage.txt; the stage fails below 90% of the lines
#      of fsdpcheck_torch (only code marked `# pragma: no cover (cuda|hpu|xla)` is left out).
#      Not measured on another lock or the quick selection (the oldest pair's quick run is a
#      compatibility check: its coverage says nothing new); with FSDPCHECK_TORCH_PYTEST_ARGS
#      (a selection) the report is printed but not gated.
# FSDPCHECK_TORCH_TESTS=quick runs a smaller selection (see adapters/torch/tests/conftest.py);
# FSDPCHECK_TORCH_TESTS=xla runs tests/test_xla.py and test_xla_layout.py alone (with requirements-xla.lock: XLA's CPU client).
# FSDPCHECK_TORCH_LOCK names another lock (requirements-oldest.lock: the oldest supported
# torch/transformers pair), with its own virtual environment (.venv-torch-<lock name>);
# FSDPCHECK_TORCH_PYTEST_ARGS adds pytest arguments (a -k selection).
# --venv-only stops after step 1 (ci/test.sh makes the venvs in the background while the C
# stages run: their download and unpacking is mostly waiting on the network and the disk).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
venv_only=0
case ${1:-} in
  "") ;;
  --venv-only) venv_only=1 ;;
  *) echo "ci/torch.sh: unknown argument $1 (usage: ci/torch.sh [--venv-only])" >&2; exit 2 ;;
esac
LOCK=${FSDPCHECK_TORCH_LOCK:-adapters/torch/requirements.lock}
[ -f "$LOCK" ] || { echo "ci/torch.sh: no lock file $LOCK" >&2; exit 2; }
NAME=$(basename "$LOCK" .lock)
if [ "$NAME" = requirements ]; then VENV=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch}; else VENV=${FSDPCHECK_TORCH_VENV:-$ROOT/.venv-torch-${NAME#requirements-}}; fi
HASH=$( (cat "$LOCK"; python3 --version) | sha256sum | cut -c1-16)
export HWLOC_COMPONENTS=-pci,-x86 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

bash ci/setup.sh

echo "== torch adapter: virtual environment ($VENV)"
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
if [ -f "$VENV/.lock-hash" ] && [ "$(cat "$VENV/.lock-hash")" = "$HASH" ] && [ -x "$VENV/bin/python" ]; then
  echo "reusing $VENV (lock $HASH)"
else
  start=$(date +%s)
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # no pip cache: it would keep a second copy of the wheels (about 3 GiB a lock) on a disk
  # that CI has found short
  "$VENV/bin/pip" install -q --no-cache-dir --no-deps -r "$LOCK"
  echo "$HASH" > "$VENV/.lock-hash"
  echo "installed the lock in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e adapters/torch
"$VENV/bin/python" -c 'import torch, torch.distributed as d, transformers, safetensors; print("torch", torch.__version__, "gloo", d.is_gloo_available(), "transformers", transformers.__version__, "safetensors", safetensors.__version__)'
[ $venv_only = 1 ] && exit 0

echo "== torch adapter: fsdpcheck (Release)"
# the tests hand the adapter this binary explicitly (it never looks for one in a build tree):
# FSDPCHECK where it is set, else build/default's, built if missing
if [ -z "${FSDPCHECK:-}" ]; then
  if [ ! -x build/default/oracle/fsdpcheck ]; then
    cmake --preset default >/dev/null
    cmake --build --preset default -j "$(nproc)" --target fsdpcheck
  fi
  FSDPCHECK=$ROOT/build/default/oracle/fsdpcheck
fi
[ -x "$FSDPCHECK" ] || { echo "ci/torch.sh: FSDPCHECK=$FSDPCHECK is not an executable fsdpcheck" >&2; exit 2; }
FSDPCHECK=$(cd "$(dirname "$FSDPCHECK")" && pwd)/$(basename "$FSDPCHECK")  # the tests run from other directories
export FSDPCHECK
echo "fsdpcheck: $FSDPCHECK"

echo "== torch adapter: tests (CPU, gloo)"
mkdir -p out
PYTEST=("$VENV/bin/python" -m pytest)
COVER=0
if [ "$NAME" = requirements ] && [ -z "${FSDPCHECK_TORCH_TESTS:-}" ]; then
  COVER=1
  # patch = ["subprocess"] (pyproject.toml) hands the configuration to every Python child
  # through the environment; each process writes its own $COVERAGE_FILE.<suffix>
  export COVERAGE_RCFILE=$ROOT/adapters/torch/pyproject.toml COVERAGE_FILE=$ROOT/out/torch-coverage.data
  rm -f "$COVERAGE_FILE" "$COVERAGE_FILE".*
  PYTEST=("$VENV/bin/python" -m coverage run -m pytest)
fi
start=$(date +%s)
set +e
# shellcheck disable=SC2086 # the extra arguments are words
# -rfEs: the summary names failures, errors and skips only; every passing
# check's comparison table stays in the junit file (out/), so a failure is
# not buried under 300 tables in CI's log
TESTS=(adapters/torch/tests)
[ "${FSDPCHECK_TORCH_TESTS:-}" = xla ] && TESTS=(adapters/torch/tests/test_xla.py adapters/torch/tests/test_xla_layout.py)  # the XLA lock's own stage
"${PYTEST[@]}" "${TESTS[@]}" -v -rfEs --durations=25 --junitxml="out/torch-junit-$NAME.xml" \
  -p no:cacheprovider ${FSDPCHECK_TORCH_PYTEST_ARGS:-}
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  # the failed tests again, last, where a truncated log still shows them
  echo "torch adapter: failed tests ($NAME):"
  "$VENV/bin/python" - "out/torch-junit-$NAME.xml" <<'PY' || true
import sys
import xml.etree.ElementTree as ET

for case in ET.parse(sys.argv[1]).iter("testcase"):
    for bad in list(case.findall("failure")) + list(case.findall("error")):
        msg = (bad.get("message") or "").splitlines()[:3]
        print(f"  {case.get('classname')}::{case.get('name')}: {' / '.join(msg)[:600]}")
PY
fi
echo "torch adapter tests: $(( $(date +%s) - start )) s, exit $rc"
if [ "$COVER" = 1 ]; then
  echo "== torch adapter: coverage of fsdpcheck_torch (pytest, python -m fsdpcheck_torch, torchrun workers)"
  gate=()
  [ -n "${FSDPCHECK_TORCH_PYTEST_ARGS:-}" ] && gate=(--fail-under=0) && echo "(a selection: not gated)"
  set +e
  echo "combining $(find out -maxdepth 1 -name 'torch-coverage.data.*' | wc -l) data files"
  "$VENV/bin/python" -m coverage combine -q &&
    "$VENV/bin/python" -m coverage report "${gate[@]}" > out/torch-coverage.txt
  crc=$?
  set -e
  cat out/torch-coverage.txt 2>/dev/null || true
  if [ "$crc" -ne 0 ]; then
    echo "torch adapter coverage: below the gate (fail_under in adapters/torch/pyproject.toml) or no data, exit $crc" >&2
    [ "$rc" -eq 0 ] && rc=1
  fi
fi
exit $rc
