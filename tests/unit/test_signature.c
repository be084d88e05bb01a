// tests/unit/test_signature.c — the failure signatures (oracle/signature.h) on
// steps built in memory: B made from A by one known wrong answer (c x A, a
// divide factor applied twice, a stale gradient, a step not taken or taken
// twice, another AdamW step count, state from zero, the clip skipped), each
// must be named by its shape; a
// wrong answer of no known shape must be named by none. The shapes built from
// the per-rank pieces need the reference's re-run (MPI): tests/mpi/signature.sh
// covers them through the fault catalogue. Single process, no MPI, no files.
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "compare.h"
#include "config.h"
#include "model.h"
#include "optim.h"
#include "signature.h"

static fc_model g_m;
static fc_run_config g_cfg;
static size_t N;
// a: A's step; b: B's; start: the optimizer state both started from; prev: B's gradients of the step before
static float *prev_params, *start[2], *prev_grads;
static float *ag, *ap, *as[2], *bg, *bp, *bs[2];
static fc_trace_step A, B;

static float *buf(void) {
    float *p = calloc(N, sizeof(float));
    cr_assert(p);
    return p;
}

static void setup(void) {
    fc_error e;
    fc_run_config_defaults(&g_cfg);
    cr_assert_eq(fc_model_config_load("mlp-tiny", &g_cfg.model, &e), 0, "%s", e.msg);
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    fc_model_build(&g_m, &g_cfg.model);
    N = g_m.numel;
    prev_params = buf(), start[0] = buf(), start[1] = buf(), prev_grads = buf();
    ag = buf(), ap = buf(), as[0] = buf(), as[1] = buf(), bg = buf(), bp = buf(), bs[0] = buf(), bs[1] = buf();
    for (size_t i = 0; i < N; i++) {
        prev_params[i] = 0.1f * (float)((int)(i % 13) - 6) + 0.01f;
        start[0][i] = 1e-3f * (float)((int)(i % 9) - 4);
        start[1][i] = 1e-6f * (float)(1 + i % 5);
        ag[i] = 1e-2f * sinf(0.37f * (float)i + 0.1f);
        prev_grads[i] = 1e-2f * cosf(0.21f * (float)i);
    }
}

static void teardown(void) {
    float *all[] = {prev_params, start[0], start[1], prev_grads, ag, ap, as[0], as[1], bg, bp, bs[0], bs[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    fc_model_free(&g_m);
}

TestSuite(signature, .init = setup, .fini = teardown);

// One side's step from gradient g: clipped as the config says (by `norm` when >= 0), `updates`
// AdamW updates from step count t, from `st0` (start, or zeros).
static void take_step(const float *g, float *p, float *st[2], int updates, long t, int zero_state, int clip) {
    float *c = buf();
    memcpy(c, g, N * sizeof(float));
    double norm = fc_grad_norm(g, N, g_cfg.norm_type);
    float coef = fc_clip_coef(g_cfg.clip_grad_norm, norm);
    if (clip && g_cfg.clip_grad_norm > 0 && fc_clip_applies(g_cfg.clip_grad_norm, coef))
        for (size_t i = 0; i < N; i++) c[i] *= coef;
    memcpy(p, prev_params, N * sizeof(float));
    for (int k = 0; k < 2; k++) {
        if (zero_state) memset(st[k], 0, N * sizeof(float));
        else memcpy(st[k], start[k], N * sizeof(float));
    }
    for (int u = 0; u < updates; u++) fc_optim_update(&g_cfg.optim, t + u, p, c, st[0], st[1], N);
    free(c);
}

static void make_steps(void) {
    const char *names[2] = {NULL, NULL};
    int n_state = fc_optim_state_names(&g_cfg.optim, names);
    fc_trace_step *s[2] = {&A, &B};
    float *g[2] = {ag, bg}, *p[2] = {ap, bp}, **st[2] = {as, bs};
    for (int k = 0; k < 2; k++) {
        memset(s[k], 0, sizeof *s[k]);
        s[k]->step = 3;
        s[k]->loss = 2.5f;
        s[k]->has_norm = 1;
        s[k]->grad_norm = fc_grad_norm(g[k], N, g_cfg.norm_type);
        s[k]->grads = g[k];
        s[k]->params = p[k];
        s[k]->prev_params = prev_params;
        s[k]->n_state = n_state;
        for (int i = 0; i < n_state; i++) s[k]->state_names[i] = names[i], s[k]->state[i] = st[k][i];
    }
}

// A's step taken right; B's gradient is B's own (bg), stepped as the arguments say.
static void steps(int updates, long t, int zero_state, int clip) {
    take_step(ag, ap, as, 1, 4, 0, 1);
    take_step(bg, bp, bs, updates, t, zero_state, clip);
    make_steps();
}

// The signature of B against A, at world size W, without the per-rank pieces.
static void find(int W, const float *b_prev, fc_signature *sig) {
    fc_cmp_policy pol;
    fc_cmp_policy_defaults(&pol, FC_PREC_FP32);
    fc_cmp_ctx ctx = {&g_m, &pol, &g_cfg, W, &g_cfg.optim, NULL, 0, 1, 1, 0, 0};
    fc_cmp_result r;
    fc_cmp_result_init(&r, A.step);
    fc_compare_add(&ctx, &A, &B, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &r);
    cr_assert(!r.pass, "B must fail against A for a signature to mean anything");
    fc_sig_input in = {&g_m, &g_cfg, W, &ctx, &r, &A, &B, {start[0], start[1]}, b_prev, NULL, 0};
    fc_signature_find(&in, sig);
    fc_cmp_result_free(&r);
}

static void expect(int W, const float *b_prev, const char *want) {
    fc_signature sig;
    find(W, b_prev, &sig);
    cr_expect(strstr(sig.text, want) == sig.text, "signature: %s\nwanted it to start with: %s", sig.text, want);
}

Test(signature, gradients_w_times_too_large_are_named_w_x_a) {
    for (size_t i = 0; i < N; i++) bg[i] = 4 * ag[i];
    steps(1, 4, 0, 1);
    expect(4, NULL, "B = W x A (W = 4)");
}

Test(signature, the_gradient_divide_factor_applied_twice_is_named_a_over_d) {
    g_cfg.gradient_divide_factor = 4;  // at W = 2: W x A and A / W are other constants
    for (size_t i = 0; i < N; i++) bg[i] = 0.25f * ag[i];
    steps(1, 4, 0, 1);
    expect(2, NULL, "B = A / D (D = 4, the gradient divide factor): divided by it twice");
}

Test(signature, one_tensor_scaled_names_the_tensor) {
    memcpy(bg, ag, N * sizeof(float));
    const fc_param *p = &g_m.params[0];
    for (size_t i = 0; i < p->numel; i++) bg[p->offset + i] = 0.25f * ag[p->offset + i];
    steps(1, 4, 0, 1);
    char want[300];
    snprintf(want, sizeof want, "B = A / W (W = 4): divided by the world size twice (in grad.%s: 1 of %d", p->name,
             g_m.n_params);
    expect(4, NULL, want);
}

Test(signature, the_previous_steps_gradient_is_named_stale) {
    memcpy(bg, prev_grads, N * sizeof(float));
    steps(1, 4, 0, 1);
    expect(2, prev_grads, "B = the previous step's gradient (stale)");
}

Test(signature, a_step_not_taken_and_a_step_taken_twice) {
    memcpy(bg, ag, N * sizeof(float));
    steps(0, 4, 0, 1);
    expect(2, NULL, "B's parameters were not stepped");
    steps(2, 4, 0, 1);
    expect(2, NULL, "B's parameters were stepped twice");
}

Test(signature, another_adamw_step_count_is_named_with_both_counts) {
    memcpy(bg, ag, N * sizeof(float));
    steps(1, 1, 0, 1);
    expect(2, NULL, "B's optimizer used step count 1, not 4");
    steps(1, 5, 0, 1);
    expect(2, NULL, "B's optimizer used step count 5, not 4");
}

Test(signature, optimizer_state_from_zero) {
    memcpy(bg, ag, N * sizeof(float));
    steps(1, 4, 1, 1);
    expect(2, NULL, "B's optimizer state restarted from zero");
}

Test(signature, a_skipped_clip_is_named_unclipped) {
    g_cfg.optim.kind = FC_OPT_SGD;  // AdamW's first moments hide a constant factor; SGD's step carries it
    g_cfg.optim.lr = 0.05;
    g_cfg.clip_grad_norm = 0.01f;
    memcpy(bg, ag, N * sizeof(float));
    steps(1, 4, 0, 0);
    expect(2, NULL, "B stepped with the unclipped gradient");
}

Test(signature, a_wrong_total_norm_with_the_right_step) {
    memcpy(bg, ag, N * sizeof(float));
    steps(1, 4, 0, 1);
    B.grad_norm = A.grad_norm * 1.5;
    expect(2, NULL, "B's total norm is");
}

// Wrong answers of no known shape: noise on the gradient, one element off, a step in another direction.
Test(signature, shapes_it_does_not_know_are_named_by_none) {
    for (size_t i = 0; i < N; i++) bg[i] = ag[i] + 3e-3f * cosf(1.7f * (float)i);
    steps(1, 4, 0, 1);
    expect(4, prev_grads, "none of the known shapes");
    memcpy(bg, ag, N * sizeof(float));
    bg[N / 2] += 0.5f;
    steps(1, 4, 0, 1);
    expect(4, prev_grads, "none of the known shapes");
    memcpy(bg, ag, N * sizeof(float));
    steps(1, 4, 0, 1);
    for (size_t i = 0; i < N; i++) bp[i] += 1e-3f * (float)((i % 3) - 1);
    expect(4, prev_grads, "none of the known shapes");
}
