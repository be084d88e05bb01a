#!/usr/bin/env bash
# plugin_out_of_tree.sh SOURCE_DIR BUILD_DIR MPIEXEC FSDPCHECK — builds
# examples/plugin as a separate CMake project against this build, then loads
# it with `fsdpcheck check --impl`: the plugin must match the built-in
# reference bitwise, and with a fault injected into it, check must fail (exit
# 1) and print the first divergence.
set -u
src=$1 build=$2 mpiexec=$3 bin=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cmake -S "$src/examples/plugin" -B "$out/build" -DFSDPCHECK_SOURCE_DIR="$src" -DFSDPCHECK_BUILD_DIR="$build" \
  -DCMAKE_BUILD_TYPE=Release >"$out/log" 2>&1 && cmake --build "$out/build" >>"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
lib=$out/build/libfsdpcheck_reference_plugin.so
export HWLOC_COMPONENTS=-pci,-x86
"$mpiexec" -n 2 "$bin" check --impl "$lib" --bitwise --model gpt2-tiny --strategy full_shard \
  --backward-prefetch pre --steps 3 >"$out/pass" 2>&1
rc=$?
cat "$out/pass"
[ $rc -eq 0 ] || { echo "FAIL: clean plugin vs reference exited $rc"; exit 1; }
"$mpiexec" -n 2 "$bin" check --impl "$lib" --model gpt2-tiny --strategy full_shard --steps 3 \
  --inject skip_root_reduce >"$out/fail" 2>&1
rc=$?
cat "$out/fail"
[ $rc -eq 1 ] && grep -q "first divergence" "$out/fail" || { echo "FAIL: faulty plugin: exit $rc, want 1 with a divergence"; exit 1; }
"$mpiexec" -n 1 "$bin" check --impl "$out/nonexistent.so" --steps 1 >"$out/bad" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$out/bad")" -eq 1 ] || { echo "FAIL: missing plugin: exit $rc"; cat "$out/bad"; exit 1; }
echo "plugin: built out of tree, loaded, bitwise equal to the reference; the injected fault was caught"
