#!/usr/bin/env bash
# threads_identical.sh MPIEXEC BINARY [IMPL] — the thread count changes no bit
# (core/threads.h, reference/layers.c rule 1). For each model, `fsdpcheck run`
# writes a trace with 1, 2, 3 and 4 OpenMP threads per rank (W=1) and with 1
# and 2 (W=2, full_shard), and for the GPT-2s once with no kernel wider than AVX2
# (FSDPCHECK_MM_AVX2=1: no AVX-512F 8 x 32 blocks, and AdamW and the norm's terms in
# generic C, core/simd.h) and for gpt2-tiny once with the
# generic kernel (FSDPCHECK_MM_GENERIC=1: one libm fmaf per step, 20x slower than
# the vector kernels under the sanitizer build, too slow for the wider GPT-2 there);
# every file of every trace must be
# byte-identical to the 1-thread trace of its W. The models are big enough
# that every parallel loop runs threaded (each layer's work is above
# FC_PAR_MIN): gpt2-tiny and llama-tiny at B=32, T=32, and a wider GPT-2 (C=64,
# 4 heads, vocab 1000) and a wider Llama (C=64, 4 query and 2 key/value heads,
# I=160, vocab 1000, untied head) at B=8, T=64. The run must also print the thread count asked for.
# Each failure is printed; their count is the exit code.
set -u
mpiexec=$1 bin=$2 impl=${3:-reference}
export HWLOC_COMPONENTS=-pci,-x86
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 files=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cat >"$tmp/gpt2-c64.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 1000, "n_positions": 64, "n_embd": 64, "n_head": 4, "n_layer": 2}
JSON
cat >"$tmp/llama-c64.json" <<'JSON'
{"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": false}
JSON
run() {  # run NAME W THREADS FLAGS...
  local name=$1 W=$2 t=$3; shift 3
  "$mpiexec" -n "$W" "$bin" run --impl "$impl" "$@" --threads "$t" --trace "$tmp/$name" >"$tmp/$name.out" 2>&1 ||
    { fail "run $name: $(tail -n 1 "$tmp/$name.out")"; return 1; }
  grep -q ", threads $t per rank" "$tmp/$name.out" || fail "run $name: no 'threads $t per rank' in its first line"
}
same() {  # same BASE OTHER: every file of the two traces byte-identical
  local f n=0
  for f in "$tmp/$1"/*; do
    n=$((n + 1))
    cmp -s "$f" "$tmp/$2/$(basename "$f")" || fail "$2: $(basename "$f") differs from $1's"
  done
  [ "$n" -ge 3 ] || fail "$1: only $n files in the trace"
  [ "$(ls "$tmp/$2" | wc -l)" -eq "$n" ] || fail "$2: not the same files as $1"
  files=$((files + n))
}
for model in gpt2-tiny c64 llama-tiny llama-c64; do
  case $model in
    gpt2-tiny | llama-tiny) flags="--model $model --global-batch 32 --seq-len 32" ;;
    c64) flags="--model $tmp/gpt2-c64.json --global-batch 8 --seq-len 64" ;;
    llama-c64) flags="--model $tmp/llama-c64.json --global-batch 8 --seq-len 64" ;;
  esac
  flags="$flags --steps 3"
  run "$model-W1-t1" 1 1 $flags || continue
  for t in 2 3 4; do run "$model-W1-t$t" 1 $t $flags && same "$model-W1-t1" "$model-W1-t$t"; done
  # the matmul kernels are the same code for every model: the GPT-2 cases try each
  case $model in gpt2-tiny | c64)
    if [ "$model" = gpt2-tiny ]; then
      FSDPCHECK_MM_GENERIC=1 run "$model-W1-t3-generic" 1 3 $flags && same "$model-W1-t1" "$model-W1-t3-generic"
    fi
    FSDPCHECK_MM_AVX2=1 run "$model-W1-t3-avx2" 1 3 $flags && same "$model-W1-t1" "$model-W1-t3-avx2" ;;
  esac
  run "$model-W2-t1" 2 1 $flags --strategy full_shard || continue
  run "$model-W2-t2" 2 2 $flags --strategy full_shard && same "$model-W2-t1" "$model-W2-t2"
done
echo "threads_identical: $files files compared byte for byte, $fails failures"
exit $fails
