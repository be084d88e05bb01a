#!/usr/bin/env bash
# plugin_out_of_tree.sh SOURCE_DIR BUILD_DIR MPIEXEC FSDPCHECK — the port path
# end to end, against an installed package and nothing else:
#  1. `cmake --install BUILD_DIR` into a temporary prefix;
#  2. the port template (examples/plugin) configured with only
#     -DCMAKE_PREFIX_PATH=<prefix> (find_package(fsdpcheck), fsdpcheck_add_gate),
#     built, its gate registered as ctest tests (listed, not run: the gate
#     itself runs in ci/package.sh and in a port's CI);
#  3. the installed fsdpcheck loads it with `check --impl`: bitwise equal to
#     the reference; with the template's own bug switched on
#     (FSDPCHECK_TEMPLATE_BUG=1) check fails (exit 1) and prints the first
#     divergence; --inject on a port, and a missing library, are refused
#     (exit 2, one line);
#  4. pkg-config: a program built from `pkg-config --cflags --libs
#     fsdpcheck-reference` alone runs the reference through the contract.
set -u
src=$1 build=$2 mpiexec=$3 built_bin=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=$out/prefix
cmake --install "$build" --prefix "$prefix" >"$out/log" 2>&1 || { cat "$out/log"; fail "cmake --install"; }
bin=$prefix/bin/fsdpcheck
[ "$("$bin" --version)" = "$("$built_bin" --version)" ] || fail "installed and built fsdpcheck --version differ"
"$bin" --version

cmake -S "$src/examples/plugin" -B "$out/build" -DCMAKE_PREFIX_PATH="$prefix" >"$out/log" 2>&1 &&
  cmake --build "$out/build" >>"$out/log" 2>&1 || { cat "$out/log"; fail "the template did not build against the installed package"; }
grep -q "^fsdpcheck_DIR:PATH=$prefix/" "$out/build/CMakeCache.txt" || fail "find_package(fsdpcheck) did not find $prefix"
grep -q "$build" "$out/build/CMakeCache.txt" && fail "the template's cache points into fsdpcheck's build tree"
ctest --test-dir "$out/build" -N -L gate >"$out/tests" 2>&1
n=$(grep -c "Test *#" "$out/tests")
grep -q "myport.sweep" "$out/tests" && [ "$n" -ge 10 ] || { cat "$out/tests"; fail "the template's gate is not registered"; }
echo "template: built against $prefix alone; ctest -L gate lists $n tests (myport.sweep and the fault catalogue)"

lib=$out/build/libmyport.so
export HWLOC_COMPONENTS=-pci,-x86
"$mpiexec" -n 2 "$bin" check --impl "$lib" --bitwise --model gpt2-tiny --strategy full_shard \
  --backward-prefetch pre --steps 3 >"$out/pass" 2>&1
rc=$?
cat "$out/pass"
[ $rc -eq 0 ] || fail "clean template vs reference exited $rc"
FSDPCHECK_TEMPLATE_BUG=1 "$mpiexec" -n 2 "$bin" check --impl "$lib" --model gpt2-tiny --strategy full_shard \
  --steps 3 >"$out/fail" 2>&1
rc=$?
grep -E "^(first divergence|fsdpcheck check)" "$out/fail"
[ $rc -eq 1 ] && grep -q "first divergence" "$out/fail" || { cat "$out/fail"; fail "buggy template: exit $rc, want 1 with a divergence"; }
"$mpiexec" -n 2 "$bin" check --impl "$lib" --strategy full_shard --steps 1 --inject no_divide >"$out/inj" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$out/inj")" -eq 1 ] || { cat "$out/inj"; fail "--inject into a port: exit $rc, want 2 and one line"; }
cat "$out/inj"
"$mpiexec" -n 1 "$bin" check --impl "$out/nonexistent.so" --steps 1 >"$out/bad" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$out/bad")" -eq 1 ] || { cat "$out/bad"; fail "missing plugin: exit $rc"; }

if ! command -v pkg-config >/dev/null; then
  echo "plugin: built out of tree against the installed package, loaded, bitwise equal to the reference; its bug was caught (pkg-config not installed: its check skipped)"
  exit 0
fi
pcdir=$(dirname "$(find "$prefix" -name fsdpcheck.pc | head -1)")
cat >"$out/pc.c" <<'EOF'
#include <stdio.h>
#include <fsdpcheck/impl.h>
int main(void) {
    const fc_impl_ops *ops = fc_reference_impl();
    printf("pkg-config: %s, contract ABI %d\n", ops->name, ops->abi_version);
    return ops->abi_version == FC_IMPL_ABI_VERSION ? 0 : 1;
}
EOF
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$out/pc.c" -o "$out/pc" $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs fsdpcheck-reference) \
  -Wl,-rpath,"$pcdir/.." 2>&1 && "$out/pc" || fail "a program built with pkg-config fsdpcheck-reference"
echo "plugin: built out of tree against the installed package, loaded, bitwise equal to the reference; its bug was caught"
