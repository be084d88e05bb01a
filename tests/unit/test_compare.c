// tests/unit/test_compare.c — the comparison engine (oracle/compare.h): the
// tolerance policy and its per-kind defaults, ULP distance (signed zeros, NaN,
// denormals, infinities), error statistics, the first divergence and the rank
// that owns it under full_shard / hybrid / no_shard layouts with uneven and
// empty shards, and --bitwise. Single process, in memory: no MPI, no files.
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "config.h"
#include "model.h"

// ----------------------------------------------------------------------------
// ULP distance

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

Test(ulp, equal_values_are_zero_apart) {
    cr_expect_eq(fc_ulp_distance(1.0f, 1.0f), 0);
    cr_expect_eq(fc_ulp_distance(-3.5f, -3.5f), 0);
    cr_expect_eq(fc_ulp_distance(INFINITY, INFINITY), 0);
}

Test(ulp, neighbours_are_one_apart) {
    cr_expect_eq(fc_ulp_distance(1.0f, nextafterf(1.0f, 2.0f)), 1);
    cr_expect_eq(fc_ulp_distance(nextafterf(1.0f, 0.0f), 1.0f), 1);
    cr_expect_eq(fc_ulp_distance(-1.0f, nextafterf(-1.0f, -2.0f)), 1);
    // across a power of two the spacing changes, the distance does not
    cr_expect_eq(fc_ulp_distance(nextafterf(2.0f, 0.0f), 2.0f), 1);
    cr_expect_eq(fc_ulp_distance(FLT_MAX, INFINITY), 1);
}

Test(ulp, signed_zeros_are_the_same_point) {
    cr_expect_eq(fc_ulp_distance(0.0f, -0.0f), 0);
    cr_expect_eq(fc_ulp_distance(-0.0f, 0.0f), 0);
}

Test(ulp, denormals_count_one_each) {
    float tiny = bits_to_float(1);  // the smallest positive denormal
    cr_expect_eq(fc_ulp_distance(0.0f, tiny), 1);
    cr_expect_eq(fc_ulp_distance(-0.0f, tiny), 1);
    cr_expect_eq(fc_ulp_distance(-tiny, tiny), 2);
    cr_expect_eq(fc_ulp_distance(bits_to_float(0x007fffff), FLT_MIN), 1);  // largest denormal -> smallest normal
    cr_expect_eq(fc_ulp_distance(bits_to_float(5), bits_to_float(2)), 3);
}

Test(ulp, opposite_signs_add_their_distances_to_zero) {
    cr_expect_eq(fc_ulp_distance(-1.0f, 1.0f), 2ull * 0x3f800000u);
    cr_expect_eq(fc_ulp_distance(-INFINITY, INFINITY), 2ull * 0x7f800000u);
}

Test(ulp, nan_handling_is_explicit) {
    float qnan = NAN, other_nan = bits_to_float(0x7fc00001), neg_nan = bits_to_float(0xffc00000);
    cr_expect_eq(fc_ulp_distance(qnan, qnan), 0);
    cr_expect_eq(fc_ulp_distance(qnan, other_nan), 0, "any two NaNs are the same point");
    cr_expect_eq(fc_ulp_distance(qnan, neg_nan), 0);
    cr_expect_eq(fc_ulp_distance(qnan, 1.0f), UINT64_MAX);
    cr_expect_eq(fc_ulp_distance(0.0f, qnan), UINT64_MAX);
    cr_expect_eq(fc_ulp_distance(INFINITY, qnan), UINT64_MAX);
}

// ----------------------------------------------------------------------------
// element closeness and error metrics

static const fc_tol FP32 = {1.3e-6, 1e-5, 0};
static const fc_tol EXACTLY = {0, 0, 1};

Test(close, atol_and_rtol_as_assert_close) {
    cr_expect(fc_cmp_close(0.0f, 9e-6f, &FP32));
    cr_expect_not(fc_cmp_close(0.0f, 1.1e-5f, &FP32));
    // at 100, rtol adds 1.3e-4 to the atol of 1e-5
    cr_expect(fc_cmp_close(100.0f, 100.0001f, &FP32));
    cr_expect_not(fc_cmp_close(100.0f, 100.0002f, &FP32));
}

Test(close, relative_to_the_expected_side) {
    fc_tol t = {0.5, 0, 0};
    // |a - b| = 1: within 0.5 * |2| but not 0.5 * |1|
    cr_expect(fc_cmp_close(2.0f, 1.0f, &t));
    cr_expect_not(fc_cmp_close(1.0f, 2.0f, &t));
}

Test(close, nan_matches_only_nan) {
    cr_expect(fc_cmp_close(NAN, NAN, &FP32));
    cr_expect_not(fc_cmp_close(NAN, 0.0f, &FP32));
    cr_expect_not(fc_cmp_close(1.0f, NAN, &FP32));
    fc_tol wide = {1e30, 1e30, 0};
    cr_expect_not(fc_cmp_close(1.0f, NAN, &wide), "no tolerance makes a number match NaN");
}

Test(close, infinities_must_be_equal) {
    cr_expect(fc_cmp_close(INFINITY, INFINITY, &FP32));
    cr_expect(fc_cmp_close(-INFINITY, -INFINITY, &FP32));
    cr_expect_not(fc_cmp_close(INFINITY, -INFINITY, &FP32));
    fc_tol wide = {1e30, 1e30, 0};
    cr_expect_not(fc_cmp_close(INFINITY, FLT_MAX, &wide));
}

Test(close, exact_means_identical_bits) {
    cr_expect(fc_cmp_close(1.0f, 1.0f, &EXACTLY));
    cr_expect_not(fc_cmp_close(1.0f, nextafterf(1.0f, 2.0f), &EXACTLY));
    cr_expect_not(fc_cmp_close(0.0f, -0.0f, &EXACTLY), "bitwise tells the zeros apart");
    cr_expect(fc_cmp_close(0.0f, -0.0f, &FP32), "tolerance does not");
    cr_expect(fc_cmp_close(NAN, NAN, &EXACTLY));
    cr_expect_not(fc_cmp_close(bits_to_float(0x7fc00000), bits_to_float(0x7fc00001), &EXACTLY),
                  "different NaN payloads are different bits");
}

Test(close, error_metrics) {
    cr_expect_float_eq(fc_cmp_abs_err(1.0f, 1.5f), 0.5, 1e-15);
    cr_expect_float_eq(fc_cmp_rel_err(2.0f, 1.5f), 0.25, 1e-15);
    cr_expect_eq(fc_cmp_rel_err(0.0f, 0.0f), 0.0);
    cr_expect(isinf(fc_cmp_rel_err(0.0f, 1e-30f)), "a nonzero against an expected zero is infinitely relative");
    cr_expect_eq(fc_cmp_abs_err(NAN, NAN), 0.0);
    cr_expect(isinf(fc_cmp_abs_err(NAN, 1.0f)));
    cr_expect_eq(fc_cmp_abs_err(INFINITY, INFINITY), 0.0);
    cr_expect(isinf(fc_cmp_abs_err(INFINITY, 1.0f)));
    cr_expect_eq(fc_cmp_abs_err(0.0f, -0.0f), 0.0);
}

// ----------------------------------------------------------------------------
// the policy

Test(policy, documented_defaults_per_kind) {
    // the table in compare.c and README.md: rtol per dtype from assert_close;
    // atol 1e-5 (assert_close) except where a measurement widened it
    static const struct {
        fc_prec p;
        double rtol, atol[FC_CMP_KIND_COUNT];
    } rows[] = {
        {FC_PREC_FP32, 1.3e-6, {0, 1e-5, 1e-5, 1e-5, 1e-5}},
        {FC_PREC_BF16, 1.6e-2, {0, 1e-5, 4e-3, 5e-3, 5e-4}},
        {FC_PREC_FP16, 1e-3, {0, 1e-5, 1e-3, 5e-3, 2e-4}},
    };
    for (int r = 0; r < 3; r++) {
        fc_cmp_policy p;
        fc_cmp_policy_defaults(&p, rows[r].p);
        cr_expect_eq(p.prec, rows[r].p);
        cr_expect(p.tol[FC_CMP_BATCH].exact, "batch is always exact (%s)", fc_prec_name(rows[r].p));
        for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) {
            const fc_tol *t = &p.tol[k];
            cr_expect_not(t->exact);
            cr_expect_eq(t->rtol, rows[r].rtol, "%s %s rtol %g", fc_prec_name(rows[r].p), fc_cmp_kind_name(k), t->rtol);
            cr_expect_eq(t->atol, rows[r].atol[k], "%s %s atol %g", fc_prec_name(rows[r].p), fc_cmp_kind_name(k),
                         t->atol);
        }
    }
}

Test(policy, precision_is_the_loosest_of_both_runs) {
    fc_run_config a, b;
    fc_run_config_defaults(&a);
    fc_run_config_defaults(&b);
    cr_expect_eq(fc_cmp_precision(&a, &b), FC_PREC_FP32);
    b.reduce_dtype = FC_PREC_BF16;  // fp32 params, bf16 gradient reduction
    cr_expect_eq(fc_cmp_precision(&a, &b), FC_PREC_BF16);
    a.param_dtype = FC_PREC_FP16;
    cr_expect_eq(fc_cmp_precision(&a, &b), FC_PREC_BF16, "bf16 is looser than fp16");
    b.reduce_dtype = FC_PREC_FP32;
    cr_expect_eq(fc_cmp_precision(&a, &b), FC_PREC_FP16);
    cr_expect_eq(fc_cmp_precision(&b, &a), FC_PREC_FP16);
}

Test(policy, overrides_replace_every_float_kind_but_not_the_batch) {
    fc_cmp_policy p;
    fc_cmp_policy_defaults(&p, FC_PREC_FP32);
    fc_cmp_policy_override(&p, 1, 0.5, 0, 0);  // --rtol only
    cr_expect(p.overridden);
    for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect_eq(p.tol[k].rtol, 0.5);
        cr_expect_eq(p.tol[k].atol, 1e-5, "an atol not given keeps its default");
    }
    fc_cmp_policy_override(&p, 0, 0, 1, 2.0);
    for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) cr_expect_eq(p.tol[k].atol, 2.0);
    cr_expect(p.tol[FC_CMP_BATCH].exact, "the batch is data: never toleranced");
    fc_cmp_policy q;
    fc_cmp_policy_defaults(&q, FC_PREC_FP32);
    fc_cmp_policy_override(&q, 0, 0, 0, 0);
    cr_expect_not(q.overridden, "no flag, no override");
}

Test(policy, bitwise_makes_everything_exact) {
    fc_cmp_policy p;
    fc_cmp_policy_defaults(&p, FC_PREC_BF16);
    fc_cmp_policy_bitwise(&p);
    cr_expect(p.bitwise);
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) cr_expect(p.tol[k].exact, "%s", fc_cmp_kind_name(k));
}

// ----------------------------------------------------------------------------
// owners

static fc_model g_m;
static fc_run_config g_cfg;

static void use_model(const char *preset) {
    fc_error e;
    fc_run_config_defaults(&g_cfg);
    cr_assert_eq(fc_model_config_load(preset, &g_cfg.model, &e), 0, "%s", e.msg);
    fc_model_build(&g_m, &g_cfg.model);
}

static void use_mlp(const int *dims, int n) {
    fc_run_config_defaults(&g_cfg);
    g_cfg.model.n_layers = n - 1;
    for (int i = 0; i < n; i++) g_cfg.model.dims[i] = dims[i];
    fc_error e;
    cr_assert_eq(fc_model_config_validate(&g_cfg.model, &e), 0, "%s", e.msg);
    fc_model_build(&g_m, &g_cfg.model);
}

static void done_model(void) { fc_model_free(&g_m); }

static fc_owner owner(fc_strategy s, int world, int shard_group, const char *param, size_t index) {
    g_cfg.strategy = s;
    g_cfg.shard_group = shard_group;
    int p = fc_model_find(&g_m, param);
    cr_assert_geq(p, 0, "no parameter %s", param);
    return fc_cmp_param_owner(&g_m, &g_cfg, world, p, index);
}

static const char *owner_text(const fc_owner *o) {
    static char buf[512];
    fc_owner_format(o, &g_m, &g_cfg, buf, sizeof buf);
    return buf;
}

TestSuite(owner, .fini = done_model);

Test(owner, full_shard_even_split) {
    use_model("mlp-tiny");  // unit layers.0: weight 17x13 = 221, bias 17: N = 238
    fc_owner o = owner(FC_STRATEGY_FULL_SHARD, 2, 0, "layers.0.weight", 118);
    cr_expect_eq(o.kind, FC_OWNER_SHARD);
    cr_expect_eq(o.shard_size, 119);
    cr_expect_eq(o.rank, 0);
    o = owner(FC_STRATEGY_FULL_SHARD, 2, 0, "layers.0.weight", 119);
    cr_expect_eq(o.rank, 1);
    o = owner(FC_STRATEGY_FULL_SHARD, 2, 0, "layers.0.bias", 16);  // unit offset 237, the last element
    cr_expect_eq(o.unit_offset, 237);
    cr_expect_eq(o.rank, 1);
    cr_expect_eq(o.n_groups, 1);
    const char *t = owner_text(&o);
    cr_expect_not_null(strstr(t, "rank 1 (full_shard shard 1 of 2"), "%s", t);
    cr_expect_not_null(strstr(t, "unit layers.0, element 237 of 238, shard size 119"), "%s", t);
    cr_expect_null(strstr(t, "replicated"), "full_shard holds one copy: %s", t);
}

Test(owner, full_shard_uneven_split) {
    use_model("mlp-tiny");
    // W = 3: S = ceil(238 / 3) = 80; shards [0,80) [80,160) [160,238) + 2 padding
    fc_owner o = owner(FC_STRATEGY_FULL_SHARD, 3, 0, "layers.0.weight", 159);
    cr_expect_eq(o.shard_size, 80);
    cr_expect_eq(o.rank, 1);
    o = owner(FC_STRATEGY_FULL_SHARD, 3, 0, "layers.0.weight", 160);
    cr_expect_eq(o.rank, 2);
    // layers.1: 11x17 + 11 = 198 at W = 5: S = 40, the bias's last element 197 -> rank 4
    o = owner(FC_STRATEGY_SHARD_GRAD_OP, 5, 0, "layers.1.bias", 10);
    cr_expect_eq(o.unit_offset, 197);
    cr_expect_eq(o.shard_size, 40);
    cr_expect_eq(o.rank, 4);
    // layers.2: 7x11 + 7 = 84 at W = 7: S = 12, weight element 71 -> rank 5, 72 -> rank 6
    cr_expect_eq(owner(FC_STRATEGY_FULL_SHARD, 7, 0, "layers.2.weight", 71).rank, 5);
    cr_expect_eq(owner(FC_STRATEGY_FULL_SHARD, 7, 0, "layers.2.weight", 72).rank, 6);
}

Test(owner, empty_shards) {
    static const int dims[] = {2, 1, 2};  // units of 3 (1x2 + 1) and 4 (2x1 + 2) elements
    use_mlp(dims, 3);
    // W = 8, unit 0: S = 1, shards 0..2 hold the elements, 3..7 only padding
    fc_owner o = owner(FC_STRATEGY_FULL_SHARD, 8, 0, "layers.0.bias", 0);
    cr_expect_eq(o.shard_size, 1);
    cr_expect_eq(o.rank, 2);
    o = owner(FC_STRATEGY_FULL_SHARD, 8, 0, "layers.1.bias", 1);  // unit 1 offset 3
    cr_expect_eq(o.rank, 3);
}

Test(owner, hybrid_shard_names_the_group_and_the_replicas) {
    use_model("mlp-tiny");
    // W = 4 in shard groups of F = 2: S = 119, offset 237 -> shard 1 -> rank 1, replica rank 3
    fc_owner o = owner(FC_STRATEGY_HYBRID_SHARD, 4, 2, "layers.0.bias", 16);
    cr_expect_eq(o.kind, FC_OWNER_SHARD);
    cr_expect_eq(o.group_size, 2);
    cr_expect_eq(o.n_groups, 2);
    cr_expect_eq(o.shard, 1);
    cr_expect_eq(o.rank, 1);
    const char *t = owner_text(&o);
    cr_expect_not_null(strstr(t, "rank 1 (hybrid_shard shard 1 of 2 of shard group 0, replicated on rank 3;"), "%s", t);
    // W = 6, F = 3 (zero2): S = 80, offset 100 -> shard 1, replicas 4
    o = owner(FC_STRATEGY_HYBRID_SHARD_ZERO2, 6, 3, "layers.0.weight", 100);
    cr_expect_eq(o.rank, 1);
    t = owner_text(&o);
    cr_expect_not_null(strstr(t, "replicated on rank 4;"), "%s", t);
    // W = 8, F = 2: replicas on 3, 5, 7
    o = owner(FC_STRATEGY_HYBRID_SHARD, 8, 2, "layers.0.bias", 16);
    t = owner_text(&o);
    cr_expect_not_null(strstr(t, "replicated on ranks 3, 5, 7;"), "%s", t);
    // a shard group of 0 is the whole world: full_shard's layout
    o = owner(FC_STRATEGY_HYBRID_SHARD, 3, 0, "layers.0.weight", 160);
    cr_expect_eq(o.group_size, 3);
    cr_expect_eq(o.rank, 2);
    cr_expect_eq(o.n_groups, 1);
}

Test(owner, replicated_strategies) {
    use_model("mlp-tiny");
    fc_owner o = owner(FC_STRATEGY_NO_SHARD, 4, 0, "layers.1.weight", 5);
    cr_expect_eq(o.kind, FC_OWNER_REPLICATED);
    const char *t = owner_text(&o);
    cr_expect_not_null(strstr(t, "every rank (replicated"), "%s", t);
    cr_expect_not_null(strstr(t, "no_shard"), "%s", t);
    o = owner(FC_STRATEGY_LOCAL, 1, 0, "layers.1.weight", 5);
    cr_expect_eq(o.kind, FC_OWNER_REPLICATED);
}

Test(owner, gpt2_root_unit) {
    use_model("gpt2-tiny");
    // root unit: wte 97x16 = 1552, wpe 32x16 = 512, ln_f 2x16: N = 2096; W = 3: S = 699
    fc_owner o = owner(FC_STRATEGY_FULL_SHARD, 3, 0, "transformer.wpe.weight", 0);  // unit offset 1552
    cr_expect_eq(o.unit, 0);
    cr_expect_eq(o.unit_numel, 2096);
    cr_expect_eq(o.shard_size, 699);
    cr_expect_eq(o.rank, 2);
    cr_expect_not_null(strstr(owner_text(&o), "the root unit"), "%s", owner_text(&o));
    // ln_f sits after the blocks in registration, but in the root unit: offset 2064
    o = owner(FC_STRATEGY_FULL_SHARD, 3, 0, "transformer.ln_f.weight", 0);
    cr_expect_eq(o.unit_offset, 2064);
    cr_expect_eq(o.rank, 2);
    o = owner(FC_STRATEGY_FULL_SHARD, 3, 0, "transformer.h.1.ln_1.weight", 0);
    cr_expect_eq(o.unit, 2);
    cr_expect_eq(o.rank, 0);
}

Test(owner, batch_samples) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.global_batch = 8;
    fc_owner o = fc_cmp_batch_owner(&c, 2, 5);
    cr_expect_eq(o.kind, FC_OWNER_DATA);
    cr_expect_eq(o.rank, 1);
    cr_expect_eq(o.per_rank, 4);
    cr_expect_eq(o.micro_batch, -1);
    cr_expect_eq(fc_cmp_batch_owner(&c, 2, 1).rank, 0, "contiguous ranges, not round robin");
    cr_expect_eq(fc_cmp_batch_owner(&c, 4, 5).rank, 2);
    c.grad_accum = 2;
    cr_expect_eq(fc_cmp_batch_owner(&c, 2, 5).micro_batch, 0);
    cr_expect_eq(fc_cmp_batch_owner(&c, 2, 7).micro_batch, 1);
    cr_expect_eq(fc_cmp_batch_owner(&c, 1, 7).rank, 0);
    cr_expect_eq(fc_cmp_batch_owner(&c, 3, 7).kind, FC_OWNER_NONE, "8 samples do not split over 3 ranks");
}

// ----------------------------------------------------------------------------
// whole steps in memory: the API `check` and `sweep` use

typedef struct {
    float *grads, *params, *s0, *s1;
    fc_batch batch;
    fc_trace_step s;
} set;

static void make_set(set *x, const fc_model *m, const fc_run_config *c) {
    size_t n = m->numel;
    x->grads = malloc(n * sizeof(float));
    x->params = malloc(n * sizeof(float));
    x->s0 = malloc(n * sizeof(float));
    x->s1 = malloc(n * sizeof(float));
    cr_assert(x->grads && x->params && x->s0 && x->s1);
    for (size_t i = 0; i < n; i++) {
        x->grads[i] = 1e-3f * (float)((int)(i % 17) - 8);
        x->params[i] = 0.1f * (float)((int)(i % 13) - 6) + 0.01f;
        x->s0[i] = 1e-4f * (float)(i % 7);
        x->s1[i] = 1e-7f * (float)(i % 5);
    }
    fc_batch_alloc(&x->batch, &c->model, c->global_batch, c->seq_len);
    fc_data_fill(&x->batch, &c->model, c->seed, 0, 0);
    memset(&x->s, 0, sizeof x->s);
    x->s.step = 3;
    x->s.loss = 2.5f;
    x->s.batch = &x->batch;
    x->s.grads = x->grads;
    x->s.params = x->params;
    x->s.n_state = 2;
    x->s.state_names[0] = "exp_avg";
    x->s.state_names[1] = "exp_avg_sq";
    x->s.state[0] = x->s0;
    x->s.state[1] = x->s1;
}

static void free_set(set *x) {
    free(x->grads);
    free(x->params);
    free(x->s0);
    free(x->s1);
    fc_batch_free(&x->batch);
}

static set A, B;
static fc_cmp_policy g_pol;
static fc_cmp_result R;

static void step_setup(void) {
    use_model("mlp-tiny");
    make_set(&A, &g_m, &g_cfg);
    make_set(&B, &g_m, &g_cfg);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    memset(&R, 0, sizeof R);
}

static void step_teardown(void) {
    fc_cmp_result_free(&R);
    free_set(&A);
    free_set(&B);
    done_model();
}

TestSuite(step, .init = step_setup, .fini = step_teardown);

static void compare_under(fc_strategy s, int world) {
    g_cfg.strategy = s;
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, world};
    fc_cmp_result_free(&R);
    fc_compare_step(&c, &A.s, &B.s, &R);
}

static float *elem(set *x, const char *kind, const char *param, size_t i) {
    int p = fc_model_find(&g_m, param);
    cr_assert_geq(p, 0);
    float *base = !strcmp(kind, "grad") ? x->grads : !strcmp(kind, "param") ? x->params : x->s1;
    return base + g_m.params[p].offset + i;
}

Test(step, identical_sets_pass_with_counts_per_kind) {
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    cr_expect_not(R.first.found);
    cr_expect_eq(R.step, 3);
    cr_expect_eq(R.kinds[FC_CMP_BATCH].n_tensors, 2);
    cr_expect_eq(R.kinds[FC_CMP_LOSS].n_tensors, 1);
    cr_expect_eq(R.kinds[FC_CMP_GRAD].n_tensors, 6);
    cr_expect_eq(R.kinds[FC_CMP_PARAM].n_tensors, 6);
    cr_expect_eq(R.kinds[FC_CMP_OPTIM].n_tensors, 12);
    cr_expect_eq(R.n_tensors, 27);
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect_eq(R.kinds[k].max_abs, 0);
        cr_expect_eq(R.kinds[k].max_ulp, 0);
    }
    cr_expect_str_eq(R.tensors[0].name, "batch.input");
    cr_expect_str_eq(R.tensors[2].name, "loss");
    cr_expect_str_eq(R.tensors[3].name, "grad.layers.0.weight");
    cr_expect_str_eq(R.tensors[26].name, "optim.exp_avg_sq.layers.2.bias");
}

Test(step, statistics_of_a_difference_within_tolerance) {
    float *x = elem(&B, "param", "layers.1.weight", 7);
    *x = nextafterf(nextafterf(*x, 1.0f), 1.0f);  // 2 ULP
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    cr_expect_eq(R.kinds[FC_CMP_PARAM].max_ulp, 2);
    cr_expect_gt(R.kinds[FC_CMP_PARAM].max_abs, 0);
    cr_expect_eq(R.kinds[FC_CMP_GRAD].max_ulp, 0);
    const fc_cmp_tensor *t = &R.tensors[3 + 6 + 2];
    cr_expect_str_eq(t->name, "param.layers.1.weight");
    cr_expect_eq(t->max_ulp, 2);
    cr_expect_eq(t->n_bad, 0);
    cr_expect_float_eq(t->max_rel, t->max_abs / fabs((double)*elem(&A, "param", "layers.1.weight", 7)), 1e-12);
}

Test(step, bitwise_fails_what_tolerance_passes) {
    float *x = elem(&B, "param", "layers.1.weight", 7);
    *x = nextafterf(*x, 1.0f);
    fc_cmp_policy_bitwise(&g_pol);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect(R.first.found);
    cr_expect_str_eq(R.first.tensor, "param.layers.1.weight");
    cr_expect_eq(R.first.index, 7);
    cr_expect_eq(R.first.ulp, 1);
    cr_expect(R.first.tol.exact);
    cr_expect_eq(R.kinds[FC_CMP_PARAM].n_failed, 1);
}

Test(step, first_divergence_element_values_and_owner) {
    // unit layers.0 is weight (221) then bias (17): 238 elements, S = 119 at W = 2
    *elem(&B, "param", "layers.0.bias", 16) += 0.5f;   // unit offset 237: rank 1
    *elem(&B, "param", "layers.0.bias", 3) += 0.25f;   // unit offset 224: rank 1
    *elem(&B, "param", "layers.0.weight", 5) -= 1.0f;  // unit offset 5: rank 0, and first
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    const fc_cmp_divergence *d = &R.first;
    cr_assert(d->found);
    cr_expect_eq(d->step, 3);
    cr_expect_eq(d->kind, FC_CMP_PARAM);
    cr_expect_str_eq(d->tensor, "param.layers.0.weight");
    cr_expect_eq(d->index, 5);
    cr_expect_eq(d->multi[0], 0);
    cr_expect_eq(d->multi[1], 5);
    cr_expect_eq(d->a, (double)*elem(&A, "param", "layers.0.weight", 5));
    cr_expect_eq(d->b, (double)*elem(&B, "param", "layers.0.weight", 5));
    cr_expect_eq(d->owner.kind, FC_OWNER_SHARD);
    cr_expect_eq(d->owner.rank, 0);
    cr_expect_eq(R.tensors[3 + 6 + 1].n_bad, 2, "both bias elements are counted");
    cr_expect_eq(R.kinds[FC_CMP_PARAM].n_failed, 2);
    // with the weight restored, the bias's earlier element is first
    *elem(&B, "param", "layers.0.weight", 5) = *elem(&A, "param", "layers.0.weight", 5);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "param.layers.0.bias");
    cr_expect_eq(R.first.index, 3);
    cr_expect_eq(R.first.ndim, 1);
    cr_expect_eq(R.first.owner.unit_offset, 224);
    cr_expect_eq(R.first.owner.rank, 1);
    cr_expect_not_null(strstr(R.first.owner_text, "rank 1 (full_shard shard 1 of 2"), "%s", R.first.owner_text);
    // at W = 3 (S = 80) the same element is rank 2's
    compare_under(FC_STRATEGY_FULL_SHARD, 3);
    cr_expect_eq(R.first.owner.rank, 2);
    // and under a no_shard layout, every rank's
    compare_under(FC_STRATEGY_NO_SHARD, 2);
    cr_expect_eq(R.first.owner.kind, FC_OWNER_REPLICATED);
}

Test(step, multi_index_of_a_matrix_element) {
    // layers.1.weight is [11, 17]: flat 3*17 + 5 = 56 is [3, 5]
    *elem(&B, "grad", "layers.1.weight", 56) = 1.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "grad.layers.1.weight");
    cr_expect_eq(R.first.index, 56);
    cr_expect_eq(R.first.ndim, 2);
    cr_expect_eq(R.first.multi[0], 3);
    cr_expect_eq(R.first.multi[1], 5);
    cr_expect_eq(R.first.shape[0], 11);
    cr_expect_eq(R.first.shape[1], 17);
}

Test(step, kinds_are_compared_in_causal_order) {
    *elem(&B, "param", "layers.0.weight", 0) += 1.0f;
    *elem(&B, "grad", "layers.2.bias", 6) += 1.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "grad.layers.2.bias", "gradients come before parameters");
    B.s.loss = 3.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "loss", "the loss before the gradients");
    cr_expect_eq(R.first.owner.kind, FC_OWNER_NONE);
    cr_expect_eq(R.first.ndim, 0);
    B.batch.features[20] += 1.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "batch.input", "the data before everything");
}

Test(step, batch_is_exact_even_under_a_wide_override) {
    // one ULP in a feature: different data, whatever the tolerance
    B.batch.features[2 * 13 + 4] = nextafterf(B.batch.features[2 * 13 + 4], 10.0f);
    fc_cmp_policy_override(&g_pol, 1, 1.0, 1, 1.0);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "batch.input");
    cr_expect_eq(R.first.multi[0], 2);
    cr_expect_eq(R.first.multi[1], 4);
    cr_expect_eq(R.first.owner.kind, FC_OWNER_DATA);
    cr_expect_eq(R.first.owner.sample, 2);
    cr_expect_eq(R.first.owner.rank, 0);
    cr_expect_not_null(strstr(R.first.note, "different data"), "%s", R.first.note);
    cr_expect_eq(R.kinds[FC_CMP_BATCH].n_failed, 1);
    cr_expect_eq(R.kinds[FC_CMP_GRAD].n_failed, 0);
}

Test(step, batch_target_and_shape_mismatch) {
    B.batch.target[7] = (B.batch.target[7] + 1) % 7;
    compare_under(FC_STRATEGY_NO_SHARD, 4);
    cr_expect_str_eq(R.first.tensor, "batch.target");
    cr_expect_eq(R.first.index, 7);
    cr_expect_not(R.first.is_float);
    cr_expect_eq(R.first.owner.rank, 3, "sample 7 of 8 is read by rank 3 of 4");
    // a different batch size cannot be compared element-wise
    B.batch.B = 4;
    compare_under(FC_STRATEGY_NO_SHARD, 4);
    cr_expect_eq(R.first.index, -1);
    cr_expect_not_null(strstr(R.first.note, "batch shapes differ"), "%s", R.first.note);
    B.batch.B = 8;
}

Test(step, gpt2_tokens_are_integers) {
    step_teardown();
    use_model("gpt2-tiny");
    make_set(&A, &g_m, &g_cfg);
    make_set(&B, &g_m, &g_cfg);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    int T = g_cfg.seq_len;
    B.batch.input[5 * T + 2] += 1;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "batch.input");
    cr_expect_eq(R.first.multi[0], 5);
    cr_expect_eq(R.first.multi[1], 2);
    cr_expect_eq(R.first.b - R.first.a, 1.0);
    cr_expect_eq(R.first.ulp, 1);
    cr_expect_eq(R.first.owner.rank, 1);
}

Test(step, nan_in_both_matches_nan_in_one_does_not) {
    *elem(&A, "grad", "layers.1.bias", 2) = NAN;
    *elem(&B, "grad", "layers.1.bias", 2) = NAN;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "the same overflow on both sides is agreement");
    *elem(&B, "grad", "layers.1.bias", 2) = 0.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "grad.layers.1.bias");
    cr_expect_eq(R.first.ulp, UINT64_MAX);
    cr_expect(isinf(R.kinds[FC_CMP_GRAD].max_abs));
}

Test(step, precision_decides_the_verdict) {
    // 1.0 against 1.01: fine for bf16 (1.6e-2 * 1 + 5e-3), not fp16 (1e-3 + 5e-3) or fp32
    *elem(&A, "param", "layers.2.weight", 10) = 1.0f;
    *elem(&B, "param", "layers.2.weight", 10) = 1.01f;
    fc_cmp_policy_defaults(&g_pol, FC_PREC_BF16);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP16);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
}

Test(step, optimizer_state_present_on_one_side_only) {
    B.s.n_state = 1;  // B lost exp_avg_sq
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "optim.exp_avg_sq");
    cr_expect_eq(R.first.index, -1);
    cr_expect_not_null(strstr(R.first.note, "in A, not in B"), "%s", R.first.note);
    B.s.n_state = 2;
    A.s.n_state = 1;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not_null(strstr(R.first.note, "in B, not in A"), "%s", R.first.note);
}

Test(step, parts_accumulate_into_one_result) {
    // `compare` reads a step a tensor set at a time: the same result as all at once
    *elem(&B, "param", "layers.2.bias", 1) += 1.0f;
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2};
    fc_cmp_result parts;
    fc_cmp_result_init(&parts, 3);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_BATCH) | FC_CMP_MASK(FC_CMP_LOSS), &parts);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_GRAD), &parts);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_PARAM) | FC_CMP_MASK(FC_CMP_OPTIM), &parts);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_eq(parts.n_tensors, R.n_tensors);
    cr_expect_eq(parts.pass, R.pass);
    cr_expect_str_eq(parts.first.tensor, R.first.tensor);
    cr_expect_eq(parts.first.index, R.first.index);
    fc_cmp_result_free(&parts);
}
