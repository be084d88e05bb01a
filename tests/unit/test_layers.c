// tests/unit/test_layers.c — the reference layer kernels (reference/layers.c).
//
// The checks, none sharing code with layers.c:
//  - finite differences: for every layer, the analytic backward against central
//    differences of a scalar loss L = sum(out * R) (R fixed and random; the
//    cross-entropy loss itself for that layer), all in the double build, where
//    the truncation and rounding errors of the difference (~1e-10) are far
//    below the tolerance |a - n| <= 1e-6 + 1e-5 |n|;
//  - exact values: small cases whose result is known by hand (integer
//    matmuls, a LayerNorm of 1..4, gelu(0) = 0, equal logits give log V, ...);
//  - conventions of layers.h: backward accumulates (twice from zero gives
//    exactly 2x, pre-filled gradients are added to), NULL gradient pointers,
//    the causal mask, and the fixed summation order (the blocked, vectorized
//    matmul gives the same bits as a plain sequential loop);
//  - the float build (the one that trains) against the double build.
//
// This file includes layers.h in its double form (FC_REAL_DOUBLE), so the RN()
// names are the _f64 functions; the few float functions used are declared by
// hand below. The test binary links both fc_refmath and fc_refmath_f64.
#define FC_REAL_DOUBLE
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

// The naive loops below are compared bit for bit with layers.c, so they must
// not be contracted to FMA either (see the same pragma in layers.c).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// ---- the float build ---------------------------------------------------------
void fc_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int M,
                       int K, int N, fc_wlayout layout);
void fc_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, int M, int K, int N, fc_wlayout layout);
void fc_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C, float eps);
void fc_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);
void fc_gelu_forward(float *out, const float *inp, size_t n);
void fc_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void fc_attention_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                          int C, int NH);
void fc_attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH);
float fc_crossentropy_forward(float *probs, const float *logits, const int32_t *targets, int N,
                              int V);
void fc_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, int N,
                              int V, float scale);

// ---- helpers -----------------------------------------------------------------

#include "layers_test_util.h"

// ---- matmul ------------------------------------------------------------------

typedef struct {
    int M, K, N;
    fc_wlayout layout;
    double *inp, *w, *bias, *out, *R;  // bias may be NULL
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    fc_matmul_forward_f64(c->out, c->inp, c->w, c->bias, c->M, c->K, c->N, c->layout);
    return dot_sum(c->out, c->R, (size_t)c->M * c->N);
}

static void fd_matmul(int M, int K, int N, fc_wlayout layout, int with_bias) {
    mm_ctx c = {M, K, N, layout, NULL, NULL, NULL, NULL, NULL};
    const size_t nin = (size_t)M * K, nw = (size_t)K * N, nout = (size_t)M * N;
    c.inp = drand_array(nin, -1, 1);
    c.w = drand_array(nw, -1, 1);
    c.bias = with_bias ? drand_array((size_t)N, -1, 1) : NULL;
    c.out = dalloc(nout);
    c.R = drand_array(nout, -1, 1);
    double *dinp = dalloc(nin), *dw = dalloc(nw), *dbias = dalloc((size_t)N);
    fc_matmul_backward_f64(dinp, dw, with_bias ? dbias : NULL, c.R, c.inp, c.w, M, K, N, layout);
    char what[96];
    snprintf(what, sizeof what, "matmul %s M=%d K=%d N=%d inp", layout == FC_W_KN ? "KN" : "NK",
             M, K, N);
    check_fd(what, c.inp, nin, dinp, mm_loss, &c);
    snprintf(what, sizeof what, "matmul %s M=%d K=%d N=%d w", layout == FC_W_KN ? "KN" : "NK", M,
             K, N);
    check_fd(what, c.w, nw, dw, mm_loss, &c);
    if (with_bias) {
        snprintf(what, sizeof what, "matmul %s M=%d K=%d N=%d bias",
                 layout == FC_W_KN ? "KN" : "NK", M, K, N);
        check_fd(what, c.bias, (size_t)N, dbias, mm_loss, &c);
    }
    free(c.inp); free(c.w); free(c.bias); free(c.out); free(c.R);
    free(dinp); free(dw); free(dbias);
}

// Shapes cover full 4 x 8 (float) / 4 x 4 (double) blocks, edge blocks in
// rows, columns and both, and the 1 x 1 x 1 degenerate case.
static const int mm_shapes[][3] = {{1, 1, 1}, {5, 7, 9}, {8, 3, 8}, {9, 13, 6}, {4, 2, 17}};

Test(layers_matmul, fd_kn_bias) {
    rng_seed(1);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        fd_matmul(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], FC_W_KN, 1);
    }
}
Test(layers_matmul, fd_kn_nobias) {
    rng_seed(2);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        fd_matmul(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], FC_W_KN, 0);
    }
}
Test(layers_matmul, fd_nk_bias) {
    rng_seed(3);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        fd_matmul(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], FC_W_NK, 1);
    }
}
Test(layers_matmul, fd_nk_nobias) {
    rng_seed(4);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        fd_matmul(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], FC_W_NK, 0);
    }
}

Test(layers_matmul, exact_small_integers) {
    // inp [2,2] = [[1,2],[3,4]], w (KN) [2,3] = [[5,6,7],[8,9,10]], bias [3] = [1,2,3]
    // inp @ w = [[21,24,27],[47,54,61]]
    const double inp[4] = {1, 2, 3, 4};
    const double w_kn[6] = {5, 6, 7, 8, 9, 10};
    const double w_nk[6] = {5, 8, 6, 9, 7, 10};  // the same matrix as [N,K]
    const double bias[3] = {1, 2, 3};
    const double want_nb[6] = {21, 24, 27, 47, 54, 61};
    const double want_b[6] = {22, 26, 30, 48, 56, 64};
    double out[6];
    fc_matmul_forward_f64(out, inp, w_kn, NULL, 2, 2, 3, FC_W_KN);
    for (int i = 0; i < 6; i++) { cr_expect_eq(out[i], want_nb[i], "KN out[%d] = %g", i, out[i]); }
    fc_matmul_forward_f64(out, inp, w_kn, bias, 2, 2, 3, FC_W_KN);
    for (int i = 0; i < 6; i++) { cr_expect_eq(out[i], want_b[i], "KN+b out[%d] = %g", i, out[i]); }
    fc_matmul_forward_f64(out, inp, w_nk, bias, 2, 2, 3, FC_W_NK);
    for (int i = 0; i < 6; i++) { cr_expect_eq(out[i], want_b[i], "NK+b out[%d] = %g", i, out[i]); }

    // backward with dout = ones: dinp[m,k] = sum_n w(k,n) = [18, 27] per row;
    // dw(k,n) = sum_m inp[m,k] = [4, 6] down k; dbias = [2,2,2]
    const double ones[6] = {1, 1, 1, 1, 1, 1};
    double dinp[4] = {0}, dw[6] = {0}, db[3] = {0};
    fc_matmul_backward_f64(dinp, dw, db, ones, inp, w_kn, 2, 2, 3, FC_W_KN);
    const double want_dinp[4] = {18, 27, 18, 27}, want_dw_kn[6] = {4, 4, 4, 6, 6, 6};
    for (int i = 0; i < 4; i++) { cr_expect_eq(dinp[i], want_dinp[i], "KN dinp[%d]", i); }
    for (int i = 0; i < 6; i++) { cr_expect_eq(dw[i], want_dw_kn[i], "KN dw[%d]", i); }
    for (int i = 0; i < 3; i++) { cr_expect_eq(db[i], 2.0, "dbias[%d]", i); }
    memset(dinp, 0, sizeof dinp);
    memset(dw, 0, sizeof dw);
    fc_matmul_backward_f64(dinp, dw, NULL, ones, inp, w_nk, 2, 2, 3, FC_W_NK);
    const double want_dw_nk[6] = {4, 6, 4, 6, 4, 6};
    for (int i = 0; i < 4; i++) { cr_expect_eq(dinp[i], want_dinp[i], "NK dinp[%d]", i); }
    for (int i = 0; i < 6; i++) { cr_expect_eq(dw[i], want_dw_nk[i], "NK dw[%d]", i); }
}

// The fixed summation order, bit for bit, in the float build (the one that
// trains) and the double build: out[m,n] = bias[n] first, then fused
// multiply-adds of inp[m,k] w(k,n) for k ascending; backward contributions are sums from 0 in ascending order,
// added to the gradient once. Shapes are large enough for many full vector
// blocks plus edges in both directions.
static void naive_matmul_f(float *out, const float *inp, const float *w, const float *bias, int M,
                           int K, int N, fc_wlayout L) {
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            float s = bias ? bias[n] : 0.0f;
            for (int k = 0; k < K; k++) {
                const float wv = L == FC_W_KN ? w[(size_t)k * N + n] : w[(size_t)n * K + k];
                s = fmaf(inp[(size_t)m * K + k], wv, s);
            }
            out[(size_t)m * N + n] = s;
        }
    }
}
static void naive_matmul_backward_f(float *dinp, float *dw, float *dbias, const float *dout,
                                    const float *inp, const float *w, int M, int K, int N,
                                    fc_wlayout L) {
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) {
                const float wv = L == FC_W_KN ? w[(size_t)k * N + n] : w[(size_t)n * K + k];
                s = fmaf(dout[(size_t)m * N + n], wv, s);
            }
            dinp[(size_t)m * K + k] += s;
        }
    }
    for (int k = 0; k < K; k++) {
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int m = 0; m < M; m++) { s = fmaf(inp[(size_t)m * K + k], dout[(size_t)m * N + n], s); }
            dw[L == FC_W_KN ? (size_t)k * N + n : (size_t)n * K + k] += s;
        }
    }
    for (int n = 0; n < N; n++) {
        float s = 0.0f;
        for (int m = 0; m < M; m++) { s += dout[(size_t)m * N + n]; }
        dbias[n] += s;
    }
}
static void naive_matmul_d(double *out, const double *inp, const double *w, const double *bias,
                           int M, int K, int N, fc_wlayout L) {
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < K; k++) {
                const double wv = L == FC_W_KN ? w[(size_t)k * N + n] : w[(size_t)n * K + k];
                s = fma(inp[(size_t)m * K + k], wv, s);
            }
            out[(size_t)m * N + n] = s;
        }
    }
}

static void matmul_bits_against_naive(void) {
    rng_seed(5);
    // {24, 300, 70}: r past one chunk (MM_KC) and whole 32-column groups packed by 8 x 8 tiles with a tail
    const int shapes[][3] = {{13, 37, 29}, {32, 64, 40}, {3, 100, 5}, {17, 1, 33}, {24, 300, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        const size_t nin = (size_t)M * K, nw = (size_t)K * N, nout = (size_t)M * N;
        double *inp_d = drand_array(nin, -1, 1), *w_d = drand_array(nw, -1, 1);
        double *b_d = drand_array((size_t)N, -1, 1), *dout_d = drand_array(nout, -1, 1);
        double *pre_d = drand_array(nin + nw + (size_t)N, -1, 1);  // pre-filled gradients
        float *inp = to_float(inp_d, nin), *w = to_float(w_d, nw), *b = to_float(b_d, (size_t)N);
        float *dout = to_float(dout_d, nout);
        float *out = falloc(nout), *ref = falloc(nout);
        for (int L = 0; L < 2; L++) {
            const fc_wlayout lay = L ? FC_W_NK : FC_W_KN;
            for (int wb = 0; wb < 2; wb++) {
                fc_matmul_forward(out, inp, w, wb ? b : NULL, M, K, N, lay);
                naive_matmul_f(ref, inp, w, wb ? b : NULL, M, K, N, lay);
                cr_expect(same_bits_f(out, ref, nout), "float forward %s bias=%d M=%d K=%d N=%d",
                          L ? "NK" : "KN", wb, M, K, N);
                double *outd = dalloc(nout), *refd = dalloc(nout);
                fc_matmul_forward_f64(outd, inp_d, w_d, wb ? b_d : NULL, M, K, N, lay);
                naive_matmul_d(refd, inp_d, w_d, wb ? b_d : NULL, M, K, N, lay);
                cr_expect(same_bits_d(outd, refd, nout), "double forward %s bias=%d M=%d K=%d N=%d",
                          L ? "NK" : "KN", wb, M, K, N);
                free(outd);
                free(refd);
            }
            const size_t ng = nin + nw + (size_t)N;
            float *g = to_float(pre_d, ng), *gref = to_float(pre_d, ng);
            fc_matmul_backward(g, g + nin, g + nin + nw, dout, inp, w, M, K, N, lay);
            naive_matmul_backward_f(gref, gref + nin, gref + nin + nw, dout, inp, w, M, K, N, lay);
            cr_expect(same_bits_f(g, gref, nin), "float dinp %s M=%d K=%d N=%d", L ? "NK" : "KN",
                      M, K, N);
            cr_expect(same_bits_f(g + nin, gref + nin, nw), "float dw %s M=%d K=%d N=%d",
                      L ? "NK" : "KN", M, K, N);
            cr_expect(same_bits_f(g + nin + nw, gref + nin + nw, (size_t)N), "float dbias %s",
                      L ? "NK" : "KN");
            free(g);
            free(gref);
        }
        free(inp_d); free(w_d); free(b_d); free(dout_d); free(pre_d);
        free(inp); free(w); free(b); free(dout); free(out); free(ref);
    }
}

Test(layers_matmul, fixed_summation_order_bitwise) { matmul_bits_against_naive(); }

// The narrower kernel sets (core/simd.h) on the same shapes, so each runs under the sanitizers
// here: a fresh process per test, whose first matmul reads the environment.
Test(layers_matmul, fixed_summation_order_bitwise_avx2) {
    setenv("FSDPCHECK_MM_AVX2", "1", 1);
    matmul_bits_against_naive();
}

Test(layers_matmul, fixed_summation_order_bitwise_generic) {
    setenv("FSDPCHECK_MM_GENERIC", "1", 1);
    matmul_bits_against_naive();
}

// Results must not depend on where the buffers happen to sit in memory.
Test(layers_matmul, independent_of_alignment) {
    rng_seed(6);
    const int M = 9, K = 21, N = 19;
    const size_t nin = (size_t)M * K, nw = (size_t)K * N, nout = (size_t)M * N;
    double *inp_d = drand_array(nin, -1, 1), *w_d = drand_array(nw, -1, 1);
    double *b_d = drand_array((size_t)N, -1, 1);
    float *inp = to_float(inp_d, nin), *w = to_float(w_d, nw), *b = to_float(b_d, (size_t)N);
    float *inp1 = falloc(nin + 1), *w1 = falloc(nw + 1), *b1 = falloc((size_t)N + 1);
    memcpy(inp1 + 1, inp, nin * sizeof(float));
    memcpy(w1 + 1, w, nw * sizeof(float));
    memcpy(b1 + 1, b, (size_t)N * sizeof(float));
    float *out = falloc(nout), *out1 = falloc(nout + 1);
    for (int L = 0; L < 2; L++) {
        fc_matmul_forward(out, inp, w, b, M, K, N, (fc_wlayout)L);
        fc_matmul_forward(out1 + 1, inp1 + 1, w1 + 1, b1 + 1, M, K, N, (fc_wlayout)L);
        cr_expect(same_bits_f(out, out1 + 1, nout), "layout %d: misaligned buffers change bits", L);
    }
    free(inp_d); free(w_d); free(b_d); free(inp); free(w); free(b);
    free(inp1); free(w1); free(b1); free(out); free(out1);
}

Test(layers_matmul, backward_accumulates_and_null_grads) {
    rng_seed(7);
    const int M = 6, K = 5, N = 9;
    const size_t nin = (size_t)M * K, nw = (size_t)K * N;
    double *inp = drand_array(nin, -1, 1), *w = drand_array(nw, -1, 1);
    double *dout = drand_array((size_t)M * N, -1, 1);
    for (int L = 0; L < 2; L++) {
        const fc_wlayout lay = (fc_wlayout)L;
        // once from zero
        double *g1i = dalloc(nin), *g1w = dalloc(nw), *g1b = dalloc((size_t)N);
        fc_matmul_backward_f64(g1i, g1w, g1b, dout, inp, w, M, K, N, lay);
        // twice from zero: exactly 2x (each call adds a contribution summed from 0)
        double *g2i = dalloc(nin), *g2w = dalloc(nw), *g2b = dalloc((size_t)N);
        fc_matmul_backward_f64(g2i, g2w, g2b, dout, inp, w, M, K, N, lay);
        fc_matmul_backward_f64(g2i, g2w, g2b, dout, inp, w, M, K, N, lay);
        for (size_t i = 0; i < nin; i++) { cr_expect_eq(g2i[i], 2 * g1i[i], "dinp[%zu]", i); }
        for (size_t i = 0; i < nw; i++) { cr_expect_eq(g2w[i], 2 * g1w[i], "dw[%zu]", i); }
        for (int i = 0; i < N; i++) { cr_expect_eq(g2b[i], 2 * g1b[i], "dbias[%d]", i); }
        // pre-filled: P + contribution
        double *pi = drand_array(nin, -1, 1), *pw = drand_array(nw, -1, 1);
        double *pb = drand_array((size_t)N, -1, 1);
        double *gi = dcopy(pi, nin), *gw = dcopy(pw, nw), *gb = dcopy(pb, (size_t)N);
        fc_matmul_backward_f64(gi, gw, gb, dout, inp, w, M, K, N, lay);
        for (size_t i = 0; i < nin; i++) {
            cr_expect_eq(gi[i], pi[i] + g1i[i], "pre dinp[%zu]", i);
        }
        for (size_t i = 0; i < nw; i++) { cr_expect_eq(gw[i], pw[i] + g1w[i], "pre dw[%zu]", i); }
        for (int i = 0; i < N; i++) { cr_expect_eq(gb[i], pb[i] + g1b[i], "pre dbias[%d]", i); }
        // NULL pointers: every subset, the others unchanged
        for (int mask = 0; mask < 8; mask++) {
            double *ni = dalloc(nin), *nw_ = dalloc(nw), *nb = dalloc((size_t)N);
            fc_matmul_backward_f64(mask & 1 ? ni : NULL, mask & 2 ? nw_ : NULL,
                                   mask & 4 ? nb : NULL, dout, inp, w, M, K, N, lay);
            if (mask & 1) { cr_expect(same_bits_d(ni, g1i, nin), "mask %d dinp", mask); }
            if (mask & 2) { cr_expect(same_bits_d(nw_, g1w, nw), "mask %d dw", mask); }
            if (mask & 4) { cr_expect(same_bits_d(nb, g1b, (size_t)N), "mask %d dbias", mask); }
            free(ni); free(nw_); free(nb);
        }
        free(g1i); free(g1w); free(g1b); free(g2i); free(g2w); free(g2b);
        free(pi); free(pw); free(pb); free(gi); free(gw); free(gb);
    }
    free(inp); free(w); free(dout);
}

Test(layers_matmul, float_matches_double) {
    rng_seed(8);
    const int M = 64, K = 300, N = 50;
    const size_t nin = (size_t)M * K, nw = (size_t)K * N, nout = (size_t)M * N;
    double *inp_d = drand_array(nin, -1, 1), *w_d = drand_array(nw, -1, 1);
    double *b_d = drand_array((size_t)N, -1, 1), *dout_d = drand_array(nout, -1, 1);
    float *inp = to_float(inp_d, nin), *w = to_float(w_d, nw), *b = to_float(b_d, (size_t)N);
    float *dout = to_float(dout_d, nout);
    // the double build on the float-rounded inputs, so only arithmetic differs
    double *inp_r = dalloc(nin), *w_r = dalloc(nw), *b_r = dalloc((size_t)N);
    double *dout_r = dalloc(nout);
    for (size_t i = 0; i < nin; i++) { inp_r[i] = inp[i]; }
    for (size_t i = 0; i < nw; i++) { w_r[i] = w[i]; }
    for (int i = 0; i < N; i++) { b_r[i] = b[i]; }
    for (size_t i = 0; i < nout; i++) { dout_r[i] = dout[i]; }
    for (int L = 0; L < 2; L++) {
        float *out = falloc(nout), *di = falloc(nin), *dw = falloc(nw), *db = falloc((size_t)N);
        double *outd = dalloc(nout), *did = dalloc(nin), *dwd = dalloc(nw);
        double *dbd = dalloc((size_t)N);
        fc_matmul_forward(out, inp, w, b, M, K, N, (fc_wlayout)L);
        fc_matmul_forward_f64(outd, inp_r, w_r, b_r, M, K, N, (fc_wlayout)L);
        fc_matmul_backward(di, dw, db, dout, inp, w, M, K, N, (fc_wlayout)L);
        fc_matmul_backward_f64(did, dwd, dbd, dout_r, inp_r, w_r, M, K, N, (fc_wlayout)L);
        // sums of ~300 terms of size ~1 in fp32: absolute error ~1e-5
        for (size_t i = 0; i < nout; i++) {
            cr_assert(fabs(out[i] - outd[i]) <= 1e-4 + 1e-5 * fabs(outd[i]), "out[%zu] %g vs %g",
                      i, out[i], outd[i]);
        }
        for (size_t i = 0; i < nin; i++) {
            cr_assert(fabs(di[i] - did[i]) <= 1e-4 + 1e-5 * fabs(did[i]), "dinp[%zu]", i);
        }
        for (size_t i = 0; i < nw; i++) {
            cr_assert(fabs(dw[i] - dwd[i]) <= 1e-4 + 1e-5 * fabs(dwd[i]), "dw[%zu]", i);
        }
        for (int i = 0; i < N; i++) {
            cr_assert(fabs(db[i] - dbd[i]) <= 1e-4 + 1e-5 * fabs(dbd[i]), "dbias[%d]", i);
        }
        free(out); free(di); free(dw); free(db); free(outd); free(did); free(dwd); free(dbd);
    }
    free(inp_d); free(w_d); free(b_d); free(dout_d); free(inp); free(w); free(b); free(dout);
    free(inp_r); free(w_r); free(b_r); free(dout_r);
}

// ---- layernorm ---------------------------------------------------------------

typedef struct {
    int N, C;
    double eps;
    double *inp, *weight, *bias, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    fc_layernorm_forward_f64(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, c->N, c->C,
                             c->eps);
    return dot_sum(c->out, c->R, (size_t)c->N * c->C);
}

static void ln_setup(ln_ctx *c, int N, int C) {
    c->N = N;
    c->C = C;
    c->eps = 1e-5;
    c->inp = drand_array((size_t)N * C, -2, 2);
    c->weight = drand_array((size_t)C, 0.5, 1.5);
    c->bias = drand_array((size_t)C, -0.5, 0.5);
    c->out = dalloc((size_t)N * C);
    c->mean = dalloc((size_t)N);
    c->rstd = dalloc((size_t)N);
    c->R = drand_array((size_t)N * C, -1, 1);
}
static void ln_free(ln_ctx *c) {
    free(c->inp); free(c->weight); free(c->bias); free(c->out); free(c->mean); free(c->rstd);
    free(c->R);
}

Test(layers_layernorm, fd) {
    rng_seed(11);
    const int shapes[][2] = {{1, 2}, {3, 7}, {4, 70}};  // C = 70 crosses the 64-wide chunks
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        ln_ctx c;
        ln_setup(&c, shapes[s][0], shapes[s][1]);
        const size_t n = (size_t)c.N * c.C;
        ln_loss(&c);  // mean, rstd for the backward
        double *dinp = dalloc(n), *dw = dalloc((size_t)c.C), *db = dalloc((size_t)c.C);
        fc_layernorm_backward_f64(dinp, dw, db, c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
        check_fd("layernorm inp", c.inp, n, dinp, ln_loss, &c);
        check_fd("layernorm weight", c.weight, (size_t)c.C, dw, ln_loss, &c);
        check_fd("layernorm bias", c.bias, (size_t)c.C, db, ln_loss, &c);
        free(dinp); free(dw); free(db);
        ln_free(&c);
    }
}

Test(layers_layernorm, exact_known_row) {
    // x = [1,2,3,4]: mean 2.5, biased var 1.25, eps 0 -> out = (x - 2.5) / sqrt(1.25)
    const double x[4] = {1, 2, 3, 4}, ones[4] = {1, 1, 1, 1}, zeros[4] = {0};
    double out[4], mean, rstd;
    fc_layernorm_forward_f64(out, &mean, &rstd, x, ones, zeros, 1, 4, 0.0);
    cr_expect_eq(mean, 2.5);
    cr_expect(fabs(rstd - 1 / sqrt(1.25)) <= 1e-15, "rstd %.17g", rstd);
    const double want[4] = {-1.5 / sqrt(1.25), -0.5 / sqrt(1.25), 0.5 / sqrt(1.25),
                            1.5 / sqrt(1.25)};
    for (int i = 0; i < 4; i++) {
        cr_expect(fabs(out[i] - want[i]) <= 1e-15, "out[%d] = %.17g want %.17g", i, out[i],
                  want[i]);
    }
    // weight, bias and eps: var + eps = 1.25 + 2.75 = 4, so rstd = 0.5 exactly and
    // out = (x - 2.5) * 0.5 * 2 + 1 = x - 1.5
    const double w[4] = {2, 2, 2, 2}, b[4] = {1, 1, 1, 1};
    fc_layernorm_forward_f64(out, &mean, &rstd, x, w, b, 1, 4, 2.75);
    cr_expect_eq(rstd, 0.5, "rstd %.17g", rstd);
    for (int i = 0; i < 4; i++) { cr_expect_eq(out[i], x[i] - 1.5, "out[%d] = %.17g", i, out[i]); }
    // a constant row has variance 0: out = bias, rstd = 1/sqrt(eps)
    const double cst[4] = {3, 3, 3, 3};
    fc_layernorm_forward_f64(out, &mean, &rstd, cst, w, b, 1, 4, 0.25);
    cr_expect_eq(rstd, 2.0);
    for (int i = 0; i < 4; i++) { cr_expect_eq(out[i], 1.0, "const row out[%d]", i); }
}

Test(layers_layernorm, backward_accumulates_and_null_grads) {
    rng_seed(12);
    ln_ctx c;
    ln_setup(&c, 5, 67);
    const size_t n = (size_t)c.N * c.C, C = (size_t)c.C;
    ln_loss(&c);
    double *g1i = dalloc(n), *g1w = dalloc(C), *g1b = dalloc(C);
    fc_layernorm_backward_f64(g1i, g1w, g1b, c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    double *g2i = dalloc(n), *g2w = dalloc(C), *g2b = dalloc(C);
    for (int rep = 0; rep < 2; rep++) {
        fc_layernorm_backward_f64(g2i, g2w, g2b, c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    }
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g2i[i], 2 * g1i[i], "dinp[%zu]", i); }
    for (size_t i = 0; i < C; i++) {
        cr_expect_eq(g2w[i], 2 * g1w[i], "dweight[%zu]", i);
        cr_expect_eq(g2b[i], 2 * g1b[i], "dbias[%zu]", i);
    }
    double *pi = drand_array(n, -1, 1), *pw = drand_array(C, -1, 1), *pb = drand_array(C, -1, 1);
    double *gi = dcopy(pi, n), *gw = dcopy(pw, C), *gb = dcopy(pb, C);
    fc_layernorm_backward_f64(gi, gw, gb, c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(gi[i], pi[i] + g1i[i], "pre dinp[%zu]", i); }
    for (size_t i = 0; i < C; i++) {
        cr_expect_eq(gw[i], pw[i] + g1w[i], "pre dweight[%zu]", i);
        cr_expect_eq(gb[i], pb[i] + g1b[i], "pre dbias[%zu]", i);
    }
    for (int mask = 0; mask < 8; mask++) {
        double *ni = dalloc(n), *nw = dalloc(C), *nb = dalloc(C);
        fc_layernorm_backward_f64(mask & 1 ? ni : NULL, mask & 2 ? nw : NULL, mask & 4 ? nb : NULL,
                                  c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
        if (mask & 1) { cr_expect(same_bits_d(ni, g1i, n), "mask %d dinp", mask); }
        if (mask & 2) { cr_expect(same_bits_d(nw, g1w, C), "mask %d dweight", mask); }
        if (mask & 4) { cr_expect(same_bits_d(nb, g1b, C), "mask %d dbias", mask); }
        free(ni); free(nw); free(nb);
    }
    free(g1i); free(g1w); free(g1b); free(g2i); free(g2w); free(g2b);
    free(pi); free(pw); free(pb); free(gi); free(gw); free(gb);
    ln_free(&c);
}

Test(layers_layernorm, float_matches_double) {
    rng_seed(13);
    ln_ctx c;
    ln_setup(&c, 16, 768);
    const size_t n = (size_t)c.N * c.C, C = (size_t)c.C;
    // round the inputs to float first so only the arithmetic differs
    float *inp = to_float(c.inp, n), *w = to_float(c.weight, C), *b = to_float(c.bias, C);
    float *dout = to_float(c.R, n);
    for (size_t i = 0; i < n; i++) { c.inp[i] = inp[i]; c.R[i] = dout[i]; }
    for (size_t i = 0; i < C; i++) { c.weight[i] = w[i]; c.bias[i] = b[i]; }
    float *out = falloc(n), *mean = falloc((size_t)c.N), *rstd = falloc((size_t)c.N);
    fc_layernorm_forward(out, mean, rstd, inp, w, b, c.N, c.C, 1e-5f);
    ln_loss(&c);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(out[i] - c.out[i]) <= 1e-5 + 1e-5 * fabs(c.out[i]), "out[%zu] %g vs %g", i,
                  out[i], c.out[i]);
    }
    for (int i = 0; i < c.N; i++) {
        cr_assert(fabs(mean[i] - c.mean[i]) <= 1e-6, "mean[%d]", i);
        cr_assert(fabs(rstd[i] - c.rstd[i]) <= 1e-5 * c.rstd[i], "rstd[%d]", i);
    }
    float *di = falloc(n), *dw = falloc(C), *db = falloc(C);
    double *did = dalloc(n), *dwd = dalloc(C), *dbd = dalloc(C);
    fc_layernorm_backward(di, dw, db, dout, inp, w, mean, rstd, c.N, c.C);
    fc_layernorm_backward_f64(did, dwd, dbd, c.R, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(di[i] - did[i]) <= 1e-5 + 1e-4 * fabs(did[i]), "dinp[%zu] %g vs %g", i,
                  di[i], did[i]);
    }
    for (size_t i = 0; i < C; i++) {
        cr_assert(fabs(dw[i] - dwd[i]) <= 1e-5 + 1e-5 * fabs(dwd[i]), "dweight[%zu]", i);
        cr_assert(fabs(db[i] - dbd[i]) <= 1e-5 + 1e-5 * fabs(dbd[i]), "dbias[%zu]", i);
    }
    free(inp); free(w); free(b); free(dout); free(out); free(mean); free(rstd);
    free(di); free(dw); free(db); free(did); free(dwd); free(dbd);
    ln_free(&c);
}

// ---- gelu --------------------------------------------------------------------

typedef struct {
    size_t n;
    double *inp, *out, *R;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    fc_gelu_forward_f64(c->out, c->inp, c->n);
    return dot_sum(c->out, c->R, c->n);
}

Test(layers_gelu, fd) {
    rng_seed(21);
    gelu_ctx c = {200, NULL, NULL, NULL};
    c.inp = drand_array(c.n, -5, 5);
    c.inp[0] = 0;  // the origin and both tails explicitly
    c.inp[1] = -8;
    c.inp[2] = 8;
    c.out = dalloc(c.n);
    c.R = drand_array(c.n, -1, 1);
    double *dinp = dalloc(c.n);
    fc_gelu_backward_f64(dinp, c.inp, c.R, c.n);
    check_fd("gelu inp", c.inp, c.n, dinp, gelu_loss, &c);
    free(c.inp); free(c.out); free(c.R); free(dinp);
}

Test(layers_gelu, exact_values) {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated independently
    // (Python math): gelu(1) = 0.8411919906082768, gelu(-1) = -0.15880800939172324,
    // gelu(2) = 1.954597694087775; gelu(0) = 0 exactly; far tails are x and 0.
    const double x[6] = {0, 1, -1, 2, 30, -30};
    const double want[6] = {0, 0.8411919906082768, -0.15880800939172324, 1.954597694087775, 30, 0};
    double out[6];
    fc_gelu_forward_f64(out, x, 6);
    for (int i = 0; i < 6; i++) {
        cr_expect(fabs(out[i] - want[i]) <= 1e-15, "gelu(%g) = %.17g want %.17g", x[i], out[i],
                  want[i]);
    }
    cr_expect_eq(out[0], 0.0);
    // gelu'(0) = 0.5
    const double zero = 0, one = 1;
    double d = 0;
    fc_gelu_backward_f64(&d, &zero, &one, 1);
    cr_expect_eq(d, 0.5);
}

Test(layers_gelu, accumulates_null_and_float) {
    rng_seed(22);
    const size_t n = 1000;
    double *x = drand_array(n, -6, 6), *dout = drand_array(n, -1, 1);
    double *g1 = dalloc(n), *g2 = dalloc(n);
    fc_gelu_backward_f64(g1, x, dout, n);
    fc_gelu_backward_f64(g2, x, dout, n);
    fc_gelu_backward_f64(g2, x, dout, n);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g2[i], 2 * g1[i], "twice [%zu]", i); }
    double *p = drand_array(n, -1, 1), *g = dcopy(p, n);
    fc_gelu_backward_f64(g, x, dout, n);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g[i], p[i] + g1[i], "pre-filled [%zu]", i); }
    fc_gelu_backward_f64(NULL, x, dout, n);  // must not crash
    float *xf = to_float(x, n), *df = to_float(dout, n), *of = falloc(n), *gf = falloc(n);
    double *od = dalloc(n), *xr = dalloc(n), *dr = dalloc(n), *gd = dalloc(n);
    for (size_t i = 0; i < n; i++) { xr[i] = xf[i]; dr[i] = df[i]; }
    fc_gelu_forward(of, xf, n);
    fc_gelu_forward_f64(od, xr, n);
    fc_gelu_backward(gf, xf, df, n);
    fc_gelu_backward_f64(gd, xr, dr, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(of[i] - od[i]) <= 1e-6 + 1e-6 * fabs(od[i]), "out[%zu]", i);
        cr_assert(fabs(gf[i] - gd[i]) <= 1e-6 + 1e-5 * fabs(gd[i]), "dinp[%zu]", i);
    }
    free(x); free(dout); free(g1); free(g2); free(p); free(g);
    free(xf); free(df); free(of); free(gf); free(od); free(xr); free(dr); free(gd);
}

// ---- attention ---------------------------------------------------------------

typedef struct {
    int B, T, C, NH;
    double *qkv, *out, *preatt, *att, *R;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    fc_attention_forward_f64(c->out, c->preatt, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot_sum(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void att_setup(att_ctx *c, int B, int T, int C, int NH) {
    c->B = B; c->T = T; c->C = C; c->NH = NH;
    const size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T;
    c->qkv = drand_array(BT * 3 * C, -1.5, 1.5);
    c->out = dalloc(BT * C);
    c->preatt = dalloc(att);
    c->att = dalloc(att);
    c->R = drand_array(BT * C, -1, 1);
}
static void att_free(att_ctx *c) {
    free(c->qkv); free(c->out); free(c->preatt); free(c->att); free(c->R);
}

// (B, T, C, NH): T = 1; several heads; hs = 2; T = 9 (4-wide dot blocks plus a
// tail); hs = 130 (crosses the 64-wide chunks of the backward).
static const int att_shapes[][4] = {{1, 1, 4, 1}, {2, 5, 8, 2}, {1, 7, 12, 3},
                                    {2, 4, 6, 3}, {1, 9, 8, 1}, {1, 3, 130, 1}};

Test(layers_attention, fd) {
    rng_seed(31);
    for (size_t s = 0; s < sizeof att_shapes / sizeof att_shapes[0]; s++) {
        att_ctx c;
        att_setup(&c, att_shapes[s][0], att_shapes[s][1], att_shapes[s][2], att_shapes[s][3]);
        const size_t nqkv = (size_t)c.B * c.T * 3 * c.C, natt = (size_t)c.B * c.NH * c.T * c.T;
        att_loss(&c);
        double *dqkv = dalloc(nqkv), *dpre = dalloc(natt), *datt = dalloc(natt);
        fc_attention_backward_f64(dqkv, dpre, datt, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
        char what[96];
        snprintf(what, sizeof what, "attention B=%d T=%d C=%d NH=%d qkv", c.B, c.T, c.C, c.NH);
        check_fd(what, c.qkv, nqkv, dqkv, att_loss, &c);
        free(dqkv); free(dpre); free(datt);
        att_free(&c);
    }
}

Test(layers_attention, softmax_rows_and_mask_layout) {
    rng_seed(32);
    att_ctx c;
    att_setup(&c, 2, 6, 8, 2);
    att_loss(&c);
    const double *q = c.qkv;
    for (int b = 0; b < c.B; b++) {
        for (int h = 0; h < c.NH; h++) {
            for (int t = 0; t < c.T; t++) {
                const size_t row = (((size_t)b * c.NH + h) * c.T + t) * c.T;
                double sum = 0;
                for (int t2 = 0; t2 < c.T; t2++) {
                    const double a = c.att[row + t2];
                    if (t2 > t) {
                        cr_expect_eq(a, 0.0, "att above the diagonal (b%d h%d t%d t2 %d)", b, h,
                                     t, t2);
                        cr_expect_eq(c.preatt[row + t2], 0.0, "preatt above the diagonal");
                    } else {
                        cr_expect(a > 0, "att must be positive on and below the diagonal");
                        // preatt = q . k / sqrt(hs)
                        const int hs = c.C / c.NH;
                        const double *qt = q + ((size_t)b * c.T + t) * 3 * c.C + h * hs;
                        const double *kt = q + ((size_t)b * c.T + t2) * 3 * c.C + c.C + h * hs;
                        double d = 0;
                        for (int i = 0; i < hs; i++) { d += qt[i] * kt[i]; }
                        cr_expect(fabs(c.preatt[row + t2] - d / sqrt(hs)) <= 1e-14,
                                  "preatt %.17g vs %.17g", c.preatt[row + t2], d / sqrt(hs));
                    }
                    sum += a;
                }
                cr_expect(fabs(sum - 1) <= 1e-14, "softmax row sums to %.17g", sum);
            }
        }
    }
    att_free(&c);
}

Test(layers_attention, causal_future_does_not_leak) {
    rng_seed(33);
    att_ctx c;
    att_setup(&c, 2, 7, 12, 3);
    const size_t nout = (size_t)c.B * c.T * c.C, natt = (size_t)c.B * c.NH * c.T * c.T;
    att_loss(&c);
    double *out0 = dcopy(c.out, nout), *att0 = dcopy(c.att, natt);
    // perturb every q, k, v at positions t >= 4 of every sample
    const int tcut = 4;
    for (int b = 0; b < c.B; b++) {
        for (int t = tcut; t < c.T; t++) {
            double *row = c.qkv + ((size_t)b * c.T + t) * 3 * c.C;
            for (int i = 0; i < 3 * c.C; i++) { row[i] += 0.37; }
        }
    }
    att_loss(&c);
    for (int b = 0; b < c.B; b++) {
        for (int t = 0; t < c.T; t++) {
            const double *o0 = out0 + ((size_t)b * c.T + t) * c.C;
            const double *o1 = c.out + ((size_t)b * c.T + t) * c.C;
            if (t < tcut) {
                cr_expect(same_bits_d(o0, o1, (size_t)c.C), "out at t=%d changed by the future",
                          t);
            } else {
                cr_expect(!same_bits_d(o0, o1, (size_t)c.C), "out at t=%d should have changed", t);
            }
        }
        for (int h = 0; h < c.NH; h++) {
            for (int t = 0; t < tcut; t++) {
                const size_t row = (((size_t)b * c.NH + h) * c.T + t) * c.T;
                cr_expect(same_bits_d(att0 + row, c.att + row, (size_t)c.T),
                          "att row %d changed", t);
            }
        }
    }
    free(out0); free(att0);
    att_free(&c);
}

Test(layers_attention, exact_cases) {
    // T = 1: softmax over one score is 1, so out = v exactly.
    rng_seed(34);
    att_ctx c;
    att_setup(&c, 2, 1, 6, 2);
    att_loss(&c);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 6; i++) {
            cr_expect_eq(c.out[b * 6 + i], c.qkv[b * 18 + 12 + i], "T=1: out != v");
        }
        for (int h = 0; h < 2; h++) { cr_expect_eq(c.att[b * 2 + h], 1.0); }
    }
    att_free(&c);
    // All keys equal: uniform attention, out_t = mean of v_0..v_t.
    // v_t = (t, 2t) in the one head, so out_t = (t/2, t) exactly.
    const int T = 4, C = 2;
    double qkv[4 * 3 * 2], out[4 * 2], pre[16], att[16];
    for (int t = 0; t < T; t++) {
        qkv[t * 6 + 0] = 0.5 * (t + 1);  // q varies
        qkv[t * 6 + 1] = -1.0;
        qkv[t * 6 + 2] = 1.0;  // k the same for every t
        qkv[t * 6 + 3] = 1.0;
        qkv[t * 6 + 4] = t;  // v
        qkv[t * 6 + 5] = 2.0 * t;
    }
    fc_attention_forward_f64(out, pre, att, qkv, 1, T, C, 1);
    for (int t = 0; t < T; t++) {
        cr_expect(fabs(out[t * 2 + 0] - t / 2.0) <= 1e-15, "out[%d] = %.17g", t, out[t * 2]);
        cr_expect(fabs(out[t * 2 + 1] - t) <= 1e-15, "out[%d] = %.17g", t, out[t * 2 + 1]);
    }
}

Test(layers_attention, backward_accumulates_and_float) {
    rng_seed(35);
    att_ctx c;
    att_setup(&c, 2, 5, 8, 2);
    const size_t nqkv = (size_t)c.B * c.T * 3 * c.C, natt = (size_t)c.B * c.NH * c.T * c.T;
    att_loss(&c);
    double *dpre = dalloc(natt), *datt = dalloc(natt);
    double *g1 = dalloc(nqkv), *g2 = dalloc(nqkv);
    fc_attention_backward_f64(g1, dpre, datt, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    // scratch is overwritten, not accumulated: garbage in it must not matter
    for (size_t i = 0; i < natt; i++) { dpre[i] = 1e30; datt[i] = -7; }
    fc_attention_backward_f64(g2, dpre, datt, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    cr_expect(same_bits_d(g1, g2, nqkv), "backward depends on the scratch's old contents");
    fc_attention_backward_f64(g2, dpre, datt, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    for (size_t i = 0; i < nqkv; i++) { cr_expect_eq(g2[i], 2 * g1[i], "twice dqkv[%zu]", i); }
    double *p = drand_array(nqkv, -1, 1), *g = dcopy(p, nqkv);
    fc_attention_backward_f64(g, dpre, datt, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    for (size_t i = 0; i < nqkv; i++) { cr_expect_eq(g[i], p[i] + g1[i], "pre dqkv[%zu]", i); }

    // float build on the same (float-rounded) inputs
    att_free(&c);
    att_setup(&c, 2, 64, 32, 4);
    const size_t nqkv2 = (size_t)c.B * c.T * 3 * c.C, natt2 = (size_t)c.B * c.NH * c.T * c.T;
    const size_t nout2 = (size_t)c.B * c.T * c.C;
    float *qkvf = to_float(c.qkv, nqkv2), *Rf = to_float(c.R, nout2);
    for (size_t i = 0; i < nqkv2; i++) { c.qkv[i] = qkvf[i]; }
    for (size_t i = 0; i < nout2; i++) { c.R[i] = Rf[i]; }
    att_loss(&c);
    float *outf = falloc(nout2), *pref = falloc(natt2), *attf = falloc(natt2);
    fc_attention_forward(outf, pref, attf, qkvf, c.B, c.T, c.C, c.NH);
    for (size_t i = 0; i < nout2; i++) {
        cr_assert(fabs(outf[i] - c.out[i]) <= 1e-5 + 1e-5 * fabs(c.out[i]), "out[%zu] %g vs %g", i,
                  outf[i], c.out[i]);
    }
    for (size_t i = 0; i < natt2; i++) {
        cr_assert(fabs(attf[i] - c.att[i]) <= 1e-6 + 1e-5 * fabs(c.att[i]), "att[%zu]", i);
    }
    float *dqf = falloc(nqkv2), *dpf = falloc(natt2), *daf = falloc(natt2);
    double *dqd = dalloc(nqkv2), *dpd = dalloc(natt2), *dad = dalloc(natt2);
    fc_attention_backward(dqf, dpf, daf, Rf, qkvf, attf, c.B, c.T, c.C, c.NH);
    fc_attention_backward_f64(dqd, dpd, dad, c.R, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    for (size_t i = 0; i < nqkv2; i++) {
        cr_assert(fabs(dqf[i] - dqd[i]) <= 1e-5 + 1e-4 * fabs(dqd[i]), "dqkv[%zu] %g vs %g", i,
                  dqf[i], dqd[i]);
    }
    free(dpre); free(datt); free(g1); free(g2); free(p); free(g);
    free(qkvf); free(Rf); free(outf); free(pref); free(attf);
    free(dqf); free(dpf); free(daf); free(dqd); free(dpd); free(dad);
    att_free(&c);
}

// ---- encoder -----------------------------------------------------------------

typedef struct {
    int B, T, C, V;
    const int32_t *ids;
    double *wte, *wpe, *out, *R;
} enc_ctx;

static double enc_loss(void *p) {
    enc_ctx *c = p;
    fc_encoder_forward_f64(c->out, c->ids, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_sum(c->out, c->R, (size_t)c->B * c->T * c->C);
}

// ids [2,5] over V = 6 with repeats inside a sample and across samples; token 4
// never appears (its gradient must stay exactly 0); wpe has 2 spare rows.
static const int32_t enc_ids[10] = {1, 3, 1, 1, 0, 3, 5, 2, 1, 5};

Test(layers_encoder, fd) {
    rng_seed(41);
    enc_ctx c = {2, 5, 70, 6, enc_ids, NULL, NULL, NULL, NULL};  // C = 70 crosses a chunk
    const int P = 7;
    c.wte = drand_array((size_t)c.V * c.C, -1, 1);
    c.wpe = drand_array((size_t)P * c.C, -1, 1);
    c.out = dalloc((size_t)c.B * c.T * c.C);
    c.R = drand_array((size_t)c.B * c.T * c.C, -1, 1);
    double *dwte = dalloc((size_t)c.V * c.C), *dwpe = dalloc((size_t)P * c.C);
    fc_encoder_backward_f64(dwte, dwpe, c.R, c.ids, c.B, c.T, c.C);
    check_fd("encoder wte", c.wte, (size_t)c.V * c.C, dwte, enc_loss, &c);
    check_fd("encoder wpe", c.wpe, (size_t)P * c.C, dwpe, enc_loss, &c);
    for (int i = 0; i < c.C; i++) {
        cr_expect_eq(dwte[4 * c.C + i], 0.0, "unused token got a gradient");
        cr_expect_eq(dwpe[5 * c.C + i], 0.0, "unused position got a gradient");
    }
    free(c.wte); free(c.wpe); free(c.out); free(c.R); free(dwte); free(dwpe);
}

Test(layers_encoder, exact_and_accumulation) {
    // forward: out[b,t] = wte[ids[b,t]] + wpe[t], with small integers
    const int B = 2, T = 5, C = 3, V = 6;
    double wte[6 * 3], wpe[5 * 3], out[2 * 5 * 3];
    for (int i = 0; i < V * C; i++) { wte[i] = 100 * (i / C) + i % C; }
    for (int i = 0; i < T * C; i++) { wpe[i] = 10 * (i / C); }
    fc_encoder_forward_f64(out, enc_ids, wte, wpe, B, T, C);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < C; i++) {
                cr_expect_eq(out[(b * T + t) * C + i], 100.0 * enc_ids[b * T + t] + i + 10.0 * t);
            }
        }
    }
    // backward with dout = 1 everywhere: dwte[v] = count of v, dwpe[t] = B
    double ones[2 * 5 * 3], dwte[6 * 3] = {0}, dwpe[5 * 3] = {0};
    for (int i = 0; i < B * T * C; i++) { ones[i] = 1; }
    fc_encoder_backward_f64(dwte, dwpe, ones, enc_ids, B, T, C);
    const double count[6] = {1, 4, 1, 2, 0, 2};
    for (int v = 0; v < V; v++) {
        for (int i = 0; i < C; i++) { cr_expect_eq(dwte[v * C + i], count[v], "dwte[%d]", v); }
    }
    for (int i = 0; i < T * C; i++) { cr_expect_eq(dwpe[i], 2.0, "dwpe[%d]", i); }

    // random dout: twice = 2x, pre-filled adds, NULL pointers
    rng_seed(42);
    double *dout = drand_array((size_t)B * T * C, -1, 1);
    double g1e[18] = {0}, g1p[15] = {0}, g2e[18] = {0}, g2p[15] = {0};
    fc_encoder_backward_f64(g1e, g1p, dout, enc_ids, B, T, C);
    fc_encoder_backward_f64(g2e, g2p, dout, enc_ids, B, T, C);
    fc_encoder_backward_f64(g2e, g2p, dout, enc_ids, B, T, C);
    for (int i = 0; i < 18; i++) { cr_expect_eq(g2e[i], 2 * g1e[i], "twice dwte[%d]", i); }
    for (int i = 0; i < 15; i++) { cr_expect_eq(g2p[i], 2 * g1p[i], "twice dwpe[%d]", i); }
    double *pe = drand_array(18, -1, 1), *pp = drand_array(15, -1, 1);
    double *ge = dcopy(pe, 18), *gp = dcopy(pp, 15);
    fc_encoder_backward_f64(ge, gp, dout, enc_ids, B, T, C);
    for (int i = 0; i < 18; i++) { cr_expect_eq(ge[i], pe[i] + g1e[i], "pre dwte[%d]", i); }
    for (int i = 0; i < 15; i++) { cr_expect_eq(gp[i], pp[i] + g1p[i], "pre dwpe[%d]", i); }
    // a token's rows are summed in (b, t) order: token 1 sits at positions 0, 2, 3, 8;
    // with rows 1, 1e-16, -1, 1e-16 that order gives ((1 + 1e-16) - 1) + 1e-16 = 1e-16,
    // while any other grouping (reversed: ((1e-16 - 1) + 1e-16) + 1 = 0) differs.
    {
        double dd[2 * 5 * 3] = {0}, ge1[18] = {0};
        const double vals[4] = {1.0, 1e-16, -1.0, 1e-16};
        const int pos[4] = {0, 2, 3, 8};
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < C; i++) { dd[pos[k] * C + i] = vals[k]; }
        }
        fc_encoder_backward_f64(ge1, NULL, dd, enc_ids, B, T, C);
        for (int i = 0; i < C; i++) {
            cr_expect_eq(ge1[1 * C + i], 1e-16, "token 1 not summed in position order: %g",
                         ge1[1 * C + i]);
        }
    }
    double ne[18] = {0}, np[15] = {0};
    fc_encoder_backward_f64(NULL, np, dout, enc_ids, B, T, C);
    fc_encoder_backward_f64(ne, NULL, dout, enc_ids, B, T, C);
    cr_expect(same_bits_d(ne, g1e, 18), "dwte with dwpe NULL");
    cr_expect(same_bits_d(np, g1p, 15), "dwpe with dwte NULL");
    free(dout); free(pe); free(pp); free(ge); free(gp);
}

// ---- residual ----------------------------------------------------------------

Test(layers_residual, exact_and_aliasing) {
    double a[5] = {1, -2, 0.5, 1e300, -0.0}, b[5] = {2, 2, 0.25, 1e300, 0.0}, out[5];
    const double want[5] = {3, 0, 0.75, 2e300, 0.0};
    fc_residual_forward_f64(out, a, b, 5);
    for (int i = 0; i < 5; i++) { cr_expect_eq(out[i], want[i], "out[%d]", i); }
    fc_residual_forward_f64(a, a, b, 5);  // out aliases a
    for (int i = 0; i < 5; i++) { cr_expect_eq(a[i], want[i], "aliased a: [%d]", i); }
    double c[2] = {1, 2}, d[2] = {10, 20};
    fc_residual_forward_f64(d, c, d, 2);  // out aliases b
    cr_expect_eq(d[0], 11.0);
    cr_expect_eq(d[1], 22.0);
}

// ---- cross-entropy -----------------------------------------------------------

typedef struct {
    int N, V;
    double scale;
    const int32_t *targets;
    double *logits, *probs;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    return c->scale * fc_crossentropy_forward_f64(c->probs, c->logits, c->targets, c->N, c->V);
}

Test(layers_crossentropy, fd) {
    rng_seed(51);
    const int32_t targets[4] = {2, 0, 6, 2};
    const double scales[2] = {1.0, 0.37};
    for (int s = 0; s < 2; s++) {
        ce_ctx c = {4, 7, scales[s], targets, NULL, NULL};
        c.logits = drand_array((size_t)c.N * c.V, -3, 3);
        c.probs = dalloc((size_t)c.N * c.V);
        ce_loss(&c);
        double *dl = dalloc((size_t)c.N * c.V);
        fc_crossentropy_backward_f64(dl, c.probs, c.targets, c.N, c.V, c.scale);
        check_fd("crossentropy logits", c.logits, (size_t)c.N * c.V, dl, ce_loss, &c);
        free(c.logits); free(c.probs); free(dl);
    }
}

Test(layers_crossentropy, exact_values) {
    // equal logits: probs 1/V, each row loss log V, total N log V
    const int N = 3, V = 5;
    double logits[15], probs[15];
    const int32_t t[3] = {0, 4, 2};
    for (int i = 0; i < N * V; i++) { logits[i] = 1.25; }
    const double loss = fc_crossentropy_forward_f64(probs, logits, t, N, V);
    cr_expect(fabs(loss - 3 * log(5.0)) <= 1e-15, "loss %.17g want %.17g", loss, 3 * log(5.0));
    for (int i = 0; i < N * V; i++) { cr_expect(fabs(probs[i] - 0.2) <= 1e-16, "probs[%d]", i); }
    // two classes, logits (0, log 3): p = (1/4, 3/4); target 0 -> loss log 4
    const double l2[2] = {0, log(3.0)};
    double p2[2];
    const int32_t t0 = 0;
    const double loss2 = fc_crossentropy_forward_f64(p2, l2, &t0, 1, 2);
    cr_expect(fabs(loss2 - log(4.0)) <= 1e-15, "loss %.17g", loss2);
    cr_expect(fabs(p2[0] - 0.25) <= 1e-16 && fabs(p2[1] - 0.75) <= 1e-16);
    // backward: scale * (probs - onehot)
    double d2[2] = {10, 20};
    fc_crossentropy_backward_f64(d2, p2, &t0, 1, 2, 2.0);
    cr_expect(fabs(d2[0] - (10 + 2 * (0.25 - 1))) <= 1e-15);
    cr_expect(fabs(d2[1] - (20 + 2 * 0.75)) <= 1e-15);
    // a target whose softmax underflows to 0 still has a finite loss (log-softmax form)
    const double l3[3] = {0, 2000, -2000};
    double p3[3];
    const int32_t t2 = 2;
    const double loss3 = fc_crossentropy_forward_f64(p3, l3, &t2, 1, 3);
    cr_expect(fabs(loss3 - 4000) <= 1e-9, "extreme loss %.17g", loss3);
    cr_expect_eq(p3[2], 0.0);
    // the same in the float build
    const float l3f[3] = {0, 2000, -2000};
    float p3f[3];
    const float loss3f = fc_crossentropy_forward(p3f, l3f, &t2, 1, 3);
    cr_expect(isfinite(loss3f) && fabsf(loss3f - 4000) <= 1e-3f, "float extreme loss %g", loss3f);
}

Test(layers_crossentropy, accumulates_null_and_float) {
    rng_seed(52);
    const int N = 8, V = 1000;
    const size_t n = (size_t)N * V;
    int32_t t[8];
    for (int i = 0; i < N; i++) { t[i] = (int32_t)(rng_next() % V); }
    double *logits = drand_array(n, -4, 4), *probs = dalloc(n);
    fc_crossentropy_forward_f64(probs, logits, t, N, V);
    double *g1 = dalloc(n), *g2 = dalloc(n);
    fc_crossentropy_backward_f64(g1, probs, t, N, V, 0.125);
    fc_crossentropy_backward_f64(g2, probs, t, N, V, 0.125);
    fc_crossentropy_backward_f64(g2, probs, t, N, V, 0.125);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g2[i], 2 * g1[i], "twice [%zu]", i); }
    double *p = drand_array(n, -1, 1), *g = dcopy(p, n);
    fc_crossentropy_backward_f64(g, probs, t, N, V, 0.125);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g[i], p[i] + g1[i], "pre-filled [%zu]", i); }
    fc_crossentropy_backward_f64(NULL, probs, t, N, V, 0.125);  // must not crash
    for (int r = 0; r < N; r++) {
        double s = 0;
        for (int i = 0; i < V; i++) { s += probs[(size_t)r * V + i]; }
        cr_expect(fabs(s - 1) <= 1e-13, "probs row %d sums to %.17g", r, s);
    }
    // float build
    float *lf = to_float(logits, n), *pf = falloc(n), *gf = falloc(n);
    double *lr = dalloc(n), *pd = dalloc(n), *gd = dalloc(n);
    for (size_t i = 0; i < n; i++) { lr[i] = lf[i]; }
    const float lossf = fc_crossentropy_forward(pf, lf, t, N, V);
    const double lossd = fc_crossentropy_forward_f64(pd, lr, t, N, V);
    cr_expect(fabs(lossf - lossd) <= 1e-5 * fabs(lossd), "loss %.9g vs %.17g", lossf, lossd);
    fc_crossentropy_backward(gf, pf, t, N, V, 0.125f);
    fc_crossentropy_backward_f64(gd, pd, t, N, V, 0.125);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(pf[i] - pd[i]) <= 1e-9 + 1e-5 * pd[i], "probs[%zu] %g vs %g", i, pf[i],
                  pd[i]);
        cr_assert(fabs(gf[i] - gd[i]) <= 1e-9 + 1e-5 * fabs(gd[i]), "dlogits[%zu]", i);
    }
    free(logits); free(probs); free(g1); free(g2); free(p); free(g);
    free(lf); free(pf); free(gf); free(lr); free(pd); free(gd);
}
