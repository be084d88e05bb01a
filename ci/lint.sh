#!/usr/bin/env bash
# ci/lint.sh — the Python adapter is `ruff check` and `ruff format --check` clean,
# with the ruff pinned in adapters/torch/requirements-lint.lock, installed into a
# virtual environment this script makes (reused while the lock's hash matches;
# FSDPCHECK_LINT_VENV moves it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LOCK=adapters/torch/requirements-lint.lock
VENV=${FSDPCHECK_LINT_VENV:-$ROOT/.venv-lint}
HASH=$( (cat "$LOCK"; python3 --version) | sha256sum | cut -c1-16)
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
if ! { [ -f "$VENV/.lock-hash" ] && [ "$(cat "$VENV/.lock-hash")" = "$HASH" ] && [ -x "$VENV/bin/ruff" ]; }; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-cache-dir --no-deps -r "$LOCK"
  echo "$HASH" > "$VENV/.lock-hash"
fi
"$VENV/bin/ruff" --version
"$VENV/bin/ruff" check adapters/torch
"$VENV/bin/ruff" format --check adapters/torch
# the corpus generators outside the adapter, under the adapter's rules
mapfile -t other < <(git ls-files '*.py' | grep -v '^adapters/torch/')
"$VENV/bin/ruff" check --config adapters/torch/pyproject.toml "${other[@]}"
"$VENV/bin/ruff" format --config adapters/torch/pyproject.toml --check "${other[@]}"
