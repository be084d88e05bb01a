// tests/mpi/test_equivalence.c — the numerical properties of the reference
// FSDP engine at the communicator's W (DESIGN §8):
//   P1  local == no_shard                              (tolerance)
//   P2  no_shard == full_shard == shard_grad_op        (bitwise)
//   P3  hybrid_shard(F) == full_shard                  (tolerance); zero2 == hybrid (bitwise)
//   P4  every prefetch setting == no prefetch          (bitwise)
//   P5  world-size invariance: W' = 1..W via sub-communicators, with empty shards
//   P6  K micro-batches (with and without no_sync) == one step on the joined batch
//   P8  clip_grad_norm: norm and clipped training == the local model's
//   P9  mixed precision: FSDP == DDP under the same policy (bitwise)
//   P12 the same run twice is bitwise identical
//   P14 cpu_offload == no offload (bitwise), with the memory moved to the host
// Comparisons happen on rank 0, where the harness gathers full tensors.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "mpitest.h"

static int W, rank;

// Tolerances for comparisons whose reduction order differs (fp32): PyTorch's
// assert_close defaults, rtol 1.3e-6 / atol 1e-5, for loss, gradients,
// parameters and optimizer state alike. Measured at W = 1..4 over this
// file's cases: gradients differ by at most ~1e-9, parameters by at most
// 3.7e-6 after 3 AdamW steps (an element whose gradient is tiny: AdamW's
// m / sqrt(v) normalisation turns its last-bit gradient differences into
// update differences of a few lr * 1e-3).
#define RTOL 1.3e-6
#define ATOL 1e-5
#define PARAM_ATOL ATOL

static void compare(const char *what, const fc_run_config *cfg, const mt_result *a, const mt_result *b,
                    int bitwise) {
    if (rank != 0) return;
    fc_model m;
    fc_model_build(&m, &cfg->model);
    char name[512];
    snprintf(name, sizeof name, "%s [%s] grads", what, cfg->model.name);
    mt_compare(name, &m, a->grads, b->grads, bitwise, RTOL, ATOL);
    snprintf(name, sizeof name, "%s [%s] params", what, cfg->model.name);
    mt_compare(name, &m, a->params, b->params, bitwise, RTOL, PARAM_ATOL);
    for (int i = 0; i < a->n_state && i < b->n_state; i++) {
        snprintf(name, sizeof name, "%s [%s] optimizer state %d", what, cfg->model.name, i);
        mt_compare(name, &m, a->state[i], b->state[i], bitwise, RTOL, ATOL);
    }
    for (int t = 0; t < a->steps && t < b->steps; t++) {
        int same = bitwise ? memcmp(&a->loss[t], &b->loss[t], sizeof(float)) == 0
                           : fabs((double)a->loss[t] - b->loss[t]) <= ATOL + RTOL * fabs((double)b->loss[t]);
        MT_CHECK(same, "%s [%s] loss at step %d: %.9g vs %.9g", what, cfg->model.name, t, (double)a->loss[t],
                 (double)b->loss[t]);
    }
    fc_model_free(&m);
}

// The `local` ground truth of cfg, on rank 0 alone.
static void run_local(fc_run_config cfg, mt_result *r) {
    memset(r, 0, sizeof *r);
    cfg.strategy = FC_STRATEGY_LOCAL;
    cfg.shard_group = 0;
    cfg.backward_prefetch = FC_PREFETCH_NONE;
    cfg.forward_prefetch = cfg.limit_all_gathers = cfg.no_sync = cfg.cpu_offload = 0;
    if (rank == 0) mt_run(&cfg, MPI_COMM_SELF, r);
}

static void run(const fc_run_config *cfg, mt_result *r) { mt_run(cfg, MPI_COMM_WORLD, r); }

// P1 and P2
static void check_strategies(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_NO_SHARD, W, 3);
    mt_result local, ddp, zero3, zero2;
    run_local(c, &local);
    run(&c, &ddp);
    c.strategy = FC_STRATEGY_FULL_SHARD;
    run(&c, &zero3);
    c.strategy = FC_STRATEGY_SHARD_GRAD_OP;
    run(&c, &zero2);
    compare("P1 no_shard vs local", &c, &ddp, &local, 0);
    compare("P2 full_shard vs no_shard", &c, &zero3, &ddp, 1);
    compare("P2 shard_grad_op vs no_shard", &c, &zero2, &ddp, 1);
    // SGD with momentum through the same strategies (the other optimizer)
    c.optim.kind = FC_OPT_SGD;
    c.optim.lr = 0.05;
    c.optim.weight_decay = 0.01;
    mt_result s_local, s_ddp, s_zero3;
    run_local(c, &s_local);
    c.strategy = FC_STRATEGY_NO_SHARD;
    run(&c, &s_ddp);
    c.strategy = FC_STRATEGY_FULL_SHARD;
    run(&c, &s_zero3);
    compare("P1 sgd no_shard vs local", &c, &s_ddp, &s_local, 0);
    compare("P2 sgd full_shard vs no_shard", &c, &s_zero3, &s_ddp, 1);
    mt_result_free(&local), mt_result_free(&ddp), mt_result_free(&zero3), mt_result_free(&zero2);
    mt_result_free(&s_local), mt_result_free(&s_ddp), mt_result_free(&s_zero3);
}

// P3: every shard-group size F dividing W
static void check_hybrid(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2);
    mt_result zero3;
    run(&c, &zero3);
    for (int F = 1; F <= W; F++) {
        if (W % F) continue;
        mt_result hs, hs2;
        c.strategy = FC_STRATEGY_HYBRID_SHARD;
        c.shard_group = F;
        run(&c, &hs);
        c.strategy = FC_STRATEGY_HYBRID_SHARD_ZERO2;
        run(&c, &hs2);
        char what[96];
        snprintf(what, sizeof what, "P3 hybrid_shard(F=%d) vs full_shard", F);
        compare(what, &c, &hs, &zero3, F == W);  // F = W is full_shard exactly
        snprintf(what, sizeof what, "P3 hybrid_shard_zero2(F=%d) vs hybrid_shard", F);
        compare(what, &c, &hs2, &hs, 1);
        mt_result_free(&hs), mt_result_free(&hs2);
    }
    c.shard_group = 0;
    mt_result_free(&zero3);
}

// P4: all prefetch settings, bitwise equal to no prefetch
static void check_prefetch(const char *model) {
    const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_HYBRID_SHARD};
    for (int si = 0; si < 3; si++) {
        fc_run_config c = mt_config(model, strategies[si], W, 2);
        if (strategies[si] == FC_STRATEGY_HYBRID_SHARD) {
            if (W % 2 || W < 4) continue;
            c.shard_group = W / 2;
        }
        mt_result base;
        run(&c, &base);
        for (int bp = 0; bp < 3; bp++)
            for (int fp = 0; fp < 2; fp++)
                for (int lim = 0; lim < 2; lim++) {
                    if (bp == 0 && fp == 0) continue;  // the baseline, and the limiter needs a prefetch
                    c.backward_prefetch = (fc_prefetch)bp;
                    c.forward_prefetch = fp;
                    c.limit_all_gathers = lim;
                    mt_result r;
                    run(&c, &r);
                    char what[160];
                    snprintf(what, sizeof what, "P4 %s backward_prefetch=%s forward_prefetch=%d limit=%d",
                             fc_strategy_name(c.strategy), fc_prefetch_name(c.backward_prefetch), fp, lim);
                    compare(what, &c, &r, &base, 1);
                    mt_result_free(&r);
                }
        mt_result_free(&base);
    }
}

// P6: gradient accumulation
static void check_accumulation(const char *model) {
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2);
    mt_result one, local2;
    run(&c, &one);
    c.grad_accum = 2;
    run_local(c, &local2);
    for (int ns = 0; ns < 2; ns++) {
        c.no_sync = ns;
        mt_result acc, acc_ddp;
        run(&c, &acc);
        c.strategy = FC_STRATEGY_NO_SHARD;
        run(&c, &acc_ddp);
        c.strategy = FC_STRATEGY_FULL_SHARD;
        compare(ns ? "P6 K=2 no_sync vs K=1" : "P6 K=2 vs K=1", &c, &acc, &one, 0);
        compare(ns ? "P6 K=2 no_sync vs local K=2" : "P6 K=2 vs local K=2", &c, &acc, &local2, 0);
        compare(ns ? "P2 K=2 no_sync full_shard vs no_shard" : "P2 K=2 full_shard vs no_shard", &c, &acc,
                &acc_ddp, 1);
        mt_result_free(&acc), mt_result_free(&acc_ddp);
    }
    mt_result_free(&one), mt_result_free(&local2);
}

// P8: clip_grad_norm against the local model, every norm type
static void check_clip(const char *model) {
    for (int nt = 0; nt < 3; nt++) {
        fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, 2);
        c.norm_type = (fc_norm_type)nt;
        c.clip_grad_norm = nt == FC_NORM_1 ? 0.5f : 0.02f;  // below every measured norm: clipping is active
        mt_result local, zero3, ddp;
        run_local(c, &local);
        run(&c, &zero3);
        c.strategy = FC_STRATEGY_NO_SHARD;
        run(&c, &ddp);
        char what[96];
        snprintf(what, sizeof what, "P8 clip norm_type=%s vs local", fc_norm_name(c.norm_type));
        compare(what, &c, &zero3, &local, 0);
        snprintf(what, sizeof what, "P8 clip norm_type=%s full_shard vs no_shard", fc_norm_name(c.norm_type));
        compare(what, &c, &zero3, &ddp, 1);
        if (rank == 0)
            for (int t = 0; t < c.steps; t++) {
                MT_CHECK(fabs(zero3.norm[t] - local.norm[t]) <= 1e-5 * local.norm[t],
                         "P8 norm_type=%s step %d: total norm %.9g vs local %.9g", fc_norm_name(c.norm_type), t,
                         zero3.norm[t], local.norm[t]);
                MT_CHECK(local.norm[t] > c.clip_grad_norm, "P8: norm %.6g does not exceed max_norm %.3g: not clipping",
                         local.norm[t], (double)c.clip_grad_norm);
            }
        mt_result_free(&local), mt_result_free(&zero3), mt_result_free(&ddp);
    }
}

// P9: mixed precision, FSDP == DDP under the same policy
static void check_mixed_precision(const char *model) {
    const fc_prec pol[][2] = {{FC_PREC_BF16, FC_PREC_FP32}, {FC_PREC_BF16, FC_PREC_BF16}, {FC_PREC_FP16, FC_PREC_FP16}};
    fc_run_config c = mt_config(model, FC_STRATEGY_NO_SHARD, W, 2);
    mt_result fp32;
    run(&c, &fp32);
    for (int i = 0; i < 3; i++) {
        c.param_dtype = pol[i][0];
        c.reduce_dtype = pol[i][1];
        mt_result ddp, zero3, zero2;
        c.strategy = FC_STRATEGY_NO_SHARD;
        run(&c, &ddp);
        c.strategy = FC_STRATEGY_FULL_SHARD;
        run(&c, &zero3);
        c.strategy = FC_STRATEGY_SHARD_GRAD_OP;
        run(&c, &zero2);
        char what[128];
        snprintf(what, sizeof what, "P9 param=%s reduce=%s full_shard vs no_shard", fc_prec_name(c.param_dtype),
                 fc_prec_name(c.reduce_dtype));
        compare(what, &c, &zero3, &ddp, 1);
        snprintf(what, sizeof what, "P9 param=%s reduce=%s shard_grad_op vs no_shard", fc_prec_name(c.param_dtype),
                 fc_prec_name(c.reduce_dtype));
        compare(what, &c, &zero2, &ddp, 1);
        if (rank == 0) {  // the policy must change the numbers, or the flag did nothing
            int differs = memcmp(ddp.params, fp32.params, ddp.numel * sizeof(float)) != 0;
            MT_CHECK(differs, "P9 param=%s: mixed precision gave the fp32 result bitwise", fc_prec_name(c.param_dtype));
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
    mt_result a, b, off;
    run(&c, &a);
    run(&c, &b);
    compare("P12 same run twice", &c, &b, &a, 1);
    // offload under accumulation and clipping too, where the optimizer and the
    // reduced gradient shards live on the host
    c.grad_accum = 2;
    c.clip_grad_norm = 0.02f;
    mt_result on;
    run(&c, &on);
    c.cpu_offload = 1;
    run(&c, &off);
    compare("P14 cpu_offload vs none", &c, &off, &on, 1);
    mt_result_free(&on);
    MT_CHECK(off.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD] == 0 && off.mem.peak[FC_LOC_HOST][FC_MEM_PARAM_SHARD] ==
                                                                          a.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD],
             "P14: parameter shards not moved to the host (device %zu, host %zu)",
             off.mem.peak[FC_LOC_DEVICE][FC_MEM_PARAM_SHARD], off.mem.peak[FC_LOC_HOST][FC_MEM_PARAM_SHARD]);
    MT_CHECK(off.mem.peak[FC_LOC_HOST][FC_MEM_OPTIM_STATE] == a.mem.peak[FC_LOC_DEVICE][FC_MEM_OPTIM_STATE],
             "P14: optimizer state not moved to the host");
    mt_result_free(&a), mt_result_free(&b), mt_result_free(&off);
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
    fc_run_config c = mt_config("mlp-tiny", FC_STRATEGY_FULL_SHARD, 1, 2);
    c.model = *mc;
    c.global_batch = B;
    mt_result local;
    run_local(c, &local);
    for (int w = 1; w <= W; w++) {
        MPI_Comm sub;
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, rank < w ? 0 : MPI_UNDEFINED, rank, &sub));
        if (sub == MPI_COMM_NULL) continue;
        mt_result r;
        mt_run(&c, sub, &r);
        char what[96];
        snprintf(what, sizeof what, "P5 full_shard at W'=%d (B=%d) vs local", w, B);
        compare(what, &c, &r, &local, 0);
        mt_result_free(&r);
        mpiCheck(MPI_Comm_free(&sub));
    }
    mt_result_free(&local);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    const char *models[] = {"mlp-tiny", "gpt2-tiny"};
    for (int i = 0; i < 2; i++) {
        check_strategies(models[i]);
        check_hybrid(models[i]);
        check_prefetch(models[i]);
        check_accumulation(models[i]);
        check_clip(models[i]);
        check_mixed_precision(models[i]);
        check_determinism_offload(models[i]);
    }
    // 3 -> 2 -> 2: units of 8 and 6 elements, so at W >= 7 some ranks own only padding
    fc_model_config micro = {0};
    micro.kind = FC_MODEL_MLP;
    snprintf(micro.name, sizeof micro.name, "mlp-micro");
    micro.n_layers = 2;
    micro.dims[0] = 3, micro.dims[1] = 2, micro.dims[2] = 2;
    check_world_sizes(&micro);
    fc_model_config g;
    fc_error e;
    if (fc_model_config_load("gpt2-tiny", &g, &e) == 0) check_world_sizes(&g);
    return mt_finalize();
}
