// tests/mpi/test_schedule.c — P10 (comm log) and P11 (memory) of the reference
// against the oracle's theory (oracle/theory.h).
//
// The theory itself (expected counts, bytes and dtypes of every collective,
// waits, compute only on completed gathers, frees, the issue order of each
// prefetch policy, the limiter's bound, per-rank memory) lives in
// oracle/theory*.c, where the sweep uses it too; this program is its driver.
// Each rank runs the configurations below through mt_run, checks its own comm
// log and memory figures, and counts every finding as one failure (MPICH
// style: mt_finalize sums the counts). What one run cannot show is checked
// here across runs: the six prefetch settings give six different issue
// orders, and the limiter changes the order and the units alive at a prefetch.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "mpitest.h"
#include "schedule.h"
#include "theory.h"

static int W = 1, RANK = 0;

// ---------------------------------------------------------------------------
// One run's verdict and the statistics the cross-run checks compare.

typedef struct {
    int max_alive_before_prefetch;  // over prefetched all_gathers: units gathered before the issue
    int *seq;                       // the first step's events as op * 1000 + unit + 1
    int nseq;
} run_stats;

typedef struct {
    fc_run_config cfg;
    int done;
    run_stats st;
} case_result;

static void label_of(const fc_run_config *c, char *label, size_t cap) {
    int n = snprintf(label, cap, "%s %s", c->model.name, fc_strategy_name(c->strategy));
#define ADD(...) n += snprintf(label + n, cap - (size_t)n, __VA_ARGS__)
    if (c->strategy == FC_STRATEGY_HYBRID_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2)
        ADD("(F=%d)", c->shard_group ? c->shard_group : W);
    if (c->backward_prefetch != FC_PREFETCH_NONE) ADD(" bwd=%s", fc_prefetch_name(c->backward_prefetch));
    if (c->forward_prefetch) ADD(c->forward_prefetch > 1 ? " fwd_prefetch=%d" : " fwd_prefetch", c->forward_prefetch);
    if (c->backward_prefetch_depth) ADD(" bwd_lists=%d", c->backward_prefetch_depth);
    if (c->limit_all_gathers) ADD(" limit_all_gathers");
    if (c->grad_accum > 1) ADD(" K=%d%s", c->grad_accum, c->no_sync ? " no_sync" : "");
    if (c->cpu_offload) ADD(" cpu_offload");
    if (c->act_ckpt != FC_ACT_CKPT_NONE) ADD(" act_ckpt=%s", fc_act_ckpt_name(c->act_ckpt));
    if (c->fsdp_version != 1) ADD(" fsdp%d", c->fsdp_version);
    if (c->reshard_after_forward) ADD(" reshard_after_forward=%d", c->reshard_after_forward);
    if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
        ADD(" param=%s reduce=%s", fc_prec_name(c->param_dtype), fc_prec_name(c->reduce_dtype));
    if (c->optim.kind != FC_OPT_ADAMW) ADD(" %s", fc_opt_name(c->optim.kind));
    if (c->clip_grad_norm > 0) ADD(" clip=%g", (double)c->clip_grad_norm);
    ADD(" W=%d", W);
#undef ADD
}

static void dump_log(const char *label, const fc_comm_log *log) {
    fprintf(stderr, "[rank %d] comm log of %s:\n", RANK, label);
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        int w = e->op == FC_OP_WAIT;
        fprintf(stderr, "  s%ld m%d #%-3d %-14s%s%-14s unit %2d stage %2d %-9s %7zu B %-4s %-8s%s\n", e->step, e->micro,
                e->order, fc_op_name(e->op), w ? "of " : "   ", w ? fc_op_name(e->of) : "", e->unit, e->stage,
                fc_group_name(e->group), e->bytes, fc_prec_name(e->dtype), fc_phase_name(e->phase),
                e->prefetch ? " prefetch" : "");
    }
}

// Every finding is one failure of this rank; the first few are printed.
static void count_findings(const char *label, const char *prop, const fc_findings *f) {
    for (int i = 0; i < f->n_kept; i++) MT_CHECK(0, "%s: %s: %s", label, prop, f->msg[i]);
    if (f->n > f->n_kept) {
        mt_errs += f->n - f->n_kept;
        fprintf(stderr, "[rank %d] %s: %s: %d more finding(s) not shown\n", RANK, label, prop, f->n - f->n_kept);
    }
}

static void stats_of(const fc_comm_log *log, run_stats *st) {
    int alive = 0;
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        if (e->op == FC_OP_ALL_GATHER) {
            if (e->prefetch && alive > st->max_alive_before_prefetch) st->max_alive_before_prefetch = alive;
            alive++;
        }
        if (e->op == FC_OP_FREE) alive--;
    }
    size_t n = 0;
    while (n < log->n && log->ev[n].step == log->ev[0].step) n++;
    st->nseq = (int)n;
    st->seq = mallocCheck((n ? n : 1) * sizeof(int));
    for (size_t i = 0; i < n; i++) st->seq[i] = (int)log->ev[i].op * 1000 + log->ev[i].unit + 1;
}

static int seq_equal(const run_stats *a, const run_stats *b) {
    return a->nseq == b->nseq && memcmp(a->seq, b->seq, (size_t)a->nseq * sizeof(int)) == 0;
}

// ---------------------------------------------------------------------------
// Cases

static fc_run_config base(const char *model, fc_strategy s) { return mt_config(model, s, W, 1); }

static int proper_divisor(void) {  // largest divisor of W other than W, 0 if none
    for (int f = W / 2; f >= 1; f--)
        if (W % f == 0) return f;
    return 0;
}

// Runs cfg, checks this rank's comm log (P10) and memory (P11) against the
// theory; keeps the run's statistics in *out, and the run itself in *keep
// (the caller frees it; keep->ok is 0 when it did not run), when asked.
static void run_case_keep(const fc_run_config *cfg, case_result *out, mt_result *keep) {
    if (keep) memset(keep, 0, sizeof *keep);
    fc_error e;
    if (fc_run_config_validate(cfg, &e) || fc_run_config_validate_world(cfg, W, &e)) {
        MT_CHECK(0, "test config invalid: %s", e.msg);
        return;
    }
    char label[256];
    label_of(cfg, label, sizeof label);
    mt_result r;
    run_stats st;
    memset(&st, 0, sizeof st);
    double t0 = MPI_Wtime();
    int errs0 = mt_errs;
    if (mt_run(cfg, MPI_COMM_WORLD, &r) == 0) {
        MT_CHECK(r.n_state == (cfg->optim.kind == FC_OPT_ADAMW ? 2 : 1), "%s: %d optimizer states", label, r.n_state);
        fc_findings p10 = {0}, p11 = {0};
        fc_theory_check_schedule(cfg, W, RANK, &r.log, &p10);
        fc_theory_check_memory(cfg, W, RANK, &r.log, &r.mem, &p11);
        count_findings(label, "P10", &p10);
        count_findings(label, "P11", &p11);
        if ((getenv("SCHED_DUMP") && mt_errs > errs0) || (getenv("SCHED_DUMP_ALL") && RANK == 0))
            dump_log(label, &r.log);
        stats_of(&r.log, &st);
        if (keep)
            *keep = r;
        else
            mt_result_free(&r);
    }
    if (getenv("SCHED_VERBOSE") && RANK == 0)
        printf("  %-80s %.2fs errs %d\n", label, MPI_Wtime() - t0, mt_errs);
    if (out) {
        out->cfg = *cfg;
        out->done = 1;
        out->st = st;
    } else {
        free(st.seq);
    }
}

static void run_case(const fc_run_config *cfg, case_result *out) { run_case_keep(cfg, out, NULL); }

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &RANK);
    const char *models[2] = {"mlp-tiny", "gpt2-tiny"};
    int F = proper_divisor();

    // 1. every strategy on both models (no prefetch, fp32, K = 1); two steps for full_shard
    for (int mi = 0; mi < 2; mi++) {
        fc_strategy ss[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP,
                            FC_STRATEGY_HYBRID_SHARD, FC_STRATEGY_HYBRID_SHARD_ZERO2};
        for (int i = 0; i < 5; i++) {
            fc_run_config c = base(models[mi], ss[i]);
            if (ss[i] == FC_STRATEGY_HYBRID_SHARD || ss[i] == FC_STRATEGY_HYBRID_SHARD_ZERO2) {
                if (!F) continue;
                c.shard_group = F;
            }
            if (ss[i] == FC_STRATEGY_FULL_SHARD) c.steps = 2;
            run_case(&c, NULL);
        }
    }

    // 2. gpt2 full_shard: backward_prefetch none/pre/post x forward_prefetch off/on,
    //    all six issue orders pairwise different
    case_result pf[3][2];
    memset(pf, 0, sizeof pf);
    fc_prefetch bps[3] = {FC_PREFETCH_NONE, FC_PREFETCH_PRE, FC_PREFETCH_POST};
    for (int i = 0; i < 3; i++)
        for (int f = 0; f < 2; f++) {
            fc_run_config c = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
            c.backward_prefetch = bps[i];
            c.forward_prefetch = f;
            run_case(&c, &pf[i][f]);
        }
    for (int a = 0; a < 6; a++)
        for (int bb = a + 1; bb < 6; bb++) {
            case_result *x = &pf[a / 2][a % 2], *y = &pf[bb / 2][bb % 2];
            if (!x->done || !y->done || !x->st.seq || !y->st.seq) continue;
            MT_CHECK(!seq_equal(&x->st, &y->st),
                     "gpt2-tiny full_shard: bwd=%s fwd_prefetch=%d and bwd=%s fwd_prefetch=%d give the same issue "
                     "order",
                     fc_prefetch_name(bps[a / 2]), a % 2, fc_prefetch_name(bps[bb / 2]), bb % 2);
        }

    // 3. the limiter: gpt2 full_shard + forward_prefetch holds root + 2 blocks
    //    without it and at most 2 units with it
    {
        case_result lim;
        memset(&lim, 0, sizeof lim);
        fc_run_config c = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
        c.forward_prefetch = 1;
        c.limit_all_gathers = 1;
        run_case(&c, &lim);
        if (pf[0][1].done && lim.done) {
            MT_CHECK(pf[0][1].st.max_alive_before_prefetch >= 2,
                     "gpt2-tiny full_shard fwd_prefetch: expected a prefetch with 2 units alive without the limiter, "
                     "max was %d",
                     pf[0][1].st.max_alive_before_prefetch);
            MT_CHECK(lim.st.max_alive_before_prefetch <= 1,
                     "gpt2-tiny full_shard fwd_prefetch limit_all_gathers: a prefetch with %d units alive",
                     lim.st.max_alive_before_prefetch);
            MT_CHECK(lim.st.seq && pf[0][1].st.seq && !seq_equal(&lim.st, &pf[0][1].st),
                     "gpt2-tiny full_shard fwd_prefetch: the limiter does not change the issue order");
        }
        free(lim.st.seq);
        fc_prefetch lb[2] = {FC_PREFETCH_PRE, FC_PREFETCH_POST};
        for (int i = 0; i < 2; i++) {
            c = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
            c.backward_prefetch = lb[i];
            c.limit_all_gathers = 1;
            run_case(&c, NULL);
        }
        c = base("mlp-tiny", FC_STRATEGY_FULL_SHARD);
        c.forward_prefetch = 1;
        c.backward_prefetch = FC_PREFETCH_PRE;
        c.limit_all_gathers = 1;
        run_case(&c, NULL);
        c = base("gpt2-tiny", FC_STRATEGY_SHARD_GRAD_OP);
        c.forward_prefetch = 1;
        c.limit_all_gathers = 1;
        run_case(&c, NULL);
    }
    for (int i = 0; i < 3; i++)
        for (int f = 0; f < 2; f++) free(pf[i][f].st.seq);

    // 4. mlp prefetch without a root; shard_grad_op with prefetch flags; FSDP2's
    //    explicit forward prefetch lists beside its implicit backward prefetch
    {
        for (int mi = 0; mi < 2; mi++) {
            fc_run_config c2 = base(models[mi], FC_STRATEGY_FULL_SHARD);
            c2.fsdp_version = 2;
            c2.forward_prefetch = 1;
            c2.divide = fc_default_divide(&c2);
            run_case(&c2, NULL);
        }
        fc_run_config c = base("mlp-tiny", FC_STRATEGY_FULL_SHARD);
        c.backward_prefetch = FC_PREFETCH_POST;
        c.forward_prefetch = 1;
        run_case(&c, NULL);
        c = base("mlp-tiny", FC_STRATEGY_FULL_SHARD);
        c.backward_prefetch = FC_PREFETCH_PRE;
        run_case(&c, NULL);
        c = base("gpt2-tiny", FC_STRATEGY_SHARD_GRAD_OP);
        c.backward_prefetch = FC_PREFETCH_PRE;
        c.forward_prefetch = 1;
        run_case(&c, NULL);
        if (F) {
            c = base("gpt2-tiny", FC_STRATEGY_HYBRID_SHARD);
            c.shard_group = F;
            c.backward_prefetch = FC_PREFETCH_POST;
            c.forward_prefetch = 1;
            run_case(&c, NULL);
        }
    }

    // 5. gradient accumulation K = 2, with and without no_sync
    {
        fc_strategy ks[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
        for (int i = 0; i < 3; i++)
            for (int ns = 0; ns < 2; ns++) {
                fc_run_config c = base(i == 0 ? "gpt2-tiny" : "mlp-tiny", ks[i]);
                c.grad_accum = 2;
                c.no_sync = ns;
                if (i == 0) c.backward_prefetch = FC_PREFETCH_PRE;
                run_case(&c, NULL);
            }
        if (F) {
            fc_run_config c = base("mlp-tiny", FC_STRATEGY_HYBRID_SHARD_ZERO2);
            c.shard_group = F;
            c.grad_accum = 2;
            c.no_sync = 1;
            run_case(&c, NULL);
        }
    }

    // 6. cpu_offload
    {
        fc_run_config c = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
        c.cpu_offload = 1;
        c.backward_prefetch = FC_PREFETCH_POST;
        run_case(&c, NULL);
        c = base("mlp-tiny", FC_STRATEGY_SHARD_GRAD_OP);
        c.cpu_offload = 1;
        c.grad_accum = 2;
        c.no_sync = 1;
        run_case(&c, NULL);
        if (F) {
            c = base("mlp-tiny", FC_STRATEGY_HYBRID_SHARD);
            c.shard_group = F;
            c.cpu_offload = 1;
            run_case(&c, NULL);
        }
    }

    // 7. mixed precision: bf16 params, fp32 reductions
    {
        fc_strategy ms[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
        for (int i = 0; i < 3; i++) {
            fc_run_config c = base(i == 0 ? "gpt2-tiny" : "mlp-tiny", ms[i]);
            c.param_dtype = FC_PREC_BF16;
            c.reduce_dtype = FC_PREC_FP32;
            run_case(&c, NULL);
        }
        if (F) {
            fc_run_config c = base("mlp-tiny", FC_STRATEGY_HYBRID_SHARD_ZERO2);
            c.shard_group = F;
            c.param_dtype = FC_PREC_BF16;
            c.reduce_dtype = FC_PREC_FP32;
            run_case(&c, NULL);
        }
    }

    // 8. SGD with momentum (one state), and clipping on (the norm all-reduce is there either way)
    {
        fc_run_config c = base("mlp-tiny", FC_STRATEGY_FULL_SHARD);
        c.optim.kind = FC_OPT_SGD;
        c.clip_grad_norm = 0.5f;
        run_case(&c, NULL);
        c = base("mlp-tiny", FC_STRATEGY_NO_SHARD);
        c.optim.kind = FC_OPT_SGD;
        run_case(&c, NULL);
    }
    // 9. activation checkpointing, both placements: P10 and P11 per run, and
    //    across runs what the placement costs: outside the unit, FSDP1 gathers
    //    every non-root unit freed after forward a second time per micro-batch
    //    (its recompute's own all-gather); inside, and under FSDP2, it does not.
    //    Every checkpointed stage is recomputed once per micro-batch, and the
    //    activation memory's peak drops. A log judged as another placement fails.
    {
        fc_act_ckpt acs[3] = {FC_ACT_CKPT_NONE, FC_ACT_CKPT_INSIDE, FC_ACT_CKPT_OUTSIDE};
        struct {
            const char *model;
            fc_strategy s;
            int version, K, bwd_pre;
            fc_prec pd;
        } cs[] = {{"gpt2-tiny", FC_STRATEGY_FULL_SHARD, 1, 2, 1, FC_PREC_BF16},
                  {"mlp-tiny", FC_STRATEGY_FULL_SHARD, 1, 1, 0, FC_PREC_FP32},
                  {"gpt2-tiny", FC_STRATEGY_SHARD_GRAD_OP, 1, 1, 0, FC_PREC_FP32},
                  {"gpt2-tiny", FC_STRATEGY_FULL_SHARD, 2, 2, 0, FC_PREC_BF16},
                  {"mlp-tiny", FC_STRATEGY_NO_SHARD, 1, 2, 0, FC_PREC_FP32}};
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            fc_run_config c = base(cs[ci].model, cs[ci].s);
            c.fsdp_version = cs[ci].version;
            c.grad_accum = cs[ci].K;
            c.backward_prefetch = cs[ci].bwd_pre ? FC_PREFETCH_PRE : FC_PREFETCH_NONE;
            c.param_dtype = cs[ci].pd;
            c.divide = fc_default_divide(&c);
            fc_model m;
            fc_model_build(&m, &c.model);
            int ag[3] = {0}, fwd[3] = {0}, rec_ok[3] = {0};
            size_t act_peak[3] = {0};
            fc_comm_log logs[3];
            memset(logs, 0, sizeof logs);
            for (int a = 0; a < 3; a++) {
                fc_run_config ca = c;
                ca.act_ckpt = acs[a];
                mt_result r;
                run_case_keep(&ca, NULL, &r);  // P10, P11 against the theory
                if (!r.ok) continue;
                rec_ok[a] = 1;
                for (size_t i = 0; i < r.log.n; i++) {
                    ag[a] += r.log.ev[i].op == FC_OP_ALL_GATHER;
                    fwd[a] += r.log.ev[i].op == FC_OP_FORWARD;
                }
                act_peak[a] = r.mem.peak[FC_LOC_DEVICE][FC_MEM_ACTIVATIONS];
                logs[a] = r.log;  // kept: judged below as the other placements
                memset(&r.log, 0, sizeof r.log);
                mt_result_free(&r);
            }
            char label[256];
            label_of(&c, label, sizeof label);
            if (rec_ok[0] && rec_ok[1] && rec_ok[2]) {
                int stages = 0, units = 0;  // the checkpointed (non-root) ones
                for (int st = 0; st < m.n_stages; st++) stages += m.stages[st].unit != m.root_unit;
                for (int u = 0; u < m.n_units; u++)
                    units += u != m.root_unit && fc_strategy_reshards(c.strategy);
                int second = c.fsdp_version == 1 ? units * c.grad_accum : 0;
                MT_CHECK(ag[1] == ag[0] && ag[2] == ag[0] + second,
                         "%s: all_gathers none %d, inside %d, outside %d; expected inside == none and outside == "
                         "none + %d",
                         label, ag[0], ag[1], ag[2], second);
                for (int a = 1; a < 3; a++)
                    MT_CHECK(fwd[a] == fwd[0] + stages * c.grad_accum,
                             "%s %s: %d forward computes, expected %d + %d recomputes", label,
                             fc_act_ckpt_name(acs[a]), fwd[a], fwd[0], stages * c.grad_accum);
                MT_CHECK(act_peak[1] < act_peak[0] && act_peak[2] == act_peak[1],
                         "%s: activation peaks none %zu, inside %zu, outside %zu: expected checkpointing lower, the "
                         "placements equal",
                         label, act_peak[0], act_peak[1], act_peak[2]);
                if (RANK == 0 && getenv("SCHED_VERBOSE"))
                    printf("  %s: all_gathers %d/%d/%d, activation peak %zu/%zu/%zu bytes (none/inside/outside)\n",
                           label, ag[0], ag[1], ag[2], act_peak[0], act_peak[1], act_peak[2]);
                // each log judged as another placement: the theory tells them apart
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 3; b++) {
                        if (a == b || (a + b == 3 && !second)) continue;  // inside == outside where no second gather
                        fc_run_config cb = c;
                        cb.act_ckpt = acs[b];
                        fc_findings f = {0};
                        fc_theory_check_schedule(&cb, W, RANK, &logs[a], &f);
                        MT_CHECK(f.n > 0, "%s: the %s log passes P10 judged as %s", label, fc_act_ckpt_name(acs[a]),
                                 fc_act_ckpt_name(acs[b]));
                    }
            }
            for (int a = 0; a < 3; a++) fc_log_free(&logs[a]);
            fc_model_free(&m);
        }
    }
    // 10. FSDP2's integer reshard_after_forward R (a divisor of the shard
    //     group between 1 and F): P10 and P11 per run; the backward all-gathers
    //     run over the post-forward group with the full unit's bytes; the
    //     gathered memory holds the slices; a log judged with another R fails.
    for (int R = 2; R < W; R++) {
        if (W % R) continue;
        fc_run_config c = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD), c0;
        c.fsdp_version = 2;
        c.param_dtype = FC_PREC_BF16;
        c.grad_accum = 2;
        c.divide = fc_default_divide(&c);
        c0 = c;
        c.reshard_after_forward = R;
        mt_result r, r0;
        run_case_keep(&c, NULL, &r);
        fc_run_config fp = c;  // with explicit forward prefetch lists too
        fp.forward_prefetch = 1;
        run_case(&fp, NULL);
        if (F && F % R == 0 && F > R) {  // hybrid: R inside each shard group
            fc_run_config h = c;
            h.strategy = FC_STRATEGY_HYBRID_SHARD;
            h.shard_group = F;
            run_case(&h, NULL);
        }
        if (!r.ok) continue;
        if (mt_run(&c0, MPI_COMM_WORLD, &r0) == 0) {
            int post = 0, shard = 0;
            for (size_t i = 0; i < r.log.n; i++)
                if (r.log.ev[i].op == FC_OP_ALL_GATHER)
                    post += r.log.ev[i].group == FC_GROUP_POST_FORWARD, shard += r.log.ev[i].group != FC_GROUP_POST_FORWARD;
            fc_model m;
            fc_model_build(&m, &c.model);
            int want = (m.n_units - 1) * c.grad_accum;  // every non-root unit, per micro-batch
            MT_CHECK(post == want && shard == m.n_units * c.grad_accum,
                     "reshard_after_forward=%d: %d all_gathers over the post-forward group, %d over the shard group; "
                     "expected %d and %d",
                     R, post, shard, want, m.n_units * c.grad_accum);
            size_t g = r.mem.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS],
                   g0 = r0.mem.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS];
            MT_CHECK(g > g0, "reshard_after_forward=%d: gathered_params peak %zu, not above reshard_after_forward=True's "
                             "%zu (the slices kept after forward)",
                     R, g, g0);
            if (RANK == 0 && getenv("SCHED_VERBOSE"))
                printf("  reshard_after_forward=%d W=%d: all_gathers %d post_forward + %d shard, gathered_params peak "
                       "%zu (True: %zu)\n",
                       R, W, post, shard, g, g0);
            fc_findings f = {0}, f0 = {0};
            fc_theory_check_schedule(&c0, W, RANK, &r.log, &f);   // R's log judged as True
            fc_theory_check_schedule(&c, W, RANK, &r0.log, &f0);  // True's judged as R
            MT_CHECK(f.n > 0 && f0.n > 0, "reshard_after_forward=%d and True: a log passes P10 judged as the other", R);
            fc_model_free(&m);
            mt_result_free(&r0);
        }
        mt_result_free(&r);
    }
    // 11. FSDP2's explicit prefetch lists: every unit's
    //     set_modules_to_forward_prefetch / set_modules_to_backward_prefetch
    //     of the next D units of the pass, on gpt2 with four blocks. P10 and
    //     P11 per run; lists of 2 (and 3, backward only) hold more gathered
    //     parameters than one unit ahead; a log judged with the other's lists
    //     fails.
    if (W >= 2) {
        fc_run_config one = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
        one.model.n_layer = 4;
        one.fsdp_version = 2;
        one.param_dtype = FC_PREC_BF16;
        one.divide = fc_default_divide(&one);
        one.forward_prefetch = 1;
        fc_run_config two = one, three = one;
        two.forward_prefetch = 2, two.backward_prefetch_depth = 2;
        three.forward_prefetch = 0, three.backward_prefetch_depth = 3;
        mt_result r1, r2, r3;
        run_case_keep(&one, NULL, &r1);
        run_case_keep(&two, NULL, &r2);
        run_case_keep(&three, NULL, &r3);
        if (r1.ok && r2.ok && r3.ok) {
            size_t g1 = r1.mem.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS],
                   g2 = r2.mem.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS],
                   g3 = r3.mem.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS];
            MT_CHECK(g2 > g1 && g3 > g2, "prefetch lists: gathered_params peaks %zu (one ahead), %zu (lists of 2), %zu "
                                         "(backward lists of 3): not increasing", g1, g2, g3);
            if (RANK == 0 && getenv("SCHED_VERBOSE"))
                printf("  FSDP2 prefetch lists W=%d, 4 blocks: gathered_params peak %zu / %zu / %zu bytes (one ahead, "
                       "lists of 2, backward lists of 3)\n", W, g1, g2, g3);
            fc_findings f12 = {0}, f21 = {0}, f32 = {0};
            fc_theory_check_schedule(&two, W, RANK, &r1.log, &f12);
            fc_theory_check_schedule(&one, W, RANK, &r2.log, &f21);
            fc_theory_check_schedule(&two, W, RANK, &r3.log, &f32);
            MT_CHECK(f12.n > 0 && f21.n > 0 && f32.n > 0,
                     "prefetch lists: a log passes P10 judged with other lists (%d, %d, %d findings)", f12.n, f21.n,
                     f32.n);
        }
        mt_result_free(&r1);
        mt_result_free(&r2);
        mt_result_free(&r3);
    }
    return mt_finalize();
}
