// optimized/kernels.h — the port's kernels, as C launchers (one .cu file per
// concern, llm.c's llmc/ layout). Tensors are row-major; `p` is the storage
// precision of every tensor argument typed void* (fc_bf16/fc_f16/float, see
// common.cuh); float* arguments are fp32 whatever p is. Every launcher
// enqueues on `s` and returns at once. Backward kernels ACCUMULATE (+=) into
// their gradient outputs, like the reference's (reference/layers.h).
#ifndef FC_CUDA_KERNELS_H
#define FC_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "clip.h"
#include "config.h"
#include "dtype.h"
#include "hd.h"

FC_BEGIN_DECLS

// ---- flat.cu: flat-buffer packs and casts (core/round.h) -------------------
// dst [n] (p) = src [n] fp32 rounded to p; src may be pinned host memory.
void fck_cast(void *dst, fc_prec p, const float *src, size_t n, cudaStream_t s);
// dst [n] (rd) = round_rd(round_rd(g) / pre), g [n] (pd)
void fck_predivide(void *dst, fc_prec rd, const void *g, fc_prec pd, size_t n, float pre, cudaStream_t s);
// grad [n] fp32 += round_rd(src / post), src [n] (rd); grad may be pinned host memory
void fck_accumulate(float *grad, const void *src, fc_prec rd, size_t n, float post, cudaStream_t s);
// Unit copies between the natural order [N] and FSDP2's wire order [P] (p):
// map [3 * n] (device) = per piece (unit offset, wire offset, count), from
// core/layout.h's pieces of every chunk; to_wire zeroes the padding first.
void fck_permute(void *natural, void *wire, const size_t *map, int n, size_t P, int to_wire, fc_prec p,
                 cudaStream_t s);

// ---- encoder.cu: token (+ position) embedding --------------------------------
// out [B,T,C] = wte [V,C] [ids [B,T]] + wpe [P,C] [t]; wpe NULL (llama): wte's row alone
void fck_encoder_forward(void *out, const int32_t *ids, const void *wte, const void *wpe, int B, int T, int C,
                         fc_prec p, cudaStream_t s);
// dwte [V,C] += per token bucket (enc_buckets.h: tok [n_tok], off [n_tok+1],
// pos [B*T]) the sum of dout [B,T,C] rows in position order; dwpe [P,C] +=
// sum over b ascending of dout [b,t]. Either may be NULL (frozen, or llama's
// absent wpe). No atomics.
void fck_encoder_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tok, const int32_t *off,
                          const int32_t *pos, int n_tok, int B, int T, int C, fc_prec p, cudaStream_t s);

// ---- layernorm.cu: nn.LayerNorm, biased variance ----------------------------
// out [N,C]; mean, rstd [N] fp32; inp [N,C]; w, b [C]
void fck_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b, int N,
                           int C, float eps, fc_prec p, cudaStream_t s);
// dinp [N,C] +=; dw, db [C] +=; dout, inp [N,C]; w [C]; mean, rstd [N] fp32
void fck_layernorm_backward(void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w,
                            const float *mean, const float *rstd, int N, int C, fc_prec p, cudaStream_t s);

// ---- rmsnorm.cu: Llama's RMSNorm, no mean, no bias ---------------------------
// out [N,C] = w [C] * (inp [N,C] * rstd); rstd [N] fp32 = 1 / sqrt(mean(inp^2) + eps)
void fck_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps, fc_prec p,
                         cudaStream_t s);
// dinp [N,C] +=; dw [C] += (NULL: a frozen weight, not computed); dout, inp [N,C]; w [C]; rstd [N] fp32
void fck_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const float *rstd,
                          int N, int C, fc_prec p, cudaStream_t s);

// ---- rope.cu: rotary embedding, Hugging Face's rotate_half form --------------
// x [B,T,H,hd] (H heads of hd per token); cosv, sinv [T,hd/2] fp32 (device),
// built on the host by the reference's arithmetic (model_cu.c).
// out = x cos + rotate_half(x) sin (out may alias inp)
void fck_rope_forward(void *out, const void *inp, const float *cosv, const float *sinv, int B, int T, int H, int hd,
                      fc_prec p, cudaStream_t s);
// dinp += the transpose rotation of dout
void fck_rope_backward(void *dinp, const void *dout, const float *cosv, const float *sinv, int B, int T, int H,
                       int hd, fc_prec p, cudaStream_t s);

// ---- swiglu.cu: LlamaMLP's gate ----------------------------------------------
// out [n] = silu(gate) * up, silu(x) = x / (1 + exp(-x))
void fck_swiglu_forward(void *out, const void *gate, const void *up, size_t n, fc_prec p, cudaStream_t s);
// dgate, dup [n] += (either may be NULL)
void fck_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n,
                         fc_prec p, cudaStream_t s);

// ---- lora.cu: LoRA's scaling around its two matmuls --------------------------
// out [n] += t [n] * scale
void fck_lora_add(void *out, const void *t, float scale, size_t n, fc_prec p, cudaStream_t s);
// out [n] = inp [n] * scale
void fck_scale(void *out, const void *inp, float scale, size_t n, fc_prec p, cudaStream_t s);

// ---- matmul.cu: cuBLASLt -----------------------------------------------------
typedef struct fck_mm fck_mm;
// One cuBLASLt handle with a fixed workspace [ws_bytes] (device) and a cache
// of the algorithm chosen per shape, so a shape always runs one algorithm.
fck_mm *fck_mm_create(void *workspace, size_t ws_bytes);
void fck_mm_destroy(fck_mm *mm);
// C [M,N] (= or +=) op(A) [M,K] op(B) [K,N] (+ bias [N]): A stored [M,K]
// (ta = 0) or [K,M] (ta = 1); B stored [K,N] (tb = 0) or [N,K] (tb = 1).
// Inputs and output in p, accumulation in fp32 (TF32 never).
void fck_matmul(fck_mm *mm, void *C, const void *A, const void *B, const void *bias, int M, int N, int K, int ta,
                int tb, int accumulate, fc_prec p, cudaStream_t s);
// dbias [N] += sum over rows of dout [M,N]
void fck_bias_backward(void *dbias, const void *dout, int M, int N, fc_prec p, cudaStream_t s);

// ---- residual.cu ------------------------------------------------------------
// out [n] = a + b (out may alias a or b)
void fck_residual(void *out, const void *a, const void *b, size_t n, fc_prec p, cudaStream_t s);

// ---- gelu.cu: gelu_new, tanh form -------------------------------------------
void fck_gelu_forward(void *out, const void *inp, size_t n, fc_prec p, cudaStream_t s);
void fck_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, fc_prec p, cudaStream_t s);

// ---- attention.cu: causal attention cores -----------------------------------
// GPT-2, multi-head, scores q.k / sqrt(C/NH):
// out [B,T,C]; att [B,NH,T,T] (softmax, 0 above the diagonal); qkv [B,T,3C]
void fck_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, int NH, fc_prec p,
                           cudaStream_t s);
// dqkv [B,T,3C] +=; dpreatt [B,NH,T,T] scratch; dout [B,T,C]
void fck_attention_backward(void *dqkv, void *dpreatt, const void *dout, const void *qkv, const void *att, int B,
                            int T, int C, int NH, fc_prec p, cudaStream_t s);
// Llama, grouped-query (NKV divides NH; query head h reads kv head h / (NH/NKV)),
// scores q.k * hs**-0.5: out [B,T,NH*hs]; att [B,NH,T,T]; q [B,T,NH*hs]; k, v [B,T,NKV*hs]
void fck_gqa_attention_forward(void *out, void *att, const void *q, const void *k, const void *v, int B, int T, int NH,
                               int NKV, int hs, fc_prec p, cudaStream_t s);
// dq [B,T,NH*hs], dk, dv [B,T,NKV*hs] += (any may be NULL); dpreatt [B,NH,T,T] scratch; dout [B,T,NH*hs]
void fck_gqa_attention_backward(void *dq, void *dk, void *dv, void *dpreatt, const void *dout, const void *q,
                                const void *k, const void *v, const void *att, int B, int T, int NH, int NKV, int hs,
                                fc_prec p, cudaStream_t s);

// ---- classifier.cu: fused softmax + cross-entropy + its gradient ------------
// losses [N] fp32 = per-row log_softmax loss of logits [N,V] at targets [N];
// dlogits [N,V] += scale * (softmax - onehot)
void fck_classifier(float *losses, void *dlogits, const void *logits, const int32_t *targets, int N, int V,
                    float scale, fc_prec p, cudaStream_t s);

// ---- optimizer.cu: multi-tensor AdamW / SGD (core/optim.h) -----------------
// One step over nu flat fp32 buffers p[u], g[u], s0[u], s1[u] of n[u]
// elements (s0/s1 may be NULL), the gradient scaled by coef when clip.
void fck_optimizer(const fc_optim_config *c, long step, float coef, int clip, float *const *p, float *const *g,
                   float *const *s0, float *const *s1, const size_t *n, int nu, cudaStream_t s);

// ---- global_norm.cu: a partial gradient norm (core/clip.h) ------------------
// parts[FCK_NORM_BLOCKS] (device) += the exact partial norms of nu fp32
// buffers g[u] [n[u]], one per block; the caller merges them on the host
// (fc_norm_part_merge: exact, so the result is the reference's bits).
#define FCK_NORM_BLOCKS 64
#define FCK_NORM_SEGS 32
void fck_norm_parts(fc_norm_part *parts, float *const *g, const size_t *n, int nu, fc_norm_type t, cudaStream_t s);

FC_END_DECLS

#endif
