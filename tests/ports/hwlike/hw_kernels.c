// tests/ports/hwlike/hw_kernels.c — the hardware-like port's norms,
// elementwise layers, embedding and cross-entropy (attention is in
// hw_attention.c, matmul in hw_matmul.c).
//
// Each hw_X has the signature and meaning of reference/layers.c's fc_X
// (layers.h) and calls it where none of its knobs is on, so with every knob
// off the port computes the reference's bits. The knobs here:
//  - HW_K_NORMS: LayerNorm's statistics in one pass (Welford per lane, lanes
//    merged with Chan's formula), RMSNorm's sum of squares in lanes merged
//    pairwise: a fused norm kernel's warp reduction;
//  - HW_K_COMPUTE16: every output, and every gradient after it accumulates,
//    rounded to the 16-bit compute precision (saved mean and rstd stay fp32);
//  - HW_K_ATOMICS: embedding and norm parameter gradients added term by term
//    into the gradient in a run-to-run order, as atomicAdd kernels do.
// OpenMP threads split independent outputs only, as in layers.c.
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "hwlike.h"
#include "layers.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// Less work than this (in elements) stays on one thread, as layers.c's FC_PAR_MIN.
#define HW_PAR_MIN 32768
// Channels per thread's share of a parameter gradient (layers.c's FC_CHUNK).
#define HW_CHUNK 64
// The most lanes a row reduction uses: a warp.
#define HW_LANES_MAX 32

// The atomics' salts, one per kernel, so two kernels of a step order differently.
enum { HW_SALT_ENCODER = 1, HW_SALT_LAYERNORM = 2, HW_SALT_RMSNORM = 3 };

// x [n] rounded to the compute precision under HW_K_COMPUTE16; NULL is no buffer.
static void hw_round_out(float *x, size_t n) {
    if (x && hw_on(HW_K_COMPUTE16)) hw_r16n(x, n);
}

// ----------------------------------------------------------------------------
// norms: the forward's row reduction as a fused kernel's warp does it

// The shape of a row reduction over C channels: `lanes` threads, each taking
// `vec` consecutive channels at a time (scalar or float4 loads), channel i to
// lane (i / vec) % lanes, each lane summing its channels in ascending order.
// A pure function of the seed and C, as a kernel's launch shape is of C.
typedef struct {
    int lanes, vec;
} hw_lanes;

static hw_lanes norm_lanes(int C) {
    const uint64_t h = hw_mix(hw.seed, (uint64_t)C);
    const hw_lanes s = {4 << (int)(h % 4), (h >> 8) & 1 ? 4 : 1};  // 4..32 lanes
    return s;
}

// A Welford state: count, mean, sum of squared deviations.
typedef struct {
    float n, mean, m2;
} welford;

// Chan's parallel merge of two states (apex's cuChanOnlineSum); an empty
// state (a lane with no channels) leaves the other as it is.
static welford welford_merge(welford a, welford b) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    const float n = a.n + b.n, nb_n = b.n / n, delta = b.mean - a.mean;
    const welford r = {n, a.mean + delta * nb_n, a.m2 + b.m2 + delta * delta * a.n * nb_n};
    return r;
}

// The mean and biased variance of x [C] in one pass: Welford's update per lane
// (apex's cuWelfordOnlineSum), then the lanes merged as a warp's shuffle-down
// reduction merges them (lane k takes lane k + off, off = lanes/2 .. 1).
static void welford_row(const float *x, int C, hw_lanes sh, float *mean, float *var) {
    welford w[HW_LANES_MAX] = {{0, 0, 0}};
    for (int i = 0; i < C; i++) {
        welford *s = &w[(i / sh.vec) % sh.lanes];
        s->n = s->n + 1;
        const float delta = x[i] - s->mean;
        s->mean = s->mean + delta / s->n;
        s->m2 = s->m2 + delta * (x[i] - s->mean);
    }
    for (int off = sh.lanes / 2; off >= 1; off /= 2) {
        for (int k = 0; k < off; k++) w[k] = welford_merge(w[k], w[k + off]);
    }
    *mean = w[0].mean;
    *var = w[0].m2 / (float)C;  // biased, as layers.c
}

// The sum of squares of x [C] per lane, the lanes then summed pairwise as in welford_row.
static float sumsq_row(const float *x, int C, hw_lanes sh) {
    float acc[HW_LANES_MAX] = {0};
    for (int i = 0; i < C; i++) acc[(i / sh.vec) % sh.lanes] += x[i] * x[i];
    for (int off = sh.lanes / 2; off >= 1; off /= 2) {
        for (int k = 0; k < off; k++) acc[k] = acc[k] + acc[k + off];
    }
    return acc[0];
}

void hw_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int N, int C, float eps) {
    // out [N,C], mean [N], rstd [N], inp [N,C], weight [C], bias [C]
    if (!hw_on(HW_K_NORMS)) {
        fc_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
    } else {
        const hw_lanes sh = norm_lanes(C);
#pragma omp parallel for schedule(static) if ((size_t)N * C >= HW_PAR_MIN)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;  // x [C]
            float *o = out + (size_t)n * C;        // o [C]
            float m, v;
            welford_row(x, C, sh, &m, &v);
            const float s = 1.0f / sqrtf(v + eps);
            for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
            mean[n] = m;
            rstd[n] = s;
        }
    }
    hw_round_out(out, (size_t)N * C);  // mean and rstd stay fp32, as fused kernels keep them
}

void hw_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
    // out [N,C], rstd [N], inp [N,C], weight [C]
    if (!hw_on(HW_K_NORMS)) {
        fc_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    } else {
        const hw_lanes sh = norm_lanes(C);
#pragma omp parallel for schedule(static) if ((size_t)N * C >= HW_PAR_MIN)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;  // x [C]
            float *o = out + (size_t)n * C;        // o [C]
            const float v = sumsq_row(x, C, sh) / (float)C;
            const float s = 1.0f / sqrtf(v + eps);
            for (int i = 0; i < C; i++) o[i] = weight[i] * (x[i] * s);  // layers.c's (and HF's) order
            rstd[n] = s;
        }
    }
    hw_round_out(out, (size_t)N * C);
}

// dweight[c] += norm[n,c] * dout[n,c] and dbias[c] += dout[n,c], added term by
// term in a fresh row order (HW_K_ATOMICS), norm = (x - mean) * rstd, or
// x * rstd for RMSNorm (mean NULL). Threads split channel chunks.
static void norm_param_grads_atomic(float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *mean, const float *rstd, int N, int C, uint64_t salt) {
    // dweight [C] or NULL, dbias [C] or NULL, dout [N,C], inp [N,C], mean [N] or NULL, rstd [N]
    size_t *perm = mallocCheck(((size_t)N + 1) * sizeof(size_t));  // perm [N]
    hw_atomic_order(perm, (size_t)N, salt);
#pragma omp parallel for schedule(static) if ((size_t)N * C >= HW_PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += HW_CHUNK) {
        const int cb = C - c0 < HW_CHUNK ? C - c0 : HW_CHUNK;
        for (int r = 0; r < N; r++) {
            const size_t n = perm[r];
            const float *x = inp + n * C + c0, *dy = dout + n * C + c0;  // x, dy [cb]
            const float m = mean ? mean[n] : 0.0f, s = rstd[n];          // x - 0 is x, bit for bit
            if (dweight) {
                for (int j = 0; j < cb; j++) dweight[c0 + j] += (x[j] - m) * s * dy[j];
            }
            if (dbias) {
                for (int j = 0; j < cb; j++) dbias[c0 + j] += dy[j];
            }
        }
    }
    free(perm);
}

void hw_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int N, int C) {
    // dinp [N,C], dweight [C], dbias [C], dout [N,C], inp [N,C], weight [C], mean, rstd [N]
    if (hw_on(HW_K_ATOMICS) && (dweight || dbias)) {
        fc_layernorm_backward(dinp, NULL, NULL, dout, inp, weight, mean, rstd, N, C);
        norm_param_grads_atomic(dweight, dbias, dout, inp, mean, rstd, N, C, HW_SALT_LAYERNORM);
    } else {
        fc_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    }
    hw_round_out(dinp, (size_t)N * C);
    hw_round_out(dweight, (size_t)C);
    hw_round_out(dbias, (size_t)C);
}

void hw_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         const float *rstd, int N, int C) {
    // dinp [N,C], dweight [C], dout [N,C], inp [N,C], weight [C], rstd [N]
    if (hw_on(HW_K_ATOMICS) && dweight) {
        fc_rmsnorm_backward(dinp, NULL, dout, inp, weight, rstd, N, C);
        norm_param_grads_atomic(dweight, NULL, dout, inp, NULL, rstd, N, C, HW_SALT_RMSNORM);
    } else {
        fc_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    }
    hw_round_out(dinp, (size_t)N * C);
    hw_round_out(dweight, (size_t)C);
}

// ----------------------------------------------------------------------------
// elementwise: layers.c's arithmetic, the outputs rounded under HW_K_COMPUTE16

void hw_gelu_forward(float *out, const float *inp, size_t n) {
    // out [n], inp [n]
    fc_gelu_forward(out, inp, n);
    hw_round_out(out, n);
}

void hw_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    // dinp [n] +=, inp [n], dout [n]
    fc_gelu_backward(dinp, inp, dout, n);
    hw_round_out(dinp, n);
}

void hw_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    // out [n], gate [n], up [n]
    fc_swiglu_forward(out, gate, up, n);
    hw_round_out(out, n);
}

void hw_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    // dgate [n] +=, dup [n] +=, dout [n], gate [n], up [n]
    fc_swiglu_backward(dgate, dup, dout, gate, up, n);
    hw_round_out(dgate, n);
    hw_round_out(dup, n);
}

void hw_rope_forward(float *out, const float *inp, int B, int T, int H, int hd, double theta) {
    // out [B,T,H,hd], inp [B,T,H,hd]; out may alias inp
    fc_rope_forward(out, inp, B, T, H, hd, theta);
    hw_round_out(out, (size_t)B * T * H * hd);
}

void hw_rope_backward(float *dinp, const float *dout, int B, int T, int H, int hd, double theta) {
    // dinp [B,T,H,hd] +=, dout [B,T,H,hd]
    fc_rope_backward(dinp, dout, B, T, H, hd, theta);
    hw_round_out(dinp, (size_t)B * T * H * hd);
}

void hw_residual_forward(float *out, const float *a, const float *b, size_t n) {
    // out [n], a [n], b [n]; out may alias a or b
    fc_residual_forward(out, a, b, n);
    hw_round_out(out, n);
}

// ----------------------------------------------------------------------------
// token + position embedding

void hw_encoder_forward(float *out, const int32_t *ids, const float *wte, const float *wpe, int B, int T, int C) {
    // out [B,T,C], ids [B,T], wte [V,C], wpe [P,C] or NULL
    fc_encoder_forward(out, ids, wte, wpe, B, T, C);
    hw_round_out(out, (size_t)B * T * C);
}

// dwte[ids[p]] += dout[p] and dwpe[p % T] += dout[p], one token p at a time in
// a fresh order (HW_K_ATOMICS), as an atomicAdd kernel adds them. Threads
// split channel chunks, so each element's adds stay in that order.
static void encoder_backward_atomic(float *dwte, float *dwpe, const float *dout, const int32_t *ids, int B, int T,
                                    int C) {
    // dwte [V,C] or NULL, dwpe [P,C] or NULL, dout [B,T,C], ids [B,T]
    const size_t BT = (size_t)B * T;
    size_t *perm = mallocCheck((BT + 1) * sizeof(size_t));  // perm [B*T]
    hw_atomic_order(perm, BT, HW_SALT_ENCODER);
#pragma omp parallel for schedule(static) if (BT * C >= HW_PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += HW_CHUNK) {
        const int cb = C - c0 < HW_CHUNK ? C - c0 : HW_CHUNK;
        for (size_t r = 0; r < BT; r++) {
            const size_t p = perm[r];
            const float *dy = dout + p * C + c0;  // dy [cb]
            if (dwte) {
                float *dw = dwte + (size_t)ids[p] * C + c0;
                for (int j = 0; j < cb; j++) dw[j] += dy[j];
            }
            if (dwpe) {
                float *dw = dwpe + (p % (size_t)T) * C + c0;
                for (int j = 0; j < cb; j++) dw[j] += dy[j];
            }
        }
    }
    free(perm);
}

void hw_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *ids, int B, int T, int C) {
    // dwte [V,C], dwpe [P,C], dout [B,T,C], ids [B,T]
    if (hw_on(HW_K_ATOMICS)) {
        encoder_backward_atomic(dwte, dwpe, dout, ids, B, T, C);
    } else {
        fc_encoder_backward(dwte, dwpe, dout, ids, B, T, C);
    }
    if (dwte && hw_on(HW_K_COMPUTE16)) {
        // the rows this batch touched; rounding a repeated token's row again changes nothing
        for (size_t p = 0; p < (size_t)B * T; p++) hw_r16n(dwte + (size_t)ids[p] * C, (size_t)C);
    }
    hw_round_out(dwpe, (size_t)T * C);
}

// ----------------------------------------------------------------------------
// softmax cross-entropy

float hw_crossentropy_forward(float *probs, const float *logits, const int32_t *targets, int N, int V) {
    // probs [N,V], logits [N,V], targets [N]; the loss comes from the logits, and its sum stays fp32
    const float loss = fc_crossentropy_forward(probs, logits, targets, N, V);
    hw_round_out(probs, (size_t)N * V);
    return loss;
}

void hw_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, int N, int V,
                              float scale) {
    // dlogits [N,V] +=, probs [N,V], targets [N]
    fc_crossentropy_backward(dlogits, probs, targets, N, V, scale);
    hw_round_out(dlogits, (size_t)N * V);
}
