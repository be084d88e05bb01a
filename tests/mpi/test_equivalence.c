// tests/mpi/test_equivalence.c — the numerical properties of an FSDP
// implementation (--impl, default the reference) at the communicator's W
// (docs/contract.md §8), every comparison through the one engine (oracle/props.h):
//   P1  local == no_shard, each divide mode == local     (tolerance)
//   P2  no_shard == full_shard == shard_grad_op          (bitwise in the reference)
//       == FSDP2's full_shard and shard_grad_op, and FSDP2's HSDP == FSDP1's
//       at every F (fsdp_version 2: per-parameter rows; bitwise in the reference)
//   P3  hybrid_shard(F) == full_shard                    (tolerance; F = W and
//       zero2 == hybrid bitwise in the reference)
//   P4  every prefetch setting == no prefetch            (bitwise in the reference)
//   P5  world-size invariance: W' = 1..W via sub-communicators, with empty shards
//   P6  K micro-batches (with and without no_sync) == one step on the joined batch
//   P8  clip_grad_norm: norm and clipped training == the local model's
//   P9  mixed precision: FSDP == DDP under the same policy (bitwise in the reference)
//   P12 the same run twice is bitwise identical (any implementation, as the sweep)
//   P14 cpu_offload == no offload (bitwise in the reference), memory moved to the host
//   P15 activation checkpointing, inside or outside the unit == none (bitwise,
//       any implementation) under FSDP1 and FSDP2, fp32 and bf16, K = 2, clipped
// and the gradient divide modes (docs/contract.md §4): the closed forms of
// fc_divide_factors / fc_predivide_factor at W = 1..8, and each mode (prepost,
// avg, sum-then-divide) under full_shard and no_shard against the local ground
// truth and against each other.
//
// The tested runs are the implementation under test (mt_run); the local
// ground truth is always the reference (mt_run_ref). "Bitwise" is a claim
// about the reference's canonical reductions: another implementation is
// judged by the default policy (compare.h), with the same-compute policy where
// both runs are its own at the same W on the same data split. Comparisons run
// on rank 0, which holds every step's full tensors.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "mpicheck.h"
#include "mpitest.h"

static int W, rank;

// The `local` ground truth of cfg (at this W): the reference on rank 0
// alone, while the others wait without spinning.
static void run_local(const fc_run_config *cfg, fc_run_config *lc, mt_result *r) {
    memset(r, 0, sizeof *r);
    *lc = fc_runner_local_of(*cfg, W);
    if (rank == 0) mt_run_ref(lc, MPI_COMM_SELF, r);
    fc_mpi_barrier(MPI_COMM_WORLD);
}

static void run(const fc_run_config *cfg, mt_result *r) { mt_run(cfg, MPI_COMM_WORLD, r); }

// Judges on rank 0 only: tested t (config tc) against expected e (config ec)
// over every step.
static void judge(fc_prop p, const char *what, const fc_run_config *tc, const mt_result *t, const fc_run_config *ec,
                  const mt_result *e, int bitwise, int same_compute) {
    if (rank != 0) return;
    mt_judge(&(mt_judgement){.p = p, .what = what, .tested = {tc, W, t, 0}, .expected = {ec, 0, e, 0},
                             .bitwise = bitwise, .same_compute = same_compute});
}

// P1 and P2, both optimizers
static void check_strategies(const char *model) {
    for (int opt = 0; opt < 2; opt++) {
        fc_run_config c = mt_config(model, FC_STRATEGY_NO_SHARD, W, 3), lc;
        if (opt) {  // SGD with momentum and weight decay: the other optimizer
            c.optim.kind = FC_OPT_SGD;
            c.optim.lr = 0.05;
            c.optim.weight_decay = 0.01;
        }
        const char *o = fc_opt_name(c.optim.kind);
        mt_result local, ddp, zero3, zero2;
        run_local(&c, &lc, &local);
        run(&c, &ddp);
        fc_run_config c3 = c, c2 = c;
        c3.strategy = FC_STRATEGY_FULL_SHARD;
        run(&c3, &zero3);
        c2.strategy = FC_STRATEGY_SHARD_GRAD_OP;
        run(&c2, &zero2);
        char what[160];
        snprintf(what, sizeof what, "local (no_shard W=%d, %s)", W, o);
        judge(FC_P1_LOCAL, what, &c, &ddp, &lc, &local, MT_POLICY, 0);
        snprintf(what, sizeof what, "no_shard (full_shard W=%d, %s)", W, o);
        judge(FC_P2_NO_SHARD, what, &c3, &zero3, &c, &ddp, MT_BITWISE_REF, 1);
        snprintf(what, sizeof what, "no_shard (shard_grad_op W=%d, %s)", W, o);
        judge(FC_P2_NO_SHARD, what, &c2, &zero2, &c, &ddp, MT_BITWISE_REF, 1);
        mt_result_free(&local), mt_result_free(&ddp), mt_result_free(&zero3), mt_result_free(&zero2);
    }
}

// Frozen parameters (docs/contract.md §2) beside trainable ones in a unit: the local
// model (which never touches them) against DDP, and every FSDP1 and FSDP2
// strategy against DDP bit for bit, with decay and clipping on, so a frozen
// element that is decayed, normed or stepped anywhere shows (the comparison
// judges frozen tensors exactly). An implementation without FC_IMPL_FREEZE
// skips it.
// With lora (R:ALPHA:REGEX instead of a freeze), the same for LoRA adapters
// on a frozen base model, whose root unit then trains nothing.
static void check_frozen(const char *model, const char *freeze, const char *lora) {
    if (!(mt_impl()->features & FC_IMPL_FREEZE)) return;
    for (int opt = 0; opt < 2; opt++) {
        fc_run_config d = mt_config(model, FC_STRATEGY_NO_SHARD, W, 3), lc;
        fc_error e;
        if (lora && fc_model_config_set_lora(&d.model, lora, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
        if (lora) freeze = lora;  // for the messages
        else snprintf(d.freeze, sizeof d.freeze, "%s", freeze);
        d.clip_grad_norm = 0.05f;  // below the tiny models' norms: every step clips
        if (opt) d.optim.kind = FC_OPT_SGD, d.optim.lr = 0.05, d.optim.weight_decay = 0.01;
        mt_result local, ddp;
        run_local(&d, &lc, &local);
        run(&d, &ddp);
        char what[200];
        const char *flag = lora ? "--lora" : "--freeze";
        snprintf(what, sizeof what, "local (no_shard W=%d, %s, %s %s)", W, fc_opt_name(d.optim.kind), flag, freeze);
        judge(FC_P1_LOCAL, what, &d, &ddp, &lc, &local, MT_POLICY, 0);
        d.divide = FC_DIVIDE_AVG;  // FSDP2's: one divide for both layouts, so they agree bit for bit
        mt_result_free(&ddp);
        run(&d, &ddp);
        const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
        for (int v = 1; v <= 2; v++)
            for (int si = 0; si < 2; si++) {
                fc_run_config c = d;
                c.strategy = strategies[si];
                c.fsdp_version = v;
                mt_result r;
                run(&c, &r);
                snprintf(what, sizeof what, "no_shard (FSDP%d %s W=%d, %s, %s %s)", v, fc_strategy_name(c.strategy), W,
                         fc_opt_name(d.optim.kind), flag, freeze);
                judge(FC_P2_NO_SHARD, what, &c, &r, &d, &ddp, MT_BITWISE_REF, 1);
                mt_result_free(&r);
            }
        mt_result_free(&local), mt_result_free(&ddp);
    }
}

// Runs tc and ec and judges tc against ec under property p, bitwise in the reference.
static void run_and_judge_bitwise(int p, const char *what, const fc_run_config *tc, const fc_run_config *ec) {
    mt_result t, e;
    run(tc, &t);
    run(ec, &e);
    judge(p, what, tc, &t, ec, &e, MT_BITWISE_REF, 1);
    mt_result_free(&t), mt_result_free(&e);
}

// P2 for FSDP2 (docs/contract.md §5): fully_shard's per-parameter rows train as FSDP1
// and DDP do, bit for bit in the reference, under FSDP2's own divide (AVG)
// and with clipping (the exact norm makes the layouts' different partials
// agree), in fp32 and in bf16; HSDP against FSDP1's HSDP at each F dividing W.
static void check_fsdp2(const char *model) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
        fc_run_config d = mt_config(model, FC_STRATEGY_NO_SHARD, W, 3);
        d.divide = FC_DIVIDE_AVG;
        d.clip_grad_norm = 0.05f;  // below the tiny models' norms (about 0.8): every step clips
        if (bf16) d.param_dtype = d.reduce_dtype = FC_PREC_BF16;
        const char *pd = fc_prec_name(d.param_dtype);
        mt_result ddp;
        run(&d, &ddp);
        char what[160];
        // the third: full_shard with explicit forward prefetch lists (each unit
        // the next); the fourth with lists of the next two units in both passes
        const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_FULL_SHARD,
                                          FC_STRATEGY_FULL_SHARD};
        for (int si = 0; si < 4; si++) {
            fc_run_config c = d;
            c.strategy = strategies[si];
            c.fsdp_version = 2;
            c.forward_prefetch = si == 2 ? 1 : si == 3 ? 2 : 0;
            c.backward_prefetch_depth = si == 3 ? 2 : 0;
            mt_result r;
            run(&c, &r);
            snprintf(what, sizeof what, "no_shard (FSDP2 %s%s W=%d, %s)", fc_strategy_name(c.strategy),
                     si == 2 ? " forward prefetch list" : si == 3 ? " prefetch lists of 2" : "", W, pd);
            judge(FC_P2_NO_SHARD, what, &c, &r, &d, &ddp, MT_BITWISE_REF, 1);
            mt_result_free(&r);
        }
        // an integer reshard_after_forward R: backward rebuilds each unit from
        // the slices kept after forward within groups of R ranks
        for (int R = 2; R < W; R++) {
            if (W % R) continue;
            fc_run_config c = d;
            c.strategy = FC_STRATEGY_FULL_SHARD;
            c.fsdp_version = 2;
            c.reshard_after_forward = R;
            c.grad_accum = 2;  // each micro-batch's backward from its own forward's slices
            fc_run_config dk = d;
            dk.grad_accum = 2;
            snprintf(what, sizeof what, "no_shard (FSDP2 full_shard reshard_after_forward=%d W=%d K=2, %s)", R, W, pd);
            run_and_judge_bitwise(2, what, &c, &dk);
        }
        for (int F = 2; F < W; F++) {
            if (W % F) continue;
            fc_run_config h1 = d, h2;
            h1.strategy = FC_STRATEGY_HYBRID_SHARD;
            h1.shard_group = F;
            h2 = h1;
            h2.fsdp_version = 2;
            snprintf(what, sizeof what, "FSDP1 hybrid_shard (FSDP2 hybrid_shard F=%d W=%d, %s)", F, W, pd);
            run_and_judge_bitwise(2, what, &h2, &h1);
        }
        mt_result_free(&ddp);
    }
}

// FSDP2's set_gradient_divide_factor F (on every unit): the reduction divides
// by F where it divides by W, so the gradient is W / F times the mean. F = 2W,
// and 1 at W > 1, under avg (FSDP2's), sum-then-divide (force-sum) and, with
// fp16 reduction, pre/post from F: FSDP2 full_shard == DDP with the same F,
// bitwise (P2); == local with F / W (P1, fp32); the same run without F
// disagrees (the factor is applied, not dropped).
static void check_gradient_divide_factor(const char *model) {
    const double factors[2] = {2.0 * W, 1.0};
    for (int fi = 0; fi < (W > 1 ? 2 : 1); fi++)
        for (int mode = 0; mode < 3; mode++) {
            fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2), dc, lc;
            c.fsdp_version = 2;
            c.gradient_divide_factor = factors[fi];
            if (mode == 2) c.param_dtype = c.reduce_dtype = FC_PREC_FP16;
            c.divide = mode == 1 ? FC_DIVIDE_SUM_THEN_DIVIDE : fc_default_divide(&c);
            dc = c;
            dc.strategy = FC_STRATEGY_NO_SHARD;
            dc.fsdp_version = 1;
            mt_result r, ddp, local;
            run(&c, &r);
            run(&dc, &ddp);
            char what[160];
            snprintf(what, sizeof what, "no_shard with the same factor (FSDP2 full_shard W=%d F=%g --divide %s, %s)", W,
                     c.gradient_divide_factor, fc_divide_name(c.divide), fc_prec_name(c.param_dtype));
            judge(FC_P2_NO_SHARD, what, &c, &r, &dc, &ddp, MT_BITWISE_REF, 1);
            if (mode != 2) {
                run_local(&c, &lc, &local);
                snprintf(what, sizeof what, "local with F / W = %g (FSDP2 full_shard W=%d F=%g --divide %s)",
                         lc.gradient_divide_factor, W, c.gradient_divide_factor, fc_divide_name(c.divide));
                judge(FC_P1_LOCAL, what, &c, &r, &lc, &local, MT_POLICY, 0);
                if (rank == 0) {
                    fc_run_config plain = lc;
                    plain.gradient_divide_factor = 0;
                    mt_result unscaled;
                    mt_run_ref(&plain, MPI_COMM_SELF, &unscaled);
                    char detail[400];
                    mt_judgement j = {.p = FC_P1_LOCAL, .what = what, .tested = {&c, W, &r, 0},
                                      .expected = {&plain, 0, &unscaled, 0}, .n = 1, .bitwise = MT_POLICY};
                    MT_CHECK(!mt_agrees(&j, detail, sizeof detail),
                             "FSDP2 W=%d F=%g agrees with local without the factor: the factor changed nothing", W,
                             c.gradient_divide_factor);
                    mt_result_free(&unscaled);
                }
                fc_mpi_barrier(MPI_COMM_WORLD);
                mt_result_free(&local);
            }
            mt_result_free(&r);
            mt_result_free(&ddp);
        }
}

// P3: every shard-group size F dividing W
static void check_hybrid(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2);
    mt_result zero3;
    run(&c, &zero3);
    int n = 0;
    for (int F = 1; F <= W; F++) {
        if (W % F) continue;  // not a shard group of W: not a configuration
        n++;
        mt_result hs, hs2;
        fc_run_config h = c, h2 = c;
        h.strategy = FC_STRATEGY_HYBRID_SHARD;
        h.shard_group = F;
        run(&h, &hs);
        h2.strategy = FC_STRATEGY_HYBRID_SHARD_ZERO2;
        h2.shard_group = F;
        run(&h2, &hs2);
        char what[128];
        snprintf(what, sizeof what, "full_shard (hybrid_shard F=%d W=%d)", F, W);
        // F = W is full_shard's reduction exactly
        judge(FC_P3_HYBRID, what, &h, &hs, &c, &zero3, F == W ? MT_BITWISE_REF : MT_POLICY, 1);
        snprintf(what, sizeof what, "hybrid_shard (hybrid_shard_zero2 F=%d W=%d)", F, W);
        judge(FC_P3_HYBRID, what, &h2, &hs2, &h, &hs, MT_BITWISE_REF, 1);
        mt_result_free(&hs), mt_result_free(&hs2);
    }
    MT_CHECK(n >= 1, "P3: no shard group checked at W=%d", W);
    mt_result_free(&zero3);
}

// P4: all prefetch settings against no prefetch
static void check_prefetch(const char *model) {
    const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_HYBRID_SHARD};
    for (int si = 0; si < 3; si++) {
        fc_run_config c = mt_config(model, strategies[si], W, 2);
        if (strategies[si] == FC_STRATEGY_HYBRID_SHARD) {
            if (W % 2 || W < 4) {
                mt_skip("P4 %s hybrid_shard prefetch at W=%d: needs an even W >= 4 for a shard group of W/2 >= 2 "
                        "with 2 or more replicas",
                        model, W);
                continue;
            }
            c.shard_group = W / 2;
        }
        mt_result base;
        run(&c, &base);
        for (int bp = 0; bp < 3; bp++)
            for (int fp = 0; fp < 2; fp++)
                for (int lim = 0; lim < 2; lim++) {
                    if (bp == 0 && fp == 0) continue;  // the baseline itself, and the limiter without a prefetch
                    fc_run_config p = c;
                    p.backward_prefetch = (fc_prefetch)bp;
                    p.forward_prefetch = fp;
                    p.limit_all_gathers = lim;
                    mt_result r;
                    run(&p, &r);
                    char what[160];
                    snprintf(what, sizeof what, "no prefetch (%s W=%d backward_prefetch=%s forward_prefetch=%d limit=%d)",
                             fc_strategy_name(p.strategy), W, fc_prefetch_name(p.backward_prefetch), fp, lim);
                    judge(FC_P4_PREFETCH, what, &p, &r, &c, &base, MT_BITWISE_REF, 1);
                    mt_result_free(&r);
                }
        mt_result_free(&base);
    }
}

// P6: gradient accumulation
static void check_accumulation(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2), c2 = c, lc2;
    mt_result one, local2;
    run(&c, &one);
    c2.grad_accum = 2;
    run_local(&c2, &lc2, &local2);
    for (int ns = 0; ns < 2; ns++) {
        fc_run_config a = c2, d;
        a.no_sync = ns;
        d = a;
        d.strategy = FC_STRATEGY_NO_SHARD;
        mt_result acc, acc_ddp;
        run(&a, &acc);
        run(&d, &acc_ddp);
        const char *tag = ns ? " no_sync" : "";
        char what[128];
        snprintf(what, sizeof what, "K=1 (full_shard W=%d K=2%s)", W, tag);
        judge(FC_P6_ACCUMULATION, what, &a, &acc, &c, &one, MT_POLICY, 0);
        snprintf(what, sizeof what, "local K=2 (full_shard W=%d K=2%s)", W, tag);
        judge(FC_P6_ACCUMULATION, what, &a, &acc, &lc2, &local2, MT_POLICY, 0);
        snprintf(what, sizeof what, "no_shard K=2%s (full_shard W=%d K=2%s)", tag, W, tag);
        judge(FC_P2_NO_SHARD, what, &a, &acc, &d, &acc_ddp, MT_BITWISE_REF, 1);
        mt_result_free(&acc), mt_result_free(&acc_ddp);
    }
    mt_result_free(&one), mt_result_free(&local2);
}

// P8: clip_grad_norm against the local model, every norm type. The engine
// compares the total norm of every step too.
static void check_clip(const char *model) {
    for (int nt = 0; nt < 3; nt++) {
        fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2), lc, d;
        c.norm_type = (fc_norm_type)nt;
        c.clip_grad_norm = nt == FC_NORM_1 ? 0.5f : 0.02f;  // below every measured norm: clipping is active
        d = c;
        d.strategy = FC_STRATEGY_NO_SHARD;
        mt_result local, zero3, ddp;
        run_local(&c, &lc, &local);
        run(&c, &zero3);
        run(&d, &ddp);
        char what[128];
        snprintf(what, sizeof what, "local (clip norm_type=%s, full_shard W=%d)", fc_norm_name(c.norm_type), W);
        judge(FC_P8_CLIP, what, &c, &zero3, &lc, &local, MT_POLICY, 0);
        snprintf(what, sizeof what, "no_shard (clip norm_type=%s, full_shard W=%d)", fc_norm_name(c.norm_type), W);
        judge(FC_P8_CLIP, what, &c, &zero3, &d, &ddp, MT_BITWISE_REF, 1);
        if (rank == 0 && local.ok)
            for (int t = 0; t < c.steps; t++)
                MT_CHECK(local.step[t].norm > c.clip_grad_norm,
                         "P8 %s: norm %.6g does not exceed max_norm %.3g at step %d: not clipping", model,
                         local.step[t].norm, (double)c.clip_grad_norm, t);
        mt_result_free(&local), mt_result_free(&zero3), mt_result_free(&ddp);
    }
}

// P9: mixed precision, FSDP == DDP under the same policy
static void check_mixed_precision(const char *model) {
    const fc_prec pol[][2] = {{FC_PREC_BF16, FC_PREC_FP32}, {FC_PREC_BF16, FC_PREC_BF16}, {FC_PREC_FP16, FC_PREC_FP16}};
    fc_run_config c32 = mt_config(model, FC_STRATEGY_NO_SHARD, W, 2);
    mt_result fp32;
    run(&c32, &fp32);
    for (int i = 0; i < 3; i++) {
        fc_run_config d = c32, f3, f2;
        d.param_dtype = pol[i][0];
        d.reduce_dtype = pol[i][1];
        f3 = f2 = d;
        f3.strategy = FC_STRATEGY_FULL_SHARD;
        f2.strategy = FC_STRATEGY_SHARD_GRAD_OP;
        mt_result ddp, zero3, zero2;
        run(&d, &ddp);
        run(&f3, &zero3);
        run(&f2, &zero2);
        char what[128];
        snprintf(what, sizeof what, "no_shard (full_shard W=%d param=%s reduce=%s)", W, fc_prec_name(d.param_dtype),
                 fc_prec_name(d.reduce_dtype));
        judge(FC_P9_MIXED_PRECISION, what, &f3, &zero3, &d, &ddp, MT_BITWISE_REF, 1);
        snprintf(what, sizeof what, "no_shard (shard_grad_op W=%d param=%s reduce=%s)", W,
                 fc_prec_name(d.param_dtype), fc_prec_name(d.reduce_dtype));
        judge(FC_P9_MIXED_PRECISION, what, &f2, &zero2, &d, &ddp, MT_BITWISE_REF, 1);
        if (rank == 0 && ddp.ok && fp32.ok) {  // the policy must change the numbers, or the flag did nothing
            int last = ddp.steps - 1;
            int differs = memcmp(ddp.step[last].params, fp32.step[last].params, ddp.numel * sizeof(float)) != 0;
            MT_CHECK(differs, "P9 %s param=%s: mixed precision gave the fp32 result bitwise", model,
                     fc_prec_name(d.param_dtype));
        }
        mt_result_free(&ddp), mt_result_free(&zero3), mt_result_free(&zero2);
    }
    mt_result_free(&fp32);
}

// P12 and P14
static void check_determinism_offload(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2);
    c.forward_prefetch = 1;
    c.backward_prefetch = FC_PREFETCH_PRE;
    mt_result a, b;
    run(&c, &a);
    run(&c, &b);
    // determinism is bitwise for any implementation (docs/contract.md §8), as in the sweep
    if (rank == 0)
        mt_judge(&(mt_judgement){.p = FC_P12_DETERMINISM, .what = "itself (full_shard, prefetch)",
                                 .tested = {&c, W, &b, 0}, .expected = {&c, 0, &a, 0},
                                 .bitwise = MT_BITWISE_ANY, .same_compute = 1});
    // offload under accumulation and clipping too, where the optimizer and the
    // reduced gradient shards live on the host
    fc_run_config on = c, off;
    on.grad_accum = 2;
    on.clip_grad_norm = 0.02f;
    off = on;
    off.cpu_offload = 1;
    mt_result ron, roff;
    run(&on, &ron);
    run(&off, &roff);
    char what[96];
    snprintf(what, sizeof what, "no offload (cpu_offload, full_shard W=%d K=2 clipped)", W);
    judge(FC_P14_CPU_OFFLOAD, what, &off, &roff, &on, &ron, MT_BITWISE_REF, 1);
    mt_result_free(&ron);
    MT_CHECK(roff.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD] == 0 &&
                 roff.mem.peak[FC_LOC_HOST][FC_MEM_PARAM_SHARD] == a.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD],
             "P14 %s: parameter shards not moved to the host (device %zu, host %zu)", model,
             roff.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD], roff.mem.peak[FC_LOC_HOST][FC_MEM_PARAM_SHARD]);
    MT_CHECK(roff.mem.peak[FC_LOC_HOST][FC_MEM_OPTIM_STATE] == a.mem.peak[FC_LOC_DEVICE][FC_MEM_OPTIM_STATE],
             "P14 %s: optimizer state not moved to the host", model);
    mt_result_free(&a), mt_result_free(&b), mt_result_free(&roff);
}

// P15: the recompute computes the same activations from the same parameters
// and micro-batch, so checkpointing changes no bit (docs/contract.md §5), for any
// implementation (as the sweep judges it). Ports without it (core/impl.h
// features) are not asked.
static void check_act_ckpt(const char *model) {
    if (!(mt_impl()->features & FC_IMPL_ACT_CKPT)) return;
    struct {
        fc_strategy s;
        int version;
    } cs[] = {{FC_STRATEGY_FULL_SHARD, 1}, {FC_STRATEGY_SHARD_GRAD_OP, 1}, {FC_STRATEGY_HYBRID_SHARD, 1},
              {FC_STRATEGY_NO_SHARD, 1},   {FC_STRATEGY_FULL_SHARD, 2}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            fc_run_config c = mt_config(model, cs[i].s, W, 2);
            c.fsdp_version = cs[i].version;
            c.grad_accum = 2;
            c.clip_grad_norm = 0.05f;
            if (cs[i].s == FC_STRATEGY_HYBRID_SHARD) c.shard_group = W % 2 == 0 ? W / 2 : W;
            if (cs[i].s == FC_STRATEGY_FULL_SHARD && cs[i].version == 1) c.backward_prefetch = FC_PREFETCH_POST;
            if (bf16) c.param_dtype = c.reduce_dtype = FC_PREC_BF16;
            c.divide = fc_default_divide(&c);
            mt_result none;
            run(&c, &none);
            for (int a = FC_ACT_CKPT_INSIDE; a <= FC_ACT_CKPT_OUTSIDE; a++) {
                fc_run_config ca = c;
                ca.act_ckpt = (fc_act_ckpt)a;
                mt_result r;
                run(&ca, &r);
                char what[160];
                snprintf(what, sizeof what, "no checkpointing (%s, FSDP%d %s W=%d K=2, %s)",
                         fc_act_ckpt_name(ca.act_ckpt), c.fsdp_version, fc_strategy_name(c.strategy), W,
                         fc_prec_name(c.param_dtype));
                if (rank == 0)
                    mt_judge(&(mt_judgement){.p = FC_P15_ACT_CKPT, .what = what, .tested = {&ca, W, &r, 0},
                                             .expected = {&c, 0, &none, 0}, .bitwise = MT_BITWISE_ANY,
                                             .same_compute = 1});
                mt_result_free(&r);
            }
            mt_result_free(&none);
        }
}

// ---------------------------------------------------------------------------
// divide modes (docs/contract.md §4)

// (a) the closed forms: FSDP1's factor (torch.distributed.fsdp
// _get_gradient_predivide_factor) doubles f while W % f == 0 and W / f > f, so
// it need not divide W: at W = 6 it goes 1 -> 2 -> 4 (6 % 2 == 0, 6 / 2 > 2)
// and stops there, pre 4, post 1.5.
static void check_divide_factors(void) {
    if (rank != 0) return;
    //                           W = 1  2  3  4  5  6  7  8
    static const double pre[9] = {0, 1, 2, 2, 2, 2, 4, 2, 4};
    for (int w = 1; w <= 8; w++) {
        MT_CHECK(fc_predivide_factor(w) == pre[w], "fc_predivide_factor(%d) = %g, want %g", w, fc_predivide_factor(w),
                 pre[w]);
        double a, b;
        fc_divide_factors(FC_DIVIDE_PREPOST, w, &a, &b);
        MT_CHECK(a == pre[w] && b == (double)w / pre[w], "prepost W=%d: pre %g post %g, want %g and %g", w, a, b,
                 pre[w], (double)w / pre[w]);
        MT_CHECK(a * b == (double)w, "prepost W=%d: pre * post = %g, not W", w, a * b);
        fc_divide_factors(FC_DIVIDE_AVG, w, &a, &b);
        MT_CHECK(a == (double)w && b == 1.0, "avg W=%d: pre %g post %g, want %d and 1", w, a, b, w);
        fc_divide_factors(FC_DIVIDE_SUM_THEN_DIVIDE, w, &a, &b);
        MT_CHECK(a == 1.0 && b == (double)w, "sum-then-divide W=%d: pre %g post %g, want 1 and %d", w, a, b, w);
    }
    // the documented examples, spelled out
    double a, b;
    fc_divide_factors(FC_DIVIDE_PREPOST, 3, &a, &b);
    MT_CHECK(a == 2.0 && b == 1.5, "prepost W=3: %g, %g (want 2, 1.5)", a, b);
    fc_divide_factors(FC_DIVIDE_PREPOST, 6, &a, &b);
    MT_CHECK(a == 4.0 && b == 1.5, "prepost W=6: %g, %g (want 4, 1.5, as PyTorch)", a, b);
    fc_divide_factors(FC_DIVIDE_PREPOST, 2, &a, &b);
    MT_CHECK(a == 2.0 && b == 1.0, "prepost W=2: %g, %g (want 2, 1)", a, b);
    fc_divide_factors(FC_DIVIDE_PREPOST, 8, &a, &b);
    MT_CHECK(a == 4.0 && b == 2.0, "prepost W=8: %g, %g (want 4, 2)", a, b);
}

// (b) each mode under full_shard and no_shard at this W: the local ground
// truth (P1), and the modes against each other (one average, different
// roundings: the same implementation at the same W, so the same-compute policy).
static void check_divide_modes(const char *model) {
    fc_run_config base = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 3), lc;
    mt_result local;
    run_local(&base, &lc, &local);
    const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_NO_SHARD};
    for (int si = 0; si < 2; si++) {
        fc_run_config c[3];
        mt_result r[3];
        for (int d = 0; d < 3; d++) {
            c[d] = base;
            c[d].strategy = strategies[si];
            c[d].divide = (fc_divide)d;
            run(&c[d], &r[d]);
            char what[128];
            snprintf(what, sizeof what, "local (%s W=%d --divide %s)", fc_strategy_name(c[d].strategy), W,
                     fc_divide_name(c[d].divide));
            judge(FC_P1_LOCAL, what, &c[d], &r[d], &lc, &local, MT_POLICY, 0);
        }
        for (int d = 1; d < 3; d++) {
            char what[128];
            snprintf(what, sizeof what, "--divide prepost (%s W=%d --divide %s)", fc_strategy_name(c[d].strategy), W,
                     fc_divide_name(c[d].divide));
            // at W = 1 every factor is 1: the same bits
            judge(FC_P1_LOCAL, what, &c[d], &r[d], &c[0], &r[0], W == 1 ? MT_BITWISE_REF : MT_POLICY, 1);
        }
        for (int d = 0; d < 3; d++) mt_result_free(&r[d]);
    }
    mt_result_free(&local);
}

// P5: world-size invariance over sub-communicators W' = 1..W, on a model
// small enough that some units have fewer elements than ranks (empty shards).
static void check_world_sizes(const fc_model_config *mc) {
    int B = 1;
    for (int w = 2; w <= W; w++) {  // lcm(1..W): every W' divides the global batch
        int a = B, b = w;
        while (b) {
            int t = a % b;
            a = b, b = t;
        }
        B = B / a * w;
    }
    fc_run_config c = mt_config("mlp-tiny", FC_STRATEGY_FULL_SHARD, 1, 2), lc;
    c.model = *mc;
    c.global_batch = B;
    mt_result local;
    run_local(&c, &lc, &local);
    // which W' give some rank a shard of padding only (S = ceil(N / W'), (W' - 1) S >= N)
    fc_model m;
    fc_model_build(&m, mc);
    char empty[64] = "";
    for (int w = 2; w <= W; w++)
        for (int u = 0; u < m.n_units; u++) {
            size_t N = m.units[u].numel, S = (N + (size_t)w - 1) / (size_t)w;
            if ((size_t)(w - 1) * S < N) continue;
            size_t k = strlen(empty);
            snprintf(empty + k, sizeof empty - k, "%s%d", k ? "," : "", w);
            break;
        }
    fc_model_free(&m);
    if (empty[0]) {
        if (rank == 0) printf("P5 %s: empty shards at W'=%s\n", mc->name, empty);
    } else {
        mt_skip("P5 %s: no W' <= %d leaves a rank with padding only (empty shards are covered at larger W)", mc->name,
                W);
    }
    for (int w = 1; w <= W; w++) {
        MPI_Comm sub;
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, rank < w ? 0 : MPI_UNDEFINED, rank, &sub));
        if (sub != MPI_COMM_NULL) {  // ranks >= w wait below
            mt_result r;
            mt_run(&c, sub, &r);
            if (rank == 0) {
                char what[96];
                snprintf(what, sizeof what, "local (full_shard W'=%d B=%d)", w, B);
                mt_judge(&(mt_judgement){.p = FC_P5_WORLD_SIZE, .what = what, .tested = {&c, w, &r, 0},
                                         .expected = {&lc, 0, &local, 0}, .bitwise = MT_POLICY});
            }
            mt_result_free(&r);
            mpiCheck(MPI_Comm_free(&sub));
        }
        fc_mpi_barrier(MPI_COMM_WORLD);
    }
    mt_result_free(&local);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    check_divide_factors();
    const char *models[] = {"mlp-tiny", "gpt2-tiny"};
    for (int i = 0; i < 2; i++) {
        check_strategies(models[i]);
        check_fsdp2(models[i]);
        check_gradient_divide_factor(models[i]);
        check_divide_modes(models[i]);
        check_hybrid(models[i]);
        check_prefetch(models[i]);
        check_accumulation(models[i]);
        check_clip(models[i]);
        check_mixed_precision(models[i]);
        check_determinism_offload(models[i]);
        check_act_ckpt(models[i]);
    }
    check_frozen("gpt2-tiny", "wte|ln_1|c_fc[.]bias", NULL);  // the tied embedding: both gradient paths dropped
    check_frozen("gpt2-tiny", "transformer[.](wte|wpe|ln_f)", NULL);  // a root unit that trains nothing
    check_frozen("mlp-tiny", "bias", NULL);
    // llama's own layers (RMSNorm, RoPE, GQA, SwiGLU, an untied head) under the
    // same bitwise equalities of sharding, FSDP2, mixed precision and
    // checkpointing; an implementation without the model skips them
    if (mt_impl()->features & FC_IMPL_LLAMA) {
        check_strategies("llama-tiny");
        check_fsdp2("llama-tiny");
        check_mixed_precision("llama-tiny");
        check_act_ckpt("llama-tiny");
        check_frozen("llama-tiny", "embed_tokens|q_proj|v_proj", NULL);
        check_frozen("llama-tiny", NULL, "4:8:[qv]_proj");
    }
    // 3 -> 2 -> 2: units of 8 and 6 elements, so from W = 4 some ranks own only padding
    fc_model_config micro = {0};
    micro.kind = FC_MODEL_MLP;
    snprintf(micro.name, sizeof micro.name, "mlp-micro");
    micro.n_layers = 2;
    micro.dims[0] = 3, micro.dims[1] = 2, micro.dims[2] = 2;
    check_world_sizes(&micro);
    fc_model_config g;
    fc_error e;
    if (fc_model_config_load("gpt2-tiny", &g, &e) == 0) check_world_sizes(&g);
    else MT_CHECK(0, "gpt2-tiny: %s", e.msg);
    return mt_finalize();
}
