#!/usr/bin/env bash
# bench/calibrate.sh [OUT] — measures the noise of legitimate differences that
# the comparison engine's tolerances (oracle/compare_policy.c) are set from: the
# reference against itself across world sizes 1..8, every strategy, hybrid
# trees, prefetch, accumulation with and without no_sync, clipping, the divide
# modes, checkpoints loaded at another W and strategy, three seeds, for each
# precision policy, on gpt2-tiny and mlp-tiny (FSDPCHECK_CALIBRATE_124M=1 adds
# one gpt2-124m step, several minutes and ~6 GB of traces;
# FSDPCHECK_CALIBRATE_MAIN_SEEDS="" runs only the small-batch block, whose
# seeds, models and policies FSDPCHECK_CALIBRATE_SMALL_SEEDS, _SMALL_MODELS
# and _SMALL_POLICIES (e.g. "bf16,fp32 fp16,fp16") choose).
#
# Every pair is compared with `fsdpcheck compare --rtol 1` (so nothing stops
# it) and the largest per-kind "max err/scale" and "norm ratio" are printed
# per precision, with the pair that produced each: the noise floors that
# compare_policy.c's constants are a stated margin above.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/fsdpcheck-calibrate}
bin=./build/default/oracle/fsdpcheck
[ -x "$bin" ] || { cmake --preset default >/dev/null && cmake --build --preset default -j "$(nproc)" --target fsdpcheck >/dev/null; }
export HWLOC_COMPONENTS=-pci,-x86
rm -rf "$out"; mkdir -p "$out"
cp "$bin" "$out/fsdpcheck"; bin=$out/fsdpcheck  # a rebuild during the hour this takes must not change it
rows="$out/rows.txt"; : > "$rows"
runs=0
run() {  # run NAME W FLAGS...
  local name=$1 W=$2; shift 2
  mpiexec -n "$W" "$bin" run --quiet "$@" --trace "$out/$name" >/dev/null
  runs=$((runs + 1))
}
pair() {  # pair PREC A B
  local prec=$1 a=$2 b=$3
  "$bin" compare "$out/$a" "$out/$b" --rtol 1 | awk -v prec="$prec" -v p="$a~$b" \
    '$4 ~ /^(loss|norm|grad|param|optim)$/ { print prec, $4, $7, $9, p, $2, $3 }' >> "$rows" || true
}
for seed in ${FSDPCHECK_CALIBRATE_MAIN_SEEDS-1 7 1234}; do
  for model in gpt2-tiny mlp-tiny; do
    m="--model $model --steps 4 --seed $seed"
    [ "$model" = gpt2-tiny ] && m="$m --seq-len 16"
    B="--global-batch 24"
    for pol in "fp32 fp32" "bf16 fp32" "bf16 bf16" "fp16 fp16"; do
      set -- $pol; pd=$1 rd=$2; prec=$pd; [ "$rd" = bf16 ] && prec=bf16
      tag="$model-s$seed-$pd$rd"
      P="--param-dtype $pd --reduce-dtype $rd"
      if [ "$pd" = fp32 ]; then base="$tag-local"; run "$base" 1 $m $B --strategy local
      else base="$tag-ddp1"; run "$base" 1 $m $B --strategy no_shard $P; fi
      for W in 2 3 4 6 8; do
        run "$tag-fs$W" $W $m $B --strategy full_shard $P; pair $prec "$base" "$tag-fs$W"
      done
      run "$tag-ddp3" 3 $m $B --strategy no_shard $P; pair $prec "$base" "$tag-ddp3"
      run "$tag-zero2-4" 4 $m $B --strategy shard_grad_op $P --backward-prefetch post --forward-prefetch; pair $prec "$base" "$tag-zero2-4"
      for hf in "4 2" "6 2" "6 3" "8 2" "8 4"; do
        set -- $hf
        run "$tag-h$1f$2" $1 $m $B --strategy hybrid_shard --shard-group $2 $P; pair $prec "$base" "$tag-h$1f$2"
        pair $prec "$tag-fs$1" "$tag-h$1f$2"   # P3's comparison: the same W, another tree
      done
      run "$tag-acc" 4 $m $B --strategy full_shard --grad-accum 2 $P; pair $prec "$base" "$tag-acc"
      run "$tag-accns" 3 $m $B --strategy full_shard --grad-accum 2 --no-sync $P; pair $prec "$base" "$tag-accns"
      for d in avg sum-then-divide; do
        run "$tag-div$d" 6 $m $B --strategy full_shard --divide $d $P; pair $prec "$tag-fs6" "$tag-div$d"; pair $prec "$base" "$tag-div$d"
      done
      for nt in 1 2 inf; do
        if [ "$pd" = fp32 ]; then run "$tag-clip$nt-local" 1 $m $B --strategy local --clip-grad-norm 0.05 --norm-type $nt; cb="$tag-clip$nt-local"
        else run "$tag-clip$nt-ddp1" 1 $m $B --strategy no_shard --clip-grad-norm 0.05 --norm-type $nt $P; cb="$tag-clip$nt-ddp1"; fi
        run "$tag-clip$nt" 4 $m $B --strategy full_shard --clip-grad-norm 0.05 --norm-type $nt $P; pair $prec "$cb" "$tag-clip$nt"
      done
      # a checkpoint at step 2 of a W=3 run, loaded at W=2 and W=4 (another tree)
      for sd in full sharded; do
        mpiexec -n 3 "$bin" run --quiet $m --steps 2 $B --strategy full_shard $P --save "$out/$tag-ck$sd" --state-dict $sd >/dev/null
        for W in 2 4; do
          run "$tag-ld$sd$W" $W $m --steps 2 $B --strategy shard_grad_op $P --load "$out/$tag-ck$sd"
          pair $prec "$base" "$tag-ld$sd$W"
        done
        rm -rf "$out/$tag-ck$sd"
      done
    done
    rm -rf "$out"/$model-s$seed-*/
  done
done
# sweep-like cases: small batches, short sequences (more gradient elements at
# noise level, so more AdamW flips and larger diverged-step differences)
for seed in ${FSDPCHECK_CALIBRATE_SMALL_SEEDS-1 2 3 4 5 6 7 8}; do
  for model in ${FSDPCHECK_CALIBRATE_SMALL_MODELS-gpt2-tiny mlp-tiny mlp-micro}; do
    for Bm in 1 2; do
      for pol in ${FSDPCHECK_CALIBRATE_SMALL_POLICIES-fp32,fp32 bf16,fp32 bf16,bf16 fp16,fp16}; do
        set -- ${pol/,/ }; pd=$1 rd=$2; prec=$pd; [ "$rd" = bf16 ] && prec=bf16
        P="--param-dtype $pd --reduce-dtype $rd"
        tag="small-$model-s$seed-b$Bm-$pd$rd"
        m="--model $model --steps 3 --seed $seed"
        [ "$model" = gpt2-tiny ] && m="$m --seq-len 8"
        B="--global-batch $((12 * Bm))"
        if [ "$pd" = fp32 ]; then base="$tag-local"; run "$base" 1 $m $B --strategy local
        else base="$tag-ddp1"; run "$base" 1 $m $B --strategy no_shard $P; fi
        for W in 2 3 4; do
          run "$tag-fs$W" $W $m $B --strategy full_shard $P; pair $prec "$base" "$tag-fs$W"
        done
        run "$tag-h4" 4 $m $B --strategy hybrid_shard --shard-group 2 $P; pair $prec "$tag-fs4" "$tag-h4"
        # one sample per rank, the sweep's smallest batches
        for W in 2 3 4; do
          if [ "$pd" = fp32 ]; then run "$tag-one$W-a" 1 $m --global-batch $W --strategy local
          else run "$tag-one$W-a" 1 $m --global-batch $W --strategy no_shard $P; fi
          run "$tag-one$W-b" $W $m --global-batch $W --strategy full_shard $P; pair $prec "$tag-one$W-a" "$tag-one$W-b"
        done
        rm -rf "$out"/$tag-*/
      done
    done
  done
done
if [ "${FSDPCHECK_CALIBRATE_124M:-0}" = 1 ]; then
  m="--model gpt2-124m --steps 1 --seq-len 64 --global-batch 4"
  run big-local 1 $m --strategy local; run big-fs2 2 $m --strategy full_shard; pair fp32 big-local big-fs2
  rm -rf "$out"/big-*/
fi
echo "diverged steps: kappa = the largest (err - the lockstep floor) / (the relative difference of the parameters the step started from):"
for prec in fp32 bf16 fp16; do
  for kind in loss grad param optim; do
    awk -v prec=$prec -v kind=$kind '$1 == prec && $2 == kind && $6 == "lock" { if ($3 + 0 > f) f = $3 + 0 }
      $1 == prec && $2 == kind && $6 == "div" && $7 + 0 > 0 { d[++n] = $3 + 0; p[n] = $7 + 0; w[n] = $5 }
      END { for (i = 1; i <= n; i++) { k = (d[i] - f) / p[i]; if (k > K) { K = k; W = w[i] } }
            if (n) printf "%-5s %-6s lock floor %10.3g  kappa %10.3g  %s\n", prec, kind, f, K, W }' "$rows"
  done
done
echo "calibration: $runs runs, $(wc -l < "$rows") kind rows compared; largest noise per precision, row and kind"
echo "(lock: steps the two runs start in lockstep; div: after AdamW turned noise into a parameter difference):"
printf "%-5s %-4s %-6s %14s %14s  %s\n" prec row kind "max err/scale" "norm ratio" "worst pair (err/scale)"
for prec in fp32 bf16 fp16; do
  for row in lock div; do
    for kind in loss norm grad param optim; do
      awk -v prec=$prec -v row=$row -v kind=$kind '$1 == prec && $6 == row && $2 == kind {
          if ($3 + 0 > e) { e = $3 + 0; w = $5 } if ($4 + 0 > n) n = $4 + 0; seen = 1 }
        END { if (seen) printf "%-5s %-4s %-6s %14.3g %14.3g  %s\n", prec, row, kind, e, n, w }' "$rows"
    done
  done
done
