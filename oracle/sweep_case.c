// oracle/sweep_case.c — one checked case of the sweep: the case runs on the
// implementation under test and every property of docs/contract.md §8 that applies is
// checked, numbers through the one comparison engine (props.h, compare.h),
// the schedule and memory through the one theory (theory.h):
//   P1  == the `local` ground truth (fp32 policies); with it P5 when shards
//       are uneven at W', P6 under accumulation (and against local on the
//       joined batch, K = 1), P8 under clipping
//   P2  full_shard / shard_grad_op == no_shard at the same W'
//   P9  a mixed-precision case == no_shard under the same policy
//   P3  hybrid == full_shard (or shard_grad_op) over the whole W'
//   P4  the case's prefetch == none (same implementation)
//   P7  train k, save, load at another W and strategy, train n == uninterrupted
//   P10 every rank's comm log == theory; P11 every rank's memory == formula
//   P12 the same case twice (bitwise where determinism is claimed)
//   P14 cpu_offload == none (same implementation)
//   P15 activation checkpointing == none (same implementation)
// Two runs are judged bitwise only where the tested implementation's table
// claims it (core/impl.h, docs/contract.md §8): against the reference when it
// is the reference, on one reduction tree; against its own runs on one tree
// when it claims layout invariance and determinism; the same case twice when
// it claims determinism. All others are judged by the default policy of their
// precision, per element for 16 bits (the magnitude pass): the reduce_dtype's
// when both runs share their per-rank compute (the same implementation, and
// one that claims layout invariance, at the same W' and data split), the less
// precise of param_dtype and reduce_dtype otherwise.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "mpicheck.h"
#include "runner.h"
#include "checkpoint.h"
#include "sweep_internal.h"
#include "theory.h"

// The expected side of a comparison with the tested run t. Judged within a
// tolerance, it runs its first step on its own (both start from one init) and
// every later step in lockstep, from t's own state after the step before
// (fc_runner_lockstep): a difference can never hide behind a trajectory that
// has legitimately drifted (docs/contract.md §8). Judged bitwise, it runs whole: equal
// bits stay equal, and any drift is itself the failure. Collective over comm.
typedef struct {
    fc_run_result run;   // the whole run, or its first step
    fc_run_result lock;  // steps 1.. in lockstep (when locked)
    int locked;
} expected_run;

static void run_expected(const fc_impl_ops *ops, const fc_run_config *c, MPI_Comm comm, const fc_run_result *t,
                         int bitwise, expected_run *x) {
    memset(x, 0, sizeof *x);
    if (bitwise || c->steps < 2) {
        fc_runner_run(ops, c, comm, &x->run);
        return;
    }
    fc_run_config first = *c;
    first.steps = 1;
    fc_runner_run(ops, &first, comm, &x->run);
    fc_runner_lockstep(ops, c, comm, t, 0, x->run.first_step, &x->lock);
    x->locked = 1;
}

static const fc_run_result *lock_of(const expected_run *x) { return x->locked ? &x->lock : NULL; }

static void free_expected(expected_run *x) {
    fc_runner_free(&x->run);
    fc_runner_free(&x->lock);
}

static fc_run_config no_prefetch(fc_run_config c) {
    c.backward_prefetch = FC_PREFETCH_NONE;
    c.forward_prefetch = c.backward_prefetch_depth = c.limit_all_gathers = 0;
    return c;
}

// Runs the reference's `local` on rank 0 of sub while the others wait quietly.
static void run_local_rank0(const fc_sweep_ctx *x, const fc_run_config *c, MPI_Comm sub, const fc_run_result *t,
                            expected_run *out) {
    memset(out, 0, sizeof *out);
    if (x->rank == 0) run_expected(x->ref, c, MPI_COMM_SELF, t, 0, out);
    fc_mpi_barrier(sub);
}

void fc_sweep_subs_make(fc_sweep_ctx *x) {
    x->sub = callocCheck((size_t)x->W + 1, sizeof(MPI_Comm));
    x->sub[0] = MPI_COMM_NULL;
    for (int w = 1; w <= x->W; w++)
        fc_mpi_comm_split(MPI_COMM_WORLD, x->rank < w ? 0 : MPI_UNDEFINED, x->rank, &x->sub[w]);
}

void fc_sweep_subs_free(fc_sweep_ctx *x) {
    for (int w = 1; x->sub && w <= x->W; w++)
        if (x->sub[w] != MPI_COMM_NULL) mpiCheck(MPI_Comm_free(&x->sub[w]));
    free(x->sub);
    x->sub = NULL;
}

// ---------------------------------------------------------------------------
// P10 and P11: every rank checks its own comm log and memory against the
// theory; rank 0 learns the count and the lowest failing rank's first finding.

static void check_theory(fc_case_result *res, fc_prop p, const fc_findings *mine, MPI_Comm sub) {
    int rank, W;
    mpiCheck(MPI_Comm_rank(sub, &rank));
    mpiCheck(MPI_Comm_size(sub, &W));
    int total = 0, first = mine->n ? rank : W, lowest = W;
    fc_mpi_allreduce_int(&mine->n, &total, 1, MPI_SUM, sub);
    fc_mpi_allreduce_int(&first, &lowest, 1, MPI_MIN, sub);
    char msg[400] = "";
    if (lowest < W) {
        if (rank == lowest) snprintf(msg, sizeof msg, "%s", mine->msg[0]);
        fc_mpi_bcast(msg, (int)sizeof msg, MPI_CHAR, lowest, sub);
    }
    if (rank == 0) fc_props_record(&res->v, p, total == 0, "%d violation%s; first on rank %d: %s", total,
                                   total == 1 ? "" : "s", lowest, msg);
}

static void measurements(fc_case_result *res, const fc_run_result *t) {
    const fc_mem_stats *ms = &t->mem;
    for (int k = 0; k < FC_MEM_COUNT; k++) res->mem_peak[k] = ms->peak[FC_LOC_DEVICE][k] + ms->peak[FC_LOC_HOST][k];
    res->mem_total = ms->peak_total[FC_LOC_DEVICE] + ms->peak_total[FC_LOC_HOST];
    memset(res->comm_bytes, 0, sizeof res->comm_bytes);
    for (size_t i = 0; i < t->log.n; i++) {
        const fc_event *e = &t->log.ev[i];
        if (e->step == t->first_step && e->op <= FC_OP_ALL_REDUCE) res->comm_bytes[e->op] += e->bytes;
    }
}

// ---------------------------------------------------------------------------
// P7: train k->at steps at W, save, load into a fresh instance at k->W with
// k->strategy, train the rest; the result must equal the uninterrupted run t
// (bitwise on the same reduction tree, else within tolerance). World-collective.

typedef struct {
    const fc_sweep_ctx *x;
    const fc_run_config *cfg;  // the case
    const fc_run_config *tc;   // as the tested implementation runs it (with the fault)
    int W;
    const fc_case_ckpt *k;
    fc_state_dict kind;        // what is saved
    char dir[64];              // where
    const fc_run_result *t;    // the uninterrupted run
    fc_case_result *res;
} round_trip;

// The loading run: another W and strategy, the steps after the save.
static fc_run_config loading_config(const round_trip *rt) {
    const fc_case_ckpt *k = rt->k;
    fc_run_config lc = *rt->tc;
    lc.strategy = k->strategy;
    lc.reshard_after_forward = 0;  // the loading run's own schedule
    lc.shard_group = 0;
    // FSDP2 has no no_shard: its checkpoint then loads into FSDP1's (DDP)
    if (lc.strategy == FC_STRATEGY_NO_SHARD) lc.fsdp_version = 1, lc = no_prefetch(lc);
    // a fault of the saver's layout (dcp_saved_offsets) is in the files, not in an FSDP1 loader
    if (!(fc_fault_versions(lc.inject) & (1u << lc.fsdp_version))) lc.inject = FC_FAULT_NONE;
    if (k->W == 1) lc.divide = FC_DIVIDE_PREPOST;
    // FSDP2's divide factor scales with the world: the same multiple W / F of the mean gradient
    if (lc.gradient_divide_factor > 0) lc.gradient_divide_factor *= (double)k->W / rt->W;
    lc.steps = rt->cfg->steps - k->at;
    return lc;
}

// Loads the saved checkpoint, trains the rest, and judges it against the uninterrupted run.
static void resume_and_judge(const round_trip *rt) {
    const fc_sweep_ctx *x = rt->x;
    const fc_case_ckpt *k = rt->k;
    fc_run_config lc = loading_config(rt);
    fc_run_result r;
    memset(&r, 0, sizeof r);
    MPI_Comm sub = x->sub[k->W];
    if (sub != MPI_COMM_NULL) fc_runner_resume(x->tested, &lc, sub, rt->dir, &r);
    fc_mpi_barrier(MPI_COMM_WORLD);
    int flat = !fc_strategy_hybrid(rt->cfg->strategy);
    int same_tree = flat && k->W == rt->W && lc.divide == rt->cfg->divide;
    int bitwise = x->same_bits && same_tree;
    // the uninterrupted run's steps after the first resumed one, in
    // lockstep from the resumed run's state (world rank 0 holds it)
    fc_run_result lock;
    memset(&lock, 0, sizeof lock);
    int r_ok = r.ok;
    fc_mpi_bcast(&r_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!bitwise && r_ok && lc.steps > 1) {
        fc_run_config uc = *rt->tc;
        uc.steps = lc.steps;
        sub = x->sub[rt->W];
        if (sub != MPI_COMM_NULL) fc_runner_lockstep(x->tested, &uc, sub, &r, 0, rt->t->first_step + k->at, &lock);
        fc_mpi_barrier(MPI_COMM_WORLD);
    }
    if (x->rank == 0) {
        char against[128];
        snprintf(against, sizeof against, "uninterrupted (%s checkpoint at step %d, loaded at W=%d %s FSDP%d)",
                 fc_state_dict_name(rt->kind), k->at, k->W, fc_strategy_name(k->strategy), lc.fsdp_version);
        // the resumed run's steps 0.. are the uninterrupted run's steps at..
        fc_judgement j = {.p = FC_P7_CHECKPOINT, .against = against, .tested = {&lc, k->W, &r, 0},
                          .expected = {rt->cfg, rt->W, rt->t, k->at}, .n = lc.steps, .bitwise = bitwise,
                          .lock = bitwise || lc.steps < 2 ? NULL : &lock};
        fc_props_compare(&rt->res->v, &j);
    }
    fc_runner_free(&lock);
    fc_runner_free(&r);
}

static void check_round_trip(const fc_sweep_ctx *x, const fc_run_config *cfg, const fc_run_config *tc, int W,
                             const fc_case_ckpt *k, const fc_run_result *t, fc_case_result *res) {
    round_trip rt = {.x = x, .cfg = cfg, .tc = tc, .W = W, .k = k, .t = t, .res = res};
    if (x->rank == 0 && !mkdtemp(strcpy(rt.dir, "/tmp/fsdpcheck-sweep-XXXXXX"))) rt.dir[0] = '\0';
    fc_mpi_bcast(rt.dir, sizeof rt.dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!rt.dir[0]) {
        fc_props_record(&res->v, FC_P7_CHECKPOINT, 0, "cannot create a temporary checkpoint directory");
        return;
    }
    rt.kind = k->sharded ? fc_ckpt_sharded_kind(cfg) : FC_STATE_DICT_FULL;  // FSDP2's is DCP's
    int saved = 1;
    fc_error e = {{0}};
    MPI_Comm sub = x->sub[W];
    // an implementation that does not repeat its bits saves from the
    // uninterrupted run itself: another run's state differs by its nondeterminism
    fc_run_result u;
    memset(&u, 0, sizeof u);
    if (sub != MPI_COMM_NULL && x->repeatable)
        saved = fc_runner_save(x->tested, rt.tc, sub, k->at, rt.dir, rt.kind, &e) == 0;
    else if (sub != MPI_COMM_NULL) {
        fc_runner_run_saving(x->tested, rt.tc, sub, k->at, rt.dir, rt.kind, &u);
        saved = u.ok;
        snprintf(e.msg, sizeof e.msg, "%.500s", u.error);
        rt.t = &u;
    }
    fc_mpi_barrier(MPI_COMM_WORLD);
    fc_mpi_bcast(&saved, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (saved) resume_and_judge(&rt);
    else if (x->rank == 0) fc_props_record(&res->v, FC_P7_CHECKPOINT, 0, "save after step %d failed: %s", k->at, e.msg);
    fc_runner_free(&u);
    if (x->rank == 0) fc_remove_flat_dir(rt.dir);
}

// ---------------------------------------------------------------------------
// the case's checks on its W' ranks

// What every check of one case shares.
typedef struct {
    const fc_sweep_ctx *x;
    const fc_run_config *cfg;  // the case
    const fc_run_config *tc;   // as the tested implementation runs it (with the fault)
    int W;
    MPI_Comm sub;              // its W' ranks
    const fc_run_result *t;    // the tested run
    fc_case_result *res;
    int is0;                   // world rank 0, which judges
    int exact;                 // the tested implementation is the reference: bitwise against its runs
    int same_bits;             // its own runs on one tree are bitwise (fc_impl_claims_same_bits)
    int mixed;                 // a mixed-precision policy
} case_ctx;

// Judges the tested run against the expected run e of config ec at eW, over every step.
static int judge(const case_ctx *cc, fc_prop p, const char *against, const fc_run_config *ec, int eW,
                 const expected_run *e, int bitwise, int same_compute) {
    fc_judgement j = {.p = p, .against = against, .tested = {cc->cfg, cc->W, cc->t, 0},
                      .expected = {ec, eW, &e->run, 0}, .n = cc->cfg->steps, .bitwise = bitwise,
                      .same_compute = same_compute, .lock = lock_of(e)};
    return fc_props_compare(&cc->res->v, &j);
}

// P12: the same case again: bitwise for an implementation that claims
// determinism, else within its arithmetic's allowance, in lockstep from the
// tested run's state (docs/contract.md §8).
static void check_determinism(const case_ctx *cc) {
    int bitwise = cc->x->repeatable;
    expected_run e;
    run_expected(cc->x->tested, cc->tc, cc->sub, cc->t, bitwise, &e);
    if (cc->is0)
        judge(cc, FC_P12_DETERMINISM, bitwise ? "itself" : "itself (nondeterministic: within its arithmetic's allowance)",
              cc->cfg, cc->W, &e, bitwise, bitwise);
    free_expected(&e);
}

// P1 (with P5, P6, P8): the local ground truth, for fp32 policies.
static void check_local(const case_ctx *cc) {
    const fc_run_config *cfg = cc->cfg;
    int W = cc->W;
    fc_run_config lc = fc_runner_local_of(*cfg, W);
    expected_run e;
    run_local_rank0(cc->x, &lc, cc->sub, cc->t, &e);
    if (cc->is0) {
        int ok = judge(cc, FC_P1_LOCAL, "local", &lc, 1, &e, 0, 0);
        fc_model m;
        fc_model_build_run(&m, cfg);
        int uneven = 0;
        for (int u = 0; u < m.n_units; u++) uneven |= m.units[u].numel % (size_t)W != 0;
        fc_model_free(&m);
        // the same comparison is the evidence for these: its detail is P1's
        fc_props *v = &cc->res->v;
        if (uneven && W > 1) fc_props_record(v, FC_P5_WORLD_SIZE, ok, "(uneven shards at W=%d) as P1", W);
        if (cfg->clip_grad_norm > 0) fc_props_record(v, FC_P8_CLIP, ok, "(clipped) as P1");
        if (cfg->grad_accum > 1) {  // P6: against local on the joined batch (K = 1)
            fc_run_config l1c = lc;
            l1c.grad_accum = 1;
            expected_run l1;
            run_expected(cc->x->ref, &l1c, MPI_COMM_SELF, cc->t, 0, &l1);
            judge(cc, FC_P6_ACCUMULATION, "local with K=1", &l1c, 1, &l1, 0, 0);
            free_expected(&l1);
        }
    }
    free_expected(&e);
    fc_mpi_barrier(cc->sub);
}

// P2 / P9: no_shard under the same policy at the same W'.
static void check_no_shard(const case_ctx *cc) {
    const fc_run_config *cfg = cc->cfg;
    fc_run_config dc = no_prefetch(*cfg);
    dc.strategy = FC_STRATEGY_NO_SHARD;
    dc.fsdp_version = 1;  // DDP: FSDP2 has no no_shard
    dc.reshard_after_forward = 0;
    dc.shard_group = 0;
    // the same reduction tree: a flat strategy, or a hybrid whose shard group is W'
    int same_tree = !fc_strategy_hybrid(cfg->strategy) || (cfg->shard_group && cfg->shard_group == cc->W);
    int bitwise = cc->exact && same_tree;
    expected_run e;
    run_expected(cc->x->ref, &dc, cc->sub, cc->t, bitwise, &e);
    fc_prop p = cc->mixed ? FC_P9_MIXED_PRECISION : FC_P2_NO_SHARD;
    if (cc->is0) judge(cc, p, "no_shard", &dc, cc->W, &e, bitwise, cc->exact);
    free_expected(&e);
}

// P3: hybrid against full_shard / shard_grad_op over the whole world.
static void check_hybrid(const case_ctx *cc) {
    const fc_run_config *cfg = cc->cfg;
    fc_run_config fcfg = *cfg;
    fcfg.strategy = cfg->strategy == FC_STRATEGY_HYBRID_SHARD ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_SHARD_GRAD_OP;
    fcfg.shard_group = 0;
    int bitwise = cc->exact && cfg->shard_group == cc->W;
    expected_run e;
    run_expected(cc->x->ref, &fcfg, cc->sub, cc->t, bitwise, &e);
    if (cc->is0) judge(cc, FC_P3_HYBRID, "full_shard", &fcfg, cc->W, &e, bitwise, cc->exact);
    free_expected(&e);
}

// P4, P14, P15: the same implementation with one option off (vc): bitwise
// where it claims so (bitwise), else by the policy of its precision.
static void check_variant(const case_ctx *cc, fc_prop p, const char *against, const fc_run_config *vc, int bitwise) {
    expected_run e;
    run_expected(cc->x->tested, vc, cc->sub, cc->t, bitwise, &e);
    if (cc->is0) judge(cc, p, against, vc, cc->W, &e, bitwise, bitwise);
    free_expected(&e);
}

static void check_variants(const case_ctx *cc) {
    const fc_run_config *cfg = cc->cfg;
    if (cfg->forward_prefetch || cfg->backward_prefetch != FC_PREFETCH_NONE || cfg->backward_prefetch_depth) {
        fc_run_config nc = no_prefetch(*cc->tc);
        check_variant(cc, FC_P4_PREFETCH, "no prefetch", &nc, cc->same_bits);
    }
    if (cfg->cpu_offload) {
        fc_run_config oc = *cc->tc;
        oc.cpu_offload = 0;
        check_variant(cc, FC_P14_CPU_OFFLOAD, "no offload", &oc, cc->same_bits);
    }
    // P15: the recompute computes the same activations from the same
    // parameters and micro-batch (docs/contract.md §5), the same computation
    // again: bitwise where determinism is claimed
    if (cfg->act_ckpt != FC_ACT_CKPT_NONE) {
        fc_run_config ac = *cc->tc;
        ac.act_ckpt = FC_ACT_CKPT_NONE;
        check_variant(cc, FC_P15_ACT_CKPT, "no checkpointing", &ac, cc->x->repeatable);
    }
}

// Runs the case on its W' ranks and checks every property that applies but P7;
// t keeps the tested run for the round trip.
static void check_on_sub(const fc_sweep_ctx *x, const fc_run_config *cfg, const fc_run_config *tc, int W,
                         fc_run_result *t, fc_case_result *res) {
    case_ctx cc = {.x = x, .cfg = cfg, .tc = tc, .W = W, .sub = x->sub[W], .t = t, .res = res,
                   .is0 = x->rank == 0, .exact = x->tested_is_ref, .same_bits = x->same_bits,
                   .mixed = cfg->param_dtype != FC_PREC_FP32 || cfg->reduce_dtype != FC_PREC_FP32};
    fc_runner_run(x->tested, tc, cc.sub, t);
    if (!t->ok) {
        if (cc.is0) fc_props_record(&res->v, FC_P12_DETERMINISM, 0, "the case did not run: %s", t->error);
        return;
    }
    check_determinism(&cc);
    if (!cc.mixed) check_local(&cc);
    if (cfg->strategy == FC_STRATEGY_FULL_SHARD || cfg->strategy == FC_STRATEGY_SHARD_GRAD_OP || cc.mixed)
        check_no_shard(&cc);
    if (fc_strategy_hybrid(cfg->strategy)) check_hybrid(&cc);
    check_variants(&cc);
    // P10, P11: every rank's own log and memory against the theory
    fc_findings sched = {0}, mem = {0};
    fc_theory_check_schedule(cfg, W, x->rank, &t->log, &sched);
    fc_theory_check_memory(cfg, W, x->rank, &t->log, &t->mem, &mem);
    check_theory(res, FC_P10_COMM_LOG, &sched, cc.sub);
    check_theory(res, FC_P11_MEMORY, &mem, cc.sub);
    if (cc.is0) measurements(res, t);
}

// ---------------------------------------------------------------------------
// the case

void fc_sweep_run_case(const fc_sweep_ctx *x, const fc_run_config *cfg, int W, const fc_case_ckpt *k,
                       fc_case_result *res) {
    double t0 = fc_sweep_now();
    memset(res, 0, sizeof *res);
    res->W = W;
    res->cfg = *cfg;
    res->ckpt = *k;
    fc_sweep_case_spec(cfg, k, res->spec, sizeof res->spec);
    fc_run_config tc = *cfg;  // the case as the tested implementation runs it: with the fault
    tc.inject = x->inject;
    fc_run_result t;  // the tested run, kept for the round trip below
    memset(&t, 0, sizeof t);
    if (x->sub[W] != MPI_COMM_NULL) check_on_sub(x, cfg, &tc, W, &t, res);
    fc_mpi_barrier(MPI_COMM_WORLD);
    int t_ok = t.ok;
    fc_mpi_bcast(&t_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (k->on && t_ok) check_round_trip(x, cfg, &tc, W, k, &t, res);
    fc_runner_free(&t);
    res->seconds = fc_sweep_now() - t0;
    // everyone learns rank 0's verdict (shrinking must take the same path everywhere)
    fc_mpi_bcast(res, (int)sizeof *res, MPI_BYTE, 0, MPI_COMM_WORLD);
}
