// tests/unit/test_layers_llama.c — the Llama layer kernels of reference/layers.c:
// RMSNorm, rotary position embedding, SwiGLU's gate, grouped-query attention.
//
// The checks, in the manner of test_layers.c and sharing no code with layers.c:
//  - finite differences: each backward against central differences of
//    L = sum(out * R) in the double build, |a - n| <= 1e-6 + 1e-5 |n|;
//  - exact values and identities: RoPE at t = 0 is the identity bit for bit,
//    its backward is its inverse, hand-computed rotations; a constant row's
//    RMSNorm; silu(0) = 0 and silu'(0) = 1/2;
//  - independent reference implementations written here: GQA against textbook
//    attention on k, v repeated per head (Hugging Face's repeat_kv) with the
//    full softmax Jacobian, and against the GPT-2 kernel on packed qkv;
//  - the conventions of layers.h: backward accumulates (twice from zero is
//    exactly 2x, pre-filled gradients are added to), NULL gradient pointers,
//    the build's precision (RoPE's tables in float in the float build), fixed
//    summation order (bits independent of the thread count, a kv head's
//    gradient summed over its query heads in ascending order);
//  - the float build (the one that trains) against the double build.
//
// As in test_layers.c, layers.h is included in its double form, so RN() names
// are the _f64 functions; the float functions are declared by hand below.
#define FC_REAL_DOUBLE
#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
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
void fc_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                        float eps);
void fc_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);
void fc_rope_forward(float *out, const float *inp, int B, int T, int H, int hd, double theta);
void fc_rope_backward(float *dinp, const float *dout, int B, int T, int H, int hd, double theta);
void fc_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void fc_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                        const float *up, size_t n);
void fc_gqa_attention_forward(float *out, float *preatt, float *att, const float *q, const float *k,
                              const float *v, int B, int T, int NH, int NKV, int hs);
void fc_gqa_attention_backward(float *dq, float *dk, float *dv, float *dpreatt, float *datt,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *att, int B, int T, int NH, int NKV, int hs);
void fc_attention_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                          int C, int NH);
void fc_attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH);

// ---- helpers (the shared ones in layers_test_util.h) ------------------------

#include "layers_test_util.h"

// rounds a double array to float values in place (so both builds see the same inputs)
static void round_to_float(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) { x[i] = (float)x[i]; }
}

// |a - b| <= atol + rtol |b| everywhere; reports the first element that is not
static void expect_float_near(const char *what, const float *a, const double *b, size_t n, double atol,
                            double rtol) {
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(a[i] - b[i]) <= atol + rtol * fabs(b[i]))) {
            cr_assert(0, "%s[%zu]: float %.9g vs double %.17g", what, i, a[i], b[i]);
        }
    }
}

static void expect_near(const char *what, const double *a, const double *b, size_t n,
                            double atol, double rtol) {
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(a[i] - b[i]) <= atol + rtol * fabs(b[i]))) {
            cr_assert(0, "%s[%zu]: %.17g vs %.17g (diff %.3g)", what, i, a[i], b[i],
                      fabs(a[i] - b[i]));
        }
    }
}

// ---- RMSNorm -----------------------------------------------------------------

typedef struct {
    int N, C;
    double eps;
    double *inp, *weight, *out, *rstd, *R;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    fc_rmsnorm_forward_f64(c->out, c->rstd, c->inp, c->weight, c->N, c->C, c->eps);
    return dot_sum(c->out, c->R, (size_t)c->N * c->C);
}

static void rms_setup(rms_ctx *c, int N, int C) {
    c->N = N;
    c->C = C;
    c->eps = 1e-5;
    c->inp = drand_array((size_t)N * C, -2, 2);
    c->weight = drand_array((size_t)C, 0.5, 1.5);
    c->out = dalloc((size_t)N * C);
    c->rstd = dalloc((size_t)N);
    c->R = drand_array((size_t)N * C, -1, 1);
}
static void rms_free(rms_ctx *c) {
    free(c->inp); free(c->weight); free(c->out); free(c->rstd); free(c->R);
}

Test(layers_rmsnorm, fd) {
    rng_seed(101);
    const int shapes[][2] = {{1, 2}, {3, 7}, {4, 70}};  // C = 70 crosses the 64-wide chunks
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        rms_ctx c;
        rms_setup(&c, shapes[s][0], shapes[s][1]);
        const size_t n = (size_t)c.N * c.C;
        rms_loss(&c);  // rstd for the backward
        double *dinp = dalloc(n), *dw = dalloc((size_t)c.C);
        fc_rmsnorm_backward_f64(dinp, dw, c.R, c.inp, c.weight, c.rstd, c.N, c.C);
        char what[64];
        snprintf(what, sizeof what, "rmsnorm N=%d C=%d inp", c.N, c.C);
        check_fd(what, c.inp, n, dinp, rms_loss, &c);
        snprintf(what, sizeof what, "rmsnorm N=%d C=%d weight", c.N, c.C);
        check_fd(what, c.weight, (size_t)c.C, dw, rms_loss, &c);
        free(dinp); free(dw);
        rms_free(&c);
    }
}

Test(layers_rmsnorm, exact_rows) {
    // a constant row c: mean(x^2) = c^2, so out = weight * c / sqrt(c^2 + eps).
    // c = 3, eps = 16: sqrt(25) = 5 exactly, rstd = 1/5 rounded once.
    const double cst[4] = {3, 3, 3, 3}, w[4] = {1, 2, -0.5, 1.25};
    double out[4], rstd;
    fc_rmsnorm_forward_f64(out, &rstd, cst, w, 1, 4, 16.0);
    cr_expect_eq(rstd, 1.0 / 5.0, "rstd %.17g", rstd);
    for (int i = 0; i < 4; i++) {
        cr_expect(fabs(out[i] - w[i] * 3.0 / 5.0) <= 1e-15, "const row out[%d] = %.17g", i, out[i]);
    }
    // other constants and eps, against weight * c / sqrt(c^2 + eps)
    const double cs[3] = {-0.7, 1e-3, 12.5}, epss[3] = {1e-6, 1e-5, 0.25};
    for (int k = 0; k < 3; k++) {
        const double row[4] = {cs[k], cs[k], cs[k], cs[k]};
        fc_rmsnorm_forward_f64(out, &rstd, row, w, 1, 4, epss[k]);
        for (int i = 0; i < 4; i++) {
            const double want = w[i] * cs[k] / sqrt(cs[k] * cs[k] + epss[k]);
            cr_expect(fabs(out[i] - want) <= 4e-16 * fabs(want), "c=%g out[%d] = %.17g want %.17g",
                      cs[k], i, out[i], want);
        }
    }
    // x = [1,2,3,4]: mean(x^2) = 7.5, + eps 0.5 = 8, rstd = 1/sqrt(8); no mean is subtracted
    const double x[4] = {1, 2, 3, 4}, ones[4] = {1, 1, 1, 1};
    fc_rmsnorm_forward_f64(out, &rstd, x, ones, 1, 4, 0.5);
    cr_expect_eq(rstd, 1.0 / sqrt(8.0), "rstd %.17g", rstd);
    for (int i = 0; i < 4; i++) {
        cr_expect(fabs(out[i] - x[i] / sqrt(8.0)) <= 1e-15, "out[%d] = %.17g", i, out[i]);
    }
    // layers.h's rounding order, weight * (x * rstd), and rstd = 1 / sqrt(v + eps)
    // with two roundings (torch.rsqrt's CPU kernel), bit for bit in both builds;
    // enough rows that a correctly rounded rsqrt would differ in some
    rng_seed(102);
    const int N = 64, C = 33;
    double *xi = drand_array((size_t)N * C, -3, 3), *wi = drand_array((size_t)C, -2, 2);
    round_to_float(xi, (size_t)N * C);
    round_to_float(wi, (size_t)C);
    double *o = dalloc((size_t)N * C), *r = dalloc((size_t)N);
    float *xf = to_float(xi, (size_t)N * C), *wf = to_float(wi, (size_t)C);
    float *of = falloc((size_t)N * C), *rf = falloc((size_t)N);
    fc_rmsnorm_forward_f64(o, r, xi, wi, N, C, 1e-6);
    fc_rmsnorm_forward(of, rf, xf, wf, N, C, 1e-6f);
    int rsqrt_forms_differ = 0;
    for (int n = 0; n < N; n++) {
        double ss = 0;
        float ssf = 0;
        for (int i = 0; i < C; i++) {
            ss += xi[n * C + i] * xi[n * C + i];
            ssf += xf[n * C + i] * xf[n * C + i];
        }
        cr_expect_eq(r[n], 1.0 / sqrt(ss / C + 1e-6), "rstd[%d]", n);
        const float vf = ssf / (float)C + 1e-6f;
        cr_expect_eq(rf[n], 1.0f / sqrtf(vf), "float rstd[%d]", n);
        if (1.0f / sqrtf(vf) != (float)(1.0 / sqrt((double)vf))) { rsqrt_forms_differ++; }
        for (int i = 0; i < C; i++) {
            cr_expect_eq(o[n * C + i], wi[i] * (xi[n * C + i] * r[n]), "out[%d,%d] order", n, i);
            cr_expect_eq(of[n * C + i], wf[i] * (xf[n * C + i] * rf[n]), "float out[%d,%d]", n, i);
        }
    }
    cr_expect(rsqrt_forms_differ > 0, "no row tells 1/sqrtf from a rounded double rsqrt");
    free(xi); free(wi); free(o); free(r); free(xf); free(wf); free(of); free(rf);
}

Test(layers_rmsnorm, backward_accumulates_null_and_float) {
    rng_seed(103);
    rms_ctx c;
    rms_setup(&c, 5, 67);
    const size_t n = (size_t)c.N * c.C, C = (size_t)c.C;
    rms_loss(&c);
    double *g1i = dalloc(n), *g1w = dalloc(C), *g2i = dalloc(n), *g2w = dalloc(C);
    fc_rmsnorm_backward_f64(g1i, g1w, c.R, c.inp, c.weight, c.rstd, c.N, c.C);
    for (int rep = 0; rep < 2; rep++) {
        fc_rmsnorm_backward_f64(g2i, g2w, c.R, c.inp, c.weight, c.rstd, c.N, c.C);
    }
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g2i[i], 2 * g1i[i], "twice dinp[%zu]", i); }
    for (size_t i = 0; i < C; i++) { cr_expect_eq(g2w[i], 2 * g1w[i], "twice dweight[%zu]", i); }
    double *pi = drand_array(n, -1, 1), *pw = drand_array(C, -1, 1);
    double *gi = dcopy(pi, n), *gw = dcopy(pw, C);
    fc_rmsnorm_backward_f64(gi, gw, c.R, c.inp, c.weight, c.rstd, c.N, c.C);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(gi[i], pi[i] + g1i[i], "pre dinp[%zu]", i); }
    for (size_t i = 0; i < C; i++) { cr_expect_eq(gw[i], pw[i] + g1w[i], "pre dweight[%zu]", i); }
    for (int mask = 0; mask < 4; mask++) {
        double *ni = dalloc(n), *nw = dalloc(C);
        fc_rmsnorm_backward_f64(mask & 1 ? ni : NULL, mask & 2 ? nw : NULL, c.R, c.inp, c.weight,
                                c.rstd, c.N, c.C);
        if (mask & 1) { cr_expect(same_bits_d(ni, g1i, n), "mask %d dinp", mask); }
        if (mask & 2) { cr_expect(same_bits_d(nw, g1w, C), "mask %d dweight", mask); }
        free(ni); free(nw);
    }
    free(g1i); free(g1w); free(g2i); free(g2w); free(pi); free(pw); free(gi); free(gw);
    rms_free(&c);

    // float build against double on float-rounded inputs, a model-sized row
    rms_setup(&c, 16, 768);
    const size_t n2 = (size_t)c.N * c.C, C2 = (size_t)c.C;
    round_to_float(c.inp, n2);
    round_to_float(c.R, n2);
    round_to_float(c.weight, C2);
    c.eps = 1e-5f;
    float *inp = to_float(c.inp, n2), *w = to_float(c.weight, C2), *dout = to_float(c.R, n2);
    float *out = falloc(n2), *rstd = falloc((size_t)c.N);
    fc_rmsnorm_forward(out, rstd, inp, w, c.N, c.C, 1e-5f);
    rms_loss(&c);
    expect_float_near("rmsnorm out", out, c.out, n2, 1e-6, 1e-5);
    expect_float_near("rmsnorm rstd", rstd, c.rstd, (size_t)c.N, 0, 1e-5);
    float *di = falloc(n2), *dw = falloc(C2);
    double *did = dalloc(n2), *dwd = dalloc(C2);
    fc_rmsnorm_backward(di, dw, dout, inp, w, rstd, c.N, c.C);
    fc_rmsnorm_backward_f64(did, dwd, c.R, c.inp, c.weight, c.rstd, c.N, c.C);
    expect_float_near("rmsnorm dinp", di, did, n2, 1e-5, 1e-4);
    expect_float_near("rmsnorm dweight", dw, dwd, C2, 1e-5, 1e-5);
    free(inp); free(w); free(dout); free(out); free(rstd); free(di); free(dw); free(did); free(dwd);
    rms_free(&c);
}

// ---- RoPE --------------------------------------------------------------------

typedef struct {
    int B, T, H, hd;
    double theta;
    double *inp, *out, *R;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    fc_rope_forward_f64(c->out, c->inp, c->B, c->T, c->H, c->hd, c->theta);
    return dot_sum(c->out, c->R, (size_t)c->B * c->T * c->H * c->hd);
}

Test(layers_rope, fd) {
    rng_seed(111);
    // theta 10000 (Llama's) and 3 (every frequency turns far within T = 5);
    // hd = 2 (one frequency, inv_freq = 1) and 8
    const struct { int B, T, H, hd; double theta; } cases[] = {
        {2, 5, 3, 8, 10000.0}, {2, 5, 2, 8, 3.0}, {1, 6, 1, 2, 500000.0}, {1, 4, 2, 16, 10.0}};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        rope_ctx c = {cases[s].B, cases[s].T, cases[s].H, cases[s].hd, cases[s].theta, NULL, NULL, NULL};
        const size_t n = (size_t)c.B * c.T * c.H * c.hd;
        c.inp = drand_array(n, -1, 1);
        c.out = dalloc(n);
        c.R = drand_array(n, -1, 1);
        double *dinp = dalloc(n);
        fc_rope_backward_f64(dinp, c.R, c.B, c.T, c.H, c.hd, c.theta);
        char what[96];
        snprintf(what, sizeof what, "rope B=%d T=%d H=%d hd=%d theta=%g inp", c.B, c.T, c.H, c.hd,
                 c.theta);
        check_fd(what, c.inp, n, dinp, rope_loss, &c);
        free(c.inp); free(c.out); free(c.R); free(dinp);
    }
}

Test(layers_rope, exact_rotations) {
    // hd = 4, theta = 100: inv_freq = [1, 1 / 100^(1/2)] = [1, 0.1]; the pairs are
    // (0, 2) and (1, 3), the two halves of the head, not neighbours (0, 1).
    // x = e_0 at t = 1: out = (cos 1, 0, sin 1, 0); x = e_3 at t = 2: angle 0.2,
    // out = (0, -sin 0.2, 0, cos 0.2).
    const int T = 3;
    double in3[3 * 4] = {0}, out3[3 * 4];
    in3[1 * 4 + 0] = 1;  // t = 1: e_0
    in3[2 * 4 + 3] = 1;  // t = 2: e_3
    fc_rope_forward_f64(out3, in3, 1, T, 1, 4, 100.0);
    const double want1[4] = {cos(1.0), 0, sin(1.0), 0};
    const double want2[4] = {0, -sin(0.2), 0, cos(0.2)};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(out3[0 * 4 + i], 0.0, "t=0 of a zero row");
        cr_expect(fabs(out3[1 * 4 + i] - want1[i]) <= 1e-16, "t=1 out[%d] = %.17g", i, out3[4 + i]);
        cr_expect(fabs(out3[2 * 4 + i] - want2[i]) <= 1e-16, "t=2 out[%d] = %.17g", i, out3[8 + i]);
    }
    // a general 2-d rotation, hd = 2: angle t exactly (inv_freq[0] = 1/theta^0 = 1)
    double x4[4 * 2];
    for (int t = 0; t < 4; t++) { x4[2 * t] = 0.75; x4[2 * t + 1] = -1.5; }
    double o4[4 * 2];
    fc_rope_forward_f64(o4, x4, 1, 4, 1, 2, 10000.0);
    for (int t = 0; t < 4; t++) {
        const double c = cos((double)t), s = sin((double)t);
        cr_expect(fabs(o4[2 * t] - (0.75 * c + 1.5 * s)) <= 1e-15, "hd=2 t=%d out[0]", t);
        cr_expect(fabs(o4[2 * t + 1] - (-1.5 * c + 0.75 * s)) <= 1e-15, "hd=2 t=%d out[1]", t);
    }
    // a rotation keeps each pair's length
    rng_seed(112);
    const int B = 2, T2 = 9, H = 3, hd = 16;
    const size_t n = (size_t)B * T2 * H * hd;
    double *xi = drand_array(n, -1, 1), *o = dalloc(n);
    fc_rope_forward_f64(o, xi, B, T2, H, hd, 10000.0);
    for (size_t r = 0; r < n / hd; r++) {
        for (int i = 0; i < hd / 2; i++) {
            const double *a = xi + r * hd, *b = o + r * hd;
            const double la = a[i] * a[i] + a[i + hd / 2] * a[i + hd / 2];
            const double lb = b[i] * b[i] + b[i + hd / 2] * b[i + hd / 2];
            cr_expect(fabs(la - lb) <= 1e-14, "pair length changed: %.17g vs %.17g", la, lb);
        }
    }
    free(xi); free(o);
}

// out[t] for every head at t = 0 is the input bit for bit (cos 0 = 1, sin 0 = 0:
// x * 1 - y * 0 = x exactly), and nothing else is (so the test can fail).
Test(layers_rope, t0_is_identity_and_in_place) {
    rng_seed(113);
    const int B = 2, T = 6, H = 3, hd = 8;
    const size_t n = (size_t)B * T * H * hd, row = (size_t)H * hd;
    double *x = drand_array(n, -2, 2), *o = dalloc(n);
    fc_rope_forward_f64(o, x, B, T, H, hd, 10000.0);
    float *xf = to_float(x, n), *of = falloc(n);
    fc_rope_forward(of, xf, B, T, H, hd, 10000.0);
    for (int b = 0; b < B; b++) {
        const size_t r0 = (size_t)b * T * row;
        cr_expect(same_bits_d(o + r0, x + r0, row), "double: t = 0 of sample %d is not the identity", b);
        cr_expect(same_bits_f(of + r0, xf + r0, row), "float: t = 0 of sample %d is not the identity", b);
        for (int t = 1; t < T; t++) {
            cr_expect(!same_bits_d(o + r0 + t * row, x + r0 + t * row, row), "t = %d unchanged", t);
        }
    }
    // the position restarts at 0 in every sample: sample 1 equals sample 0 on equal inputs
    double *x2 = dalloc(n), *o2 = dalloc(n);
    memcpy(x2, x, n / 2 * sizeof(double));
    memcpy(x2 + n / 2, x, n / 2 * sizeof(double));
    fc_rope_forward_f64(o2, x2, B, T, H, hd, 10000.0);
    cr_expect(same_bits_d(o2, o2 + n / 2, n / 2), "positions do not restart per sample");
    // in place (out aliases inp) gives the same bits
    double *xp = dcopy(x, n);
    fc_rope_forward_f64(xp, xp, B, T, H, hd, 10000.0);
    cr_expect(same_bits_d(xp, o, n), "double in-place rope differs");
    float *xpf = to_float(x, n);
    fc_rope_forward(xpf, xpf, B, T, H, hd, 10000.0);
    cr_expect(same_bits_f(xpf, of, n), "float in-place rope differs");
    free(x); free(o); free(xf); free(of); free(x2); free(o2); free(xp); free(xpf);
}

// The backward applies the transpose rotation, which is the inverse: forward
// then backward (into zeros) gives x back.
Test(layers_rope, backward_is_inverse_and_accumulates) {
    rng_seed(114);
    const int B = 2, T = 7, H = 2, hd = 12;
    const size_t n = (size_t)B * T * H * hd;
    double *x = drand_array(n, -1, 1), *y = dalloc(n), *back = dalloc(n);
    fc_rope_forward_f64(y, x, B, T, H, hd, 10000.0);
    fc_rope_backward_f64(back, y, B, T, H, hd, 10000.0);
    expect_near("rope inverse", back, x, n, 1e-12, 0);
    float *xf = to_float(x, n), *yf = falloc(n), *bf = falloc(n);
    fc_rope_forward(yf, xf, B, T, H, hd, 10000.0);
    fc_rope_backward(bf, yf, B, T, H, hd, 10000.0);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabsf(bf[i] - xf[i]) <= 1e-6f, "float inverse [%zu] %g vs %g", i, bf[i], xf[i]);
    }
    // accumulation: twice from zero is exactly 2x; pre-filled is added to; NULL is a no-op
    double *g1 = dalloc(n), *g2 = dalloc(n);
    fc_rope_backward_f64(g1, y, B, T, H, hd, 10000.0);
    fc_rope_backward_f64(g2, y, B, T, H, hd, 10000.0);
    fc_rope_backward_f64(g2, y, B, T, H, hd, 10000.0);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g2[i], 2 * g1[i], "twice [%zu]", i); }
    double *p = drand_array(n, -1, 1), *g = dcopy(p, n);
    fc_rope_backward_f64(g, y, B, T, H, hd, 10000.0);
    for (size_t i = 0; i < n; i++) { cr_expect_eq(g[i], p[i] + g1[i], "pre-filled [%zu]", i); }
    fc_rope_backward_f64(NULL, y, B, T, H, hd, 10000.0);
    free(x); free(y); free(back); free(xf); free(yf); free(bf); free(g1); free(g2); free(p); free(g);
}

// The float build builds its tables in float, as torch's fp32 does:
// inv_freq = 1 / powf(theta, (2i) / hd), angle = (float)t * inv_freq, cosf, sinf.
// A double angle rounded to float would differ at large t; this checks the bits.
static void naive_rope_f(float *out, const float *inp, int B, int T, int H, int hd, double theta) {
    const int half = hd / 2;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                const float *x = inp + (((size_t)b * T + t) * H + h) * hd;
                float *o = out + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < half; i++) {
                    const float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)hd);
                    const float a = (float)t * inv;
                    const float c = cosf(a), s = sinf(a);
                    o[i] = x[i] * c - x[i + half] * s;
                    o[i + half] = x[i + half] * c + x[i] * s;
                }
            }
        }
    }
}

Test(layers_rope, float_tables_and_float_matches_double) {
    rng_seed(115);
    const int B = 1, T = 2048, H = 2, hd = 64;
    const size_t n = (size_t)B * T * H * hd;
    double *x = drand_array(n, -1, 1);
    round_to_float(x, n);
    float *xf = to_float(x, n), *of = falloc(n), *ref = falloc(n);
    const double thetas[2] = {10000.0, 500000.0};
    for (int k = 0; k < 2; k++) {
        fc_rope_forward(of, xf, B, T, H, hd, thetas[k]);
        naive_rope_f(ref, xf, B, T, H, hd, thetas[k]);
        cr_expect(same_bits_f(of, ref, n), "theta %g: float rope is not fp32 table math", thetas[k]);
        // against the double build: the fp32 angle t * inv_freq is off by up to
        // ~T * 2^-24 rad at t ~ 2048, so the comparison allows 1e-3 absolute
        double *od = dalloc(n);
        fc_rope_forward_f64(od, x, B, T, H, hd, thetas[k]);
        expect_float_near("rope float vs double", of, od, n, 1e-3, 0);
        double maxd = 0;
        for (size_t i = 0; i < n; i++) {
            if (fabs(of[i] - od[i]) > maxd) { maxd = fabs(of[i] - od[i]); }
        }
        cr_expect(maxd > 1e-6, "float and double builds agree too well: the float tables are double");
        free(od);
    }
    // backward, small T: both builds agree to float rounding
    const int T2 = 16;
    const size_t n2 = (size_t)2 * T2 * 3 * 8;
    double *dy = drand_array(n2, -1, 1);
    round_to_float(dy, n2);
    float *dyf = to_float(dy, n2), *gf = falloc(n2);
    double *gd = dalloc(n2);
    fc_rope_backward(gf, dyf, 2, T2, 3, 8, 10000.0);
    fc_rope_backward_f64(gd, dy, 2, T2, 3, 8, 10000.0);
    expect_float_near("rope backward float vs double", gf, gd, n2, 1e-6, 1e-5);
    free(x); free(xf); free(of); free(ref); free(dy); free(dyf); free(gf); free(gd);
}

// ---- SwiGLU ------------------------------------------------------------------

typedef struct {
    size_t n;
    double *gate, *up, *out, *R;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    fc_swiglu_forward_f64(c->out, c->gate, c->up, c->n);
    return dot_sum(c->out, c->R, c->n);
}

Test(layers_swiglu, fd) {
    rng_seed(121);
    swiglu_ctx c = {200, NULL, NULL, NULL, NULL};
    c.gate = drand_array(c.n, -6, 6);
    c.gate[0] = 0;  // the origin and both tails explicitly
    c.gate[1] = -12;
    c.gate[2] = 12;
    c.up = drand_array(c.n, -2, 2);
    c.out = dalloc(c.n);
    c.R = drand_array(c.n, -1, 1);
    double *dg = dalloc(c.n), *du = dalloc(c.n);
    fc_swiglu_backward_f64(dg, du, c.R, c.gate, c.up, c.n);
    check_fd("swiglu gate", c.gate, c.n, dg, swiglu_loss, &c);
    check_fd("swiglu up", c.up, c.n, du, swiglu_loss, &c);
    free(c.gate); free(c.up); free(c.out); free(c.R); free(dg); free(du);
}

Test(layers_swiglu, exact_values) {
    // silu(x) = x / (1 + e^-x), evaluated independently (Python math):
    // silu(1) = 0.7310585786300049, silu(-1) = -0.2689414213699951,
    // silu(2) = 1.7615941559557646; silu(0) = 0 whatever up is; far tails x and -0.
    const double g[7] = {0, 0, 1, -1, 2, 40, -800};
    const double u[7] = {5, -3, 1, 1, 1, 1, 1};
    const double want[7] = {0, 0, 0.7310585786300049, -0.2689414213699951, 1.7615941559557646, 40, 0};
    double out[7];
    fc_swiglu_forward_f64(out, g, u, 7);
    for (int i = 0; i < 7; i++) {
        cr_expect(fabs(out[i] - want[i]) <= 1e-15, "swiglu(%g, %g) = %.17g want %.17g", g[i], u[i],
                  out[i], want[i]);
    }
    cr_expect_eq(out[0], 0.0);
    cr_expect_eq(out[1], 0.0);
    // up scales linearly: swiglu(1, 2.5) = 2.5 silu(1)
    const double g1 = 1, u1 = 2.5;
    double o1;
    fc_swiglu_forward_f64(&o1, &g1, &u1, 1);
    cr_expect(fabs(o1 - 2.5 * 0.7310585786300049) <= 1e-15, "%.17g", o1);
    // backward at gate 0: silu'(0) = 1/2 exactly, and dup = dout * silu(0) = 0
    const double zero = 0, three = 3, one = 1;
    double dg = 0, du = 0;
    fc_swiglu_backward_f64(&dg, &du, &one, &zero, &three, 1);
    cr_expect_eq(dg, 1.5, "dgate at 0: %.17g", dg);
    cr_expect_eq(du, 0.0);
    // silu'(1) = s (1 + 1 (1 - s)), s = 1/(1 + e^-1): 0.9276705118714869 (Python math)
    dg = du = 0;
    fc_swiglu_backward_f64(&dg, &du, &one, &one, &one, 1);
    cr_expect(fabs(dg - 0.9276705118714869) <= 1e-15, "silu'(1) = %.17g", dg);
    cr_expect(fabs(du - 0.7310585786300049) <= 1e-15, "dup = silu(1) = %.17g", du);
    // far negative gate: exp overflows, no NaN, gradients 0 (also in float, where it overflows sooner)
    const double neg = -800;
    dg = du = 0;
    fc_swiglu_backward_f64(&dg, &du, &one, &neg, &one, 1);
    cr_expect(dg == 0 && du == 0, "gate -800: dgate %g dup %g", dg, du);
    const float negf = -200.0f, onef = 1.0f;
    float of, dgf = 0, duf = 0;
    fc_swiglu_forward(&of, &negf, &onef, 1);
    fc_swiglu_backward(&dgf, &duf, &onef, &negf, &onef, 1);
    cr_expect(of == 0 && dgf == 0 && duf == 0, "float gate -200: %g %g %g", of, dgf, duf);
}

// torch's formulas in the float build, bit for bit: silu = x / (1 + exp(-x)),
// then * up; dgate = dout * up * s * (1 + x (1 - s)); dup = dout * silu.
Test(layers_swiglu, float_formula_bits) {
    rng_seed(122);
    const size_t n = 4096;
    double *g = drand_array(n, -10, 10), *u = drand_array(n, -3, 3), *dy = drand_array(n, -1, 1);
    float *gf = to_float(g, n), *uf = to_float(u, n), *dyf = to_float(dy, n);
    float *of = falloc(n), *dgf = falloc(n), *duf = falloc(n);
    fc_swiglu_forward(of, gf, uf, n);
    fc_swiglu_backward(dgf, duf, dyf, gf, uf, n);
    size_t differs_from_sigmoid_form = 0;
    for (size_t i = 0; i < n; i++) {
        const float x = gf[i];
        const float silu = x / (1.0f + expf(-x));
        const float s = 1.0f / (1.0f + expf(-x));
        cr_assert_eq(of[i], silu * uf[i], "out[%zu]", i);
        cr_assert_eq(dgf[i], dyf[i] * uf[i] * s * (1.0f + x * (1.0f - s)), "dgate[%zu]", i);
        cr_assert_eq(duf[i], dyf[i] * silu, "dup[%zu]", i);
        if (x * s != silu) { differs_from_sigmoid_form++; }
    }
    // the check above can tell the two silu forms apart
    cr_expect(differs_from_sigmoid_form > 0, "x * sigmoid(x) never differs from x / (1 + e^-x)");
    free(g); free(u); free(dy); free(gf); free(uf); free(dyf); free(of); free(dgf); free(duf);
}

Test(layers_swiglu, accumulates_null_and_float) {
    rng_seed(123);
    const size_t n = 1000;
    double *g = drand_array(n, -6, 6), *u = drand_array(n, -2, 2), *dy = drand_array(n, -1, 1);
    double *g1 = dalloc(n), *u1 = dalloc(n), *g2 = dalloc(n), *u2 = dalloc(n);
    fc_swiglu_backward_f64(g1, u1, dy, g, u, n);
    fc_swiglu_backward_f64(g2, u2, dy, g, u, n);
    fc_swiglu_backward_f64(g2, u2, dy, g, u, n);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(g2[i], 2 * g1[i], "twice dgate[%zu]", i);
        cr_expect_eq(u2[i], 2 * u1[i], "twice dup[%zu]", i);
    }
    double *pg = drand_array(n, -1, 1), *pu = drand_array(n, -1, 1);
    double *gg = dcopy(pg, n), *gu = dcopy(pu, n);
    fc_swiglu_backward_f64(gg, gu, dy, g, u, n);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(gg[i], pg[i] + g1[i], "pre dgate[%zu]", i);
        cr_expect_eq(gu[i], pu[i] + u1[i], "pre dup[%zu]", i);
    }
    double *ng = dalloc(n), *nu = dalloc(n);
    fc_swiglu_backward_f64(ng, NULL, dy, g, u, n);
    fc_swiglu_backward_f64(NULL, nu, dy, g, u, n);
    fc_swiglu_backward_f64(NULL, NULL, dy, g, u, n);
    cr_expect(same_bits_d(ng, g1, n), "dgate with dup NULL");
    cr_expect(same_bits_d(nu, u1, n), "dup with dgate NULL");
    // float build against double on float-rounded inputs
    round_to_float(g, n);
    round_to_float(u, n);
    round_to_float(dy, n);
    float *gf = to_float(g, n), *uf = to_float(u, n), *dyf = to_float(dy, n);
    float *of = falloc(n), *dgf = falloc(n), *duf = falloc(n);
    double *od = dalloc(n), *dgd = dalloc(n), *dud = dalloc(n);
    fc_swiglu_forward(of, gf, uf, n);
    fc_swiglu_forward_f64(od, g, u, n);
    fc_swiglu_backward(dgf, duf, dyf, gf, uf, n);
    fc_swiglu_backward_f64(dgd, dud, dy, g, u, n);
    expect_float_near("swiglu out", of, od, n, 1e-6, 1e-6);
    expect_float_near("swiglu dgate", dgf, dgd, n, 1e-6, 1e-5);
    expect_float_near("swiglu dup", duf, dud, n, 1e-6, 1e-6);
    free(g); free(u); free(dy); free(g1); free(u1); free(g2); free(u2); free(pg); free(pu);
    free(gg); free(gu); free(ng); free(nu); free(gf); free(uf); free(dyf); free(of); free(dgf);
    free(duf); free(od); free(dgd); free(dud);
}

// ---- grouped-query attention -------------------------------------------------

typedef struct {
    int B, T, NH, NKV, hs;
    double *q, *k, *v, *out, *preatt, *att, *R;
} gqa_ctx;

static size_t gqa_nq(const gqa_ctx *c) { return (size_t)c->B * c->T * c->NH * c->hs; }
static size_t gqa_nkv(const gqa_ctx *c) { return (size_t)c->B * c->T * c->NKV * c->hs; }
static size_t gqa_natt(const gqa_ctx *c) { return (size_t)c->B * c->NH * c->T * c->T; }

static double gqa_loss(void *p) {
    gqa_ctx *c = p;
    fc_gqa_attention_forward_f64(c->out, c->preatt, c->att, c->q, c->k, c->v, c->B, c->T, c->NH,
                                 c->NKV, c->hs);
    return dot_sum(c->out, c->R, gqa_nq(c));
}

static void gqa_setup(gqa_ctx *c, int B, int T, int NH, int NKV, int hs) {
    c->B = B; c->T = T; c->NH = NH; c->NKV = NKV; c->hs = hs;
    c->q = drand_array(gqa_nq(c), -1.5, 1.5);
    c->k = drand_array(gqa_nkv(c), -1.5, 1.5);
    c->v = drand_array(gqa_nkv(c), -1.5, 1.5);
    c->out = dalloc(gqa_nq(c));
    c->preatt = dalloc(gqa_natt(c));
    c->att = dalloc(gqa_natt(c));
    c->R = drand_array(gqa_nq(c), -1, 1);
}
static void gqa_free(gqa_ctx *c) {
    free(c->q); free(c->k); free(c->v); free(c->out); free(c->preatt); free(c->att); free(c->R);
}

// (B, T, NH, NKV, hs): groups of 2, plain multi-head (NKV = NH), multi-query
// (NKV = 1), groups of 3, T = 9 (4-wide dot blocks plus a tail), hs = 130
// (crosses the 64-wide chunks of the backward).
static const int gqa_shapes[][5] = {{2, 5, 4, 2, 4}, {2, 5, 4, 4, 8}, {2, 5, 4, 1, 4},
                                    {1, 6, 6, 2, 8}, {1, 9, 2, 1, 4}, {1, 3, 2, 1, 130}};

Test(layers_gqa, fd) {
    rng_seed(131);
    for (size_t s = 0; s < sizeof gqa_shapes / sizeof gqa_shapes[0]; s++) {
        const int *sh = gqa_shapes[s];
        gqa_ctx c;
        gqa_setup(&c, sh[0], sh[1], sh[2], sh[3], sh[4]);
        gqa_loss(&c);
        double *dq = dalloc(gqa_nq(&c)), *dk = dalloc(gqa_nkv(&c)), *dv = dalloc(gqa_nkv(&c));
        double *dpre = dalloc(gqa_natt(&c)), *datt = dalloc(gqa_natt(&c));
        fc_gqa_attention_backward_f64(dq, dk, dv, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T,
                                      c.NH, c.NKV, c.hs);
        char what[96];
        snprintf(what, sizeof what, "gqa B=%d T=%d NH=%d NKV=%d hs=%d q", c.B, c.T, c.NH, c.NKV, c.hs);
        check_fd(what, c.q, gqa_nq(&c), dq, gqa_loss, &c);
        snprintf(what, sizeof what, "gqa B=%d T=%d NH=%d NKV=%d hs=%d k", c.B, c.T, c.NH, c.NKV, c.hs);
        check_fd(what, c.k, gqa_nkv(&c), dk, gqa_loss, &c);
        snprintf(what, sizeof what, "gqa B=%d T=%d NH=%d NKV=%d hs=%d v", c.B, c.T, c.NH, c.NKV, c.hs);
        check_fd(what, c.v, gqa_nkv(&c), dv, gqa_loss, &c);
        free(dq); free(dk); free(dv); free(dpre); free(datt);
        gqa_free(&c);
    }
}

// Textbook attention, written independently of layers.c: k and v repeated to
// NH heads as Hugging Face's repeat_kv does (head h reads kv head h / (NH/NKV)),
// scores q.k * hs^-0.5 with the future set to -inf, softmax by exp / sum, and
// the backward with the full softmax Jacobian
//   dpre[t,j] = sum_m att[t,m] (delta(j,m) - att[t,j]) datt[t,m],
// then dk, dv of a kv head summed over its group of query heads.
// Layouts: q, out, dout [B,T,NH,hs], k, v [B,T,NKV,hs], att, preatt [B,NH,T,T].
static void naive_gqa(double *out, double *preatt, double *att, double *dq, double *dk, double *dv,
                      const double *dout, const double *q, const double *k, const double *v, int B,
                      int T, int NH, int NKV, int hs) {
    const int rep = NH / NKV;
    const double scale = pow((double)hs, -0.5);
    double *kr = dalloc((size_t)B * T * NH * hs), *vr = dalloc((size_t)B * T * NH * hs);  // [B,T,NH,hs]
    double *dkr = dalloc((size_t)B * T * NH * hs), *dvr = dalloc((size_t)B * T * NH * hs);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                for (int i = 0; i < hs; i++) {
                    const size_t dst = (((size_t)b * T + t) * NH + h) * hs + i;
                    const size_t src = (((size_t)b * T + t) * NKV + h / rep) * hs + i;
                    kr[dst] = k[src];
                    vr[dst] = v[src];
                }
            }
        }
    }
#define QI(b, t, h, i) ((((size_t)(b) * T + (t)) * NH + (h)) * hs + (i))
#define AI(b, h, t, j) ((((size_t)(b) * NH + (h)) * T + (t)) * T + (j))
    double *datt = dalloc((size_t)T), *dpre = dalloc((size_t)T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    double s = -INFINITY;
                    if (j <= t) {
                        s = 0;
                        for (int i = 0; i < hs; i++) { s += q[QI(b, t, h, i)] * kr[QI(b, j, h, i)]; }
                        s *= scale;
                    }
                    preatt[AI(b, h, t, j)] = j <= t ? s : 0;
                    att[AI(b, h, t, j)] = s;
                    if (s > mx) { mx = s; }
                }
                for (int j = 0; j < T; j++) {
                    att[AI(b, h, t, j)] = exp(att[AI(b, h, t, j)] - mx);  // exp(-inf) = 0
                    sum += att[AI(b, h, t, j)];
                }
                for (int j = 0; j < T; j++) { att[AI(b, h, t, j)] /= sum; }
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int j = 0; j < T; j++) { o += att[AI(b, h, t, j)] * vr[QI(b, j, h, i)]; }
                    out[QI(b, t, h, i)] = o;
                }
            }
            if (!dout) { continue; }
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < T; j++) {
                    datt[j] = 0;
                    for (int i = 0; i < hs; i++) { datt[j] += dout[QI(b, t, h, i)] * vr[QI(b, j, h, i)]; }
                }
                for (int j = 0; j < T; j++) {
                    dpre[j] = 0;
                    for (int m = 0; m < T; m++) {
                        const double delta = j == m ? 1.0 : 0.0;
                        dpre[j] += att[AI(b, h, t, m)] * (delta - att[AI(b, h, t, j)]) * datt[m];
                    }
                }
                for (int j = 0; j < T; j++) {
                    const double g = dpre[j] * scale;  // masked j: att = 0, so dpre = 0
                    for (int i = 0; i < hs; i++) {
                        dq[QI(b, t, h, i)] += g * kr[QI(b, j, h, i)];
                        dkr[QI(b, j, h, i)] += g * q[QI(b, t, h, i)];
                        dvr[QI(b, j, h, i)] += att[AI(b, h, t, j)] * dout[QI(b, t, h, i)];
                    }
                }
            }
        }
    }
    if (dout) {  // repeat_kv's backward: a kv head's gradient sums its group
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                for (int h = 0; h < NH; h++) {
                    for (int i = 0; i < hs; i++) {
                        const size_t kvi = (((size_t)b * T + t) * NKV + h / rep) * hs + i;
                        dk[kvi] += dkr[QI(b, t, h, i)];
                        dv[kvi] += dvr[QI(b, t, h, i)];
                    }
                }
            }
        }
    }
#undef QI
#undef AI
    free(kr); free(vr); free(dkr); free(dvr); free(datt); free(dpre);
}

Test(layers_gqa, matches_naive_repeat_kv) {
    rng_seed(132);
    for (size_t s = 0; s < sizeof gqa_shapes / sizeof gqa_shapes[0]; s++) {
        const int *sh = gqa_shapes[s];
        gqa_ctx c;
        gqa_setup(&c, sh[0], sh[1], sh[2], sh[3], sh[4]);
        const size_t nq = gqa_nq(&c), nkv = gqa_nkv(&c), natt = gqa_natt(&c);
        gqa_loss(&c);
        double *dq = dalloc(nq), *dk = dalloc(nkv), *dv = dalloc(nkv);
        double *dpre = dalloc(natt), *datt = dalloc(natt);
        fc_gqa_attention_backward_f64(dq, dk, dv, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T,
                                      c.NH, c.NKV, c.hs);
        double *out = dalloc(nq), *pre = dalloc(natt), *att = dalloc(natt);
        double *rq = dalloc(nq), *rk = dalloc(nkv), *rv = dalloc(nkv);
        naive_gqa(out, pre, att, rq, rk, rv, c.R, c.q, c.k, c.v, c.B, c.T, c.NH, c.NKV, c.hs);
        char what[64];
        snprintf(what, sizeof what, "shape %zu out", s);
        expect_near(what, c.out, out, nq, 1e-13, 1e-12);
        snprintf(what, sizeof what, "shape %zu preatt", s);
        expect_near(what, c.preatt, pre, natt, 1e-13, 1e-12);
        snprintf(what, sizeof what, "shape %zu att", s);
        expect_near(what, c.att, att, natt, 1e-14, 1e-12);
        snprintf(what, sizeof what, "shape %zu dq", s);
        expect_near(what, dq, rq, nq, 1e-13, 1e-12);
        snprintf(what, sizeof what, "shape %zu dk", s);
        expect_near(what, dk, rk, nkv, 1e-13, 1e-12);
        snprintf(what, sizeof what, "shape %zu dv", s);
        expect_near(what, dv, rv, nkv, 1e-13, 1e-12);
        // the mask is written as exact zeros, as fc_attention_forward does
        for (int b = 0; b < c.B; b++) {
            for (int h = 0; h < c.NH; h++) {
                for (int t = 0; t < c.T; t++) {
                    for (int j = t + 1; j < c.T; j++) {
                        const size_t a = (((size_t)b * c.NH + h) * c.T + t) * c.T + j;
                        cr_expect(c.att[a] == 0 && c.preatt[a] == 0, "mask not 0 at (%d,%d)", t, j);
                    }
                }
            }
        }
        free(dq); free(dk); free(dv); free(dpre); free(datt);
        free(out); free(pre); free(att); free(rq); free(rk); free(rv);
        gqa_free(&c);
    }
}

// Packs q, k, v [B,T,NH*hs] into GPT-2's qkv [B,T,3C].
static void pack_qkv_d(double *qkv, const double *q, const double *k, const double *v, int BT, int C) {
    for (int r = 0; r < BT; r++) {
        memcpy(qkv + (size_t)r * 3 * C, q + (size_t)r * C, (size_t)C * sizeof(double));
        memcpy(qkv + (size_t)r * 3 * C + C, k + (size_t)r * C, (size_t)C * sizeof(double));
        memcpy(qkv + (size_t)r * 3 * C + 2 * C, v + (size_t)r * C, (size_t)C * sizeof(double));
    }
}
static void pack_qkv_f(float *qkv, const float *q, const float *k, const float *v, int BT, int C) {
    for (int r = 0; r < BT; r++) {
        memcpy(qkv + (size_t)r * 3 * C, q + (size_t)r * C, (size_t)C * sizeof(float));
        memcpy(qkv + (size_t)r * 3 * C + C, k + (size_t)r * C, (size_t)C * sizeof(float));
        memcpy(qkv + (size_t)r * 3 * C + 2 * C, v + (size_t)r * C, (size_t)C * sizeof(float));
    }
}

// With NKV = NH, GQA is GPT-2's attention but for the scale's form. For hs = 4
// or 16 dividing by sqrt(hs) and multiplying by hs^-0.5 are the same exact
// operation (a power of 2), so both kernels must give the same bits, forward
// and backward, in both builds. For hs = 8 the forms round differently.
Test(layers_gqa, equals_gpt2_attention_when_nkv_is_nh) {
    rng_seed(133);
    const int shapes[][4] = {{2, 5, 2, 4}, {1, 9, 3, 16}, {2, 7, 4, 8}};  // B, T, NH, hs
    for (size_t s = 0; s < 3; s++) {
        const int B = shapes[s][0], T = shapes[s][1], NH = shapes[s][2], hs = shapes[s][3];
        const int C = NH * hs, BT = B * T;
        const size_t n = (size_t)BT * C, natt = (size_t)B * NH * T * T;
        const int exact = hs != 8;
        gqa_ctx c;
        gqa_setup(&c, B, T, NH, NH, hs);
        round_to_float(c.q, n);
        round_to_float(c.k, n);
        round_to_float(c.v, n);
        round_to_float(c.R, n);
        // double build
        double *qkv = dalloc(3 * n), *o2 = dalloc(n), *p2 = dalloc(natt), *a2 = dalloc(natt);
        pack_qkv_d(qkv, c.q, c.k, c.v, BT, C);
        gqa_loss(&c);
        fc_attention_forward_f64(o2, p2, a2, qkv, B, T, C, NH);
        double *dqkv = dalloc(3 * n), *dp = dalloc(natt), *da = dalloc(natt);
        double *dq = dalloc(n), *dk = dalloc(n), *dv = dalloc(n), *dqkv_g = dalloc(3 * n);
        fc_attention_backward_f64(dqkv, dp, da, c.R, qkv, a2, B, T, C, NH);
        fc_gqa_attention_backward_f64(dq, dk, dv, dp, da, c.R, c.q, c.k, c.v, c.att, B, T, NH, NH, hs);
        pack_qkv_d(dqkv_g, dq, dk, dv, BT, C);
        if (exact) {
            cr_expect(same_bits_d(c.out, o2, n), "hs=%d double out differs from GPT-2's", hs);
            cr_expect(same_bits_d(c.preatt, p2, natt), "hs=%d double preatt", hs);
            cr_expect(same_bits_d(c.att, a2, natt), "hs=%d double att", hs);
            cr_expect(same_bits_d(dqkv_g, dqkv, 3 * n), "hs=%d double dq, dk, dv", hs);
        } else {
            expect_near("hs=8 out", c.out, o2, n, 1e-15, 1e-14);
            expect_near("hs=8 dqkv", dqkv_g, dqkv, 3 * n, 1e-14, 1e-13);
        }
        // float build
        float *qf = to_float(c.q, n), *kf = to_float(c.k, n), *vf = to_float(c.v, n);
        float *Rf = to_float(c.R, n), *qkvf = falloc(3 * n);
        pack_qkv_f(qkvf, qf, kf, vf, BT, C);
        float *o1 = falloc(n), *p1 = falloc(natt), *a1 = falloc(natt);
        float *o2f = falloc(n), *p2f = falloc(natt), *a2f = falloc(natt);
        fc_gqa_attention_forward(o1, p1, a1, qf, kf, vf, B, T, NH, NH, hs);
        fc_attention_forward(o2f, p2f, a2f, qkvf, B, T, C, NH);
        float *dqkvf = falloc(3 * n), *dpf = falloc(natt), *daf = falloc(natt);
        float *dqf = falloc(n), *dkf = falloc(n), *dvf = falloc(n), *dqkvf_g = falloc(3 * n);
        fc_attention_backward(dqkvf, dpf, daf, Rf, qkvf, a2f, B, T, C, NH);
        fc_gqa_attention_backward(dqf, dkf, dvf, dpf, daf, Rf, qf, kf, vf, a1, B, T, NH, NH, hs);
        pack_qkv_f(dqkvf_g, dqf, dkf, dvf, BT, C);
        if (exact) {
            cr_expect(same_bits_f(o1, o2f, n), "hs=%d float out differs from GPT-2's", hs);
            cr_expect(same_bits_f(p1, p2f, natt), "hs=%d float preatt", hs);
            cr_expect(same_bits_f(a1, a2f, natt), "hs=%d float att", hs);
            cr_expect(same_bits_f(dqkvf_g, dqkvf, 3 * n), "hs=%d float dq, dk, dv", hs);
        }
        free(qkv); free(o2); free(p2); free(a2); free(dqkv); free(dp); free(da);
        free(dq); free(dk); free(dv); free(dqkv_g);
        free(qf); free(kf); free(vf); free(Rf); free(qkvf); free(o1); free(p1); free(a1);
        free(o2f); free(p2f); free(a2f); free(dqkvf); free(dpf); free(daf);
        free(dqf); free(dkf); free(dvf); free(dqkvf_g);
        gqa_free(&c);
    }
}

// Llama multiplies the raw dot by s = (float)(1 / sqrt(hs)); at hs = 8 that
// rounds differently from GPT-2's division by sqrtf(8), and the float build
// must take the multiply: preatt = (q . k summed over i ascending) * s, bit for bit.
Test(layers_gqa, scale_is_a_multiply) {
    rng_seed(134);
    const int B = 2, T = 16, NH = 4, NKV = 2, hs = 8;
    const size_t nq = (size_t)B * T * NH * hs, nkv = (size_t)B * T * NKV * hs;
    const size_t natt = (size_t)B * NH * T * T;
    double *qd = drand_array(nq, -2, 2), *kd = drand_array(nkv, -2, 2), *vd = drand_array(nkv, -2, 2);
    float *q = to_float(qd, nq), *k = to_float(kd, nkv), *v = to_float(vd, nkv);
    float *out = falloc(nq), *pre = falloc(natt), *att = falloc(natt);
    fc_gqa_attention_forward(out, pre, att, q, k, v, B, T, NH, NKV, hs);
    const float s = (float)(1.0 / sqrt((double)hs));
    int differ = 0;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                for (int j = 0; j <= t; j++) {
                    const float *qt = q + (((size_t)b * T + t) * NH + h) * hs;
                    const float *kj = k + (((size_t)b * T + j) * NKV + h / 2) * hs;
                    float d = 0;
                    for (int i = 0; i < hs; i++) { d += qt[i] * kj[i]; }
                    const float p = pre[(((size_t)b * NH + h) * T + t) * T + j];
                    cr_assert_eq(p, d * s, "preatt (b%d h%d t%d j%d) %.9g, want %.9g", b, h, t, j, p, d * s);
                    if (d / sqrtf((float)hs) != d * s) { differ++; }
                }
            }
        }
    }
    cr_expect(differ > 0, "no score tells multiply from divide: the test cannot fail");
    free(qd); free(kd); free(vd); free(q); free(k); free(v); free(out); free(pre); free(att);
}

// A kv head's gradient element is its query heads' contributions, each summed
// from 0, added up in ascending head order, and that group sum is added to dk
// once (rule 2). So the grouped backward must give the bits of running the
// heads one at a time (NH = NKV = 1 each, into zeroed buffers: the plain
// per-head contributions c_h), then dk = P + ((c_0 + c_1) + c_2) for a
// pre-filled P. (Adding each c_h straight into dk, ((P + c_0) + c_1) + c_2,
// or summing the heads in another order, gives other bits.)
static void head_slice(double *dst, const double *src, int BT, int heads, int h, int hs) {
    for (int r = 0; r < BT; r++) {
        memcpy(dst + (size_t)r * hs, src + ((size_t)r * heads + h) * hs, (size_t)hs * sizeof(double));
    }
}
static void head_unslice(double *dst, const double *src, int BT, int heads, int h, int hs) {
    for (int r = 0; r < BT; r++) {
        memcpy(dst + ((size_t)r * heads + h) * hs, src + (size_t)r * hs, (size_t)hs * sizeof(double));
    }
}

Test(layers_gqa, group_order_bitwise) {
    rng_seed(135);
    const int B = 2, T = 6, NH = 6, NKV = 2, hs = 8, rep = NH / NKV, BT = B * T;
    gqa_ctx c;
    gqa_setup(&c, B, T, NH, NKV, hs);
    const size_t nq = gqa_nq(&c), nkv = gqa_nkv(&c), natt = gqa_natt(&c), nh = (size_t)BT * hs;
    gqa_loss(&c);
    double *pdk = drand_array(nkv, -1, 1), *pdv = drand_array(nkv, -1, 1);  // pre-filled
    double *dq = dalloc(nq), *dk = dcopy(pdk, nkv), *dv = dcopy(pdv, nkv);
    double *dpre = dalloc(natt), *datt = dalloc(natt);
    fc_gqa_attention_backward_f64(dq, dk, dv, dpre, datt, c.R, c.q, c.k, c.v, c.att, B, T, NH, NKV, hs);
    // one head at a time
    double *rdk = dalloc(nkv), *rdv = dalloc(nkv), *rdq = dalloc(nq), *rout = dalloc(nq);
    double *qh = dalloc(nh), *kh = dalloc(nh), *vh = dalloc(nh), *Rh = dalloc(nh), *oh = dalloc(nh);
    double *dqh = dalloc(nh), *dkh = dalloc(nh), *dvh = dalloc(nh), *sk = dalloc(nh), *sv = dalloc(nh);
    double *ph = dalloc((size_t)B * T * T), *ah = dalloc((size_t)B * T * T);
    double *dph = dalloc((size_t)B * T * T), *dah = dalloc((size_t)B * T * T);
    double *naive_k = dcopy(pdk, nkv), *naive_v = dcopy(pdv, nkv);  // ((P + c_0) + c_1) + c_2
    for (int kv = 0; kv < NKV; kv++) {
        head_slice(kh, c.k, BT, NKV, kv, hs);
        head_slice(vh, c.v, BT, NKV, kv, hs);
        for (int h = kv * rep; h < (kv + 1) * rep; h++) {
            head_slice(qh, c.q, BT, NH, h, hs);
            head_slice(Rh, c.R, BT, NH, h, hs);
            memset(dqh, 0, nh * sizeof(double));
            memset(dkh, 0, nh * sizeof(double));
            memset(dvh, 0, nh * sizeof(double));
            fc_gqa_attention_forward_f64(oh, ph, ah, qh, kh, vh, B, T, 1, 1, hs);
            fc_gqa_attention_backward_f64(dqh, dkh, dvh, dph, dah, Rh, qh, kh, vh, ah, B, T, 1, 1, hs);
            head_unslice(rout, oh, BT, NH, h, hs);
            head_unslice(rdq, dqh, BT, NH, h, hs);
            for (size_t i = 0; i < nh; i++) {  // the group's sum, ascending heads
                sk[i] = h == kv * rep ? dkh[i] : sk[i] + dkh[i];
                sv[i] = h == kv * rep ? dvh[i] : sv[i] + dvh[i];
            }
        }
        head_unslice(rdk, sk, BT, NKV, kv, hs);
        head_unslice(rdv, sv, BT, NKV, kv, hs);
    }
    for (size_t i = 0; i < nkv; i++) {
        rdk[i] = pdk[i] + rdk[i];
        rdv[i] = pdv[i] + rdv[i];
    }
    // the per-head adds straight into dk, to show the bitwise check can tell them apart
    for (int kv = 0; kv < NKV; kv++) {
        head_slice(kh, c.k, BT, NKV, kv, hs);
        head_slice(vh, c.v, BT, NKV, kv, hs);
        head_slice(dkh, naive_k, BT, NKV, kv, hs);
        head_slice(dvh, naive_v, BT, NKV, kv, hs);
        for (int h = kv * rep; h < (kv + 1) * rep; h++) {
            head_slice(qh, c.q, BT, NH, h, hs);
            head_slice(Rh, c.R, BT, NH, h, hs);
            fc_gqa_attention_forward_f64(oh, ph, ah, qh, kh, vh, B, T, 1, 1, hs);
            fc_gqa_attention_backward_f64(NULL, dkh, dvh, dph, dah, Rh, qh, kh, vh, ah, B, T, 1, 1, hs);
        }
        head_unslice(naive_k, dkh, BT, NKV, kv, hs);
        head_unslice(naive_v, dvh, BT, NKV, kv, hs);
    }
    cr_expect(same_bits_d(c.out, rout, nq), "grouped forward differs from head by head");
    cr_expect(same_bits_d(dq, rdq, nq), "grouped dq differs from head by head");
    cr_expect(same_bits_d(dk, rdk, nkv), "grouped dk is not P + (the heads' sum in ascending order)");
    cr_expect(same_bits_d(dv, rdv, nkv), "grouped dv is not P + (the heads' sum in ascending order)");
    cr_expect(!same_bits_d(naive_k, rdk, nkv), "per-head adds give the same dk bits: check is blind");
    free(pdk); free(pdv); free(dq); free(dk); free(dv); free(dpre); free(datt);
    free(rdk); free(rdv); free(rdq); free(rout); free(qh); free(kh); free(vh); free(Rh); free(oh);
    free(dqh); free(dkh); free(dvh); free(sk); free(sv); free(ph); free(ah); free(dph); free(dah);
    free(naive_k); free(naive_v);
    gqa_free(&c);
}

Test(layers_gqa, backward_accumulates_scratch_and_null) {
    rng_seed(136);
    gqa_ctx c;
    gqa_setup(&c, 2, 5, 4, 2, 4);
    const size_t nq = gqa_nq(&c), nkv = gqa_nkv(&c), natt = gqa_natt(&c);
    gqa_loss(&c);
    double *dpre = dalloc(natt), *datt = dalloc(natt);
    double *q1 = dalloc(nq), *k1 = dalloc(nkv), *v1 = dalloc(nkv);
    fc_gqa_attention_backward_f64(q1, k1, v1, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH,
                                  c.NKV, c.hs);
    // scratch is overwritten, not accumulated: garbage in it must not matter
    for (size_t i = 0; i < natt; i++) { dpre[i] = 1e30; datt[i] = -7; }
    double *q2 = dalloc(nq), *k2 = dalloc(nkv), *v2 = dalloc(nkv);
    fc_gqa_attention_backward_f64(q2, k2, v2, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH,
                                  c.NKV, c.hs);
    cr_expect(same_bits_d(q1, q2, nq) && same_bits_d(k1, k2, nkv) && same_bits_d(v1, v2, nkv),
              "backward depends on the scratch's old contents");
    // twice from zero: exactly 2x
    fc_gqa_attention_backward_f64(q2, k2, v2, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH,
                                  c.NKV, c.hs);
    for (size_t i = 0; i < nq; i++) { cr_expect_eq(q2[i], 2 * q1[i], "twice dq[%zu]", i); }
    for (size_t i = 0; i < nkv; i++) {
        cr_expect_eq(k2[i], 2 * k1[i], "twice dk[%zu]", i);
        cr_expect_eq(v2[i], 2 * v1[i], "twice dv[%zu]", i);
    }
    // pre-filled: P + contribution
    double *pq = drand_array(nq, -1, 1), *pk = drand_array(nkv, -1, 1), *pv = drand_array(nkv, -1, 1);
    double *gq = dcopy(pq, nq), *gk = dcopy(pk, nkv), *gv = dcopy(pv, nkv);
    fc_gqa_attention_backward_f64(gq, gk, gv, dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH,
                                  c.NKV, c.hs);
    for (size_t i = 0; i < nq; i++) { cr_expect_eq(gq[i], pq[i] + q1[i], "pre dq[%zu]", i); }
    for (size_t i = 0; i < nkv; i++) {
        cr_expect_eq(gk[i], pk[i] + k1[i], "pre dk[%zu]", i);
        cr_expect_eq(gv[i], pv[i] + v1[i], "pre dv[%zu]", i);
    }
    // NULL gradient pointers: every subset, the others unchanged
    for (int mask = 0; mask < 8; mask++) {
        double *nq_ = dalloc(nq), *nk = dalloc(nkv), *nv = dalloc(nkv);
        fc_gqa_attention_backward_f64(mask & 1 ? nq_ : NULL, mask & 2 ? nk : NULL, mask & 4 ? nv : NULL,
                                      dpre, datt, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH, c.NKV, c.hs);
        if (mask & 1) { cr_expect(same_bits_d(nq_, q1, nq), "mask %d dq", mask); }
        if (mask & 2) { cr_expect(same_bits_d(nk, k1, nkv), "mask %d dk", mask); }
        if (mask & 4) { cr_expect(same_bits_d(nv, v1, nkv), "mask %d dv", mask); }
        free(nq_); free(nk); free(nv);
    }
    free(dpre); free(datt); free(q1); free(k1); free(v1); free(q2); free(k2); free(v2);
    free(pq); free(pk); free(pv); free(gq); free(gk); free(gv);
    gqa_free(&c);
}

Test(layers_gqa, float_matches_double) {
    rng_seed(137);
    gqa_ctx c;
    gqa_setup(&c, 2, 64, 8, 2, 16);
    const size_t nq = gqa_nq(&c), nkv = gqa_nkv(&c), natt = gqa_natt(&c);
    round_to_float(c.q, nq);
    round_to_float(c.k, nkv);
    round_to_float(c.v, nkv);
    round_to_float(c.R, nq);
    gqa_loss(&c);
    float *q = to_float(c.q, nq), *k = to_float(c.k, nkv), *v = to_float(c.v, nkv), *R = to_float(c.R, nq);
    float *out = falloc(nq), *pre = falloc(natt), *att = falloc(natt);
    fc_gqa_attention_forward(out, pre, att, q, k, v, c.B, c.T, c.NH, c.NKV, c.hs);
    expect_float_near("gqa out", out, c.out, nq, 1e-5, 1e-5);
    expect_float_near("gqa att", att, c.att, natt, 1e-6, 1e-5);
    float *dq = falloc(nq), *dk = falloc(nkv), *dv = falloc(nkv), *dp = falloc(natt), *da = falloc(natt);
    double *dqd = dalloc(nq), *dkd = dalloc(nkv), *dvd = dalloc(nkv), *dpd = dalloc(natt), *dad = dalloc(natt);
    fc_gqa_attention_backward(dq, dk, dv, dp, da, R, q, k, v, att, c.B, c.T, c.NH, c.NKV, c.hs);
    fc_gqa_attention_backward_f64(dqd, dkd, dvd, dpd, dad, c.R, c.q, c.k, c.v, c.att, c.B, c.T, c.NH,
                                  c.NKV, c.hs);
    expect_float_near("gqa dq", dq, dqd, nq, 1e-5, 1e-4);
    expect_float_near("gqa dk", dk, dkd, nkv, 1e-5, 1e-4);
    expect_float_near("gqa dv", dv, dvd, nkv, 1e-5, 1e-4);
    free(q); free(k); free(v); free(R); free(out); free(pre); free(att);
    free(dq); free(dk); free(dv); free(dp); free(da); free(dqd); free(dkd); free(dvd); free(dpd); free(dad);
    gqa_free(&c);
}

// ---- fixed summation order: no bit depends on the thread count -----------------

Test(layers_llama, thread_count_does_not_change_bits) {
    rng_seed(141);
    // sizes above FC_PAR_MIN (32768 elements or multiply-adds) so the loops do go parallel
    const int B = 2, T = 64, NH = 8, NKV = 2, hs = 16;
    const size_t nq = (size_t)B * T * NH * hs, nkv = (size_t)B * T * NKV * hs;
    const size_t natt = (size_t)B * NH * T * T;
    double *qd = drand_array(nq, -1.5, 1.5), *kd = drand_array(nkv, -1.5, 1.5);
    double *vd = drand_array(nkv, -1.5, 1.5), *Rd = drand_array(nq, -1, 1);
    double *wd = drand_array((size_t)NH * hs, 0.5, 1.5);
    float *q = to_float(qd, nq), *k = to_float(kd, nkv), *v = to_float(vd, nkv), *R = to_float(Rd, nq);
    float *w = to_float(wd, (size_t)NH * hs);
    const int N = B * T, C = NH * hs;  // RMSNorm over rows of q, C = 128
    float *res[2][14];
    const int threads[2] = {1, 3};
    const int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(threads[r]);
        float **x = res[r];
        x[0] = falloc(nq); x[1] = falloc(natt); x[2] = falloc(natt);  // out, preatt, att
        x[3] = falloc(nq); x[4] = falloc(nkv); x[5] = falloc(nkv);    // dq, dk, dv
        x[6] = falloc(nq); x[7] = falloc((size_t)N); x[8] = falloc(nq); x[9] = falloc((size_t)C);  // rmsnorm
        x[10] = falloc(nq); x[11] = falloc(nq);  // rope out, dinp
        x[12] = falloc(nq); x[13] = falloc(nq);  // swiglu dgate, dup
        float *dp = falloc(natt), *da = falloc(natt);
        fc_gqa_attention_forward(x[0], x[1], x[2], q, k, v, B, T, NH, NKV, hs);
        fc_gqa_attention_backward(x[3], x[4], x[5], dp, da, R, q, k, v, x[2], B, T, NH, NKV, hs);
        fc_rmsnorm_forward(x[6], x[7], q, w, N, C, 1e-5f);
        fc_rmsnorm_backward(x[8], x[9], R, q, w, x[7], N, C);
        fc_rope_forward(x[10], q, B, T, NH, hs, 10000.0);
        fc_rope_backward(x[11], R, B, T, NH, hs, 10000.0);
        fc_swiglu_backward(x[12], x[13], R, q, R, nq);
        free(dp); free(da);
    }
    omp_set_num_threads(saved);
    const size_t sizes[14] = {nq, natt, natt, nq, nkv, nkv, nq, (size_t)N, nq, (size_t)C, nq, nq, nq, nq};
    const char *names[14] = {"gqa out", "preatt", "att", "dq", "dk", "dv", "rmsnorm out", "rstd",
                             "rmsnorm dinp", "rmsnorm dweight", "rope out", "rope dinp",
                             "swiglu dgate", "swiglu dup"};
    for (int i = 0; i < 14; i++) {
        cr_expect(same_bits_f(res[0][i], res[1][i], sizes[i]), "%s: 1 and 3 threads differ", names[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(qd); free(kd); free(vd); free(Rd); free(wd); free(q); free(k); free(v); free(R); free(w);
}
