#!/usr/bin/env bash
# bench/gpu/run.sh [--dry-run] STAGE — the GPU runbook: everything a lent GPU
# machine should run, in stages of at most 9 minutes each.
#
#   build  configure and build the port (Release, sm_90, -j of the cores)
#          against the carried Debian packages (bench/gpu/prepare.sh, run
#          here first; carry ".gpu-debs"), then print nvidia-smi, the CUDA
#          and NCCL versions and the measured bf16 cuBLASLt peak
#   test   ctest -L gpu (FC_GPU_TEST_REGEX / FC_GPU_TEST_EXCLUDE: a part of it;
#          FC_GPU_TEST_LIMIT: seconds, default 500)
#   sweep  sweep --impl cuda at W = 1..4 on one GPU (W > 1: host-staged MPI),
#          then the bf16 mixed-precision cases of SWEEP_BF16, each replayed
#   scale  check --impl cuda on gpt2-124m, 3 steps, fp32 and bf16 params with
#          fp32 reduce, W = 1 (NCCL) and W = 2 (staged); a FULL checkpoint of
#          the port read by GPT2LMHeadModel.from_pretrained against the trace
#   torch  the adapter on the device's own torch/transformers: FSDP2 and FSDP1
#          on CUDA/NCCL at W = 1, fp32 and bf16, gpt2-tiny and gpt2-124m, and
#          the HF Trainer (--fsdp "full_shard auto_wrap" and the example
#          fsdp_config.trainer.json), each judged by `fsdpcheck compare`
#   bench  gpt2-124m tokens/s, median step time, peak memory and MFU against
#          the measured peak: the port's full_shard, shard_grad_op and
#          no_shard beside PyTorch (FSDP2 eager and compiled, no wrapper)
#   all    every stage in turn
#
# Results and logs go to out/gpu/ (out/gpu-dry/ with --dry-run): STAGE.log,
# STAGE.detail.log, and one summary line per stage appended to summary.md;
# with $OUT set (the device tool's) they are also packed into $OUT.
#
# --dry-run runs the same stage logic on the CPU: --impl reference in place of
# the port, gloo and --device cpu in place of NCCL and CUDA, tiny sizes. Its
# build unpacks .gpu-debs into a scratch prefix and configures against that
# prefix alone (MPICH, cJSON, Criterion from the carried packages, checked in
# the CMake cache and with ldd), so the carried set is proven complete here.
#
# Exit: 0 the stage passed; 1 something failed (the summary says what);
# 2 usage or a missing prerequisite (one line).
set -uo pipefail
usage="usage: bench/gpu/run.sh [--dry-run] build|test|sweep|scale|torch|bench|all"
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
STAGE=$1
case $STAGE in build | test | sweep | scale | torch | bench | all) ;; *) echo "$usage" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
if [ "$DRY" = 1 ]; then tag=gpu-dry; else tag=gpu; fi
# results in out/gpu/ (out/gpu-dry/); under the device tool's $OUT, which
# brings back at most 8 files, also packed at the end as $OUT/TAG-results.tgz
# beside a copy of summary.md
RESULTS=$ROOT/out/$tag
mkdir -p "$RESULTS" || exit 2
BUILD=${FC_GPU_BUILD:-$ROOT/build/$tag}
PREFIX=${FC_GPU_PREFIX:-/tmp/fc-$tag-prefix}  # the carried packages, unpacked
DEBS=${FC_GPU_DEBS:-$ROOT/.gpu-debs}
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
NPROC=$(nproc)
export HWLOC_COMPONENTS=-pci,-x86 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
# the carried MPICH first: its libraries, hydra's proxy beside mpiexec
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PREFIX/usr/bin:$PATH
MPIEXEC=$PREFIX/usr/bin/mpiexec.hydra
FC=$BUILD/oracle/fsdpcheck
if [ "$DRY" = 1 ]; then
  IMPL=reference DEVICE=cpu BACKEND=gloo
  PY=${FSDPCHECK_TORCH_VENV:+$FSDPCHECK_TORCH_VENV/bin/python}
  PY=${PY:-$ROOT/.venv-torch/bin/python}
else
  IMPL=cuda DEVICE=cuda BACKEND=nccl
  PY=python3  # the device image's, with its torch and transformers
fi
export FSDPCHECK=$FC FSDPCHECK_CUDA_LIB=$BUILD/optimized/libfsdpcheck_cuda.so
export PYTHONPATH=$ROOT/adapters/torch${PYTHONPATH:+:$PYTHONPATH}

fails=0 passes=0 skipped=0 notes=""
ok() { echo "ok   $*"; passes=$((passes + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
skip() { echo "SKIP $*"; skipped=$((skipped + 1)); notes="$notes; skipped: $*"; }
# step LABEL LIMIT_S CMD...: runs CMD under a time limit, its output kept in
# the stage log; ok or FAIL with the exit code and the last lines
step() {
  local label=$1 limit=$2
  shift 2
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >"$RESULTS/last.out" 2>&1
  rc=$?
  cat "$RESULTS/last.out" >>"$RESULTS/$STAGE.detail.log"
  if [ $rc -eq 0 ]; then
    ok "$label ($((SECONDS - t0)) s)"
  else
    [ $rc -eq 124 ] && label="$label: over its ${limit} s limit"
    bad "$label (exit $rc, $((SECONDS - t0)) s): $*"
    tail -n 25 "$RESULTS/last.out"
  fi
  return $rc
}
summary() {  # the stage's one line, printed and appended to summary.md
  local verdict=PASS
  [ $fails -gt 0 ] && verdict=FAIL
  local line="$STAGE$([ "$DRY" = 1 ] && echo " (dry run)"): $verdict, $passes passed, $fails failed, $skipped skipped, $((SECONDS - stage_t0)) s$1${notes}"
  echo "SUMMARY $line"
  echo "- $line" >>"$RESULTS/summary.md"
}
need_build() {
  [ -x "$FC" ] || { echo "run.sh: $FC is not built: run the build stage first (in the same command)" >&2; exit 2; }
  if [ "$DRY" = 0 ] && [ ! -f "$FSDPCHECK_CUDA_LIB" ]; then
    echo "run.sh: the CUDA port $FSDPCHECK_CUDA_LIB is not built (see build.log)" >&2
    exit 2
  fi
}

# ---- build -----------------------------------------------------------------
stage_build() {
  echo "== what the machine has"
  have() { if [ -e "$2" ] || ldconfig -p 2>/dev/null | grep -q "$3"; then echo "have    $1"; else echo "missing $1 (carried)"; fi; }
  have MPICH /usr/include/x86_64-linux-gnu/mpich/mpi.h 'libmpich\.so\.12 '
  have cJSON /usr/include/cjson/cJSON.h 'libcjson\.so\.1 '
  have Criterion /usr/include/criterion/criterion.h 'libcriterion\.so\.3 '
  have "OpenSSL headers" /usr/include/openssl/evp.h '^$NEVER'
  [ -f "$DEBS/SHA256SUMS" ] || { echo "run.sh: $DEBS/SHA256SUMS missing: run bench/gpu/prepare.sh here and carry .gpu-debs" >&2; exit 2; }
  (cd "$DEBS" && sha256sum --quiet -c SHA256SUMS) || { echo "run.sh: $DEBS does not match its SHA256SUMS" >&2; exit 2; }
  rm -rf "$PREFIX" && mkdir -p "$PREFIX" || exit 2
  local d ssl_inc=""
  for d in "$DEBS"/*.deb; do
    case $(basename "$d") in libssl-dev_*) [ -f /usr/include/openssl/evp.h ] && continue ;; esac
    dpkg -x "$d" "$PREFIX" || { echo "run.sh: dpkg -x $d failed" >&2; exit 2; }
  done
  [ -f "$PREFIX/usr/include/openssl/evp.h" ] && ssl_inc="-DOPENSSL_ROOT_DIR=$PREFIX/usr"
  # FindMPI asks pkg-config for "mpi-c" and takes what it says over our
  # variables: the image's Open MPI has one (seen 2026-11-25: fsdpcheck linked
  # Open MPI's libmpi with MPICH's headers, and mpiexec.hydra started W
  # singletons). Ours, naming the carried MPICH, comes first.
  mkdir -p "$PREFIX/fc-pkgconfig"
  printf '%s\n' "prefix=$PREFIX/usr" "Name: mpi-c" "Description: the carried MPICH" "Version: 4.0.2" \
    "Cflags: -I\${prefix}/include/x86_64-linux-gnu/mpich" "Libs: -L\${prefix}/lib/x86_64-linux-gnu -lmpich" \
    >"$PREFIX/fc-pkgconfig/mpi-c.pc"
  export PKG_CONFIG_PATH=$PREFIX/fc-pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  echo "carried: $(ls "$DEBS"/*.deb | wc -l) packages, $(du -sh "$DEBS" | cut -f1), unpacked into $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
  local gen=() cuda=(-DFC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
  command -v ninja >/dev/null && gen=(-G Ninja)
  # the dry run builds what its stages use; CUDA only where it can be used
  [ "$DRY" = 1 ] && cuda=(-DFC_CUDA=OFF)
  rm -rf "$BUILD"
  # MPI, cJSON and Criterion from the prefix alone: FindMPI told not to ask a
  # compiler wrapper (MPICH's has /usr baked in) and given the carried paths;
  # cJSON's CMake package names /usr/lib's file, so the found library stands in
  step "configure against $PREFIX" 300 cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" \
    -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$PREFIX/usr/include/x86_64-linux-gnu/mpich" \
    -DMPI_C_LIB_NAMES=mpich -DMPI_mpich_LIBRARY="$LIBDIR/libmpich.so.12" -DMPIEXEC_EXECUTABLE="$MPIEXEC" \
    -DCJSON_LIB="$LIBDIR/libcjson.so" -DCJSON_INCLUDE="$PREFIX/usr/include/cjson" -DCMAKE_DISABLE_FIND_PACKAGE_cJSON=ON \
    -DCRITERION_LIB="$LIBDIR/libcriterion.so" -DCMAKE_C_FLAGS="-isystem $PREFIX/usr/include" $ssl_inc || return
  grep -E "^fsdpcheck: (CUDA|NCCL)|NCCL" "$RESULTS/last.out" | head -3
  # the carried set, and nothing else, is what the build found
  local v val
  for v in MPI_C_HEADER_DIR MPI_mpich_LIBRARY MPIEXEC_EXECUTABLE CJSON_LIB CJSON_INCLUDE CRITERION_LIB; do
    val=$(sed -n "s/^$v:[A-Z]*=//p" "$BUILD/CMakeCache.txt")
    case $val in "$PREFIX"/*) ok "$v from the prefix ($val)" ;; *) bad "$v is not from the prefix: '$val'" ;; esac
  done
  local targets=(--target fsdpcheck test_dtype)
  [ "$DRY" = 0 ] && targets=()
  step "build (-j $NPROC)" 540 cmake --build "$BUILD" -j "$NPROC" "${targets[@]}" || return
  local lib
  for lib in libmpich.so.12 libcjson.so.1; do
    if ldd "$FC" | grep "$lib" | grep -q "$PREFIX"; then ok "fsdpcheck loads $lib from the prefix"; else bad "fsdpcheck loads $lib from elsewhere: $(ldd "$FC" | grep "$lib")"; fi
  done
  if ldd "$BUILD/tests/test_dtype" | grep libcriterion | grep -q "$PREFIX"; then ok "test_dtype loads Criterion from the prefix"; else bad "test_dtype's Criterion is not the carried one"; fi
  if ldd "$FC" "$MPIEXEC" "$PREFIX/usr/bin/hydra_pmi_proxy" "$LIBDIR/libmpich.so.12" | grep -q "not found"; then
    bad "unresolved libraries: $(ldd "$FC" "$MPIEXEC" "$PREFIX/usr/bin/hydra_pmi_proxy" "$LIBDIR/libmpich.so.12" | grep 'not found' | sort -u | tr -d '\t' | tr '\n' ' ')"
  else
    ok "every library of fsdpcheck, mpiexec, hydra_pmi_proxy and libmpich resolves"
  fi
  step "the carried mpiexec runs 2 ranks" 60 "$MPIEXEC" -n 2 "$FC" run --model mlp-tiny --strategy full_shard --steps 1 --quiet
  step "test_dtype (Criterion)" 60 "$BUILD/tests/test_dtype" --jobs 1
  if [ "$DRY" = 1 ]; then
    echo "(dry run: no nvidia-smi, CUDA or NCCL versions, no peak)"
    return
  fi
  echo "== the device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi | head -12
  echo "CUDA: $(nvcc --version | tail -2 | head -1)"
  echo "NCCL: $(sed -n 's/^NCCL_LIBRARY:[A-Z]*=//p' "$BUILD/CMakeCache.txt") $(grep -h -m3 -E '#define NCCL_(MAJOR|MINOR|PATCH)' "$(sed -n 's/^NCCL_INCLUDE_DIR:[A-Z]*=//p' "$BUILD/CMakeCache.txt")/nccl.h" | awk '{printf "%s ", $3}')"
  step "bf16 cuBLASLt peak" 120 "$BUILD/optimized/fc_lt_peak" 8192 && cat "$RESULTS/last.out" | tee "$RESULTS/peak.txt"
  [ -f "$FSDPCHECK_CUDA_LIB" ] && ok "the port is built: $FSDPCHECK_CUDA_LIB" || bad "no $FSDPCHECK_CUDA_LIB"
}
peak_tflops() { sed -n 's/.*cuBLASLt \([0-9.]*\) TFLOP.*/\1/p' "$RESULTS/peak.txt" 2>/dev/null; }

# ---- test ------------------------------------------------------------------
stage_test() {
  need_build
  if [ "$DRY" = 1 ]; then
    # the dry build has no port: the same ctest call on the release build
    # (build/default, where nvcc built the port), whose gpu tests must each
    # skip with the probe's reason on a machine without a device
    local rel=$ROOT/build/default
    if [ ! -f "$rel/CTestTestfile.cmake" ] || [ ! -f "$rel/optimized/libfsdpcheck_cuda.so" ]; then
      skip "no release build with the port here (build/default, nvcc) to run the gpu label on"
      return
    fi
    step "ctest -L gpu on build/default (dry: no device)" 300 ctest --test-dir "$rel" -L gpu -V
    local n r
    n=$(grep -c "\*\*\*Skipped" "$RESULTS/last.out")
    r=$(grep -c "SKIP: no CUDA device" "$RESULTS/last.out")
    if [ "$n" -gt 0 ] && [ "$r" -ge "$n" ]; then
      ok "$n gpu tests skipped, each with the probe's reason ($(grep -m1 -o 'SKIP: no CUDA device.*' "$RESULTS/last.out"))"
    else
      bad "the gpu tests did not all skip with a reason ($n skipped, $r reasons printed)"
    fi
    return
  fi
  # the whole label outran 300 s at -j 16 on the H200 (matrix.W1..4 run ~50
  # checks each): FC_GPU_TEST_REGEX / FC_GPU_TEST_EXCLUDE split it over
  # commands, e.g. FC_GPU_TEST_EXCLUDE=matrix, then FC_GPU_TEST_REGEX=matrix
  local sel=()
  [ -n "${FC_GPU_TEST_REGEX:-}" ] && sel+=(-R "$FC_GPU_TEST_REGEX")
  [ -n "${FC_GPU_TEST_EXCLUDE:-}" ] && sel+=(-E "$FC_GPU_TEST_EXCLUDE")
  step "ctest -L gpu ${sel[*]}" "${FC_GPU_TEST_LIMIT:-500}" ctest --test-dir "$BUILD" -L gpu "${sel[@]}" -j "$NPROC" \
    --output-on-failure
  grep -E "tests passed|tests failed|\*\*\*|Skipped|Failed|Passed" "$RESULTS/last.out" | tail -n 40
}

# ---- sweep -----------------------------------------------------------------
# bf16 mixed-precision cases as W|RUN FLAGS, each replayed at its W: the drawn
# sweep takes a 16-bit policy in 2 cases of 5 and has no flag that forces one,
# so these make every run of the stage check P9 (the port against its own
# no_shard) on both layouts, NCCL and staged collectives, uneven shards and a
# hybrid tree
SWEEP_BF16=(
  "1|--model mlp-tiny --strategy full_shard --param-dtype bf16 --reduce-dtype fp32"
  "2|--model mlp-micro --strategy full_shard --fsdp-version 2 --param-dtype bf16 --reduce-dtype fp32"
  "2|--model gpt2-tiny --strategy shard_grad_op --param-dtype bf16 --reduce-dtype bf16"
  "3|--model llama-tiny --strategy full_shard --param-dtype bf16 --reduce-dtype fp32 --global-batch 12"
  "4|--model mlp-tiny --strategy hybrid_shard --shard-group 2 --param-dtype bf16 --reduce-dtype fp32"
)
stage_sweep() {
  need_build
  # FC_GPU_SWEEP_CASES, FC_GPU_SWEEP_LIMIT: fewer drawn cases, a shorter limit
  # per W; FC_GPU_SWEEP_BF16_LIMIT: each bf16 case's (the defaults keep the
  # stage under 9 minutes: 4 x 70 + 5 x 45 s)
  local cases=${FC_GPU_SWEEP_CASES:-300} W ws=(1 2 3 4) limit=${FC_GPU_SWEEP_LIMIT:-70} c spec
  [ "$DRY" = 1 ] && { cases=20; ws=(1 2); }
  for W in "${ws[@]}"; do
    step "sweep --impl $IMPL --cases $cases at W=$W" $limit "$MPIEXEC" -n "$W" "$FC" sweep --impl "$IMPL" --cases $cases --seed "$W"
    grep -E "^\[|cases|failed|passed|minimal|P[0-9]+ " "$RESULTS/last.out" | tail -n 6
  done
  for c in "${SWEEP_BF16[@]}"; do
    W=${c%%|*} spec=${c#*|}
    step "sweep --impl $IMPL --replay '$spec' at W=$W" "${FC_GPU_SWEEP_BF16_LIMIT:-45}" "$MPIEXEC" -n "$W" "$FC" sweep \
      --impl "$IMPL" --replay "$spec"
    grep -E "^P[0-9]+ .*FAIL|caught by" "$RESULTS/last.out" | tail -n 6
  done
}

# ---- scale -----------------------------------------------------------------
stage_scale() {
  need_build
  local model=gpt2-124m W pol limit=240
  [ "$DRY" = 1 ] && { model=gpt2-tiny; limit=120; }
  for W in 1 2; do
    for pol in "fp32 fp32" "bf16 fp32"; do
      set -- $pol
      step "check --impl $IMPL $model W=$W param $1 reduce $2" $limit "$MPIEXEC" -n $W "$FC" check --impl "$IMPL" \
        --model $model --strategy full_shard --steps 3 --param-dtype "$1" --reduce-dtype "$2"
      grep -E "PASS|FAIL|diverge|max|worst" "$RESULTS/last.out" | tail -n 6
    done
  done
  # the 135M llama (SmolLM2-135M's config.json; llama-tiny in the dry run),
  # B=2, T=64, FSDP1 and FSDP2, fp32 and bf16: the port's llama kernels
  local llama="$ROOT/examples/models/llama.smollm2-135m.config.json"
  [ "$DRY" = 1 ] && llama=llama-tiny
  for v in 1 2; do
    for pol in "fp32 fp32" "bf16 fp32"; do
      set -- $pol
      step "check --impl $IMPL the 135M llama FSDP$v W=2 param $1 reduce $2" $limit "$MPIEXEC" -n 2 "$FC" check \
        --impl "$IMPL" --model "$llama" --fsdp-version $v --strategy full_shard --steps 3 --global-batch 2 \
        --seq-len 64 --param-dtype "$1" --reduce-dtype "$2"
      grep -E "PASS|FAIL|diverge|max|worst" "$RESULTS/last.out" | tail -n 6
    done
  done
  local work
  work=$(mktemp -d) || exit 2
  step "the port saves FULL after step 2 of 3 ($model, W=1)" $limit "$MPIEXEC" -n 1 "$FC" run --impl "$IMPL" --model $model \
    --strategy full_shard --steps 3 --save-at 2 --save "$work/ckpt" --state-dict full --trace "$work/trace" --quiet &&
    step "GPT2LMHeadModel.from_pretrained(the FULL checkpoint) gives the trace's loss" 240 "$PY" \
      "$ROOT/adapters/torch/tools/hf_loss.py" "$work/ckpt" "$work/trace" --device "$DEVICE"
  cat "$RESULTS/last.out" | grep hf_loss
  rm -rf "$work"
}

# ---- torch -----------------------------------------------------------------
stage_torch() {
  need_build
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' ||
    { echo "run.sh: $PY has no torch/transformers" >&2; exit 2; }
  local models=(gpt2-tiny gpt2-124m) api model dt limit=240
  [ "$DRY" = 1 ] && models=(gpt2-tiny)
  for api in fsdp2 fsdp1; do
    for model in "${models[@]}"; do
      for dt in fp32 bf16; do
        step "torch $api $model $dt on $DEVICE/$BACKEND W=1" $limit "$PY" -m fsdpcheck_torch check --api $api -n 1 \
          --device "$DEVICE" --backend "$BACKEND" --mpiexec "$MPIEXEC" --model $model --strategy full_shard --steps 3 \
          --param-dtype $dt --reduce-dtype fp32
        grep -E "PASS|FAIL|verdict|known" "$RESULTS/last.out" | tail -n 4
      done
    done
  done
  local work cfg ddp=()
  # Accelerate applies DDP, not FSDP, on the CPU (adapters/torch/tests/test_trainer.py)
  # and, seen on the H200 2026-11-25, on one GPU under torchrun --nproc-per-node=1:
  # the run is still traced and compared, and the adapter's line says it was DDP
  ddp=(--allow-ddp)
  work=$(mktemp -d) || exit 2
  for cfg in "--fsdp full_shard auto_wrap" "--fsdp-config $ROOT/../shared/examples/fsdp_config.trainer.json"; do
    [ -d "$ROOT/../shared/examples" ] || cfg=${cfg//$ROOT\/..\/shared\/examples/$ROOT\/examples\/fsdp_config}
    rm -rf "$work/ref" "$work/t"
    # shellcheck disable=SC2086
    step "reference for the Trainer ($cfg)" 120 "$MPIEXEC" -n 1 "$FC" run --model gpt2-tiny \
      $( [ "${cfg%% *}" = --fsdp-config ] && echo "$cfg" || echo --strategy full_shard ) --weight-decay 0 --steps 2 --trace "$work/ref" --quiet || continue
    if [ "${cfg%% *}" = --fsdp ]; then
      step "HF Trainer --fsdp 'full_shard auto_wrap' on $DEVICE" 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 --log-dir "$work/log" \
        -m fsdpcheck_torch trainer --like "$work/ref" --trace "$work/t" --fsdp "full_shard auto_wrap" "${ddp[@]}"
    else
      # shellcheck disable=SC2086
      step "HF Trainer $cfg on $DEVICE" 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 --log-dir "$work/log" \
        -m fsdpcheck_torch trainer --like "$work/ref" --trace "$work/t" $cfg "${ddp[@]}"
    fi && grep -E "FSDP|fsdp" "$RESULTS/last.out" | tail -n 3 &&
      step "compare the reference and the Trainer" 120 "$FC" compare "$work/ref" "$work/t"
  done
  rm -rf "$work"
}

# ---- bench -----------------------------------------------------------------
# median_row NAME WARM FILE: "NAME<TAB>median ms<TAB>timed steps<TAB>peak MiB"
# from `fsdpcheck run`'s output: the "step N: ... (X ms)" lines after the first
# WARM, and rank 0's peak total from its memory table (the implementation's
# own tagged allocator: what it holds, as torch.cuda.max_memory_allocated is
# for the PyTorch rows)
median_row() {
  local peak
  peak=$(awk '$1 == "0" && $2 == "device" { printf "%.0f", $NF / 1048576 }' "$3")
  awk -v w="$2" '/^step [0-9]+:/ { n++; if (n > w) { gsub(/[()]/, "", $(NF-1)); print $(NF-1) } }' "$3" | sort -g |
    awk -v row="$1" -v peak="${peak:-n/a}" '{ t[++m] = $1 }
      END { if (m) printf "%s\t%s\t%d\t%s\n", row, (m % 2 ? t[(m+1)/2] : (t[m/2] + t[m/2+1]) / 2), m, peak }'
}
stage_bench() {
  need_build
  local model=gpt2-124m B=16 T=1024 steps=25 warm=5
  [ "$DRY" = 1 ] && { model=gpt2-tiny B=8 T=16 steps=8 warm=2; }
  local peak
  peak=$(peak_tflops)
  [ -z "$peak" ] && [ "$DRY" = 0 ] && { "$BUILD/optimized/fc_lt_peak" 8192 | tee "$RESULTS/peak.txt"; peak=$(peak_tflops); }
  [ "$DRY" = 1 ] && peak=0.1  # the CPU has no cuBLASLt: a nominal 0.1 TFLOP/s keeps the column's arithmetic alive
  local table=$RESULTS/bench.tsv
  : >"$table"
  local s dt
  for dt in bf16 fp32; do
    for s in full_shard shard_grad_op no_shard; do
      step "fsdpcheck $IMPL $s $dt" 300 "$MPIEXEC" -n 1 "$FC" run --impl "$IMPL" --model $model --strategy $s \
        --global-batch $B --seq-len $T --steps $steps --param-dtype $dt --reduce-dtype fp32 &&
        median_row "fsdpcheck $IMPL $s $dt" $warm "$RESULTS/last.out" >>"$table"
    done
  done
  step "PyTorch rows (FSDP2 eager, compiled, no wrapper)" 480 "$PY" "$ROOT/adapters/torch/tools/bench_torch.py" --device "$DEVICE" \
    --model $model --batch $B --seq-len $T --steps $steps --warmup $warm --tsv "$table"
  step "the reference, one step for scale" 300 "$MPIEXEC" -n 1 "$FC" run --model $model --global-batch $B --seq-len $T --steps 1 &&
    median_row "reference (CPU, $NPROC threads) fp32" 0 "$RESULTS/last.out" >>"$table"
  "$PY" "$ROOT/adapters/torch/tools/bench_torch.py" --report "$table" --model $model --batch $B --seq-len $T --peak-tflops "$peak" |
    tee "$RESULTS/bench.md"
}

run_stage() {
  STAGE=$1 stage_t0=$SECONDS fails=0 passes=0 skipped=0 notes=""
  : >"$RESULTS/$STAGE.detail.log"
  echo "=== bench/gpu/run.sh $([ "$DRY" = 1 ] && echo "--dry-run ")$STAGE ($(date -u +%FT%TZ), $(hostname), $NPROC cores)"
  "stage_$STAGE"
  local extra=""
  [ "$STAGE" = build ] && [ -f "$RESULTS/peak.txt" ] && extra=", peak $(peak_tflops) TFLOP/s"
  summary "$extra"
  [ $fails -eq 0 ]
}

rc=0
if [ "$STAGE" = all ]; then
  for s in build test sweep scale torch bench; do
    run_stage $s > >(tee "$RESULTS/$s.log") 2>&1 || rc=1
  done
else
  run_stage "$STAGE" > >(tee "$RESULTS/$STAGE.log") 2>&1 || rc=1
fi
wait
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$RESULTS/summary.md" "$OUT/summary.md"
  tar czf "$OUT/$tag-results.tgz" -C "$RESULTS" . || echo "run.sh: could not pack $RESULTS into $OUT" >&2
fi
exit $rc
