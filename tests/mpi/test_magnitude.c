// tests/mpi/test_magnitude.c — the magnitude pass (reference/magnitude.c) and
// the 16-bit judgement built on it (oracle/compare_model.c), on rank 0 (one process
// is all the pass runs as; the other ranks only take part in the verdict).
//
//  1. Exact: one sample through mlp-tiny, so the last layer's bias gradient
//     is a single term per element: its magnitude equals |gradient|, bit for bit.
//  2. Bound: every magnitude is at least |gradient| (|sum| <= sum |.|, up to
//     fp32 rounding of the two sums), and over gpt2-tiny the gradients cancel:
//     the magnitudes sum to more than twice the |gradients| (the pass is not
//     the gradient itself).
//  3. Judgement: under a bf16 policy with the magnitudes, a gradient element
//     moved by a third of n u mag passes, one moved by 3x the whole per-element
//     bound (docs/oracle.md, 16-bit: n u mag + 0.5 L s u max|A| + fp32's row) fails, and a tensor
//     scaled by (1 + 4u) fails as a whole; with both sides the reference
//     (activations in fp32: no per-layer roundings, no floor), an element
//     moved by twice that smaller bound fails where bf16 activations pass it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "init.h"
#include "mpitest.h"
#include "rerun.h"

typedef struct {
    fc_model m;
    float *params, *grads, *mag, *bufs[4];
    fc_trace_step a;
} stepped;

// One step of the reference (local) and of the magnitude pass from the init.
static int step_both(const fc_run_config *cfg, stepped *s) {
    memset(s, 0, sizeof *s);
    fc_model_build(&s->m, &cfg->model);
    size_t n = s->m.numel;
    s->params = mallocCheck(n * sizeof(float));
    s->mag = mallocCheck(n * sizeof(float));
    float *zero = callocCheck(n, sizeof(float));
    for (int i = 0; i < 4; i++) s->bufs[i] = callocCheck(n, sizeof(float));
    fc_init_full(&s->m, cfg->seed, s->params);
    const float *const state[2] = {zero, zero};
    fc_rerun r, mr;
    fc_error e;
    int rc = fc_rerun_open(&r, cfg, 1, NULL, &e) || fc_rerun_step(&r, 0, s->params, state, s->bufs, &s->a, &e) ||
             fc_magnitude_open(&mr, cfg, 1, NULL, &e) || fc_magnitude_step(&mr, 0, s->params, state, s->mag, &e);
    MT_CHECK(!rc, "%s: %s", cfg->model.name, e.msg);
    fc_rerun_close(&mr);
    fc_rerun_close(&r);
    free(zero);
    s->grads = s->bufs[0];
    s->a.grad_mag = s->mag;
    return rc ? -1 : 0;
}

static void free_stepped(stepped *s) {
    free(s->params);
    free(s->mag);
    for (int i = 0; i < 4; i++) free(s->bufs[i]);
    fc_model_free(&s->m);
}

static void exact_single_sample(void) {
    fc_run_config c = mt_config("mlp-tiny", FC_STRATEGY_LOCAL, 1, 1);
    c.global_batch = 1;
    stepped s;
    if (step_both(&c, &s)) return;
    const fc_param *bias = &s.m.params[s.m.n_params - 1];  // the last layer's bias: one term per element
    for (size_t i = bias->offset; i < bias->offset + bias->numel; i++)
        MT_CHECK(s.mag[i] == fabsf(s.grads[i]), "%s[%zu]: magnitude %.9g, |gradient| %.9g", bias->name,
                 i - bias->offset, (double)s.mag[i], (double)fabsf(s.grads[i]));
    free_stepped(&s);
}

static void bound_and_judgement(void) {
    fc_run_config c = mt_config("gpt2-tiny", FC_STRATEGY_LOCAL, 1, 1);
    stepped s;
    if (step_both(&c, &s)) return;
    size_t n = s.m.numel;
    double sum_mag = 0, sum_g = 0;
    for (size_t i = 0; i < n; i++) {
        double g = fabs((double)s.grads[i]), mg = s.mag[i];
        MT_CHECK(mg >= g * (1 - 1e-5), "element %zu: magnitude %.9g below |gradient| %.9g", i, mg, g);
        sum_mag += mg, sum_g += g;
    }
    MT_CHECK(sum_mag > 2 * sum_g, "magnitudes sum to %.6g, |gradients| to %.6g: no cancellation seen", sum_mag, sum_g);

    // the judgement: B = A's step, one element or the whole tensor moved
    fc_run_config b16 = c;
    b16.param_dtype = FC_PREC_BF16;  // both sides bf16 params, fp32 reduce, W = 1
    fc_cmp_policy pol;
    fc_cmp_policy_defaults(&pol, fc_cmp_precision(&b16, &b16));
    // both sides computing their activations in bf16 (PyTorch's mixed precision)
    fc_cmp_ctx ctx = {&s.m, &pol, &b16, 1, &c.optim, &b16, 1, 0, 0, 0, 0};
    int depth = c.model.n_layer, rounds = 2 * (1 + 4 * depth);  // docs/oracle.md: per side K + 4 per layer
    double u = 0x1p-8;
    const fc_param *w = &s.m.params[0];  // wte
    size_t i = w->offset + w->numel / 3;
    double scale = 0;
    for (size_t j = w->offset; j < w->offset + w->numel; j++) scale = fmax(scale, fabs((double)s.grads[j]));
    double mag_part = rounds * u * s.mag[i], bound = mag_part + 0.5 * depth * 2 * u * scale + 3.6e-5 * scale;
    // both sides the reference (activations in fp32): one rounding per side,
    // the gradient produced in bf16, and no activation floor
    double bound32 = 2 * u * s.mag[i] + 3.6e-5 * scale;
    float *bg = mallocCheck(n * sizeof(float));
    struct {
        double delta;
        int whole, act32, expect_pass;
        const char *what;
    } cases[] = {{mag_part / 3, 0, 0, 1, "a third of n u mag"},
                 {3 * bound, 0, 0, 0, "3x the per-element bound"},
                 {4 * u, 1, 0, 0, "the whole tensor scaled by 1 + 4u"},
                 {bound32 / 2, 0, 1, 1, "act32: half the per-element bound"},
                 {2 * bound32, 0, 1, 0, "act32: twice the per-element bound"},
                 {2 * bound32, 0, 0, 1, "act16: act32's twice its bound, within bf16 activations' bound"}};
    MT_CHECK(2 * bound32 < bound / 2, "the case needs bound32 %.3g well below bound %.3g", bound32, bound);
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        memcpy(bg, s.grads, n * sizeof(float));
        if (cases[k].whole)
            for (size_t j = w->offset; j < w->offset + w->numel; j++) bg[j] = (float)(bg[j] * (1 + cases[k].delta));
        else
            bg[i] = (float)(bg[i] + cases[k].delta);
        fc_trace_step b = s.a;
        b.grads = bg;
        b.grad_mag = NULL;  // B's side never brings magnitudes: A's are the expected ones
        ctx.a_act32 = ctx.b_act32 = cases[k].act32;
        fc_cmp_result r;
        fc_cmp_result_init(&r, 0);
        fc_compare_add(&ctx, &s.a, &b, FC_CMP_MASK(FC_CMP_GRAD), &r);
        MT_CHECK(r.magnitudes, "%s: the step was not judged by the magnitudes", cases[k].what);
        MT_CHECK(r.pass == cases[k].expect_pass, "%s: %s, expected %s", cases[k].what, r.pass ? "pass" : "FAIL",
                 cases[k].expect_pass ? "pass" : "FAIL");
        fc_cmp_result_free(&r);
    }
    free(bg);
    free_stepped(&s);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    if (mt_rank() == 0) {
        exact_single_sample();
        bound_and_judgement();
    }
    return mt_finalize();
}
