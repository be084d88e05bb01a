#!/usr/bin/env bash
# ci/package.sh — fsdpcheck as a port team gets it: builds the Debian 12
# package (cpack -G DEB), unpacks it into a scratch root (dpkg -x: the CI
# machine's /usr stays clean), and builds the port template that the package
# ships (usr/share/doc/fsdpcheck/examples/plugin) against that root alone,
# with only -DCMAKE_PREFIX_PATH=<root>/usr, then runs its `ctest -L gate`.
#
#   bash ci/package.sh            # build/package/fsdpcheck_<version>_<arch>.deb
#
# The gate here is short, for CI on a small machine: FSDPCHECK_GATE_WORLD=2,
# FSDPCHECK_GATE_CASES=20, FSDPCHECK_GATE_SEED=1 and FSDPCHECK_GATE_FAULTS
# (four faults) by default, each overridable from the environment; the full
# gate (4 ranks, 300 cases, every fault) is the template's own default.
# Prints the package's control fields and file list (dpkg -c). Exit 0 when the
# package builds, installs, the template builds against it and its gate passes.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
world=${FSDPCHECK_GATE_WORLD:-2}
cases=${FSDPCHECK_GATE_CASES:-20}
seed=${FSDPCHECK_GATE_SEED:-1}
faults=${FSDPCHECK_GATE_FAULTS:-no_divide;ckpt_swap;no_sync_overwrite;stale_gather}
bash ci/setup.sh >/dev/null
# what packaging needs beyond ci/setup.sh: pkg-config (the .pc check), file
# (cpack's dpkg-shlibdeps step), dpkg-dev
missing=()
for p in pkg-config file dpkg-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v dpkg-deb >/dev/null || { echo "ci/package.sh: dpkg-deb is required (Debian)" >&2; exit 2; }

# 1. Release build of what the package holds, installed under /usr. No CUDA:
#    the Debian package is the CPU oracle (a CUDA port is a plugin of its own).
#    CMAKE_SKIP_INSTALL_ALL_DEPENDENCY: cpack installs what is built here and
#    does not build the tests.
b=build/package
cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DFC_CUDA=OFF \
  -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON >"$b.configure.log" 2>&1 || { cat "$b.configure.log"; exit 1; }
cmake --build "$b" -j "$(nproc)" --target fsdpcheck fsdpcheck_core fsdpcheck_core_static fsdpcheck_reference \
  fsdpcheck_reference_static fc_abi_wrong_version fc_abi_no_entry fc_abi_null_function >"$b.build.log" 2>&1 ||
  { tail -50 "$b.build.log"; exit 1; }
rm -f "$b"/fsdpcheck_*.deb
(cd "$b" && cpack -G DEB >cpack.log 2>&1) || { cat "$b/cpack.log"; exit 1; }
deb=$(ls "$b"/fsdpcheck_*.deb)
echo "ci/package.sh: built $deb ($((SECONDS - t0)) s)"
dpkg-deb -f "$deb" Package Version Architecture Depends
echo "dpkg -c $(basename "$deb"):"
dpkg -c "$deb" | awk '{ $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print }'

# 2. Unpacked into a scratch root: the package alone, no source or build paths.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
root=$scratch/root
dpkg -x "$deb" "$root"
"$root/usr/bin/fsdpcheck" --version
# the packaged binary refuses a library that breaks the contract's ABI
for c in "wrong_version:contract version" "no_entry:no entry point" "null_function:is NULL"; do
  tests/abi/expect_refusal.sh mpiexec "$root/usr/bin/fsdpcheck" "$b/tests/abi/libfc_abi_${c%%:*}.so" "${c#*:}"
done

# 3. pkg-config alone: a program that runs the reference through the contract.
pcdir=$(dirname "$(find "$root/usr" -name fsdpcheck.pc)")
printf '#include <stdio.h>\n#include <fsdpcheck/impl.h>\nint main(void) { printf("pkg-config: %%s, contract ABI %%d\\n", fc_reference_impl()->name, FC_IMPL_ABI_VERSION); return 0; }\n' >"$scratch/pc.c"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$scratch/pc.c" -o "$scratch/pc" $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs fsdpcheck-reference) \
  -Wl,-rpath,"$pcdir/.."
"$scratch/pc"

# 4. The port template shipped in the package, configured with only the
#    prefix (plus the short gate's size), built, and its gate run.
template=$root/usr/share/doc/fsdpcheck/examples/plugin
port=$scratch/port
cmake -S "$template" -B "$port" -DCMAKE_PREFIX_PATH="$root/usr" -DPORT_GATE_WORLD="$world" \
  -DPORT_GATE_CASES="$cases" -DPORT_GATE_SEED="$seed" -DPORT_GATE_FAULTS="$faults" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
grep "^fsdpcheck_DIR:" "$port/CMakeCache.txt"
cmake --build "$port" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
export HWLOC_COMPONENTS=-pci,-x86
rc=0
ctest --test-dir "$port" -L gate --output-on-failure || rc=1
echo "ci/package.sh: exit $rc ($((SECONDS - t0)) s: package, scratch install, template, gate W=$world cases=$cases faults=$faults)"
exit $rc
