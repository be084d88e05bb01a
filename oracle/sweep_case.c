// oracle/sweep_case.c — one checked case of the sweep: the case runs on the
// implementation under test and every property of DESIGN §8 that applies is
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
//   P12 the same case twice: bitwise
//   P14 cpu_offload == none (same implementation)
//   P15 activation checkpointing == none (same implementation, bitwise)
// Comparisons of the reference with itself are bitwise where its canonical
// reductions make them so (same reduction tree); all others are judged by the
// default policy of their precision: the reduce_dtype's when both runs share
// their per-rank compute (same implementation, same W', same data split), the
// less precise of param_dtype and reduce_dtype otherwise.
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

// Compares run t (tested, config cfg at W) with run b (config bcfg at bW) under p.
// same_compute: both ran the same per-rank arithmetic (only the reduction
// tree, prefetch or offload differs), so the reduce_dtype bounds the noise.
// lock: NULL, or b's implementation in lockstep with t (run_expected).
static int judge(fc_case_result *res, int p, const fc_run_config *cfg, int W, const fc_run_config *bcfg, int bW,
                 const fc_run_result *t, int t0, const fc_run_result *b, int b0, const fc_run_result *lock, int n,
                 int bitwise, int same_compute, const char *against) {
    fc_props_pair pair = {cfg, W, bcfg, same_compute, lock, bW};
    return fc_props_compare(&res->v, p, &pair, t, t0, b, b0, n, bitwise, against);
}

// The expected side of a comparison with the tested run t. Judged within a
// tolerance, it runs its first step on its own (both start from one init) and
// every later step in lockstep, from t's own state after the step before
// (fc_runner_lockstep): a difference can never hide behind a trajectory that
// has legitimately drifted (DESIGN §8). Judged bitwise, it runs whole: equal
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

static void check_theory(fc_case_result *res, int p, const fc_findings *mine, MPI_Comm sub) {
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

static void check_round_trip(const fc_sweep_ctx *x, const fc_run_config *cfg, int W, const fc_case_ckpt *k,
                             const fc_run_result *t, fc_case_result *res) {
    char dir[64] = "";
    if (x->rank == 0 && !mkdtemp(strcpy(dir, "/tmp/fsdpcheck-sweep-XXXXXX"))) dir[0] = '\0';
    fc_mpi_bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!dir[0]) {
        fc_props_record(&res->v, 7, 0, "cannot create a temporary checkpoint directory");
        return;
    }
    fc_run_config tc = *cfg;
    tc.inject = x->inject;
    fc_state_dict kind = k->sharded ? fc_ckpt_sharded_kind(cfg) : FC_STATE_DICT_FULL;  // FSDP2's is DCP's
    int saved = 1;
    fc_error e = {{0}};
    MPI_Comm sub = x->sub[W];
    if (sub != MPI_COMM_NULL) {
        saved = fc_runner_save(x->tested, &tc, sub, k->at, dir, kind, &e) == 0;
    }
    fc_mpi_barrier(MPI_COMM_WORLD);
    fc_mpi_bcast(&saved, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!saved) {
        if (x->rank == 0) fc_props_record(&res->v, 7, 0, "save after step %d failed: %s", k->at, e.msg);
    } else {
        fc_run_config lc = tc;  // the loading run: another W and strategy
        lc.strategy = k->strategy;
        lc.reshard_after_forward = 0;  // the loading run's own schedule
        lc.shard_group = 0;
        // FSDP2 has no no_shard: its checkpoint then loads into FSDP1's (DDP)
        if (lc.strategy == FC_STRATEGY_NO_SHARD) lc.fsdp_version = 1, lc = no_prefetch(lc);
        // a fault of the saver's layout (dcp_saved_offsets) is in the files, not in an FSDP1 loader
        if (!(fc_fault_versions(lc.inject) & (1u << lc.fsdp_version))) lc.inject = FC_FAULT_NONE;
        if (k->W == 1) lc.divide = FC_DIVIDE_PREPOST;
        // FSDP2's divide factor scales with the world: the same multiple W / F of the mean gradient
        if (lc.gradient_divide_factor > 0) lc.gradient_divide_factor *= (double)k->W / W;
        lc.steps = cfg->steps - k->at;
        fc_run_result r;
        memset(&r, 0, sizeof r);
        sub = x->sub[k->W];
        if (sub != MPI_COMM_NULL) {
            fc_runner_resume(x->tested, &lc, sub, dir, &r);
        }
        fc_mpi_barrier(MPI_COMM_WORLD);
        int flat = !fc_strategy_hybrid(cfg->strategy);
        int same_tree = flat && k->W == W && lc.divide == cfg->divide;
        int bitwise = x->tested_is_ref && same_tree;
        // the uninterrupted run's steps after the first resumed one, in
        // lockstep from the resumed run's state (world rank 0 holds it)
        fc_run_result lock;
        memset(&lock, 0, sizeof lock);
        int r_ok = r.ok;
        fc_mpi_bcast(&r_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!bitwise && r_ok && lc.steps > 1) {
            fc_run_config uc = tc;
            uc.steps = lc.steps;
            sub = x->sub[W];
            if (sub != MPI_COMM_NULL) {
                fc_runner_lockstep(x->tested, &uc, sub, &r, 0, t->first_step + k->at, &lock);
            }
            fc_mpi_barrier(MPI_COMM_WORLD);
        }
        if (x->rank == 0) {
            char against[128];
            snprintf(against, sizeof against, "uninterrupted (%s checkpoint at step %d, loaded at W=%d %s FSDP%d)",
                     fc_state_dict_name(kind), k->at, k->W, fc_strategy_name(k->strategy), lc.fsdp_version);
            // the resumed run's steps 0.. are the uninterrupted run's steps at..
            judge(res, 7, &lc, k->W, cfg, W, &r, 0, t, k->at, bitwise || lc.steps < 2 ? NULL : &lock, lc.steps, bitwise, 0,
                  against);
        }
        fc_runner_free(&lock);
        fc_runner_free(&r);
    }
    if (x->rank == 0) fc_remove_flat_dir(dir);
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
    fc_run_result t;  // the tested run, kept for the round trip below
    memset(&t, 0, sizeof t);
    MPI_Comm sub = x->sub[W];
    if (sub != MPI_COMM_NULL) {
        fc_run_config tc = *cfg;
        tc.inject = x->inject;
        int exact = x->tested_is_ref;
        int n = cfg->steps;
        fc_run_result again;
        fc_runner_run(x->tested, &tc, sub, &t);
        int is0 = x->rank == 0;
        if (!t.ok && is0) fc_props_record(&res->v, 12, 0, "the case did not run: %s", t.error);
        if (t.ok) {
            // P12: the same case again, bitwise (any implementation: DESIGN §8)
            fc_runner_run(x->tested, &tc, sub, &again);
            if (is0) judge(res, 12, cfg, W, cfg, W, &again, 0, &t, 0, NULL, n, 1, 1, "itself");
            fc_runner_free(&again);
            int mixed = cfg->param_dtype != FC_PREC_FP32 || cfg->reduce_dtype != FC_PREC_FP32;
            int hybrid = fc_strategy_hybrid(cfg->strategy);
            expected_run e;
            // P1 (with P5, P6, P8): the local ground truth, for fp32 policies
            if (!mixed) {
                fc_run_config lc = fc_runner_local_of(*cfg, W);
                run_local_rank0(x, &lc, sub, &t, &e);
                if (is0) {
                    int ok = judge(res, 1, cfg, W, &lc, 1, &t, 0, &e.run, 0, lock_of(&e), n, 0, 0, "local");
                    fc_model m;
                    fc_model_build_run(&m, cfg);
                    int uneven = 0;
                    for (int u = 0; u < m.n_units; u++) uneven |= m.units[u].numel % (size_t)W != 0;
                    fc_model_free(&m);
                    // the same comparison is the evidence for these: its detail is P1's
                    if (uneven && W > 1) fc_props_record(&res->v, 5, ok, "(uneven shards at W=%d) as P1", W);
                    if (cfg->clip_grad_norm > 0) fc_props_record(&res->v, 8, ok, "(clipped) as P1");
                    if (cfg->grad_accum > 1) {  // P6: against local on the joined batch (K = 1)
                        fc_run_config l1c = lc;
                        l1c.grad_accum = 1;
                        expected_run l1;
                        run_expected(x->ref, &l1c, MPI_COMM_SELF, &t, 0, &l1);
                        judge(res, 6, cfg, W, &l1c, 1, &t, 0, &l1.run, 0, lock_of(&l1), n, 0, 0, "local with K=1");
                        free_expected(&l1);
                    }
                }
                free_expected(&e);
                fc_mpi_barrier(sub);
            }
            // P2 / P9: no_shard under the same policy at the same W'
            if (cfg->strategy == FC_STRATEGY_FULL_SHARD || cfg->strategy == FC_STRATEGY_SHARD_GRAD_OP || mixed) {
                fc_run_config dc = no_prefetch(*cfg);
                dc.strategy = FC_STRATEGY_NO_SHARD;
                dc.fsdp_version = 1;  // DDP: FSDP2 has no no_shard
                dc.reshard_after_forward = 0;
                dc.shard_group = 0;
                // the same reduction tree: a flat strategy, or a hybrid whose shard group is W'
                int same_tree = !hybrid || (cfg->shard_group && cfg->shard_group == W);
                int bitwise = exact && same_tree;
                run_expected(x->ref, &dc, sub, &t, bitwise, &e);
                if (is0) judge(res, mixed ? 9 : 2, cfg, W, &dc, W, &t, 0, &e.run, 0, lock_of(&e), n, bitwise, exact, "no_shard");
                free_expected(&e);
            }
            // P3: hybrid against full_shard / shard_grad_op over the whole world
            if (hybrid) {
                fc_run_config fcfg = *cfg;
                fcfg.strategy = cfg->strategy == FC_STRATEGY_HYBRID_SHARD ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_SHARD_GRAD_OP;
                fcfg.shard_group = 0;
                int bitwise = exact && cfg->shard_group == W;
                run_expected(x->ref, &fcfg, sub, &t, bitwise, &e);
                if (is0) judge(res, 3, cfg, W, &fcfg, W, &t, 0, &e.run, 0, lock_of(&e), n, bitwise, exact, "full_shard");
                free_expected(&e);
            }
            // P4: the same implementation without prefetch
            if (cfg->forward_prefetch || cfg->backward_prefetch != FC_PREFETCH_NONE || cfg->backward_prefetch_depth) {
                fc_run_config nc = no_prefetch(tc);
                run_expected(x->tested, &nc, sub, &t, exact, &e);
                if (is0) judge(res, 4, cfg, W, &nc, W, &t, 0, &e.run, 0, lock_of(&e), n, exact, 1, "no prefetch");
                free_expected(&e);
            }
            // P14: the same implementation without offload
            if (cfg->cpu_offload) {
                fc_run_config oc = tc;
                oc.cpu_offload = 0;
                run_expected(x->tested, &oc, sub, &t, exact, &e);
                if (is0) judge(res, 14, cfg, W, &oc, W, &t, 0, &e.run, 0, lock_of(&e), n, exact, 1, "no offload");
                free_expected(&e);
            }
            // P15: the same implementation without activation checkpointing,
            // bitwise for any implementation: the recompute computes the same
            // activations from the same parameters and micro-batch (DESIGN §5)
            if (cfg->act_ckpt != FC_ACT_CKPT_NONE) {
                fc_run_config ac = tc;
                ac.act_ckpt = FC_ACT_CKPT_NONE;
                run_expected(x->tested, &ac, sub, &t, 1, &e);
                if (is0) judge(res, 15, cfg, W, &ac, W, &t, 0, &e.run, 0, NULL, n, 1, 1, "no checkpointing");
                free_expected(&e);
            }
            // P10, P11: every rank's own log and memory against the theory
            fc_findings sched = {0}, mem = {0};
            fc_theory_check_schedule(cfg, W, x->rank, &t.log, &sched);
            fc_theory_check_memory(cfg, W, x->rank, &t.log, &t.mem, &mem);
            check_theory(res, 10, &sched, sub);
            check_theory(res, 11, &mem, sub);
            if (is0) measurements(res, &t);
        }
    }
    fc_mpi_barrier(MPI_COMM_WORLD);
    int t_ok = t.ok;
    fc_mpi_bcast(&t_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (k->on && t_ok) check_round_trip(x, cfg, W, k, &t, res);
    fc_runner_free(&t);
    res->seconds = fc_sweep_now() - t0;
    // everyone learns rank 0's verdict (shrinking must take the same path everywhere)
    fc_mpi_bcast(res, (int)sizeof *res, MPI_BYTE, 0, MPI_COMM_WORLD);
}
