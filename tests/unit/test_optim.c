// tests/unit/test_optim.c — AdamW and SGD against torch.optim's formulas.
//
// Three kinds of check, none sharing code with core/optim.c:
//  - closed forms: with a constant gradient the AdamW moments and the update
//    have a closed form (m_t = g (1 - b1^t), v_t = g^2 (1 - b2^t), so the
//    bias-corrected step is lr g / (|g| + eps)), and so does SGD momentum;
//  - a straightforward double-precision transcription of torch.optim.AdamW /
//    torch.optim.SGD (single-tensor path) fed the same fp32 gradients over
//    many steps; the code under test is fp32, so the tolerance is ~1e-6 rel;
//  - exact bits where every intermediate is a dyadic rational (powers of two),
//    so the fp32 result is exact and known by construction.
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// |a - b| <= rtol |b| + atol
static int close(double a, double b, double rtol, double atol) {
    return fabs(a - b) <= rtol * fabs(b) + atol;
}

static fc_optim_config adamw(double lr, double wd, double b1, double b2, double eps) {
    fc_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_OPT_ADAMW;
    c.lr = lr;
    c.weight_decay = wd;
    c.beta1 = b1;
    c.beta2 = b2;
    c.eps = eps;
    return c;
}

static fc_optim_config sgd(double lr, double wd, double momentum, double dampening, int nesterov) {
    fc_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_OPT_SGD;
    c.lr = lr;
    c.weight_decay = wd;
    c.momentum = momentum;
    c.dampening = dampening;
    c.nesterov = nesterov;
    return c;
}

// A deterministic gradient sequence with sign changes and magnitudes over
// several decades (a tiny LCG; the values only need to be arbitrary).
static float grad_at(int step, int i) {
    uint32_t x = (uint32_t)step * 7919u + (uint32_t)i * 104729u + 12345u;
    x = x * 1664525u + 1013904223u;
    x ^= x >> 13;
    x = x * 1664525u + 1013904223u;
    double u = (double)(x >> 8) / 16777216.0;          // [0, 1)
    double mag = pow(10.0, -3.0 + 4.0 * u);              // 1e-3 .. 10
    double sgn = ((x >> 3) & 1) ? 1.0 : -1.0;
    return (float)(sgn * mag);
}

// ---------------------------------------------------------------------------
// double-precision transcriptions of torch.optim (single-tensor path)

static void ref_adamw(const fc_optim_config *c, long t, double *p, double g, double *m, double *v) {
    *p = *p * (1.0 - c->lr * c->weight_decay);
    *m = *m + (1.0 - c->beta1) * (g - *m);  // lerp
    *v = *v * c->beta2 + (1.0 - c->beta2) * g * g;
    double bc1 = 1.0 - pow(c->beta1, (double)t);
    double bc2 = 1.0 - pow(c->beta2, (double)t);
    double denom = sqrt(*v) / sqrt(bc2) + c->eps;
    *p = *p - c->lr / bc1 * (*m / denom);
}

static void ref_sgd(const fc_optim_config *c, long t, double *p, double g, double *buf) {
    if (c->weight_decay != 0) g = g + c->weight_decay * *p;
    if (c->momentum != 0) {
        *buf = t == 1 ? g : *buf * c->momentum + (1.0 - c->dampening) * g;
        g = c->nesterov ? g + c->momentum * *buf : *buf;
    }
    *p = *p - c->lr * g;
}

// ---------------------------------------------------------------------------
// AdamW

// Constant gradient: closed forms for m, v and p after every step.
static void adamw_constant_grad(const fc_optim_config *c, int steps) {
    enum { N = 8 };
    const float g[N] = {1.0f, -1.0f, 0.5f, -3.0f, 1e-3f, -2e-4f, 7.25f, 1e-6f};
    const float p0[N] = {1.0f, -2.0f, 0.25f, 3.0f, -0.5f, 1.5f, 0.0f, 1.0f};
    float p[N], m[N], v[N];
    memcpy(p, p0, sizeof p);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    double want_p[N];
    for (int i = 0; i < N; i++) want_p[i] = p0[i];
    const double d = 1.0 - c->lr * c->weight_decay;
    for (int t = 1; t <= steps; t++) {
        fc_optim_update(c, t, p, g, m, v, N);
        double b1t = pow(c->beta1, t), b2t = pow(c->beta2, t);
        for (int i = 0; i < N; i++) {
            double gi = g[i];
            double want_m = gi * (1.0 - b1t);
            double want_v = gi * gi * (1.0 - b2t);
            // p_t = p_{t-1} (1 - lr wd) - lr/(1-b1^t) m_t / (sqrt(v_t)/sqrt(1-b2^t) + eps)
            //     = p_{t-1} (1 - lr wd) - lr g / (|g| + eps)
            want_p[i] = want_p[i] * d - c->lr * gi / (fabs(gi) + c->eps);
            cr_expect(close(m[i], want_m, 2e-6, 0), "step %d elem %d: exp_avg %.9g, want %.9g", t, i,
                      (double)m[i], want_m);
            cr_expect(close(v[i], want_v, 2e-6, 0), "step %d elem %d: exp_avg_sq %.9g, want %.9g", t,
                      i, (double)v[i], want_v);
            cr_expect(close(p[i], want_p[i], 1e-6, 1e-7 * c->lr),
                      "step %d elem %d: param %.9g, want %.9g (diff %.3g)", t, i, (double)p[i],
                      want_p[i], (double)p[i] - want_p[i]);
        }
    }
}

Test(adamw, constant_grad_closed_form_default_betas) {
    fc_optim_config c = adamw(1e-2, 0.1, 0.9, 0.999, 1e-8);
    adamw_constant_grad(&c, 10);
}

Test(adamw, constant_grad_closed_form_large_eps_and_decay) {
    // eps comparable to some |g| (1e-3, 2e-4, 1e-6), a strong decay, beta1 < 0.5
    // so the lerp weight 1-beta1 >= 0.5 takes torch's second lerp branch.
    fc_optim_config c = adamw(5e-2, 0.5, 0.3, 0.95, 1e-3);
    adamw_constant_grad(&c, 8);
}

Test(adamw, constant_grad_no_weight_decay) {
    fc_optim_config c = adamw(1e-3, 0.0, 0.8, 0.99, 1e-8);
    adamw_constant_grad(&c, 6);
}

// The first step's size is lr (bias correction makes m/sqrt(v) = sign(g)),
// whatever the betas: this fails if either bias correction is missing.
Test(adamw, first_step_is_lr_times_sign) {
    fc_optim_config c = adamw(1e-2, 0.0, 0.9, 0.999, 0.0);
    float p[3] = {1.0f, 1.0f, 1.0f}, g[3] = {0.1f, -5.0f, 1e-4f}, m[3] = {0}, v[3] = {0};
    fc_optim_update(&c, 1, p, g, m, v, 3);
    cr_expect(close(p[0], 0.99, 1e-6, 0), "p %.9g", (double)p[0]);
    cr_expect(close(p[1], 1.01, 1e-6, 0), "p %.9g", (double)p[1]);
    cr_expect(close(p[2], 0.99, 1e-6, 0), "p %.9g", (double)p[2]);
}

// Varying gradients against the double transcription of torch's formulas,
// two ways:
//  - conditioned: each step, the reference starts from the fp32 state the code
//    under test holds, so one step's error is bounded tightly (a few fp32
//    roundings of each term: ~3e-7 of |p|, 1e-6 of the update);
//  - free running: the double reference runs on its own; errors accumulate, so
//    the bound is 1e-6 of the sum of the magnitudes that entered p.
static void adamw_vs_reference(const fc_optim_config *c, int steps) {
    enum { N = 64 };
    float p[N], m[N], v[N];
    double rp[N], rm[N], rv[N], scale[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)(0.5 * sin(1.0 + i));
        rp[i] = p[i];
        scale[i] = fabs(rp[i]);
        m[i] = v[i] = 0.0f;
        rm[i] = rv[i] = 0.0;
    }
    for (int t = 1; t <= steps; t++) {
        float g[N];
        for (int i = 0; i < N; i++) g[i] = grad_at(t, i);
        float p_prev[N], m_prev[N], v_prev[N];
        memcpy(p_prev, p, sizeof p);
        memcpy(m_prev, m, sizeof m);
        memcpy(v_prev, v, sizeof v);
        fc_optim_update(c, t, p, g, m, v, N);
        for (int i = 0; i < N; i++) {
            // conditioned on the fp32 state
            double cp = p_prev[i], cm = m_prev[i], cv = v_prev[i];
            ref_adamw(c, t, &cp, g[i], &cm, &cv);
            double upd = fabs(cp - p_prev[i] * (1.0 - c->lr * c->weight_decay));
            cr_expect(close(p[i], cp, 0, 3e-7 * (fabs(p_prev[i]) + fabs(cp)) + 1e-6 * upd),
                      "step %d elem %d: param %.9g, one reference step %.9g (diff %.3g)", t, i,
                      (double)p[i], cp, (double)p[i] - cp);
            cr_expect(close(m[i], cm, 0, 3e-7 * (fabs(m_prev[i]) + fabs(g[i]))),
                      "step %d elem %d: exp_avg %.9g, one reference step %.9g", t, i, (double)m[i], cm);
            cr_expect(close(v[i], cv, 1e-6, 0), "step %d elem %d: exp_avg_sq %.9g, one reference step %.9g",
                      t, i, (double)v[i], cv);
            // free running
            double before = rp[i];
            ref_adamw(c, t, &rp[i], g[i], &rm[i], &rv[i]);
            scale[i] += fabs(before) + fabs(rp[i] - before);
            cr_expect(close(p[i], rp[i], 0, 1e-6 * scale[i]),
                      "step %d elem %d: param %.9g, reference %.9g (diff %.3g, scale %.3g)", t, i,
                      (double)p[i], rp[i], (double)p[i] - rp[i], scale[i]);
            cr_expect(close(v[i], rv[i], 1e-6 * t, 0), "step %d elem %d: exp_avg_sq %.9g, reference %.9g",
                      t, i, (double)v[i], rv[i]);
        }
    }
}

Test(adamw, varying_grad_matches_torch_formula_defaults) {
    fc_optim_config c = adamw(1e-3, 0.01, 0.9, 0.999, 1e-8);
    adamw_vs_reference(&c, 12);
}

Test(adamw, varying_grad_matches_torch_formula_aggressive) {
    fc_optim_config c = adamw(3e-2, 0.2, 0.6, 0.9, 1e-4);
    adamw_vs_reference(&c, 15);
}

Test(adamw, varying_grad_matches_torch_formula_low_beta1) {
    fc_optim_config c = adamw(1e-2, 0.05, 0.25, 0.98, 1e-8);
    adamw_vs_reference(&c, 8);
}

// The step number drives the bias correction: continuing a run at step 6
// differs from restarting the count at 1 with the same state (the
// adam_step_reset fault), and step 6 matches the reference.
Test(adamw, step_count_matters) {
    fc_optim_config c = adamw(1e-2, 0.0, 0.9, 0.999, 1e-8);
    float p1 = 1.0f, m1 = 0.05f, v1 = 2e-4f, g = 0.3f;
    float p2 = p1, m2 = m1, v2 = v1;
    fc_optim_update(&c, 6, &p1, &g, &m1, &v1, 1);
    fc_optim_update(&c, 1, &p2, &g, &m2, &v2, 1);
    double rp = 1.0, rm = 0.05f, rv = 2e-4f;
    ref_adamw(&c, 6, &rp, g, &rm, &rv);
    cr_expect(close(p1, rp, 1e-6, 0), "step 6: %.9g, reference %.9g", (double)p1, rp);
    cr_expect(fabs((double)p1 - (double)p2) > 1e-4, "step 6 and step 1 must differ: %.9g %.9g",
              (double)p1, (double)p2);
}

// Decoupled weight decay with a zero gradient: the moments stay 0, the update
// is 0 (0 / eps) and p is multiplied by fp32(1 - lr wd) each step, exactly.
Test(adamw, zero_grad_is_pure_decay_exact) {
    fc_optim_config c = adamw(0.1, 0.3, 0.9, 0.999, 1e-8);
    float p[2] = {1.0f, -3.5f}, g[2] = {0.0f, 0.0f}, m[2] = {0}, v[2] = {0};
    float want[2] = {1.0f, -3.5f};
    const float decay = (float)(1.0 - 0.1 * 0.3);
    for (int t = 1; t <= 6; t++) {
        fc_optim_update(&c, t, p, g, m, v, 2);
        for (int i = 0; i < 2; i++) {
            want[i] = want[i] * decay;
            cr_expect_eq(bits(p[i]), bits(want[i]), "step %d: %.9g, want %.9g", t, (double)p[i],
                         (double)want[i]);
            cr_expect_eq(m[i], 0.0f);
            cr_expect_eq(v[i], 0.0f);
        }
    }
}

// One step where everything is exact in binary: beta1 0.5, beta2 0.75, g 2:
// m = lerp(0, 2, 0.5) = 1, v = 0.25 * 4 = 1, sqrt(1 - 0.75) = 0.5,
// denom = 1 / 0.5 + 0 = 2, step = -lr / 0.5 = -0.5 (lr 0.25), decay 1 - 0.125.
// p = 1 * 0.875 - 0.5 * 1 / 2 = 0.625.
Test(adamw, exact_bits_one_step) {
    fc_optim_config c = adamw(0.25, 0.5, 0.5, 0.75, 0.0);
    float p = 1.0f, g = 2.0f, m = 0.0f, v = 0.0f;
    fc_optim_update(&c, 1, &p, &g, &m, &v, 1);
    cr_expect_eq(bits(m), bits(1.0f), "exp_avg %.9g", (double)m);
    cr_expect_eq(bits(v), bits(1.0f), "exp_avg_sq %.9g", (double)v);
    cr_expect_eq(bits(p), bits(0.625f), "param %.9g", (double)p);
}

// exp_avg is m.lerp_(g, 1 - beta1), and torch's CPU lerp kernel has two
// branches: self + w (end - self) for |w| < 0.5, end - (end - self)(1 - w)
// otherwise. They differ in the last bit for many inputs, and bitwise
// agreement with torch needs the right one. Expected bits are computed here in
// fp32 from torch's formula; the test also makes sure the inputs include cases
// where the single-branch formula would round differently.
static float torch_lerp(float self, float end, float w) {
    volatile float d = end - self;
    if (w < 0.5f) {
        volatile float t = w * d;
        return self + t;
    }
    volatile float omw = 1.0f - w;
    volatile float t = d * omw;
    return end - t;
}

Test(adamw, exp_avg_is_torch_lerp_bits) {
    const double beta1s[3] = {0.9, 0.3, 0.5};
    for (int k = 0; k < 3; k++) {
        fc_optim_config c = adamw(1e-3, 0.0, beta1s[k], 0.999, 1e-8);
        const float w = (float)(1.0 - beta1s[k]);
        int naive_differs = 0;
        for (int i = 0; i < 2000; i++) {
            float m = grad_at(7, i), g = grad_at(8, i), p = 1.0f, v = 1.0f;
            float want = torch_lerp(m, g, w);
            volatile float naive_t = w * (g - m);
            float naive = m + naive_t;
            naive_differs += bits(naive) != bits(want);
            fc_optim_update(&c, 2, &p, &g, &m, &v, 1);
            cr_expect_eq(bits(m), bits(want), "beta1 %g case %d: exp_avg %.9g, torch lerp %.9g",
                         beta1s[k], i, (double)m, (double)want);
        }
        if (w >= 0.5f) cr_expect(naive_differs > 0, "beta1 %g: no case separates the lerp branches", beta1s[k]);
    }
}

// The coefficients are torch's: computed in double, rounded once to fp32.
Test(adamw, coefficients_rounded_from_double) {
    fc_optim_config c = adamw(3e-4, 0.1, 0.9, 0.999, 1e-8);
    for (long t = 1; t <= 7; t++) {
        fc_adamw_coeffs k = fc_adamw_coeffs_at(&c, t);
        cr_expect_eq(bits(k.decay), bits((float)(1.0 - 3e-4 * 0.1)));
        cr_expect_eq(bits(k.w1), bits((float)(1.0 - 0.9)));
        cr_expect_eq(bits(k.beta2), bits((float)0.999));
        cr_expect_eq(bits(k.w2), bits((float)(1.0 - 0.999)));
        cr_expect_eq(bits(k.bc2_sqrt), bits((float)sqrt(1.0 - pow(0.999, (double)t))), "t %ld", t);
        cr_expect_eq(bits(k.eps), bits((float)1e-8));
        cr_expect_eq(bits(k.neg_step), bits((float)(-3e-4 / (1.0 - pow(0.9, (double)t)))), "t %ld", t);
    }
}

// ---------------------------------------------------------------------------
// SGD

Test(sgd, exact_plain_step_no_state) {
    fc_optim_config c = sgd(0.5, 0.0, 0.0, 0.0, 0);
    const char *names[2] = {NULL, NULL};
    cr_expect_eq(fc_optim_state_names(&c, names), 0, "SGD without momentum keeps no state");
    float p = 1.0f, g = 2.0f;
    // No momentum buffer exists: the local trainer passes NULL state.
    fc_optim_update(&c, 1, &p, &g, NULL, NULL, 1);
    cr_expect_eq(bits(p), bits(0.0f), "1 - 0.5 * 2 = 0 exactly, got %.9g", (double)p);
}

Test(sgd, no_momentum_many_elements_null_state) {
    fc_optim_config c = sgd(0.25, 0.0, 0.0, 0.0, 0);
    float p[5] = {1, 2, 3, 4, 5}, g[5] = {4, 4, 4, 4, -4};
    for (int t = 1; t <= 5; t++) fc_optim_update(&c, t, p, g, NULL, NULL, 5);
    const float want[5] = {-4, -3, -2, -1, 10};
    for (int i = 0; i < 5; i++) cr_expect_eq(bits(p[i]), bits(want[i]), "elem %d: %g", i, (double)p[i]);
}

// Step 1 initialises the buffer to g itself, not (1 - dampening) g; later
// steps use momentum * b + (1 - dampening) g. All values are dyadic: exact.
Test(sgd, exact_first_step_buffer_and_dampening) {
    fc_optim_config c = sgd(0.25, 0.0, 0.5, 0.5, 0);
    const float g[3] = {1.0f, 2.0f, 4.0f};
    const float want_b[3] = {1.0f, 1.5f, 2.75f};
    const float want_p[3] = {3.75f, 3.375f, 2.6875f};
    float p = 4.0f, b = 123.0f;  // the buffer's old content must be ignored at step 1
    for (int t = 1; t <= 3; t++) {
        fc_optim_update(&c, t, &p, &g[t - 1], &b, NULL, 1);
        cr_expect_eq(bits(b), bits(want_b[t - 1]), "step %d: buffer %.9g, want %.9g", t, (double)b,
                     (double)want_b[t - 1]);
        cr_expect_eq(bits(p), bits(want_p[t - 1]), "step %d: param %.9g, want %.9g", t, (double)p,
                     (double)want_p[t - 1]);
    }
}

// Nesterov: the step uses g + momentum * b.
Test(sgd, exact_nesterov) {
    fc_optim_config c = sgd(0.25, 0.0, 0.5, 0.0, 1);
    float p = 1.0f, b = 0.0f, g = 1.0f;
    fc_optim_update(&c, 1, &p, &g, &b, NULL, 1);  // b = 1, step g = 1.5
    cr_expect_eq(bits(b), bits(1.0f));
    cr_expect_eq(bits(p), bits(0.625f), "%.9g", (double)p);
    fc_optim_update(&c, 2, &p, &g, &b, NULL, 1);  // b = 1.5, step g = 1.75
    cr_expect_eq(bits(b), bits(1.5f));
    cr_expect_eq(bits(p), bits(0.1875f), "%.9g", (double)p);
    fc_optim_update(&c, 3, &p, &g, &b, NULL, 1);  // b = 1.75, step g = 1.875
    cr_expect_eq(bits(b), bits(1.75f));
    cr_expect_eq(bits(p), bits(-0.28125f), "%.9g", (double)p);
}

// Weight decay is added to the gradient (coupled, L2), before momentum.
Test(sgd, exact_weight_decay) {
    fc_optim_config c = sgd(0.5, 0.5, 0.0, 0.0, 0);
    float p = 2.0f, g = 1.0f;
    fc_optim_update(&c, 1, &p, &g, NULL, NULL, 1);  // g' = 1 + 1 = 2, p = 1
    cr_expect_eq(bits(p), bits(1.0f), "%.9g", (double)p);
    fc_optim_update(&c, 2, &p, &g, NULL, NULL, 1);  // g' = 1.5, p = 0.25
    cr_expect_eq(bits(p), bits(0.25f), "%.9g", (double)p);
    // with momentum: the buffer holds the decayed gradient
    fc_optim_config cm = sgd(0.5, 0.5, 0.5, 0.0, 0);
    float q = 2.0f, b = 0.0f;
    fc_optim_update(&cm, 1, &q, &g, &b, NULL, 1);  // g' = 2, b = 2, q = 1
    cr_expect_eq(bits(b), bits(2.0f));
    cr_expect_eq(bits(q), bits(1.0f));
    fc_optim_update(&cm, 2, &q, &g, &b, NULL, 1);  // g' = 1.5, b = 1 + 1.5 = 2.5, q = -0.25
    cr_expect_eq(bits(b), bits(2.5f));
    cr_expect_eq(bits(q), bits(-0.25f), "%.9g", (double)q);
}

// Constant gradient, heavy-ball momentum: b_t = g (1 - mu^t) / (1 - mu),
// p_t = p_0 - lr g sum_{s=1..t} (1 - mu^s) / (1 - mu).
Test(sgd, constant_grad_closed_form_momentum) {
    const double mu = 0.9, lr = 0.01;
    fc_optim_config c = sgd(lr, 0.0, mu, 0.0, 0);
    enum { N = 4 };
    float p[N] = {1.0f, -1.0f, 0.3f, 10.0f}, b[N] = {0}, g[N] = {0.7f, -2.0f, 1e-3f, 5.0f};
    const float p0[N] = {1.0f, -1.0f, 0.3f, 10.0f};
    double acc = 0;
    for (int t = 1; t <= 10; t++) {
        fc_optim_update(&c, t, p, g, b, NULL, N);
        double f = (1.0 - pow(mu, t)) / (1.0 - mu);
        acc += f;
        for (int i = 0; i < N; i++) {
            double want_b = g[i] * f, want_p = p0[i] - lr * g[i] * acc;
            cr_expect(close(b[i], want_b, 2e-6, 0), "step %d elem %d: buffer %.9g want %.9g", t, i,
                      (double)b[i], want_b);
            cr_expect(close(p[i], want_p, 1e-6, 1e-8), "step %d elem %d: param %.9g want %.9g", t, i,
                      (double)p[i], want_p);
        }
    }
}

static void sgd_vs_reference(const fc_optim_config *c, int steps) {
    enum { N = 64 };
    float p[N], b[N];
    double rp[N], rb[N], scale[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)(0.5 * cos(2.0 + i));
        rp[i] = p[i];
        scale[i] = fabs(rp[i]);
        b[i] = -99.0f;  // garbage: step 1 must not read it
        rb[i] = 0;
    }
    for (int t = 1; t <= steps; t++) {
        float g[N];
        for (int i = 0; i < N; i++) g[i] = grad_at(t + 100, i);
        float p_prev[N], b_prev[N];
        memcpy(p_prev, p, sizeof p);
        memcpy(b_prev, b, sizeof b);
        fc_optim_update(c, t, p, g, b, NULL, N);
        for (int i = 0; i < N; i++) {
            // conditioned on the fp32 state
            double cp = p_prev[i], cb = b_prev[i];
            ref_sgd(c, t, &cp, g[i], &cb);
            double gmag = fabs(g[i]) + c->weight_decay * fabs(p_prev[i]);
            double bmag = c->momentum != 0 ? fabs(cb) + c->momentum * fabs(b_prev[i]) + gmag : 0;
            double upd = c->lr * (gmag + (1 + c->momentum) * bmag);
            cr_expect(close(p[i], cp, 0, 3e-7 * (fabs(p_prev[i]) + fabs(cp)) + 1e-6 * upd),
                      "step %d elem %d: param %.9g, one reference step %.9g (diff %.3g)", t, i,
                      (double)p[i], cp, (double)p[i] - cp);
            if (c->momentum != 0)
                cr_expect(close(b[i], cb, 0, 5e-7 * bmag),
                          "step %d elem %d: momentum_buffer %.9g, one reference step %.9g", t, i,
                          (double)b[i], cb);
            // free running
            double before = rp[i];
            ref_sgd(c, t, &rp[i], g[i], &rb[i]);
            scale[i] += fabs(before) + fabs(rp[i] - before);
            cr_expect(close(p[i], rp[i], 0, 1e-6 * scale[i]),
                      "step %d elem %d: param %.9g, reference %.9g (diff %.3g)", t, i, (double)p[i],
                      rp[i], (double)p[i] - rp[i]);
        }
    }
}

Test(sgd, varying_grad_momentum_dampening_wd) {
    fc_optim_config c = sgd(1e-2, 1e-2, 0.9, 0.1, 0);
    sgd_vs_reference(&c, 10);
}

Test(sgd, varying_grad_nesterov_wd) {
    fc_optim_config c = sgd(5e-3, 0.05, 0.8, 0.0, 1);
    sgd_vs_reference(&c, 10);
}

Test(sgd, varying_grad_plain_momentum) {
    fc_optim_config c = sgd(0.1, 0.0, 0.5, 0.0, 0);
    sgd_vs_reference(&c, 7);
}

Test(sgd, varying_grad_no_momentum_wd) {
    fc_optim_config c = sgd(0.02, 0.1, 0.0, 0.0, 0);
    sgd_vs_reference(&c, 6);
}

// ---------------------------------------------------------------------------
// state names (torch state_dict keys)

Test(optim, state_names) {
    const char *names[2] = {NULL, NULL};
    fc_optim_config a = adamw(1e-3, 0.01, 0.9, 0.999, 1e-8);
    cr_assert_eq(fc_optim_state_names(&a, names), 2);
    cr_expect_str_eq(names[0], "exp_avg");
    cr_expect_str_eq(names[1], "exp_avg_sq");

    const char *sn[2] = {NULL, NULL};
    fc_optim_config s = sgd(1e-2, 0.0, 0.9, 0.0, 0);
    cr_assert_eq(fc_optim_state_names(&s, sn), 1);
    cr_expect_str_eq(sn[0], "momentum_buffer");

    const char *zn[2] = {NULL, NULL};
    fc_optim_config z = sgd(1e-2, 0.1, 0.0, 0.0, 0);
    cr_expect_eq(fc_optim_state_names(&z, zn), 0);
    cr_expect_null(zn[0]);
}

// The update is elementwise: updating n elements at once equals updating
// each on its own (no cross-element state, no off-by-one in the loop).
Test(optim, elementwise_and_bounded) {
    fc_optim_config cfgs[2] = {adamw(1e-2, 0.1, 0.9, 0.999, 1e-8), sgd(1e-2, 0.1, 0.9, 0.0, 1)};
    for (int k = 0; k < 2; k++) {
        enum { N = 37 };
        float p[N + 1], m[N + 1], v[N + 1], g[N + 1];
        float q[N], mq[N], vq[N];
        for (int i = 0; i <= N; i++) {
            p[i] = (float)i * 0.1f;
            m[i] = v[i] = 0;
            g[i] = grad_at(3, i);
        }
        p[N] = 42.0f, m[N] = 43.0f, v[N] = 44.0f;  // sentinel past the end
        memcpy(q, p, sizeof q);
        memset(mq, 0, sizeof mq);
        memset(vq, 0, sizeof vq);
        for (int t = 1; t <= 5; t++) {
            fc_optim_update(&cfgs[k], t, p, g, m, v, N);
            for (int i = 0; i < N; i++) fc_optim_update(&cfgs[k], t, &q[i], &g[i], &mq[i], &vq[i], 1);
        }
        for (int i = 0; i < N; i++) {
            cr_expect_eq(bits(p[i]), bits(q[i]), "cfg %d elem %d", k, i);
            cr_expect_eq(bits(m[i]), bits(mq[i]), "cfg %d elem %d", k, i);
        }
        cr_expect_eq(p[N], 42.0f);
        cr_expect_eq(m[N], 43.0f);
        cr_expect_eq(v[N], 44.0f);
    }
}

// Many elements at once, so the vector loop (core/simd.h) runs where the CPU has one: every
// element's bits are those of torch's formula written here in fp32, one rounding per
// operation (volatile keeps the compiler from fusing or reordering), for both lerp branches,
// with a length that leaves a tail for the scalar loop.
static void adamw_many_matches_formula(void) {
    enum { N = 70001 };
    static float p[N], g[N], m[N], v[N], p0[N], m0[N], v0[N];
    const double beta1s[2] = {0.9, 0.3};
    for (int k = 0; k < 2; k++) {
        fc_optim_config c = adamw(1e-3, 0.01, beta1s[k], 0.999, 1e-8);
        for (int i = 0; i < N; i++) {
            g[i] = grad_at(3, i), m0[i] = m[i] = grad_at(4, i) * 0.1f, p0[i] = p[i] = grad_at(5, i);
            v0[i] = v[i] = grad_at(6, i) * grad_at(6, i);
        }
        fc_optim_update(&c, 3, p, g, m, v, N);
        fc_adamw_coeffs kc = fc_adamw_coeffs_at(&c, 3);
        int bad = 0;
        for (int i = 0; i < N && bad < 5; i++) {
            volatile float pv = p0[i] * kc.decay, mv = torch_lerp(m0[i], g[i], kc.w1);
            volatile float wg = kc.w2 * g[i], wgg = wg * g[i], vb = v0[i] * kc.beta2, vv = vb + wgg;
            volatile float sq = sqrtf(vv), q = sq / kc.bc2_sqrt, denom = q + kc.eps;
            volatile float num = kc.neg_step * mv, upd = num / denom, want = pv + upd;
            if (bits(p[i]) != bits(want) || bits(m[i]) != bits(mv) || bits(v[i]) != bits(vv)) {
                bad++;
                cr_expect_fail("beta1 %g element %d: p %a m %a v %a, formula %a %a %a", beta1s[k], i, (double)p[i],
                               (double)m[i], (double)v[i], (double)want, (double)mv, (double)vv);
            }
        }
    }
}

Test(adamw, many_elements_bits_widest_kernel) { adamw_many_matches_formula(); }

Test(adamw, many_elements_bits_generic) {
    setenv("FSDPCHECK_MM_GENERIC", "1", 1);  // a fresh process: the first call reads it
    adamw_many_matches_formula();
}
