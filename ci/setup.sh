#!/usr/bin/env bash
# ci/setup.sh — installs every Debian package fsdpcheck needs to build and test.
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

PACKAGES=(build-essential cmake git mpich libmpich-dev libcriterion-dev libcjson-dev
          lcov valgrind clang libclang-rt-dev libomp-dev python3 python3-venv libssl-dev pkg-config file dpkg-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "ci/setup.sh: all packages present"
  exit 0
fi
echo "ci/setup.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
