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

// Token + position embedding: out [B,T,C] = wte[ids[b,t]] + wpe[t].
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
