// reference/layers.h — forward and backward of every layer the models use.
//
// Plain C on the CPU, written against `real` (core/real.h) and compiled both as
// float (training) and as double (finite-difference tests). Conventions, as in
// llm.c's train_gpt2.c:
//  - every tensor is row-major and contiguous; shapes are in the comments;
//  - backward functions ACCUMULATE (+=) into every gradient they produce, so a
//    tied parameter (wte) and gradient accumulation both just add; callers
//    zero gradient buffers when a new gradient begins;
//  - any gradient output pointer may be NULL when that gradient is not needed;
//  - each output element is computed with one fixed summation order that
//    depends only on the shapes, so results are bitwise reproducible.
#ifndef FC_LAYERS_H
#define FC_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "real.h"

// Weight layouts of a matmul.
//  FC_W_KN: w is [K, N], out = inp @ w        (GPT-2 Conv1D: in x out)
//  FC_W_NK: w is [N, K], out = inp @ w^T      (nn.Linear: out x in; also the tied LM head)
typedef enum { FC_W_KN, FC_W_NK } fc_wlayout;

// out [M,N] = inp [M,K] (x) w (+ bias [N] if not NULL)
void RN(fc_matmul_forward)(real *out, const real *inp, const real *w, const real *bias, int M,
                           int K, int N, fc_wlayout layout);
// dinp [M,K] += dout @ w^T;  dw (layout of w) += inp^T dout;  dbias [N] += sum_m dout[m,:]
void RN(fc_matmul_backward)(real *dinp, real *dw, real *dbias, const real *dout, const real *inp,
                            const real *w, int M, int K, int N, fc_wlayout layout);

// LayerNorm over the last dim C of inp [N,C], biased variance.
// out [N,C]; mean, rstd [N] are saved for backward.
void RN(fc_layernorm_forward)(real *out, real *mean, real *rstd, const real *inp,
                              const real *weight, const real *bias, int N, int C, real eps);
void RN(fc_layernorm_backward)(real *dinp, real *dweight, real *dbias, const real *dout,
                               const real *inp, const real *weight, const real *mean,
                               const real *rstd, int N, int C);

// gelu_new (tanh form): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n.
void RN(fc_gelu_forward)(real *out, const real *inp, size_t n);
void RN(fc_gelu_backward)(real *dinp, const real *inp, const real *dout, size_t n);

// Causal multi-head self-attention core (no projections).
// qkv [B,T,3C] holds q, k, v of C each; NH heads of hs = C/NH.
// preatt, att [B,NH,T,T] (scores, softmax); out [B,T,C] (heads merged).
// Entries of preatt/att above the diagonal are written as 0.
void RN(fc_attention_forward)(real *out, real *preatt, real *att, const real *qkv, int B, int T,
                              int C, int NH);
// dqkv [B,T,3C] +=; dpreatt, datt [B,NH,T,T] are scratch (overwritten).
void RN(fc_attention_backward)(real *dqkv, real *dpreatt, real *datt, const real *dout,
                               const real *qkv, const real *att, int B, int T, int C, int NH);

// ---- Llama (Hugging Face LlamaForCausalLM, eager attention) ------------------

// RMSNorm over the last dim C of inp [N,C] (LlamaRMSNorm):
//   rstd[n] = 1 / sqrt(mean_c x[n,c]^2 + eps),  out[n,c] = weight[c] * (x[n,c] * rstd[n])
// (two roundings, in that order, as Hugging Face computes it). rstd [N] is saved for backward.
void RN(fc_rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *weight, int N, int C,
                            real eps);
// dinp [N,C] +=; dweight [C] += sum_n dout * x * rstd.
void RN(fc_rmsnorm_backward)(real *dinp, real *dweight, const real *dout, const real *inp,
                             const real *weight, const real *rstd, int N, int C);

// Rotary position embedding as Hugging Face applies it (rotate_half, the two
// halves of a head, not interleaved pairs): for a head vector x [hd] at
// position t (t = 0..T-1 inside each sample), i < hd/2,
//   inv_freq[i] = 1 / theta^(2i / hd),  a = t * inv_freq[i]  (in the build's precision, as torch's fp32)
//   out[i]        = x[i] cos a - x[i + hd/2] sin a
//   out[i + hd/2] = x[i + hd/2] cos a + x[i] sin a
// x [B,T,H,hd] (H heads of hd per token, contiguous). out may alias inp.
void RN(fc_rope_forward)(real *out, const real *inp, int B, int T, int H, int hd, double theta);
// The transpose rotation: dinp [B,T,H,hd] += R^T dout.
void RN(fc_rope_backward)(real *dinp, const real *dout, int B, int T, int H, int hd, double theta);

// SwiGLU's gate (LlamaMLP): out [n] = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
void RN(fc_swiglu_forward)(real *out, const real *gate, const real *up, size_t n);
// dgate, dup [n] +=.
void RN(fc_swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up,
                            size_t n);

// Causal grouped-query attention core (no projections), Llama's eager path:
// q [B,T,NH*hs], k and v [B,T,NKV*hs] (NKV divides NH; query head h reads kv
// head h / (NH/NKV), as repeat_kv lays them out); out [B,T,NH*hs].
// preatt, att [B,NH,T,T] as in fc_attention_forward; the scores are
// (q . k) * s with s = (real)(1 / sqrt((double)hs)) (Llama multiplies by
// head_dim**-0.5, where GPT-2 divides by sqrt(hs)).
void RN(fc_gqa_attention_forward)(real *out, real *preatt, real *att, const real *q, const real *k,
                                  const real *v, int B, int T, int NH, int NKV, int hs);
// dq [B,T,NH*hs], dk and dv [B,T,NKV*hs] +=; a kv head's gradient sums its
// query heads' contributions in ascending head order. dpreatt, datt scratch.
void RN(fc_gqa_attention_backward)(real *dq, real *dk, real *dv, real *dpreatt, real *datt,
                                   const real *dout, const real *q, const real *k, const real *v,
                                   const real *att, int B, int T, int NH, int NKV, int hs);

// Token + position embedding: out [B,T,C] = wte[ids[b,t]] + wpe[t]; wpe NULL: wte[ids[b,t]]
// alone (llama), and dwpe NULL in backward.
// ids [B,T] must be in [0, V) (the caller validates).
void RN(fc_encoder_forward)(real *out, const int32_t *ids, const real *wte, const real *wpe,
                            int B, int T, int C);
void RN(fc_encoder_backward)(real *dwte, real *dwpe, const real *dout, const int32_t *ids, int B,
                             int T, int C);

// out [n] = a + b (out may alias a or b).
void RN(fc_residual_forward)(real *out, const real *a, const real *b, size_t n);

// Softmax cross-entropy over logits [N,V] with targets [N] in [0, V).
// Writes probs [N,V]; returns the SUM of the N per-row losses (callers divide).
real RN(fc_crossentropy_forward)(real *probs, const real *logits, const int32_t *targets, int N,
                                 int V);
// dlogits [N,V] += scale * (probs - onehot(targets)). scale is d(loss)/d(row loss),
// e.g. 1/(tokens in the mean) / (micro-batches accumulated).
void RN(fc_crossentropy_backward)(real *dlogits, const real *probs, const int32_t *targets, int N,
                                  int V, real scale);

#endif
