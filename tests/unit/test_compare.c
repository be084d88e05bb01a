// tests/unit/test_compare.c — the comparison engine (oracle/compare.h) and
// the property verdicts built on it (oracle/props.h):
//  - ULP distance (signed zeros, NaN, denormals, infinities) and fc_ulp_at;
//  - the policy: both rows per precision, the same-compute policy, --rtol /
//    --atol overrides of both rows, --bitwise;
//  - an element judged against its tensor's scale s = max(max|A|, max|B|), a
//    tensor judged by its error norm, all-zero tensors, NaN and Inf, the exact
//    batch, bitwise;
//  - the optimizer allowance: a parameter may differ by what both sides'
//    optimizer inputs explain (AdamW, SGD), and by nothing else;
//  - the lockstep row while the runs start a step from the same parameters,
//    the diverged row once they do not;
//  - the first divergence and the rank that owns it under full_shard / hybrid
//    / no_shard layouts with uneven and empty shards;
//  - fc_props_compare on runs as the runner keeps them;
//  - the 16-bit whole-tensor test (fc_cmp_projection): weighted by each
//    element's allowance, so a tensor whose magnitudes span decades is judged
//    by its bulk, not its few largest elements.
// Single process, in memory: no MPI, no files.
#include <criterion/criterion.h>
#include <omp.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "clip.h"           // fc_grad_norm
#include "compare_model.h"  // fc_cmp_projection
#include "config.h"
#include "model.h"
#include "optim.h"
#include "props.h"
#include "runner.h"

// ----------------------------------------------------------------------------
// ULP distance and the ULP at a scale

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

Test(ulp, ulp_at_a_scale_is_the_fp32_spacing_of_its_binade) {
    cr_expect_eq(fc_ulp_at(1.0), ldexp(1.0, -23));
    cr_expect_eq(fc_ulp_at(1.5), ldexp(1.0, -23));
    cr_expect_eq(fc_ulp_at(nextafter(2.0, 0.0)), ldexp(1.0, -23), "just below 2: still 1's binade");
    cr_expect_eq(fc_ulp_at(2.0), ldexp(1.0, -22));
    cr_expect_eq(fc_ulp_at(0.75), ldexp(1.0, -24));
    cr_expect_eq(fc_ulp_at(1024.0), ldexp(1.0, -13));
    cr_expect_eq(fc_ulp_at(3e-3), ldexp(1.0, -32), "3e-3 is in [2^-9, 2^-8)");
    // it agrees with the float spacing nextafterf measures, wherever fp32 is normal
    const float xs[] = {1e-30f, 1e-5f, 0.1f, 7.0f, 123456.0f, 3e38f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        cr_expect_eq(fc_ulp_at(xs[i]), (double)nextafterf(xs[i], INFINITY) - (double)xs[i], "x = %g", xs[i]);
    // the smallest normal and below: the subnormal spacing 2^-149
    cr_expect_eq(fc_ulp_at(FLT_MIN), ldexp(1.0, -149));
    cr_expect_eq(fc_ulp_at(ldexp(1.0, -130)), ldexp(1.0, -149));
    cr_expect_eq(fc_ulp_at(0.0), ldexp(1.0, -149), "a zero scale: the smallest spacing");
    cr_expect(isinf(fc_ulp_at(INFINITY)));
}

Test(ulp, error_metrics) {
    cr_expect_float_eq(fc_cmp_abs_err(1.0f, 1.5f), 0.5, 1e-15);
    cr_expect_eq(fc_cmp_abs_err(NAN, NAN), 0.0);
    cr_expect(isinf(fc_cmp_abs_err(NAN, 1.0f)));
    cr_expect(isinf(fc_cmp_abs_err(1.0f, NAN)));
    cr_expect_eq(fc_cmp_abs_err(INFINITY, INFINITY), 0.0);
    cr_expect(isinf(fc_cmp_abs_err(INFINITY, -INFINITY)));
    cr_expect(isinf(fc_cmp_abs_err(INFINITY, 1.0f)));
    cr_expect(isinf(fc_cmp_abs_err(FLT_MAX, INFINITY)));
    cr_expect_eq(fc_cmp_abs_err(0.0f, -0.0f), 0.0);
}

// ----------------------------------------------------------------------------
// the policy

static int looser_or_equal(const fc_tol *a, const fc_tol *b) { return a->rtol >= b->rtol && a->ntol >= b->ntol; }

Test(policy, defaults_are_the_two_documented_rows) {
    const fc_prec precs[] = {FC_PREC_FP32, FC_PREC_BF16, FC_PREC_FP16};
    for (int i = 0; i < 3; i++) {
        fc_prec pr = precs[i];
        fc_cmp_policy p;
        fc_cmp_policy_defaults(&p, pr);
        cr_expect_eq(p.prec, pr);
        cr_expect_eq(p.prec_div, pr);
        cr_expect_not(p.bitwise);
        cr_expect_not(p.overridden);
        cr_expect_eq(p.lockstep, FC_CMP_LOCKSTEP[pr][FC_CMP_PARAM].rtol, "lockstep = the parameter rtol");
        for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
            cr_expect_eq(memcmp(&p.tol[k], &FC_CMP_LOCKSTEP[pr][k], sizeof(fc_tol)), 0, "%s %s lockstep",
                         fc_prec_name(pr), fc_cmp_kind_name(k));
            cr_expect_eq(memcmp(&p.div[k], &FC_CMP_DIVERGED[pr][k], sizeof(fc_tol)), 0, "%s %s diverged",
                         fc_prec_name(pr), fc_cmp_kind_name(k));
        }
        cr_expect(p.tol[FC_CMP_BATCH].exact && p.div[FC_CMP_BATCH].exact, "the batch is always exact (%s)",
                  fc_prec_name(pr));
        for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) {
            const char *kn = fc_cmp_kind_name(k);
            cr_expect_not(p.tol[k].exact || p.div[k].exact, "%s %s", fc_prec_name(pr), kn);
            cr_expect_gt(p.tol[k].rtol, 0, "%s %s", fc_prec_name(pr), kn);
            cr_expect_eq(p.tol[k].atol, 0, "no absolute floor by default (%s %s)", fc_prec_name(pr), kn);
            cr_expect_eq(p.div[k].atol, 0);
            cr_expect(looser_or_equal(&p.div[k], &p.tol[k]), "%s %s: the diverged row is tighter", fc_prec_name(pr),
                      kn);
            int tensor = k == FC_CMP_GRAD || k == FC_CMP_PARAM || k == FC_CMP_OPTIM;
            cr_expect_eq(p.tol[k].ntol > 0, tensor, "%s %s: a norm check on tensors only", fc_prec_name(pr), kn);
        }
    }
    // 16-bit reductions are looser than fp32 for what they produce, bf16 the loosest
    const int kinds[] = {FC_CMP_LOSS, FC_CMP_GRAD, FC_CMP_OPTIM};
    for (int i = 0; i < 3; i++) {
        int k = kinds[i];
        cr_expect(looser_or_equal(&FC_CMP_LOCKSTEP[FC_PREC_FP16][k], &FC_CMP_LOCKSTEP[FC_PREC_FP32][k]));
        cr_expect(looser_or_equal(&FC_CMP_LOCKSTEP[FC_PREC_BF16][k], &FC_CMP_LOCKSTEP[FC_PREC_FP16][k]));
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

Test(policy, same_compute_locksteps_at_the_reduce_dtype) {
    fc_run_config a, b;
    fc_run_config_defaults(&a);
    fc_run_config_defaults(&b);
    a.param_dtype = b.param_dtype = FC_PREC_BF16;  // bf16 compute, fp32 reductions
    fc_cmp_policy p;
    fc_cmp_policy_same_compute(&p, &a, &b);
    cr_expect_eq(p.prec, FC_PREC_FP32, "the runs differ only by fp32 reductions while in lockstep");
    cr_expect_eq(p.prec_div, FC_PREC_BF16, "once diverged, bf16 compute carries the difference");
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect_eq(memcmp(&p.tol[k], &FC_CMP_LOCKSTEP[FC_PREC_FP32][k], sizeof(fc_tol)), 0, "%s",
                     fc_cmp_kind_name(k));
        cr_expect_eq(memcmp(&p.div[k], &FC_CMP_DIVERGED[FC_PREC_BF16][k], sizeof(fc_tol)), 0, "%s",
                     fc_cmp_kind_name(k));
    }
    b.reduce_dtype = FC_PREC_BF16;
    fc_cmp_policy_same_compute(&p, &a, &b);
    cr_expect_eq(p.prec, FC_PREC_BF16, "a bf16 reduction on either side");
    // fp32 everywhere: the fp32 rows
    fc_run_config_defaults(&a);
    fc_run_config_defaults(&b);
    fc_cmp_policy_same_compute(&p, &a, &b);
    cr_expect_eq(p.prec, FC_PREC_FP32);
    cr_expect_eq(p.prec_div, FC_PREC_FP32);
}

Test(policy, overrides_replace_both_rows_of_every_float_kind_but_not_the_batch) {
    fc_cmp_policy p;
    fc_cmp_policy_defaults(&p, FC_PREC_BF16);
    fc_cmp_policy_override(&p, 1, 0.5, 0, 0);  // --rtol only
    cr_expect(p.overridden);
    for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) {
        const fc_tol *rows[2] = {&p.tol[k], &p.div[k]};
        const fc_tol *def[2] = {&FC_CMP_LOCKSTEP[FC_PREC_BF16][k], &FC_CMP_DIVERGED[FC_PREC_BF16][k]};
        for (int r = 0; r < 2; r++) {
            cr_expect_eq(rows[r]->rtol, 0.5, "%s row %d", fc_cmp_kind_name(k), r);
            cr_expect_eq(rows[r]->atol, 0, "an atol not given keeps its default");
            // the norm check scales with the element check it accompanies
            cr_expect_float_eq(rows[r]->ntol, def[r]->ntol * 0.5 / def[r]->rtol, 1e-15, "%s row %d ntol %g",
                               fc_cmp_kind_name(k), r, rows[r]->ntol);
        }
    }
    fc_cmp_policy_override(&p, 0, 0, 1, 2.0);  // --atol only
    for (int k = FC_CMP_LOSS; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect_eq(p.tol[k].atol, 2.0);
        cr_expect_eq(p.div[k].atol, 2.0);
        cr_expect_eq(p.tol[k].rtol, 0.5, "an rtol not given stays");
    }
    cr_expect(p.tol[FC_CMP_BATCH].exact && p.div[FC_CMP_BATCH].exact, "the batch is data: never toleranced");
    cr_expect_eq(p.tol[FC_CMP_BATCH].atol, 0);
    fc_cmp_policy q;
    fc_cmp_policy_defaults(&q, FC_PREC_FP32);
    fc_cmp_policy_override(&q, 0, 0, 0, 0);
    cr_expect_not(q.overridden, "no flag, no override");
    cr_expect_eq(memcmp(q.tol, FC_CMP_LOCKSTEP[FC_PREC_FP32], sizeof q.tol), 0);
    cr_expect_eq(q.lockstep, FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_PARAM].rtol, "no flag changes the lockstep test");
}

Test(policy, bitwise_makes_everything_exact_in_both_rows) {
    fc_cmp_policy p;
    fc_cmp_policy_defaults(&p, FC_PREC_BF16);
    fc_cmp_policy_bitwise(&p);
    cr_expect(p.bitwise);
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect(p.tol[k].exact, "%s", fc_cmp_kind_name(k));
        cr_expect(p.div[k].exact, "%s", fc_cmp_kind_name(k));
    }
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
// whole steps in memory: the API `check`, `sweep` and the MPI programs use

typedef struct {
    float *grads, *params, *prev, *s0, *s1;
    fc_batch batch;
    fc_trace_step s;
} set;

static void make_set(set *x, const fc_model *m, const fc_run_config *c) {
    size_t n = m->numel;
    x->grads = malloc(n * sizeof(float));
    x->params = malloc(n * sizeof(float));
    x->prev = malloc(n * sizeof(float));
    x->s0 = malloc(n * sizeof(float));
    x->s1 = malloc(n * sizeof(float));
    cr_assert(x->grads && x->params && x->prev && x->s0 && x->s1);
    for (size_t i = 0; i < n; i++) {
        x->grads[i] = 1e-3f * (float)((int)(i % 17) - 8);
        x->params[i] = 0.1f * (float)((int)(i % 13) - 6) + 0.01f;
        x->prev[i] = x->params[i];
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
    x->s.prev_params = x->prev;
    x->s.n_state = 2;
    x->s.state_names[0] = "exp_avg";
    x->s.state_names[1] = "exp_avg_sq";
    x->s.state[0] = x->s0;
    x->s.state[1] = x->s1;
}

static void free_set(set *x) {
    free(x->grads);
    free(x->params);
    free(x->prev);
    free(x->s0);
    free(x->s1);
    fc_batch_free(&x->batch);
}

static set A, B;
static fc_cmp_policy g_pol;
static fc_cmp_result R;
static const fc_optim_config *g_optim;  // the optimizer allowance's optimizer (NULL: none)

static void step_setup(void) {
    use_model("mlp-tiny");
    make_set(&A, &g_m, &g_cfg);
    make_set(&B, &g_m, &g_cfg);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    memset(&R, 0, sizeof R);
    g_optim = NULL;
}

static void step_teardown(void) {
    fc_cmp_result_free(&R);
    free_set(&A);
    free_set(&B);
    done_model();
}

TestSuite(step, .init = step_setup, .fini = step_teardown);

static void compare_kinds(fc_strategy s, int world, unsigned kinds) {
    g_cfg.strategy = s;
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, world, g_optim, NULL, 0, 1, 1, 0, 0};
    fc_cmp_result_free(&R);
    fc_cmp_result_init(&R, A.s.step);
    fc_compare_add(&c, &A.s, &B.s, kinds, &R);
}

static void compare_under(fc_strategy s, int world) {
    g_cfg.strategy = s;
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, world, g_optim, NULL, 0, 1, 1, 0, 0};
    fc_cmp_result_free(&R);
    fc_compare_step(&c, &A.s, &B.s, &R);
}

static const fc_param *param(const char *name) {
    int p = fc_model_find(&g_m, name);
    cr_assert_geq(p, 0, "no parameter %s", name);
    return &g_m.params[p];
}

static float *base_of(set *x, const char *kind) {
    return !strcmp(kind, "grad") ? x->grads : !strcmp(kind, "param") ? x->params : !strcmp(kind, "prev") ? x->prev
                                                                                                          : x->s1;
}

static float *elem(set *x, const char *kind, const char *name, size_t i) {
    return base_of(x, kind) + param(name)->offset + i;
}

// Fills tensor `name` of `kind` on both sides with v(i) = ((i % 5) - 2) * 0.25:
// values -0.5 .. 0.5, scale 0.5.
static void fill_both(const char *kind, const char *name) {
    const fc_param *p = param(name);
    for (size_t i = 0; i < p->numel; i++)
        base_of(&A, kind)[p->offset + i] = base_of(&B, kind)[p->offset + i] = 0.25f * (float)((int)(i % 5) - 2);
}

static const fc_cmp_tensor *tensor(const char *name) {
    for (int i = 0; i < R.n_tensors; i++)
        if (!strcmp(R.tensors[i].name, name)) return &R.tensors[i];
    cr_assert_fail("no tensor %s in the result", name);
    return NULL;
}

Test(step, identical_sets_pass_with_counts_per_kind) {
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    cr_expect_not(R.first.found);
    cr_expect_eq(R.step, 3);
    cr_expect(R.lockstep);
    cr_expect_eq(R.prev_diff, 0);
    cr_expect_eq(R.kinds[FC_CMP_BATCH].n_tensors, 2);
    cr_expect_eq(R.kinds[FC_CMP_LOSS].n_tensors, 1);
    cr_expect_eq(R.kinds[FC_CMP_NORM].n_tensors, 0, "no norm on either side");
    cr_expect_eq(R.kinds[FC_CMP_GRAD].n_tensors, 6);
    cr_expect_eq(R.kinds[FC_CMP_PARAM].n_tensors, 6);
    cr_expect_eq(R.kinds[FC_CMP_OPTIM].n_tensors, 12);
    cr_expect_eq(R.n_tensors, 27);
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        cr_expect_eq(R.kinds[k].max_abs, 0);
        cr_expect_eq(R.kinds[k].max_scaled, 0);
        cr_expect_eq(R.kinds[k].max_ulp, 0);
        cr_expect_eq(R.kinds[k].headroom, 0);
    }
    cr_expect_str_eq(R.tensors[0].name, "batch.input");
    cr_expect_str_eq(R.tensors[2].name, "loss");
    cr_expect_str_eq(R.tensors[3].name, "grad.layers.0.weight");
    cr_expect_str_eq(R.tensors[9].name, "optim.exp_avg.layers.0.weight", "optimizer state before parameters");
    cr_expect_str_eq(R.tensors[26].name, "param.layers.2.bias");
    // the norm joins when both sides know it
    A.s.has_norm = B.s.has_norm = 1;
    A.s.grad_norm = B.s.grad_norm = 0.75;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_eq(R.kinds[FC_CMP_NORM].n_tensors, 1);
    cr_expect_str_eq(R.tensors[3].name, "grad_norm", "the norm after the loss, before the gradients");
    B.s.has_norm = 0;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_eq(R.kinds[FC_CMP_NORM].n_tensors, 0, "one side without a norm: not compared");
}

// An element is judged against its tensor's scale, not against itself.
Test(step, an_element_is_judged_against_its_tensors_scale) {
    fill_both("grad", "layers.1.weight");  // scale 0.5; fp32 lockstep grad rtol 4e-5: allowed 2e-5
    const double rtol = FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_GRAD].rtol, s = 0.5;
    *elem(&A, "grad", "layers.1.weight", 7) = 1e-6f;
    // 0.5 of the allowed error: 10 times the element itself, but small against the tensor
    *elem(&B, "grad", "layers.1.weight", 7) = (float)(1e-6 + 0.5 * rtol * s);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "an error of %g on an element of 1e-6 in a tensor of scale 0.5", 0.5 * rtol * s);
    const fc_cmp_tensor *t = tensor("grad.layers.1.weight");
    cr_expect_eq(t->scale, 0.5);
    cr_expect_float_eq(t->max_scaled, 0.5 * rtol, 1e-9);
    cr_expect_float_eq(t->max_ulp, t->max_abs / fc_ulp_at(0.5), 1e-9, "ULPs at the scale, not at the element");
    cr_expect_float_eq(t->headroom, 0.5, 1e-3, "half the tolerance used");
    cr_expect_eq(t->n_bad, 0);
    // 1.5 of the allowed error fails, and the divergence says how it was judged
    *elem(&B, "grad", "layers.1.weight", 7) = (float)(1e-6 + 1.5 * rtol * s);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    const fc_cmp_divergence *d = &R.first;
    cr_assert(d->found);
    cr_expect_str_eq(d->tensor, "grad.layers.1.weight");
    cr_expect_eq(d->index, 7);
    cr_expect_eq(d->kind, FC_CMP_GRAD);
    cr_expect_eq(d->scale, 0.5);
    cr_expect_float_eq(d->allowed, rtol * s, 1e-15);
    cr_expect_float_eq(d->scaled, 1.5 * rtol, 1e-9);
    cr_expect_float_eq(d->ulp, d->abs_err / fc_ulp_at(0.5), 1e-9);
    cr_expect_not(d->whole_tensor);
    cr_expect_eq(d->tol.rtol, rtol);
    cr_expect_eq(d->a_bits, 0x358637bd, "1e-6f's bits");
    cr_expect_eq(tensor("grad.layers.1.weight")->n_bad, 1);
    // the scale is the larger side's: B's outlier raises it for every element
    *elem(&B, "grad", "layers.1.weight", 7) = 1e-6f;
    *elem(&B, "grad", "layers.1.weight", 8) = 4.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_eq(tensor("grad.layers.1.weight")->scale, 4.0);
}

Test(step, a_small_error_on_every_element_fails_the_tensor_as_a_whole) {
    fill_both("grad", "layers.2.weight");
    const fc_tol *t = &FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_GRAD];
    double f = 0.5 * (t->rtol + t->ntol);  // between the norm tolerance and the element tolerance
    cr_assert_gt(t->rtol, t->ntol, "the element tolerance is the looser one");
    const fc_param *p = param("layers.2.weight");
    for (size_t i = 0; i < p->numel; i++) B.grads[p->offset + i] = (float)(A.grads[p->offset + i] * (1 + f));
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    const fc_cmp_tensor *x = tensor("grad.layers.2.weight");
    cr_expect_eq(x->n_bad, 0, "no element is outside its tolerance");
    cr_expect(x->norm_bad);
    cr_expect_float_eq(x->norm_ratio, f, 2e-2 * f);
    cr_expect_gt(x->headroom, 1);
    const fc_cmp_divergence *d = &R.first;
    cr_expect_str_eq(d->tensor, "grad.layers.2.weight");
    cr_expect(d->whole_tensor);
    cr_expect_float_eq(d->norm_ratio, f, 2e-2 * f);
    cr_expect_eq(fabs(d->a), 0.5, "the worst element is named: one of the largest");
    // the same error on one element only is within both checks
    for (size_t i = 0; i < p->numel; i++) B.grads[p->offset + i] = A.grads[p->offset + i];
    *elem(&B, "grad", "layers.2.weight", 2) = (float)(*elem(&A, "grad", "layers.2.weight", 2) * (1 + f));
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
}

Test(step, all_zero_tensors_must_match_exactly) {
    const fc_param *p = param("layers.0.bias");
    for (size_t i = 0; i < p->numel; i++) A.grads[p->offset + i] = B.grads[p->offset + i] = 0.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    cr_expect_eq(tensor("grad.layers.0.bias")->scale, 0);
    *elem(&B, "grad", "layers.0.bias", 3) = -0.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "-0 is 0 under a tolerance");
    *elem(&B, "grad", "layers.0.bias", 3) = bits_to_float(1);  // the smallest denormal
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass, "the tensor's scale is B's one nonzero element: it is 100%% off");
    cr_expect_str_eq(R.first.tensor, "grad.layers.0.bias");
    cr_expect_eq(R.first.index, 3);
    // an atol gives all-zero tensors a floor
    fc_cmp_policy_override(&g_pol, 0, 0, 1, 1e-30);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
}

// Against another arithmetic (B not the built-in reference), an fp32 tensor
// that is all cancellation noise is judged against its unit's largest
// gradient (fc_cmp_grad_floor32); between two references it is not, and a
// real error of the unit's scale fails either way.
Test(step, fp32_noise_tensor_is_judged_against_its_unit_for_another_arithmetic) {
    fill_both("grad", "layers.0.weight");  // the unit's largest: 0.5
    const fc_param *p = param("layers.0.bias");
    for (size_t i = 0; i < p->numel; i++) {
        A.grads[p->offset + i] = 1e-12f * (float)((int)(i % 3) - 1);
        B.grads[p->offset + i] = 1.3f * A.grads[p->offset + i];
    }
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    for (int other = 0; other < 2; other++) {
        fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, g_optim, NULL, 0, 1, !other, 0, 0};
        fc_cmp_result_free(&R);
        fc_compare_step(&c, &A.s, &B.s, &R);
        cr_expect_eq(R.pass, other, "30%% of a 1e-12 tensor beside a unit of 0.5: %s", other ? "noise" : "an error");
    }
    *elem(&B, "grad", "layers.0.bias", 0) += 1e-5f;
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, g_optim, NULL, 0, 1, 0, 0, 0};
    fc_cmp_result_free(&R);
    fc_compare_step(&c, &A.s, &B.s, &R);
    cr_expect_not(R.pass, "1e-5 in a unit of 0.5 is no fp32 rounding");
    cr_expect_str_eq(R.first.tensor, "grad.layers.0.bias");
}

Test(step, nan_matches_only_nan_and_infinities_must_be_equal) {
    *elem(&A, "grad", "layers.1.bias", 2) = NAN;
    *elem(&B, "grad", "layers.1.bias", 2) = NAN;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "the same overflow on both sides is agreement");
    cr_expect(isfinite(tensor("grad.layers.1.bias")->scale), "NaN does not enter the scale");
    *elem(&B, "grad", "layers.1.bias", 2) = 0.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "grad.layers.1.bias");
    cr_expect_eq(R.first.index, 2);
    cr_expect(isinf(R.first.abs_err));
    cr_expect(isinf(R.kinds[FC_CMP_GRAD].max_abs));
    // no tolerance makes a number match NaN
    fc_cmp_policy_override(&g_pol, 1, 1e30, 1, 1e30);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    // infinities: equal ones agree, anything else is infinitely far
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    *elem(&A, "grad", "layers.1.bias", 2) = INFINITY;
    *elem(&B, "grad", "layers.1.bias", 2) = INFINITY;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    *elem(&B, "grad", "layers.1.bias", 2) = -INFINITY;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    *elem(&B, "grad", "layers.1.bias", 2) = FLT_MAX;
    fc_cmp_policy_override(&g_pol, 1, 1e30, 1, 1e30);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass, "FLT_MAX is not infinity under any tolerance");
}

Test(step, the_loss_is_judged_against_its_own_magnitude) {
    const double rtol = FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_LOSS].rtol;
    B.s.loss = (float)(2.5 * (1 + 0.5 * rtol));
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass);
    B.s.loss = (float)(2.5 * (1 + 2 * rtol));
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "loss");
    cr_expect_eq(R.first.ndim, 0);
    cr_expect_eq(R.first.scale, (double)B.s.loss, "a scalar's scale is its larger side");
    cr_expect_eq(R.first.owner.kind, FC_OWNER_NONE);
    // the norm: a double, judged in double
    B.s.loss = A.s.loss;
    A.s.has_norm = B.s.has_norm = 1;
    A.s.grad_norm = 0.75;
    B.s.grad_norm = 0.75 * (1 + 2 * FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_NORM].rtol);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "grad_norm");
    cr_expect_eq(R.first.is_float, 2);
    cr_expect_eq(R.first.b, B.s.grad_norm);
}

Test(step, bitwise_fails_what_tolerance_passes) {
    float *x = elem(&B, "param", "layers.1.weight", 7);
    *x = nextafterf(*x, 1.0f);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "1 ULP is noise under the policy");
    cr_expect_gt(R.kinds[FC_CMP_PARAM].max_ulp, 0);
    cr_expect_leq(R.kinds[FC_CMP_PARAM].max_ulp, 1, "1 ULP of an element at most 1 ULP at its tensor's scale");
    fc_cmp_policy_bitwise(&g_pol);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect(R.first.found);
    cr_expect_str_eq(R.first.tensor, "param.layers.1.weight");
    cr_expect_eq(R.first.index, 7);
    cr_expect(R.first.tol.exact);
    cr_expect_eq(R.kinds[FC_CMP_PARAM].n_failed, 1);
    // bitwise tells the zeros apart, and NaN payloads
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    fc_cmp_policy_bitwise(&g_pol);
    *x = *elem(&A, "param", "layers.1.weight", 7);
    *elem(&A, "grad", "layers.0.bias", 1) = 0.0f;
    *elem(&B, "grad", "layers.0.bias", 1) = -0.0f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "grad.layers.0.bias");
    *elem(&B, "grad", "layers.0.bias", 1) = 0.0f;
    *elem(&A, "grad", "layers.0.bias", 1) = bits_to_float(0x7fc00000);
    *elem(&B, "grad", "layers.0.bias", 1) = bits_to_float(0x7fc00001);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass, "different NaN payloads are different bits");
}

Test(step, overrides_apply_in_both_rows) {
    fill_both("grad", "layers.1.weight");
    *elem(&B, "grad", "layers.1.weight", 3) += 0.15f;  // 30% of the scale 0.5
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    fc_cmp_policy_override(&g_pol, 1, 0.5, 0, 0);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.lockstep);
    cr_expect(R.pass, "--rtol 0.5 in the lockstep row");
    *elem(&B, "prev", "layers.0.weight", 0) += 1e-3f;  // the runs no longer start in lockstep (d ~ 1e-3: grows rtol by ~6e-3)
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.lockstep);
    cr_expect(R.pass, "--rtol 0.5 in the diverged row");
    // --atol: an absolute floor on top of the scaled tolerance, both rows
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.pass);
    fc_cmp_policy_override(&g_pol, 0, 0, 1, 0.2);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.lockstep);
    cr_expect(R.pass, "--atol 0.2 in the diverged row");
    *elem(&B, "prev", "layers.0.weight", 0) = *elem(&A, "prev", "layers.0.weight", 0);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect(R.lockstep);
    cr_expect(R.pass, "--atol 0.2 in the lockstep row");
    cr_expect_float_eq(tensor("grad.layers.1.weight")->headroom, 0.15 / (0.2 + 3.6e-5 * 0.5), 1e-3);
}

// The lockstep row while both runs start a step from the same parameters
// (within the parameter tolerance), the diverged row once they do not: the
// lockstep row grown by kappa times the previous parameters' difference d.
Test(step, lockstep_or_diverged_row) {
    fc_cmp_policy_defaults(&g_pol, FC_PREC_BF16);
    const fc_tol *lock = &FC_CMP_LOCKSTEP[FC_PREC_BF16][FC_CMP_GRAD], *div = &FC_CMP_DIVERGED[FC_PREC_BF16][FC_CMP_GRAD];
    cr_assert_eq(lock->rtol, div->rtol, "the rows differ only by their growth");
    cr_assert_gt(div->kappa, 0, "bf16 diverged gradients grow with the parameters' difference");
    const double d = 0.01;  // the previous parameters' difference the diverged case starts from
    fill_both("grad", "layers.1.weight");
    double e = lock->rtol + 0.5 * div->kappa * d;  // between the rows, relative to the scale 0.5
    *elem(&B, "grad", "layers.1.weight", 5) = (float)(*elem(&A, "grad", "layers.1.weight", 5) + e * 0.5);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect(R.lockstep);
    cr_expect_eq(R.prev_diff, 0);
    cr_expect_not(R.pass, "the lockstep row fails it");
    cr_expect_eq(R.first.tol.rtol, lock->rtol);
    // previous parameters within the lockstep threshold: still lockstep
    float *pv = elem(&B, "prev", "layers.2.weight", 0);
    double ps = 0.61;  // layers.2.weight's scale
    *pv = (float)(*elem(&A, "prev", "layers.2.weight", 0) + 0.5 * g_pol.lockstep * ps);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect(R.lockstep, "prev_diff %g", R.prev_diff);
    cr_expect_gt(R.prev_diff, 0);
    cr_expect_not(R.pass);
    // beyond it by d: the diverged row grown by kappa d, which passes it
    *pv = (float)(*elem(&A, "prev", "layers.2.weight", 0) + d * ps);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.lockstep);
    cr_expect_float_eq(R.prev_diff, d, 1e-3 * d);
    cr_expect(R.pass, "the diverged row allows it");
    // an error of twice the growth fails it
    *elem(&B, "grad", "layers.1.weight", 5) =
        (float)(*elem(&A, "grad", "layers.1.weight", 5) + (lock->rtol + 2 * div->kappa * d) * 0.5);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.pass, "beyond the grown row");
    cr_expect_float_eq(R.first.tol.rtol, lock->rtol + div->kappa * R.prev_diff, 1e-9);
    cr_expect_eq(R.first.tol.kappa, 0, "the growth is applied in the row a step is judged by");
    *elem(&B, "grad", "layers.1.weight", 5) = (float)(*elem(&A, "grad", "layers.1.weight", 5) + e * 0.5);
    // unknown previous parameters: the diverged row with nothing to grow it by
    *pv = *elem(&A, "prev", "layers.2.weight", 0);
    B.s.prev_params = NULL;
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.lockstep);
    cr_expect_eq(R.prev_diff, -1);
    cr_expect_not(R.pass);
    cr_expect_eq(R.first.tol.rtol, div->rtol);
    B.s.prev_params = B.prev;
    // two runs of one implementation: the same error fails the fp32 lockstep row
    // of the same-compute policy, and passes its bf16 diverged row
    fc_run_config a, b;
    fc_run_config_defaults(&a);
    fc_run_config_defaults(&b);
    a.param_dtype = b.param_dtype = FC_PREC_BF16;
    fc_cmp_policy_same_compute(&g_pol, &a, &b);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect(R.lockstep);
    cr_expect_not(R.pass);
    cr_expect_eq(R.first.tol.rtol, FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_GRAD].rtol);
    *pv = (float)(*elem(&A, "prev", "layers.2.weight", 0) + d * ps);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    cr_expect_not(R.lockstep);
    cr_expect(R.pass, "the bf16 diverged row, grown by kappa d");
}

// ----------------------------------------------------------------------------
// the optimizer allowance

static fc_optim_config g_oc;

// Both sides start a step from the same previous parameters, gradients and
// optimizer state; apply() then takes the real optimizer step on each side.
static void optimizer_step(void) {
    size_t n = g_m.numel;
    for (size_t i = 0; i < n; i++) {
        B.prev[i] = A.prev[i];
        B.grads[i] = A.grads[i];
    }
    float *st[2][2] = {{A.s0, A.s1}, {B.s0, B.s1}};
    float *p[2] = {A.params, B.params};
    for (int side = 0; side < 2; side++) {
        memcpy(p[side], A.prev, n * sizeof(float));
        for (size_t i = 0; i < n; i++) st[side][0][i] = 1e-3f * (float)((int)(i % 9) - 4), st[side][1][i] = 1e-6f;
    }
}

static void apply(set *x, const fc_optim_config *o) {
    memcpy(x->params, x->prev, g_m.numel * sizeof(float));
    fc_optim_update(o, x->s.step + 1, x->params, x->grads, x->s0, o->kind == FC_OPT_ADAMW ? x->s1 : NULL, g_m.numel);
}

static void use_optimizer(fc_opt_kind kind) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    g_oc = c.optim;
    g_oc.kind = kind;
    if (kind == FC_OPT_SGD) g_oc.lr = 0.05;
    g_optim = &g_oc;
    optimizer_step();
}

// fc_cmp_ctx.only (sensitivity's probes): with every other tensor passing,
// judging only the perturbed parameter's tensors gives the whole comparison's
// verdict, for every parameter, kind and size of error, and judges nothing else.
Test(step, only_one_parameter_judged_gives_the_whole_comparisons_verdict) {
    use_optimizer(FC_OPT_ADAMW);
    const fc_cmp_kind kinds[3] = {FC_CMP_GRAD, FC_CMP_PARAM, FC_CMP_OPTIM};
    const double deltas[4] = {1e-9, 1e-6, 1e-4, 1e-1};
    int verdicts[2] = {0, 0};  // how many probes passed, failed: both must occur
    for (int i = 0; i < g_m.n_params; i++) {
        const fc_param *q = &g_m.params[i];
        for (int k = 0; k < 3; k++) {
            float *b = kinds[k] == FC_CMP_GRAD ? B.grads : kinds[k] == FC_CMP_PARAM ? B.params : B.s0;
            size_t j = q->offset + q->numel / 2;
            const float keep = b[j];
            for (int d = 0; d < 4; d++) {
                b[j] = (float)(keep + deltas[d] * (fabs(keep) + 0.5));
                g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
                fc_cmp_result whole, one;
                fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, g_optim, NULL, 0, 0, 0, 0, 0};
                fc_cmp_result_init(&whole, A.s.step);
                fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(kinds[k]), &whole);
                c.only = i + 1;
                fc_cmp_result_init(&one, A.s.step);
                fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(kinds[k]), &one);
                cr_expect_eq(one.pass, whole.pass, "%s of %s, delta %g: whole %d, only %d",
                             fc_cmp_kind_name(kinds[k]), q->name, deltas[d], whole.pass, one.pass);
                cr_expect_eq(one.n_tensors, kinds[k] == FC_CMP_OPTIM ? 2 : 1, "only %s's tensors judged", q->name);
                verdicts[whole.pass ? 0 : 1]++;
                fc_cmp_result_free(&whole);
                fc_cmp_result_free(&one);
            }
            b[j] = keep;
        }
    }
    cr_expect_gt(verdicts[0], 0, "some probes pass");
    cr_expect_gt(verdicts[1], 0, "some probes fail");
}

// The same with an optimizer allowance that matters: B starts every element
// 1e-3 away from A, so its parameters differ by that much after the step and
// pass only by what the optimizer explains; judged alone, each parameter must
// still get its allowance (fc_cmp_optimizer_allowance over its elements).
Test(step, only_one_parameter_judged_keeps_its_optimizer_allowance) {
    use_optimizer(FC_OPT_ADAMW);
    for (size_t i = 0; i < g_m.numel; i++) B.prev[i] = A.prev[i] + 1e-3f;
    apply(&A, &g_oc);
    apply(&B, &g_oc);
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    for (int i = 0; i <= g_m.n_params; i++) {  // i = 0: the whole comparison
        fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, g_optim, NULL, 0, 0, 0, i, 0};
        fc_cmp_result r;
        fc_cmp_result_init(&r, A.s.step);
        fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_PARAM), &r);
        cr_expect(r.pass, "only = %d: the 1e-3 start is explained", i);
        cr_expect_gt(r.kinds[FC_CMP_PARAM].max_abs, 5e-4, "the difference is there to explain");
        fc_cmp_result_free(&r);
    }
}

Test(step, adamw_a_parameter_may_differ_by_the_two_updates_difference) {
    use_optimizer(FC_OPT_ADAMW);
    // one gradient at noise level flips its sign on B: AdamW turns it into an
    // update of about +lr on one side and -lr on the other
    size_t j = param("layers.1.weight")->offset + 20;
    A.grads[j] = 2e-7f;
    B.grads[j] = -2e-7f;
    A.s0[j] = B.s0[j] = 0.0f;
    A.s1[j] = B.s1[j] = 0.0f;
    apply(&A, &g_oc);
    apply(&B, &g_oc);
    double dp = fabs((double)A.params[j] - B.params[j]);
    cr_assert_gt(dp, g_oc.lr, "the updates differ by more than lr (%g)", dp);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect(R.pass, "the difference of the two updates is explained:\n%s", R.first.tensor);
    cr_expect_lt(R.kinds[FC_CMP_PARAM].max_scaled, FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_PARAM].rtol);
    cr_expect_gt(R.kinds[FC_CMP_PARAM].max_abs, g_oc.lr, "the raw difference is still reported");
    // without the optimizer's inputs nothing explains it
    g_optim = NULL;
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    cr_expect_eq(R.first.explained, 0);
    g_optim = &g_oc;
    // nor when one side has no optimizer state
    B.s.n_state = 0;
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    B.s.n_state = 2;
    // 0.01 lr added to another element after the step is an error
    size_t k = param("layers.2.weight")->offset + 5;
    B.params[k] += (float)(0.01 * g_oc.lr);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "param.layers.2.weight");
    cr_expect_eq(R.first.index, 5);
    cr_expect_lt(R.first.explained, 1e-9, "the optimizer explains none of it (%g)", R.first.explained);
    cr_expect_float_eq(R.first.abs_err, 0.01 * g_oc.lr, 1e-7);
}

// exp_avg = beta1 m_prev + (1 - beta1) g: its rounding is relative to those
// two terms, which cancellation can make 100x larger than the sum.
Test(step, a_momentum_state_is_judged_against_the_terms_it_sums) {
    use_optimizer(FC_OPT_ADAMW);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_BF16);
    const fc_param *p = param("layers.2.bias");
    for (size_t i = 0; i < p->numel; i++) {
        size_t j = p->offset + i;
        A.grads[j] = B.grads[j] = 1.0f;          // (1 - beta1) g = 0.1
        A.s0[j] = B.s0[j] = 0.001f;              // beta1 m_prev = -0.099: the terms sum 0.199
    }
    double terms = 0.199, tol = FC_CMP_LOCKSTEP[FC_PREC_BF16][FC_CMP_OPTIM].rtol;
    B.s0[p->offset + 3] += (float)(0.5 * tol * terms);  // half the tolerance of the terms, 12x the sum
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_OPTIM));
    cr_expect(R.pass, "within the tolerance of the terms: %s", R.first.tensor);
    cr_expect_float_eq(tensor("optim.exp_avg.layers.2.bias")->scale, terms, 1e-6);
    // measured against the sum alone (no optimizer known) it fails
    g_optim = NULL;
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_OPTIM));
    cr_expect_not(R.pass);
    g_optim = &g_oc;
    // twice the tolerance of the terms fails
    B.s0[p->offset + 3] = (float)(0.001 + 2 * tol * terms);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_OPTIM));
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "optim.exp_avg.layers.2.bias");
    cr_expect_eq(R.first.index, 3);
    // exp_avg_sq sums two non-negative terms: its own scale
    B.s0[p->offset + 3] = A.s0[p->offset + 3];
    B.s1[p->offset + 3] = A.s1[p->offset + 3] * 10.0f;  // 0.9 of its scale
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_OPTIM));
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "optim.exp_avg_sq.layers.2.bias");
}

Test(step, adamw_a_previous_difference_is_carried_by_the_decay) {
    use_optimizer(FC_OPT_ADAMW);
    size_t j = param("layers.0.weight")->offset + 33;
    B.prev[j] = (float)(A.prev[j] + 1e-3);  // the runs start the step apart (diverged)
    apply(&A, &g_oc);
    apply(&B, &g_oc);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.lockstep);
    cr_expect(R.pass, "the previous difference times the decay is explained");
    B.params[j] += (float)(0.01 * g_oc.lr);  // and nothing more
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "param.layers.0.weight");
    cr_expect_eq(R.first.index, 33);
    cr_expect_gt(R.first.explained, 9e-4, "the carried difference is explained (%g)", R.first.explained);
}

Test(step, sgd_a_parameter_may_differ_by_lr_times_the_buffers_difference) {
    use_optimizer(FC_OPT_SGD);
    A.s.n_state = B.s.n_state = 1;
    A.s.state_names[0] = B.s.state_names[0] = "momentum_buffer";
    size_t j = param("layers.1.weight")->offset + 40;
    B.grads[j] = A.grads[j] + 1e-3f;  // the momentum buffers take it in
    apply(&A, &g_oc);
    apply(&B, &g_oc);
    double dp = fabs((double)A.params[j] - B.params[j]);
    cr_assert_gt(dp, 10 * FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_PARAM].rtol * 0.61, "a difference beyond rounding");
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect(R.pass, "lr times the buffers' difference is explained");
    g_optim = NULL;
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    g_optim = &g_oc;
    size_t k = param("layers.2.bias")->offset + 2;
    B.params[k] += (float)(0.01 * g_oc.lr);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "param.layers.2.bias");
    cr_expect_eq(R.first.index, 2);
    // without momentum: lr times the gradients' difference
    g_oc.momentum = 0;
    A.s.n_state = B.s.n_state = 0;
    B.params[k] = A.params[k];
    apply(&A, &g_oc);
    apply(&B, &g_oc);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect(R.pass, "plain SGD: lr times the gradients' difference is explained");
    B.params[k] += (float)(0.01 * g_oc.lr);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_PARAM));
    cr_expect_not(R.pass);
}

// ----------------------------------------------------------------------------
// the first divergence

Test(step, first_divergence_element_values_and_owner) {
    // unit layers.0 is weight (221) then bias (17): 238 elements, S = 119 at W = 2
    *elem(&B, "grad", "layers.0.bias", 16) += 0.5f;   // unit offset 237: rank 1
    *elem(&B, "grad", "layers.0.bias", 3) += 0.25f;   // unit offset 224: rank 1
    *elem(&B, "grad", "layers.0.weight", 5) -= 1.0f;  // unit offset 5: rank 0, and first
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    const fc_cmp_divergence *d = &R.first;
    cr_assert(d->found);
    cr_expect_eq(d->step, 3);
    cr_expect_eq(d->kind, FC_CMP_GRAD);
    cr_expect_str_eq(d->tensor, "grad.layers.0.weight");
    cr_expect_eq(d->index, 5);
    cr_expect_eq(d->multi[0], 0);
    cr_expect_eq(d->multi[1], 5);
    cr_expect_eq(d->a, (double)*elem(&A, "grad", "layers.0.weight", 5));
    cr_expect_eq(d->b, (double)*elem(&B, "grad", "layers.0.weight", 5));
    cr_expect_eq(d->owner.kind, FC_OWNER_SHARD);
    cr_expect_eq(d->owner.rank, 0);
    cr_expect_eq(tensor("grad.layers.0.bias")->n_bad, 2, "both bias elements are counted");
    cr_expect_eq(R.kinds[FC_CMP_GRAD].n_failed, 2);
    // with the weight restored, the bias's earlier element is first
    *elem(&B, "grad", "layers.0.weight", 5) = *elem(&A, "grad", "layers.0.weight", 5);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_str_eq(R.first.tensor, "grad.layers.0.bias");
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
    cr_expect(R.first.tol.exact);
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
    cr_expect_eq(R.first.abs_err, 1.0);
    cr_expect_eq(R.first.owner.rank, 1);
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
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, NULL, NULL, 0, 0, 0, 0, 0};
    fc_cmp_result parts;
    fc_cmp_result_init(&parts, 3);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_BATCH) | FC_CMP_MASK(FC_CMP_LOSS), &parts);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_GRAD), &parts);
    fc_compare_add(&c, &A.s, &B.s, FC_CMP_MASK(FC_CMP_PARAM) | FC_CMP_MASK(FC_CMP_OPTIM), &parts);
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_eq(parts.n_tensors, R.n_tensors);
    cr_expect_eq(parts.pass, R.pass);
    cr_expect_eq(parts.lockstep, R.lockstep);
    cr_expect_str_eq(parts.first.tensor, R.first.tensor);
    cr_expect_eq(parts.first.index, R.first.index);
    fc_cmp_result_free(&parts);
}

Test(step, the_printed_divergence_names_scale_ulps_and_owner) {
    fill_both("grad", "layers.1.weight");
    *elem(&B, "grad", "layers.1.weight", 56) += 0.25f;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    fc_cmp_print_divergence(f, &R.first);
    fc_cmp_print_header(f);
    fc_cmp_print_rows(f, &R);
    fclose(f);
    const char *want[] = {"first divergence: step 3, tensor grad.layers.1.weight, element 56 [3, 5] of shape [11, 17]\n",
                          "  A = ", "(0x", "of the tensor's scale 0.5", "ULP at that scale; allowed 1.8e-05 (rtol 3.6e-05 ntol 1.5e-05)",
                          "owner under B's layout: rank 0 (full_shard shard 0 of 2;", "max err/scale", "ULP@scale",
                          "of tol", "     3  lock         0  grad         6", "FAIL (1 of 6 tensors)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_not_null(strstr(buf, want[i]), "lacks '%s':\n%s", want[i], buf);
    free(buf);
}

// ----------------------------------------------------------------------------
// fc_props_compare: two runs as the runner keeps them (no batch, every step,
// the norm known), judged step by step

static fc_run_result g_run[2];

static void make_run(fc_run_result *r, int steps, long first, float bump) {
    memset(r, 0, sizeof *r);
    r->ok = 1;
    r->numel = g_m.numel;
    r->steps = steps;
    r->first_step = first;
    r->n_state = 2;
    r->state_names[0] = "exp_avg";
    r->state_names[1] = "exp_avg_sq";
    r->init = calloc(g_m.numel, sizeof(float));
    r->step = calloc((size_t)steps, sizeof *r->step);
    cr_assert(r->init && r->step);
    // the parameters after global step g are base + 1e-3 (g + 1): a resumed run
    // starts from those after step first - 1
    for (size_t i = 0; i < g_m.numel; i++) r->init[i] = 0.1f * (float)((int)(i % 11) - 5) + 1e-3f * (float)first;
    for (int t = 0; t < steps; t++) {
        fc_run_step *s = &r->step[t];
        s->loss = 2.0f - 0.1f * (float)(first + t);
        s->norm = 1.0 + (double)(first + t);
        s->grads = calloc(g_m.numel, sizeof(float));
        s->params = calloc(g_m.numel, sizeof(float));
        s->state[0] = calloc(g_m.numel, sizeof(float));
        s->state[1] = calloc(g_m.numel, sizeof(float));
        cr_assert(s->grads && s->params && s->state[0] && s->state[1]);
        for (size_t i = 0; i < g_m.numel; i++) {
            s->grads[i] = 1e-2f * (float)((int)((i + (size_t)(first + t)) % 7) - 3) + bump;
            s->params[i] = 0.1f * (float)((int)(i % 11) - 5) + 1e-3f * (float)(first + t + 1);
            s->state[0][i] = 1e-3f * (float)(first + t + 1);
            s->state[1][i] = 1e-6f * (float)(first + t + 1);
        }
    }
}

static void free_runs(void) {
    for (int i = 0; i < 2; i++) {
        for (int t = 0; g_run[i].step && t < g_run[i].steps; t++) {
            free(g_run[i].step[t].grads);
            free(g_run[i].step[t].params);
            free(g_run[i].step[t].state[0]);
            free(g_run[i].step[t].state[1]);
        }
        free(g_run[i].step);
        free(g_run[i].init);
        memset(&g_run[i], 0, sizeof g_run[i]);
    }
    done_model();
}

static void props_setup(void) { use_model("mlp-tiny"); }

TestSuite(props, .init = props_setup, .fini = free_runs);

// Judges tested g_run[1] from its step 0 against expected g_run[0] from its
// step e0, both g_cfg at W = 2, over two steps.
static int props_judge(fc_props *v, fc_prop p, int same_compute, int e0, int bitwise, const char *against) {
    fc_judgement j = {.p = p, .against = against, .tested = {&g_cfg, 2, &g_run[1], 0},
                      .expected = {&g_cfg, 0, &g_run[0], e0}, .n = 2, .bitwise = bitwise, .same_compute = same_compute};
    return fc_props_compare(v, &j);
}

Test(props, runs_step_by_step_with_an_offset) {
    make_run(&g_run[0], 4, 0, 0);  // expected: steps 0..3
    make_run(&g_run[1], 2, 2, 0);  // tested: a run resumed at step 2
    fc_props v;
    memset(&v, 0, sizeof v);
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    cr_expect(props_judge(&v, FC_P7_CHECKPOINT, 0, 2, 0, "uninterrupted"));
    cr_expect(props_judge(&v, FC_P7_CHECKPOINT, 0, 2, 1, "uninterrupted"), "bitwise too");
    cr_expect_eq(v.checked, 1u << 7);
    cr_expect_eq(v.failed, 0);
    cr_expect_eq(v.detail[0], '\0');
    // compared at the wrong offset, it fails at the first step, named as the expected run's
    cr_expect_not(props_judge(&v, FC_P7_CHECKPOINT, 0, 1, 0, "uninterrupted"));
    cr_expect_eq(v.failed, 1u << 7);
    // the parameters both start from already differ (those after step 0 against those after step 1)
    cr_expect_not_null(strstr(v.detail, "P7 vs uninterrupted: the parameters before the first compared step differ: step 1, param."),
                       "%s", v.detail);
}

Test(props, the_detail_names_the_element_its_bits_scale_and_owner) {
    make_run(&g_run[0], 2, 0, 0);
    make_run(&g_run[1], 2, 0, 0);
    const fc_param *p = param("layers.0.bias");
    g_run[1].step[1].grads[p->offset + 16] += 0.01f;  // unit offset 237: rank 1 at W = 2
    fc_props v;
    memset(&v, 0, sizeof v);
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    cr_expect_not(props_judge(&v, FC_P2_NO_SHARD, 1, 0, 0, "no_shard"));
    cr_expect_eq(v.failed, 1u << 2);
    const char *want[] = {"P2 vs no_shard (fp32, lockstep): step 1, grad.layers.0.bias[16]: ", "(0x",
                          "of the tensor's scale", "ULP there; allowed 3.6e-05",
                          "owned by rank 1 (full_shard shard 1 of 2; unit layers.0, element 237 of 238"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_not_null(strstr(v.detail, want[i]), "detail lacks '%s': %s", want[i], v.detail);
    cr_expect_gt(v.headroom[2], 1);
    cr_expect_gt(v.max_scaled[2], 0);
    cr_expect_gt(v.max_ulp[2], 0);
    // the first failure's detail is kept
    char first[sizeof v.detail];
    memcpy(first, v.detail, sizeof first);
    g_run[1].step[0].loss += 1.0f;
    cr_expect_not(props_judge(&v, FC_P2_NO_SHARD, 1, 0, 0, "no_shard"));
    cr_expect_str_eq(v.detail, first);
    // a run that failed is a failure with its error
    fc_props w;
    memset(&w, 0, sizeof w);
    g_run[1].ok = 0;
    snprintf(g_run[1].error, sizeof g_run[1].error, "step 0: out of cheese");
    cr_expect_not(props_judge(&w, FC_P3_HYBRID, 1, 0, 0, "full_shard"));
    cr_expect_not_null(strstr(w.detail, "P3 vs full_shard: run failed: step 0: out of cheese"), "%s", w.detail);
    g_run[1].ok = 1;
}

Test(props, the_norm_of_every_step_is_compared) {
    make_run(&g_run[0], 2, 0, 0);
    make_run(&g_run[1], 2, 0, 0);
    g_run[1].step[1].norm *= 1.001;
    fc_props v;
    memset(&v, 0, sizeof v);
    g_cfg.strategy = FC_STRATEGY_FULL_SHARD;
    cr_expect_not(props_judge(&v, FC_P8_CLIP, 0, 0, 0, "local"));
    cr_expect_not_null(strstr(v.detail, "P8 vs local (fp32, lockstep): step 1, grad_norm: "), "%s", v.detail);
}

// ----------------------------------------------------------------------------
// The whole tensor under 16-bit rounding (fc_cmp_projection)

#define PJ_N 4096
// A whose magnitudes span 6 decades (exp_avg_sq = (1 - beta2) g^2 does), each
// element allowed 8u of itself (n u mag with no cancellation); signs alternate.
static void pj_tensor(float *a, double *allow) {
    for (int i = 0; i < PJ_N; i++) {
        a[i] = (float)((i % 2 ? -1.0 : 1.0) * pow(10.0, -6.0 * i / PJ_N));
        allow[i] = 8 * 0x1p-8 * fabs((double)a[i]);
    }
}

Test(projection, noise_at_the_full_allowance_passes) {
    // every element off by 0.9 of its allowance, of pseudo-random sign: each
    // element passes, and so must the tensor (Hoeffding at 6 sigma)
    static float a[PJ_N], b[PJ_N];
    static double allow[PJ_N];
    pj_tensor(a, allow);
    uint32_t x = 12345;
    for (int i = 0; i < PJ_N; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (float)(a[i] + ((x >> 31) ? 0.9 : -0.9) * allow[i]);
    }
    fc_cmp_policy pol;
    fc_cmp_policy_defaults(&pol, FC_PREC_BF16);
    fc_cmp_proj pj = fc_cmp_projection(&pol, 0, a, b, allow, 0, PJ_N);
    cr_assert(fabs(pj.delta) <= pj.allowed, "delta %.3g, allowed %.3g", pj.delta, pj.allowed);
}

Test(projection, the_bulk_scaled_fails_though_the_largest_elements_hide_it_unweighted) {
    // all but the 512 largest elements (an eighth) scaled by 1 + 4u: the
    // weighted estimate finds 7/8 of 4u (every element counts by |a_i| /
    // allow_i, the same here); <B - A, A> / <A, A> unweighted, 1/30 of it, is below the one
    // rounding of a scalar (u) the test allows whatever the noise
    static float a[PJ_N], b[PJ_N];
    static double allow[PJ_N];
    pj_tensor(a, allow);
    double u = 0x1p-8, num = 0, aa = 0;
    for (int i = 0; i < PJ_N; i++) {
        b[i] = i < 512 ? a[i] : (float)(a[i] * (1 + 4 * u));
        num += ((double)b[i] - a[i]) * a[i], aa += (double)a[i] * a[i];
    }
    cr_assert(num / aa < u, "unweighted %.3g: the case needs the largest elements to hide the bulk", num / aa);
    fc_cmp_policy pol;
    fc_cmp_policy_defaults(&pol, FC_PREC_BF16);
    fc_cmp_proj pj = fc_cmp_projection(&pol, 0, a, b, allow, 0, PJ_N);
    cr_assert(fabs(pj.delta - 3.5 * u) < 0.01 * u, "weighted delta %.4g, expected 3.5u = %.4g", pj.delta, 3.5 * u);
    cr_assert(fabs(pj.delta) > pj.allowed, "delta %.3g passed, allowed %.3g", pj.delta, pj.allowed);
}

// The norm is judged by what its own gradients explain: |norm(A) - norm(B)|
// <= norm(gA - gB) (the reverse triangle inequality) plus the norm row's own
// rounding. A norm that moved with its gradients passes; one that moved by
// more (an eps per rank, a group missed) fails, named as the norm.
Test(step, the_norm_is_judged_by_what_its_gradients_explain) {
    const double rtol = FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_NORM].rtol;
    size_t n = g_m.numel;
    A.s.has_norm = B.s.has_norm = 1;
    A.s.grad_norm = fc_grad_norm(A.grads, n, FC_NORM_2);
    double d = 2e-7;  // within the gradient row (3.6e-5 of the tensor's scale 8e-3: 2.9e-7)
    B.grads[5] = (float)(B.grads[5] + d);
    double dg = fabs((double)B.grads[5] - (double)A.grads[5]);  // what B's gradient really moved by
    cr_assert_gt(dg, 0);
    B.s.grad_norm = A.s.grad_norm + 0.99 * dg;  // moved with its gradient (bound: dg)
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect(R.pass, "a norm that moved with its gradients passes");
    B.s.grad_norm = A.s.grad_norm + dg + 2 * rtol * B.s.grad_norm;  // beyond both
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
    cr_expect_str_eq(R.first.tensor, "grad_norm", "the norm is named, the gradients pass");
    cr_expect_eq(R.kinds[FC_CMP_GRAD].n_failed, 0);
    // pytorch#149768's class on identical gradients: (G - 1) eps on a norm of 1
    memcpy(B.grads, A.grads, n * sizeof(float));
    A.s.grad_norm = 1.0;
    B.s.grad_norm = 1.0 + 1e-6;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass, "an eps of 1e-6 on a norm of 1 is beyond the norm's own rounding (rtol %g)", rtol);
    // an inf gradient on one side: the norm is not bounded by it (the gradients fail)
    B.grads[5] = INFINITY;
    B.s.grad_norm = INFINITY;
    compare_under(FC_STRATEGY_FULL_SHARD, 2);
    cr_expect_not(R.pass);
}

// ----------------------------------------------------------------------------
// large tensors: judged in blocks of FC_CMP_BLOCK elements on OpenMP threads
// (compare_model.h), with every sum added block by block in block order

static void blocks_setup(void) {
    static const int dims[] = {512, 300, 10};  // layers.0.weight: 300x512 = 153600 elements, 2.3 blocks
    use_mlp(dims, 3);
    make_set(&A, &g_m, &g_cfg);
    make_set(&B, &g_m, &g_cfg);
    fc_cmp_policy_defaults(&g_pol, FC_PREC_FP32);
    memset(&R, 0, sizeof R);
    g_optim = NULL;
    // gradients with every mantissa bit in use, and B a few ULPs away on every
    // element: sums of their squares round, so their order shows in the bits
    for (size_t i = 0; i < g_m.numel; i++) {
        A.grads[i] = (float)(1e-3 * sin(0.37 * (double)i));
        B.grads[i] = (float)((double)A.grads[i] * (1.0 + 3e-7 * cos(0.11 * (double)i)));
    }
}

TestSuite(blocks, .init = blocks_setup, .fini = step_teardown);

// Each compared tensor's statistics and the first divergence, at a thread count.
typedef struct {
    int pass, n;
    fc_cmp_tensor t[8];
    fc_cmp_divergence first;
} judged;

static judged judge_at(int threads) {
    omp_set_num_threads(threads);
    compare_kinds(FC_STRATEGY_FULL_SHARD, 2, FC_CMP_MASK(FC_CMP_GRAD));
    judged j;
    memset(&j, 0, sizeof j);
    j.pass = R.pass;
    j.n = R.n_tensors;
    cr_assert_leq(j.n, 8);
    memcpy(j.t, R.tensors, (size_t)j.n * sizeof *R.tensors);
    j.first = R.first;
    return j;
}

// With 1, 2 and 3 threads the statistics are the same bits, and the first
// element outside tolerance is the lowest index, even when a later block
// (the third, handled by another thread) finds its own first.
Test(blocks, a_large_tensors_verdict_and_figures_do_not_depend_on_the_thread_count) {
    const fc_param *w = param("layers.0.weight");
    cr_assert_gt(w->numel, 2 * (size_t)FC_CMP_BLOCK, "the tensor spans three blocks");
    judged base = judge_at(1);
    cr_expect(base.pass, "rounding-sized differences pass: %s", base.first.tensor);
    for (int t = 2; t <= 3; t++) {
        judged j = judge_at(t);
        cr_expect_eq(memcmp(&j, &base, sizeof j), 0, "%d threads: the same bits as 1", t);
    }
    B.grads[w->offset + 2 * FC_CMP_BLOCK + 5] += 1.0f;  // block 2
    B.grads[w->offset + FC_CMP_BLOCK + 7] += 1.0f;      // block 1: the first
    base = judge_at(1);
    cr_expect_not(base.pass);
    cr_expect_str_eq(base.first.tensor, "grad.layers.0.weight");
    cr_expect_eq(base.first.index, FC_CMP_BLOCK + 7, "the first bad element, not block 2's");
    for (int t = 2; t <= 3; t++) {
        judged j = judge_at(t);
        cr_expect_eq(memcmp(&j, &base, sizeof j), 0, "%d threads: the same bits as 1 (failing)", t);
        cr_expect_eq(j.first.index, FC_CMP_BLOCK + 7);
    }
    omp_set_num_threads(1);
}

// The projection and the norm allowance are sums too: the same bits at any
// thread count, and equal (to rounding) to the plain loop's.
Test(blocks, the_projection_and_the_norm_allowance_do_not_depend_on_the_thread_count) {
    size_t n = g_m.numel;
    double *allow = malloc(n * sizeof(double));
    cr_assert(allow);
    for (size_t i = 0; i < n; i++) allow[i] = 1e-9 * (double)(1 + i % 3);
    // differences of many significant bits: their squares' sum rounds
    for (size_t i = 0; i < n; i++) B.grads[i] = (float)((double)A.grads[i] * (1.0 + 1e-2 * cos(0.11 * (double)i)));
    fc_cmp_ctx c = {&g_m, &g_pol, &g_cfg, 2, NULL, NULL, 0, 0, 0, 0, 0};
    omp_set_num_threads(1);
    fc_cmp_proj p1 = fc_cmp_projection(&g_pol, 0, A.grads, B.grads, allow, 1e-8, n);
    double n1 = fc_cmp_norm_allowance(&c, A.grads, B.grads);
    double plain = 0;
    for (size_t i = 0; i < n; i++) plain += ((double)A.grads[i] - B.grads[i]) * ((double)A.grads[i] - B.grads[i]);
    cr_expect_float_eq(n1, sqrt(plain), 1e-12 * sqrt(plain), "the norm of the differences");
    cr_expect_gt(n1, 0);
    for (int t = 2; t <= 3; t++) {
        omp_set_num_threads(t);
        fc_cmp_proj p = fc_cmp_projection(&g_pol, 0, A.grads, B.grads, allow, 1e-8, n);
        double nt = fc_cmp_norm_allowance(&c, A.grads, B.grads);
        cr_expect_eq(memcmp(&p, &p1, sizeof p), 0, "%d threads: delta %.17g vs %.17g", t, p.delta, p1.delta);
        cr_expect_eq(memcmp(&nt, &n1, sizeof nt), 0, "%d threads: norm %.17g vs %.17g", t, nt, n1);
    }
    omp_set_num_threads(1);
    free(allow);
}
