// tests/mpi/test_schedule.c — P10 (comm log) and P11 (memory) against the theory.
//
// Every expected count, byte size, issue-order relation and memory figure here
// is derived from the specification (DESIGN §5, §8 and the schedule contract
// in core/schedule.h), from the model registry (units, stages, root_unit) and
// the config alone; nothing is taken from the engine. Each rank runs the same
// configurations through mt_run and checks its own comm log and memory figures.
//
// Theory in brief (G = shard-group size: W, or F for hybrid; S_u = ceil(N_u/G),
// P_u = S_u*G; K micro-batches, of which the sync ones reduce gradients):
//  - all_gather bytes P_u*sizeof(param_dtype); reduce_scatter P_u*sizeof(reduce_dtype);
//    no_shard all_reduce (world) P_u(G=W)*sizeof(reduce_dtype); hybrid replica
//    all_reduce (replicate) S_u*sizeof(reduce_dtype) when W/F > 1; the norm
//    all_reduce (unit -1, phase clip, 8 bytes) once a step; every issue is
//    completed later by a wait for the same op and unit.
//  - full_shard/hybrid_shard gather every unit in forward, free the non-root units
//    after their last forward stage, gather those again in backward and free every
//    unit after its last backward stage; shard_grad_op/hybrid_shard_zero2 gather
//    once in forward and free in backward; no_shard gathers nothing.
//  - prefetch orders (forward_prefetch, backward_prefetch pre/post/none) and the
//    all-gather limiter; every compute runs on a completed gather.
//  - per-rank peak memory per category.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "mpitest.h"
#include "schedule.h"

#define MAXU 16
#define MAXS 20
#define MAXK 4

static int W = 1, RANK = 0;

// ---------------------------------------------------------------------------
// The theory of one configuration.

typedef struct {
    char label[256];
    fc_run_config cfg;
    fc_model m;
    int nu, ns, root, K;
    int sharded;   // any strategy that gathers
    int reshard;   // full_shard / hybrid_shard: free after forward
    int hybrid;
    int G, nrep;   // shard-group size, number of replicas (W/G)
    int offload, limiter, fwdpf;
    fc_prefetch bp;
    size_t N[MAXU], S[MAXU], P[MAXU], PW[MAXU];
    size_t psz, rsz;
    int ff[MAXU], lf[MAXU];  // first / last forward stage of each unit
} theory;

static size_t prec_size(fc_prec p) { return p == FC_PREC_FP32 ? 4 : 2; }

static int sync_micro(const theory *t, int k) { return !t->cfg.no_sync || k == t->K - 1; }

static int unit_of(const theory *t, int s) { return t->m.stages[s].unit; }

static void theory_init(theory *t, const fc_run_config *c) {
    memset(t, 0, sizeof *t);
    t->cfg = *c;
    fc_model_build(&t->m, &c->model);
    t->nu = t->m.n_units;
    t->ns = t->m.n_stages;
    t->root = t->m.root_unit;
    t->K = c->grad_accum;
    t->hybrid = c->strategy == FC_STRATEGY_HYBRID_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
    t->sharded = c->strategy != FC_STRATEGY_NO_SHARD && c->strategy != FC_STRATEGY_LOCAL;
    t->reshard = c->strategy == FC_STRATEGY_FULL_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD;
    t->G = t->hybrid ? (c->shard_group ? c->shard_group : W) : W;
    t->nrep = W / t->G;
    t->offload = c->cpu_offload;
    t->limiter = c->limit_all_gathers;
    t->fwdpf = c->forward_prefetch;
    t->bp = c->backward_prefetch;
    t->psz = prec_size(c->param_dtype);
    t->rsz = prec_size(c->reduce_dtype);
    if (t->nu > MAXU || t->ns > MAXS || t->K > MAXK) {
        fprintf(stderr, "test_schedule: model too large for the test's tables\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (int u = 0; u < t->nu; u++) {
        t->N[u] = t->m.units[u].numel;
        t->S[u] = (t->N[u] + (size_t)t->G - 1) / (size_t)t->G;
        t->P[u] = t->S[u] * (size_t)t->G;
        t->PW[u] = (t->N[u] + (size_t)W - 1) / (size_t)W * (size_t)W;
        t->ff[u] = -1;
        t->lf[u] = -1;
    }
    for (int s = 0; s < t->ns; s++) {
        int u = unit_of(t, s);
        if (t->ff[u] < 0) t->ff[u] = s;
        t->lf[u] = s;
    }
    int n = snprintf(t->label, sizeof t->label, "%s %s", c->model.name, fc_strategy_name(c->strategy));
    if (t->hybrid) n += snprintf(t->label + n, sizeof t->label - n, "(F=%d)", t->G);
    if (t->bp != FC_PREFETCH_NONE)
        n += snprintf(t->label + n, sizeof t->label - n, " bwd=%s", fc_prefetch_name(t->bp));
    if (t->fwdpf) n += snprintf(t->label + n, sizeof t->label - n, " fwd_prefetch");
    if (t->limiter) n += snprintf(t->label + n, sizeof t->label - n, " limit_all_gathers");
    if (t->K > 1) n += snprintf(t->label + n, sizeof t->label - n, " K=%d%s", t->K, c->no_sync ? " no_sync" : "");
    if (t->offload) n += snprintf(t->label + n, sizeof t->label - n, " cpu_offload");
    if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
        n += snprintf(t->label + n, sizeof t->label - n, " param=%s reduce=%s", fc_prec_name(c->param_dtype),
                      fc_prec_name(c->reduce_dtype));
    if (c->optim.kind != FC_OPT_ADAMW) n += snprintf(t->label + n, sizeof t->label - n, " %s", fc_opt_name(c->optim.kind));
    if (c->clip_grad_norm > 0) n += snprintf(t->label + n, sizeof t->label - n, " clip=%g", (double)c->clip_grad_norm);
    snprintf(t->label + n, sizeof t->label - n, " W=%d", W);
}

static void theory_free(theory *t) { fc_model_free(&t->m); }

// Elements of unit u that this rank's shard holds (not padding), for a shard
// group that is the whole world (rank r owns [r*S, (r+1)*S)).
static size_t own_valid(const theory *t, int u, int r) {
    size_t lo = (size_t)r * t->S[u];
    if (lo >= t->N[u]) return 0;
    size_t n = t->N[u] - lo;
    return n < t->S[u] ? n : t->S[u];
}

// ---------------------------------------------------------------------------
// What one step of the log holds, by micro-batch.

typedef struct {
    int n;       // count
    int idx;     // first index (absolute in the log), -1 if none
} slot;

typedef struct {
    slot fwd[MAXK][MAXS], bwd[MAXK][MAXS];
    slot agF[MAXK][MAXU], agB[MAXK][MAXU];   // all_gather by phase
    slot frF[MAXK][MAXU], frB[MAXK][MAXU];   // free by phase
    slot rs[MAXK][MAXU], arW[MAXK][MAXU], arR[MAXK][MAXU];
    slot d2h[MAXK][MAXU], h2d[MAXU];
    slot optim[MAXU], clip;
    int other;                  // events of no expected kind
} step_idx;

static void put(slot *s, int i) {
    if (s->n++ == 0) s->idx = i;
}

// Statistics the cross-run checks use.
typedef struct {
    int max_alive_before_prefetch;  // over prefetched all_gathers, alive units before the issue
    size_t log_peak_gathered;       // max over the log of sum of alive P_u * psz
    int *seq;                       // step 0's (op, unit) codes
    int nseq;
} run_stats;

static const char *opn(fc_op op) { return fc_op_name(op); }

static void dump_log(const theory *t, const fc_comm_log *log) {
    fprintf(stderr, "[rank %d] comm log of %s:\n", RANK, t->label);
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        fprintf(stderr, "  s%ld m%d #%-3d %-14s%s%-14s unit %2d stage %2d %-9s %7zu B %-4s %-8s%s\n", e->step,
                e->micro, e->order, opn(e->op), e->op == FC_OP_WAIT ? "of " : "   ",
                e->op == FC_OP_WAIT ? opn(e->of) : "", e->unit, e->stage, fc_group_name(e->group), e->bytes,
                fc_prec_name(e->dtype), fc_phase_name(e->phase), e->prefetch ? " prefetch" : "");
    }
}

// Checks one step's events [b, e) of the log.
static void check_step(const theory *t, const fc_comm_log *log, long step, size_t b, size_t e, run_stats *st) {
    const char *L = t->label;
    const fc_event *ev = log->ev;
    int n = (int)(e - b);
    int *waitof = malloc((size_t)(n ? n : 1) * sizeof(int));   // issue -> its wait (absolute)
    int *alive_before = malloc((size_t)(n + 1) * sizeof(int)); // alive units before event i
    if (!waitof || !alive_before) abort();
    for (int i = 0; i < n; i++) waitof[i] = -1;
    step_idx x;
    memset(&x, 0, sizeof x);
    for (int k = 0; k < MAXK; k++) {
        for (int s = 0; s < MAXS; s++) x.fwd[k][s].idx = x.bwd[k][s].idx = -1;
        for (int u = 0; u < MAXU; u++)
            x.agF[k][u].idx = x.agB[k][u].idx = x.frF[k][u].idx = x.frB[k][u].idx = x.rs[k][u].idx =
                x.arW[k][u].idx = x.arR[k][u].idx = x.d2h[k][u].idx = -1;
    }
    for (int u = 0; u < MAXU; u++) x.optim[u].idx = x.h2d[u].idx = -1;
    x.clip.idx = -1;

    // Pass 1: classify, bytes, waits, gather state machine, limiter, h2d.
    int state[MAXU] = {0};  // 0 not gathered, 1 gather issued, 2 gather complete
    int h2d_pending[MAXU] = {0};
    int alive = 0;
    size_t alive_bytes = 0;
    for (size_t i = b; i < e; i++) {
        const fc_event *v = &ev[i];
        int ri = (int)(i - b);
        alive_before[ri] = alive;
        MT_CHECK(v->order == ri, "%s: step %ld event %d has order %d", L, step, ri, v->order);
        int u = v->unit, k = v->micro;
        int unit_ok = u >= 0 && u < t->nu;
        int micro_ok = k >= 0 && k < t->K;
        int per_micro = v->op != FC_OP_OPTIM && v->op != FC_OP_WAIT && v->op != FC_OP_H2D &&
                        !(v->op == FC_OP_ALL_REDUCE && u == -1);
        if (per_micro && !(unit_ok && micro_ok)) {
            MT_CHECK(0, "%s: step %ld #%d %s has unit %d micro %d (units 0..%d, micro-batches 0..%d)", L, step, ri,
                     opn(v->op), u, k, t->nu - 1, t->K - 1);
            x.other++;
            continue;
        }
        switch (v->op) {
        case FC_OP_FORWARD:
        case FC_OP_BACKWARD: {
            int s = v->stage;
            if (s < 0 || s >= t->ns || unit_of(t, s) != u) {
                MT_CHECK(0, "%s: step %ld #%d %s stage %d unit %d does not match the model's stages", L, step, ri,
                         opn(v->op), s, u);
                x.other++;
                break;
            }
            MT_CHECK(v->phase == (v->op == FC_OP_FORWARD ? FC_PHASE_FORWARD : FC_PHASE_BACKWARD),
                     "%s: step %ld #%d %s stage %d in phase %s", L, step, ri, opn(v->op), s, fc_phase_name(v->phase));
            put(v->op == FC_OP_FORWARD ? &x.fwd[k][s] : &x.bwd[k][s], (int)i);
            if (t->sharded)
                MT_CHECK(state[u] == 2,
                         "%s: step %ld micro %d: %s of stage %d (unit %d) at #%d on a unit whose all_gather is %s "
                         "(expected: waited)",
                         L, step, k, opn(v->op), s, u, ri, state[u] == 0 ? "not issued/freed" : "not yet waited");
            break;
        }
        case FC_OP_ALL_GATHER:
            MT_CHECK(t->sharded, "%s: step %ld #%d all_gather of unit %d under a strategy that gathers nothing", L,
                     step, ri, u);
            MT_CHECK(v->bytes == t->P[u] * t->psz && v->dtype == t->cfg.param_dtype,
                     "%s: all_gather unit %d: expected %zu bytes %s, got %zu bytes %s", L, u, t->P[u] * t->psz,
                     fc_prec_name(t->cfg.param_dtype), v->bytes, fc_prec_name(v->dtype));
            MT_CHECK(state[u] == 0, "%s: step %ld micro %d #%d: all_gather of unit %d while it is already gathered", L,
                     step, k, ri, u);
            if (v->phase == FC_PHASE_FORWARD)
                put(&x.agF[k][u], (int)i);
            else if (v->phase == FC_PHASE_BACKWARD)
                put(&x.agB[k][u], (int)i);
            else {
                MT_CHECK(0, "%s: all_gather unit %d in phase %s", L, u, fc_phase_name(v->phase));
                x.other++;
            }
            if (v->prefetch) {
                if (alive > st->max_alive_before_prefetch) st->max_alive_before_prefetch = alive;
                if (t->limiter)
                    MT_CHECK(alive <= 1,
                             "%s: step %ld micro %d #%d: prefetched all_gather of unit %d issued with %d units alive "
                             "(limiter allows at most 1 before a prefetch)",
                             L, step, k, ri, u, alive);
            }
            if (t->offload) {
                MT_CHECK(h2d_pending[u] > 0, "%s: step %ld #%d: all_gather of unit %d without an h2d before it", L,
                         step, ri, u);
                if (h2d_pending[u] > 0) h2d_pending[u]--;
            }
            state[u] = 1;
            alive++;
            alive_bytes += t->P[u] * t->psz;
            if (alive_bytes > st->log_peak_gathered) st->log_peak_gathered = alive_bytes;
            break;
        case FC_OP_FREE:
            MT_CHECK(t->sharded, "%s: step %ld #%d free of unit %d under a strategy that gathers nothing", L, step, ri,
                     u);
            MT_CHECK(state[u] == 2, "%s: step %ld micro %d #%d: free of unit %d whose all_gather is %s", L, step, k,
                     ri, u, state[u] == 0 ? "not issued" : "not waited");
            if (v->phase == FC_PHASE_FORWARD)
                put(&x.frF[k][u], (int)i);
            else if (v->phase == FC_PHASE_BACKWARD)
                put(&x.frB[k][u], (int)i);
            else {
                MT_CHECK(0, "%s: free unit %d in phase %s", L, u, fc_phase_name(v->phase));
                x.other++;
            }
            if (state[u]) {
                alive--;
                alive_bytes -= t->P[u] * t->psz;
            }
            state[u] = 0;
            break;
        case FC_OP_REDUCE_SCATTER:
            MT_CHECK(t->sharded, "%s: reduce_scatter under no_shard (unit %d)", L, u);
            MT_CHECK(v->bytes == t->P[u] * t->rsz && v->dtype == t->cfg.reduce_dtype,
                     "%s: reduce_scatter unit %d: expected %zu bytes %s, got %zu bytes %s", L, u, t->P[u] * t->rsz,
                     fc_prec_name(t->cfg.reduce_dtype), v->bytes, fc_prec_name(v->dtype));
            put(&x.rs[k][u], (int)i);
            break;
        case FC_OP_ALL_REDUCE:
            if (u == -1) {
                MT_CHECK(v->phase == FC_PHASE_CLIP && v->bytes == 8,
                         "%s: norm all_reduce: expected phase clip, 8 bytes; got phase %s, %zu bytes", L,
                         fc_phase_name(v->phase), v->bytes);
                put(&x.clip, (int)i);
            } else if (v->group == FC_GROUP_WORLD && !t->sharded) {
                MT_CHECK(v->bytes == t->PW[u] * t->rsz && v->dtype == t->cfg.reduce_dtype,
                         "%s: gradient all_reduce unit %d: expected %zu bytes %s, got %zu bytes %s", L, u,
                         t->PW[u] * t->rsz, fc_prec_name(t->cfg.reduce_dtype), v->bytes, fc_prec_name(v->dtype));
                put(&x.arW[k][u], (int)i);
            } else if (v->group == FC_GROUP_REPLICATE && t->hybrid) {
                MT_CHECK(v->bytes == t->S[u] * t->rsz && v->dtype == t->cfg.reduce_dtype,
                         "%s: replica all_reduce unit %d: expected %zu bytes %s, got %zu bytes %s", L, u,
                         t->S[u] * t->rsz, fc_prec_name(t->cfg.reduce_dtype), v->bytes, fc_prec_name(v->dtype));
                put(&x.arR[k][u], (int)i);
            } else {
                MT_CHECK(0, "%s: step %ld #%d: unexpected all_reduce of unit %d in group %s", L, step, ri, u,
                         fc_group_name(v->group));
                x.other++;
            }
            break;
        case FC_OP_WAIT: {
            int found = -1;
            for (size_t j = b; j < i; j++) {
                const fc_event *w = &ev[j];
                if (w->op == v->of && w->unit == u && waitof[j - b] < 0 &&
                    (w->op == FC_OP_ALL_GATHER || w->op == FC_OP_REDUCE_SCATTER || w->op == FC_OP_ALL_REDUCE)) {
                    found = (int)j;
                    break;
                }
            }
            MT_CHECK(found >= 0, "%s: step %ld #%d: wait of %s unit %d with no earlier unmatched issue", L, step, ri,
                     opn(v->of), u);
            if (found >= 0) waitof[found - (int)b] = (int)i;
            if (found >= 0 && v->of == FC_OP_ALL_GATHER && unit_ok) {
                MT_CHECK(state[u] == 1, "%s: step %ld #%d: wait of all_gather unit %d in gather state %d", L, step, ri,
                         u, state[u]);
                state[u] = 2;
            }
            break;
        }
        case FC_OP_H2D:
            MT_CHECK(t->offload && unit_ok, "%s: step %ld #%d: h2d of unit %d without cpu_offload", L, step, ri, u);
            if (unit_ok) {
                MT_CHECK(v->bytes == t->S[u] * 4, "%s: h2d unit %d: expected %zu bytes, got %zu", L, u, t->S[u] * 4,
                         v->bytes);
                put(&x.h2d[u], (int)i);
                h2d_pending[u]++;
            }
            break;
        case FC_OP_D2H:
            MT_CHECK(t->offload, "%s: step %ld #%d: d2h of unit %d without cpu_offload", L, step, ri, u);
            if (t->hybrid)
                MT_CHECK(v->bytes <= t->S[u] * 4, "%s: d2h unit %d: expected at most %zu bytes, got %zu", L, u,
                         t->S[u] * 4, v->bytes);
            else
                MT_CHECK(v->bytes == own_valid(t, u, RANK) * 4,
                         "%s: d2h unit %d: expected %zu bytes (own valid elements * 4), got %zu", L, u,
                         own_valid(t, u, RANK) * 4, v->bytes);
            put(&x.d2h[k][u], (int)i);
            break;
        case FC_OP_OPTIM:
            if (!unit_ok) {
                MT_CHECK(0, "%s: optim event with unit %d", L, u);
                break;
            }
            MT_CHECK(v->phase == FC_PHASE_OPTIM, "%s: optim unit %d in phase %s", L, u, fc_phase_name(v->phase));
            put(&x.optim[u], (int)i);
            break;
        default:
            MT_CHECK(0, "%s: unknown op %d", L, (int)v->op);
            x.other++;
        }
    }
    alive_before[n] = alive;
    for (int i = 0; i < n; i++) {
        const fc_event *w = &ev[b + (size_t)i];
        if ((w->op == FC_OP_ALL_GATHER || w->op == FC_OP_REDUCE_SCATTER || w->op == FC_OP_ALL_REDUCE))
            MT_CHECK(waitof[i] >= 0, "%s: step %ld #%d: %s of unit %d is never waited", L, step, i, opn(w->op),
                     w->unit);
    }
    if (t->sharded)
        for (int u = 0; u < t->nu; u++)
            MT_CHECK(state[u] == 0, "%s: step %ld ends with unit %d still gathered", L, step, u);
    MT_CHECK(x.other == 0, "%s: step %ld has %d events of no expected kind", L, step, x.other);
#define WAIT_OF(absidx) ((absidx) >= 0 ? waitof[(absidx) - (int)b] : -1)
#define ALIVE_AT(absidx) (alive_before[(absidx) - (int)b])

    // Pass 2: counts per micro-batch, unit and stage.
    int counts_ok = 1;
    for (int k = 0; k < t->K; k++) {
        int sy = sync_micro(t, k);
        for (int s = 0; s < t->ns; s++) {
            if (x.fwd[k][s].n != 1 || x.bwd[k][s].n != 1) {
                counts_ok = 0;
                MT_CHECK(0, "%s: step %ld micro %d stage %d: expected 1 forward and 1 backward, got %d and %d", L,
                         step, k, s, x.fwd[k][s].n, x.bwd[k][s].n);
            }
        }
        for (int u = 0; u < t->nu; u++) {
            int isroot = u == t->root;
            int eagF = t->sharded ? 1 : 0;
            int eagB = t->reshard && !isroot ? 1 : 0;
            int efrF = t->reshard && !isroot ? 1 : 0;
            int efrB = t->sharded ? 1 : 0;
            int ers = t->sharded && sy ? 1 : 0;
            int earW = !t->sharded && sy ? 1 : 0;
            int earR = t->hybrid && t->nrep > 1 && sy ? 1 : 0;
            int ed2h = t->offload && sy ? 1 : 0;
            const char *what[] = {"forward all_gather", "backward all_gather", "forward free", "backward free",
                                  "reduce_scatter", "all_reduce(world)", "all_reduce(replicate)", "d2h"};
            slot *sl[] = {&x.agF[k][u], &x.agB[k][u], &x.frF[k][u], &x.frB[k][u],
                          &x.rs[k][u],  &x.arW[k][u], &x.arR[k][u], &x.d2h[k][u]};
            int want[] = {eagF, eagB, efrF, efrB, ers, earW, earR, ed2h};
            for (int q = 0; q < 8; q++)
                if (sl[q]->n != want[q]) {
                    counts_ok = 0;
                    MT_CHECK(0, "%s: step %ld micro %d unit %d%s: expected %d %s, got %d", L, step, k, u,
                             isroot ? " (root)" : "", want[q], what[q], sl[q]->n);
                }
        }
    }
    for (int u = 0; u < t->nu; u++) {
        int ag_total = 0;
        for (int k = 0; k < t->K; k++) ag_total += x.agF[k][u].n + x.agB[k][u].n;
        int eh2d = t->offload ? ag_total : 0;
        if (x.h2d[u].n != eh2d) {
            counts_ok = 0;
            MT_CHECK(0, "%s: step %ld unit %d: expected %d h2d (one per all_gather), got %d", L, step, u, eh2d,
                     x.h2d[u].n);
        }
        if (x.optim[u].n != 1) {
            counts_ok = 0;
            MT_CHECK(0, "%s: step %ld unit %d: expected 1 optim event, got %d", L, step, u, x.optim[u].n);
        }
    }
    if (x.clip.n != 1) {
        counts_ok = 0;
        MT_CHECK(0, "%s: step %ld: expected 1 norm all_reduce (unit -1, phase clip), got %d", L, step, x.clip.n);
    }
    if (!counts_ok) {
        if (getenv("SCHED_DUMP")) dump_log(t, log);
        free(waitof);
        free(alive_before);
        return;
    }

    // Pass 3: order relations, per micro-batch.
    for (int k = 0; k < t->K; k++) {
        int sy = sync_micro(t, k);
        // stages in order forward, reverse backward; micro-batches one after the other
        for (int s = 0; s + 1 < t->ns; s++) {
            MT_CHECK(x.fwd[k][s].idx < x.fwd[k][s + 1].idx, "%s: step %ld micro %d: forward stage %d after stage %d",
                     L, step, k, s, s + 1);
            MT_CHECK(x.bwd[k][s + 1].idx < x.bwd[k][s].idx, "%s: step %ld micro %d: backward stage %d after stage %d",
                     L, step, k, s + 1, s);
        }
        MT_CHECK(x.fwd[k][t->ns - 1].idx < x.bwd[k][t->ns - 1].idx,
                 "%s: step %ld micro %d: backward starts before forward ends", L, step, k);
        if (k + 1 < t->K)
            MT_CHECK(x.bwd[k][0].idx < x.fwd[k + 1][0].idx, "%s: step %ld: micro %d starts before micro %d ends", L,
                     step, k + 1, k);

        // gradient reductions after the unit's last backward stage; replica
        // all-reduce after the reduce-scatter completed; d2h after the last reduction
        for (int u = 0; u < t->nu; u++) {
            int lastb = x.bwd[k][t->ff[u]].idx;
            int fin = -1;
            if (t->sharded && sy) {
                MT_CHECK(x.rs[k][u].idx > lastb,
                         "%s: step %ld micro %d: reduce_scatter of unit %d (#%d) before its last backward stage (#%d)",
                         L, step, k, u, x.rs[k][u].idx - (int)b, lastb - (int)b);
                fin = x.rs[k][u].idx;
                if (t->hybrid && t->nrep > 1) {
                    MT_CHECK(x.arR[k][u].idx > WAIT_OF(x.rs[k][u].idx),
                             "%s: step %ld micro %d: replica all_reduce of unit %d before its reduce_scatter's wait", L,
                             step, k, u);
                    fin = x.arR[k][u].idx;
                }
            }
            if (!t->sharded && sy) {
                MT_CHECK(x.arW[k][u].idx > lastb,
                         "%s: step %ld micro %d: all_reduce of unit %d before its last backward stage", L, step, k, u);
                fin = x.arW[k][u].idx;
            }
            if (t->offload && sy && fin >= 0)
                MT_CHECK(x.d2h[k][u].idx > WAIT_OF(fin),
                         "%s: step %ld micro %d: d2h of unit %d (#%d) before its gradient reduction completed (#%d)", L,
                         step, k, u, x.d2h[k][u].idx - (int)b, WAIT_OF(fin) - (int)b);
            if (k == t->K - 1 && fin >= 0)
                MT_CHECK(x.clip.idx > WAIT_OF(fin),
                         "%s: step %ld: norm all_reduce before unit %d's gradient reduction completed", L, step, u);
            if (k == t->K - 1)
                MT_CHECK(x.optim[u].idx > WAIT_OF(x.clip.idx),
                         "%s: step %ld: optim of unit %d before the norm all_reduce completed", L, step, u);
        }
        if (!t->sharded) continue;

        // frees: after the unit's last forward stage (non-root, reshard), after
        // its last backward stage (every unit)
        for (int u = 0; u < t->nu; u++) {
            if (t->reshard && u != t->root)
                MT_CHECK(x.frF[k][u].idx > x.fwd[k][t->lf[u]].idx,
                         "%s: step %ld micro %d: forward free of unit %d before its last forward stage", L, step, k, u);
            MT_CHECK(x.frB[k][u].idx > x.bwd[k][t->ff[u]].idx,
                     "%s: step %ld micro %d: backward free of unit %d before its last backward stage", L, step, k, u);
        }

        // forward all-gathers: stage 0's unit at need; each next unit in
        // first-use order prefetched before the current stage's compute
        MT_CHECK(!ev[x.agF[k][unit_of(t, 0)].idx].prefetch,
                 "%s: step %ld micro %d: the first unit's all_gather is flagged prefetch", L, step, k);
        for (int s = 0; s + 1 < t->ns; s++) {
            int cu = unit_of(t, s), nx = unit_of(t, s + 1);
            if (nx == cu || t->ff[nx] != s + 1) continue;  // next stage's unit already gathered
            int ag = x.agF[k][nx].idx, X = x.fwd[k][s].idx;
            int pf = ev[ag].prefetch;
            if (t->fwdpf && !t->limiter) {
                MT_CHECK(ag < X && pf,
                         "%s: step %ld micro %d: forward_prefetch: all_gather of unit %d (#%d, prefetch=%d) expected "
                         "before the forward compute of stage %d (unit %d, #%d) and flagged prefetch",
                         L, step, k, nx, ag - (int)b, pf, s, cu, X - (int)b);
            } else if (t->fwdpf) {
                if (ag < X)
                    MT_CHECK(pf, "%s: step %ld micro %d: all_gather of unit %d ahead of need but not flagged prefetch",
                             L, step, k, nx);
                else
                    MT_CHECK(ALIVE_AT(X) > 1,
                             "%s: step %ld micro %d: limiter: unit %d not prefetched at stage %d although only %d unit "
                             "alive",
                             L, step, k, nx, s, ALIVE_AT(X));
            } else {
                MT_CHECK(ag > X && !pf,
                         "%s: step %ld micro %d: no forward_prefetch: all_gather of unit %d (#%d, prefetch=%d) expected "
                         "after the forward compute of stage %d (#%d), not flagged",
                         L, step, k, nx, ag - (int)b, pf, s, X - (int)b);
            }
        }

        // backward all-gathers (reshard strategies: every non-root unit again)
        if (!t->reshard) continue;
        for (int v = 0; v < t->nu; v++) {
            if (v == t->root) continue;
            int ag = x.agB[k][v].idx;
            int pf = ev[ag].prefetch;
            int p = t->lf[v] + 1;  // the backward stage before v's first backward stage
            if (p >= t->ns) {
                MT_CHECK(ag > x.fwd[k][t->ns - 1].idx && !pf,
                         "%s: step %ld micro %d: backward all_gather of unit %d (first backward unit) expected after "
                         "the forward pass, not flagged (prefetch=%d)",
                         L, step, k, v, pf);
                continue;
            }
            int u = unit_of(t, p);
            int pre_opp = p == t->lf[u];   // p is u's first backward stage
            int post_opp = p == t->ff[u];  // p is u's last backward stage
            int X = x.bwd[k][p].idx;
            // at need: after stage p's backward and, if that finished unit u, after
            // u's free and reduce-scatter issue
            int need_lo = X;
            if (post_opp) {
                if (x.frB[k][u].idx > need_lo) need_lo = x.frB[k][u].idx;
                if (sy && x.rs[k][u].idx > need_lo) need_lo = x.rs[k][u].idx;
            }
            int mode = (t->bp == FC_PREFETCH_PRE && pre_opp)     ? FC_PREFETCH_PRE
                       : (t->bp == FC_PREFETCH_POST && post_opp) ? FC_PREFETCH_POST
                                                                 : FC_PREFETCH_NONE;
            if (mode == FC_PREFETCH_NONE) {
                MT_CHECK(ag > need_lo && !pf,
                         "%s: step %ld micro %d: backward all_gather of unit %d (#%d, prefetch=%d) expected at need: "
                         "after unit %d's backward of stage %d%s (#%d), not flagged",
                         L, step, k, v, ag - (int)b, pf, u, p, post_opp ? ", free and reduce_scatter" : "",
                         need_lo - (int)b);
                continue;
            }
            int lo, hi;
            if (mode == FC_PREFETCH_PRE) {
                lo = x.fwd[k][t->ns - 1].idx;
                int w = WAIT_OF(x.agB[k][u].idx);
                if (w > lo) lo = w;
                hi = X;
            } else {
                lo = X;
                hi = x.frB[k][u].idx;
                if (sy && x.rs[k][u].idx < hi) hi = x.rs[k][u].idx;
            }
            int inwin = ag > lo && ag < hi;
            if (!t->limiter) {
                MT_CHECK(inwin && pf,
                         "%s: step %ld micro %d: backward_prefetch %s: all_gather of unit %d (#%d, prefetch=%d) "
                         "expected between #%d and #%d (unit %d, stage %d), flagged",
                         L, step, k, fc_prefetch_name(mode), v, ag - (int)b, pf, lo - (int)b, hi - (int)b, u, p);
            } else if (inwin) {
                MT_CHECK(pf, "%s: step %ld micro %d: backward all_gather of unit %d prefetched but not flagged", L,
                         step, k, v);
            } else {
                MT_CHECK(ALIVE_AT(X) > 1 && ag > lo,
                         "%s: step %ld micro %d: limiter: unit %d not prefetched (#%d) at stage %d although only %d "
                         "unit alive",
                         L, step, k, v, ag - (int)b, p, ALIVE_AT(X));
            }
        }
    }
    if (getenv("SCHED_DUMP") && mt_errs) dump_log(t, log);
    free(waitof);
    free(alive_before);
#undef WAIT_OF
#undef ALIVE_AT
}

static void check_log(const theory *t, const fc_comm_log *log, run_stats *st) {
    MT_CHECK(log->n > 0, "%s: empty comm log", t->label);
    size_t b = 0;
    for (long step = 0; step < t->cfg.steps; step++) {
        size_t e = b;
        while (e < log->n && log->ev[e].step == step) e++;
        MT_CHECK(e > b, "%s: no events for step %ld", t->label, step);
        if (step == 0) {
            st->nseq = (int)(e - b);
            st->seq = malloc((size_t)(st->nseq ? st->nseq : 1) * sizeof(int));
            if (!st->seq) abort();
            for (size_t i = b; i < e; i++) st->seq[i - b] = (int)log->ev[i].op * 1000 + log->ev[i].unit + 1;
        }
        check_step(t, log, step, b, e, st);
        b = e;
    }
    MT_CHECK(b == log->n, "%s: %zu events beyond step %d", t->label, log->n - b, t->cfg.steps - 1);
}

// ---------------------------------------------------------------------------
// P11: per-rank peak memory per category.

static void check_mem(const theory *t, const fc_mem_stats *mem, const run_stats *st) {
    const char *L = t->label;
    size_t shard = 0;
    for (int u = 0; u < t->nu; u++) shard += (t->sharded ? t->S[u] : t->N[u]) * 4;
    int n_state = t->cfg.optim.kind == FC_OPT_ADAMW ? 2 : (t->cfg.optim.momentum > 0 ? 1 : 0);
    fc_mem_loc on = t->offload ? FC_LOC_HOST : FC_LOC_DEVICE;
    fc_mem_loc off = t->offload ? FC_LOC_DEVICE : FC_LOC_HOST;
    fc_mem_cat cats[3] = {FC_MEM_PARAM_SHARD, FC_MEM_GRAD_SHARD, FC_MEM_OPTIM_STATE};
    size_t want[3] = {shard, shard, (size_t)n_state * shard};
    for (int i = 0; i < 3; i++) {
        MT_CHECK(mem->peak[on][cats[i]] == want[i], "%s: peak %s %s: expected %zu bytes, got %zu", L,
                 fc_mem_loc_name(on), fc_mem_cat_name(cats[i]), want[i], mem->peak[on][cats[i]]);
        MT_CHECK(mem->peak[off][cats[i]] == 0, "%s: peak %s %s: expected 0 bytes, got %zu", L, fc_mem_loc_name(off),
                 fc_mem_cat_name(cats[i]), mem->peak[off][cats[i]]);
    }
    int micro = t->cfg.global_batch / W / t->K;
    int T = t->m.cfg.kind == FC_MODEL_GPT2 ? t->cfg.seq_len : 1;
    size_t acts = fc_acts_numel(&t->m, micro, T) * 4;
    MT_CHECK(mem->peak[FC_LOC_DEVICE][FC_MEM_ACTIVATIONS] == acts,
             "%s: peak device activations: expected %zu bytes (micro-batch %d), got %zu", L, acts, micro,
             mem->peak[FC_LOC_DEVICE][FC_MEM_ACTIVATIONS]);

    // gathered parameters and unsharded gradients
    const size_t *P = t->sharded ? t->P : t->PW;
    size_t R = t->root >= 0 ? P[t->root] : 0, maxNR = 0, maxPair = 0, sum = 0, sumN = 0;
    int prev = -1;
    // non-root units in forward first-use order
    for (int s = 0; s < t->ns; s++) {
        int u = unit_of(t, s);
        if (t->ff[u] != s) continue;
        sum += P[u];
        sumN += t->N[u];
        if (u == t->root) continue;
        if (P[u] > maxNR) maxNR = P[u];
        if (prev >= 0 && P[prev] + P[u] > maxPair) maxPair = P[prev] + P[u];
        prev = u;
    }
    if (maxPair < maxNR) maxPair = maxNR;
    size_t gp;
    const char *why;
    if (!t->sharded) {
        gp = t->psz == 4 ? 0 : sumN * t->psz;
        why = t->psz == 4 ? "no_shard fp32: none" : "no_shard: a param_dtype copy of every unit";
    } else if (!t->reshard) {
        gp = sum * t->psz;
        why = "sum of all P_u";
    } else if (!t->fwdpf && t->bp == FC_PREFETCH_NONE) {
        gp = (R + maxNR) * t->psz;
        why = "root + largest non-root unit";
    } else if (t->limiter && t->root >= 0) {
        gp = (R + maxNR) * t->psz;
        why = "limiter: root + one unit";
    } else {
        gp = (R + maxPair) * t->psz;
        why = "root + largest consecutive pair";
    }
    MT_CHECK(mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS] == gp,
             "%s: peak device gathered_params: expected %zu bytes (%s), got %zu", L, gp, why,
             mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS]);
    if (t->sharded)
        MT_CHECK(mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS] == st->log_peak_gathered,
                 "%s: peak gathered_params %zu disagrees with the comm log's peak of gathered units %zu", L,
                 mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS], st->log_peak_gathered);
    // Unsharded gradients: the root's lives through the whole backward, every
    // other unit's only during its own. With no_sync nothing is reduced before
    // the last micro-batch (DESIGN §4), so every unit's unsharded gradient is
    // kept across the micro-batches: the sum over all units.
    size_t gg = (t->cfg.no_sync ? sum : R + maxNR) * t->psz;
    MT_CHECK(mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_GRADS] == gg,
             "%s: peak device gathered_grads: expected %zu bytes (%s), got %zu", L, gg,
             t->cfg.no_sync ? "no_sync: every unit's P_u" : "root + largest non-root unit",
             mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_GRADS]);
    for (int c = FC_MEM_GATHERED_PARAMS; c <= FC_MEM_ACTIVATIONS; c++)
        MT_CHECK(mem->peak[FC_LOC_HOST][c] == 0, "%s: peak host %s: expected 0, got %zu", L,
                 fc_mem_cat_name((fc_mem_cat)c), mem->peak[FC_LOC_HOST][c]);
}

// ---------------------------------------------------------------------------
// Cases

typedef struct {
    fc_run_config cfg;
    int done;
    run_stats st;
} case_result;

static fc_run_config base(const char *model, fc_strategy s) { return mt_config(model, s, W, 1); }

static int proper_divisor(void) {  // largest divisor of W other than W, 0 if none
    for (int f = W / 2; f >= 1; f--)
        if (W % f == 0) return f;
    return 0;
}

static void run_case(const fc_run_config *cfg, case_result *out) {
    fc_error e;
    if (fc_run_config_validate(cfg, &e) || fc_run_config_validate_world(cfg, W, &e)) {
        MT_CHECK(0, "test config invalid: %s", e.msg);
        return;
    }
    theory t;
    theory_init(&t, cfg);
    mt_result r;
    run_stats st;
    memset(&st, 0, sizeof st);
    double t0 = MPI_Wtime();
    if (mt_run(cfg, MPI_COMM_WORLD, &r) == 0) {
        MT_CHECK(r.n_state == (cfg->optim.kind == FC_OPT_ADAMW ? 2 : 1), "%s: %d optimizer states", t.label,
                 r.n_state);
        check_log(&t, &r.log, &st);
        check_mem(&t, &r.mem, &st);
        if (getenv("SCHED_DUMP_ALL") && RANK == 0) dump_log(&t, &r.log);
        mt_result_free(&r);
    }
    if (getenv("SCHED_VERBOSE") && RANK == 0)
        printf("  %-80s %.2fs errs %d\n", t.label, MPI_Wtime() - t0, mt_errs);
    if (out) {
        out->cfg = *cfg;
        out->done = 1;
        out->st = st;
    } else {
        free(st.seq);
    }
    theory_free(&t);
}

static int seq_equal(const run_stats *a, const run_stats *b) {
    return a->nseq == b->nseq && memcmp(a->seq, b->seq, (size_t)a->nseq * sizeof(int)) == 0;
}

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

    // 4. mlp prefetch without a root; shard_grad_op with prefetch flags
    {
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
    return mt_finalize();
}
