// oracle/theory.c — see theory.h.
//
// The theory, per step of one rank's comm log (G ranks in the reduction
// layout, S_u and P_u = S_u*G unit u's chunk and padded size, all from
// fc_unit_layout_of; K micro-batches, of which the "sync" ones reduce
// gradients: every one, or with no_sync only the last):
//  - counts: per micro-batch one forward and one backward compute per stage;
//    sharded strategies all-gather every unit in forward and, where
//    fc_reshard_after_forward says the unit was freed after its last forward
//    stage, again in backward; every gathered unit is freed after its last
//    backward stage. Per sync micro-batch and unit: a reduce_scatter
//    (sharded), an all_reduce over the world (no_shard), an all_reduce over
//    the replicas (hybrid with more than one replica), a d2h (cpu_offload).
//    Per step: an h2d before every all_gather (cpu_offload), one norm
//    all_reduce (unit -1), one optim event per unit.
//  - bytes and dtypes: all_gather P_u in param_dtype, reduce_scatter P_u in
//    reduce_dtype (both move equal chunks, so padding is on the wire);
//    no_shard's all_reduce N_u or its world-padded size, the replica
//    all_reduce the chunk S_u (or its valid part), both in reduce_dtype and
//    backward; the norm one fp32 scalar (4 bytes, or 8 for an fp64 partial).
//  - every collective issue is completed by a later wait in the same step;
//    compute runs only on a unit whose all-gather was waited; a unit is freed
//    only once gathered, and is not gathered twice at once.
//  - order: stages in order, micro-batches one after the other; a gradient is
//    reduced after its last backward compute, the replica all_reduce after
//    the reduce_scatter completed, d2h after the reduction completed, the
//    norm and the optimizer after every reduction completed.
//  - prefetch (DESIGN §5): each unit has one prefetch opportunity, the stage
//    whose next unit (fc_next_forward_unit / fc_next_backward_unit) it is.
//    With the policy on, its all-gather is issued in that stage's window and
//    flagged prefetch; otherwise at need, after the stage ended, unflagged.
//  - the limiter: a prefetch is issued only while fc_limiter_allows_prefetch,
//    and one is held back (gathered at need, unflagged) only when it does not.
// Where FSDP leaves a choice to the implementation, the theory accepts each
// choice (e.g. BACKWARD_POST may free the unit before or after prefetching
// the next, as PyTorch frees first and the reference after).
#include "theory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "layout.h"
#include "model.h"
#include "optim.h"

void fc_findings_add(fc_findings *f, const char *fmt, ...) {
    int cap = (int)(sizeof f->msg / sizeof f->msg[0]);
    if (f->n_kept < cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->msg[f->n_kept], sizeof f->msg[0], fmt, ap);
        va_end(ap);
        f->n_kept++;
    }
    f->n++;
}

// ---------------------------------------------------------------------------
// the theory of one configuration at one rank

typedef struct {
    const fc_run_config *cfg;
    fc_model m;
    fc_groups g;
    int nu, ns, K;
    fc_unit_stages *st;   // [nu] the stages that use each unit
    fc_unit_layout *lay;  // [nu] each unit's flat layout at this rank
    int *fwd_opp;         // [nu] the forward stage whose next unit it is (its prefetch opportunity), -1 if none
    int *bwd_opp;         // [nu] likewise in backward
    size_t psz, rsz;      // bytes per element of param_dtype and reduce_dtype
    fc_findings *out;
} theory;

#define EXPECT(t, cond, ...)                                 \
    do {                                                     \
        if (!(cond)) fc_findings_add((t)->out, __VA_ARGS__); \
    } while (0)

static size_t prec_bytes(fc_prec p) { return p == FC_PREC_FP32 ? 4 : 2; }

static void theory_init(theory *t, const fc_run_config *cfg, int W, int rank, fc_findings *out) {
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->out = out;
    fc_model_build(&t->m, &cfg->model);
    t->g = fc_groups_of(cfg, W, rank);
    t->nu = t->m.n_units;
    t->ns = t->m.n_stages;
    t->K = cfg->grad_accum;
    t->psz = prec_bytes(cfg->param_dtype);
    t->rsz = prec_bytes(cfg->reduce_dtype);
    t->st = callocCheck((size_t)t->nu, sizeof *t->st);
    t->lay = callocCheck((size_t)t->nu, sizeof *t->lay);
    t->fwd_opp = callocCheck((size_t)t->nu, sizeof *t->fwd_opp);
    t->bwd_opp = callocCheck((size_t)t->nu, sizeof *t->bwd_opp);
    for (int u = 0; u < t->nu; u++) {
        t->st[u] = fc_unit_stages_of(&t->m, u);
        t->lay[u] = fc_unit_layout_of(t->m.units[u].numel, &t->g);
        t->fwd_opp[u] = t->bwd_opp[u] = -1;
    }
    // the first stage, in each pass's own order, at which a unit is next
    for (int s = 0; s < t->ns; s++) {
        int v = fc_next_forward_unit(&t->m, t->st, s);
        if (v >= 0 && t->fwd_opp[v] < 0) t->fwd_opp[v] = s;
    }
    for (int s = t->ns - 1; s >= 0; s--) {
        int v = fc_next_backward_unit(&t->m, t->st, s);
        if (v >= 0 && t->bwd_opp[v] < 0) t->bwd_opp[v] = s;
    }
}

static void theory_free(theory *t) {
    free(t->st);
    free(t->lay);
    free(t->fwd_opp);
    free(t->bwd_opp);
    fc_model_free(&t->m);
}

static int sync_micro(const theory *t, int k) { return !t->cfg->no_sync || k == t->K - 1; }
static int unit_of(const theory *t, int s) { return t->m.stages[s].unit; }
static int reshards(const theory *t, int u) { return fc_reshard_after_forward(t->cfg->strategy, &t->m, u); }
static int valid_unit(const theory *t, int u) { return u >= 0 && u < t->nu; }
static int is_collective(fc_op op) {
    return op == FC_OP_ALL_GATHER || op == FC_OP_REDUCE_SCATTER || op == FC_OP_ALL_REDUCE;
}

// The shard group's collectives: logged as "shard", or as "world" where the
// shard group is the world.
static int shard_group_ok(const theory *t, fc_group g) {
    return g == FC_GROUP_SHARD || (g == FC_GROUP_WORLD && t->g.F == t->g.W);
}

// ---------------------------------------------------------------------------
// one step of the log, indexed

typedef struct {
    int n;   // events of this kind
    int at;  // the first one's position in the step, -1 if none
} slot;

// events per (micro-batch, unit)
enum { AG_FWD, AG_BWD, FREE_FWD, FREE_BWD, RS, AR_WORLD, AR_REPL, D2H, N_PER_UNIT };
static const char *PER_UNIT_NAME[N_PER_UNIT] = {
    "forward all_gather", "backward all_gather", "forward free",          "backward free",
    "reduce_scatter",     "all_reduce(world)",   "all_reduce(replicate)", "d2h"};

typedef struct {
    const theory *t;
    long step;
    const fc_event *ev;  // the step's events
    int n;
    slot *fwd, *bwd;    // [K * ns] compute per stage
    slot *per_unit;     // [K * nu * N_PER_UNIT]
    slot *h2d, *optim;  // [nu] over the whole step
    slot norm;
    int *waited_by;     // [n] the wait completing collective i, -1 if none
    int *alive_before;  // [n + 1] units gathered (issued and not freed) before event i
} step_view;

static slot *S_FWD(step_view *x, int k, int s) { return &x->fwd[k * x->t->ns + s]; }
static slot *S_BWD(step_view *x, int k, int s) { return &x->bwd[k * x->t->ns + s]; }
static slot *S_UNIT(step_view *x, int k, int u, int kind) {
    return &x->per_unit[((size_t)k * (size_t)x->t->nu + (size_t)u) * N_PER_UNIT + (size_t)kind];
}

static void put(slot *s, int i) {
    if (s->n++ == 0) s->at = i;
}

static void clear_slots(slot *s, size_t n) {
    for (size_t i = 0; i < n; i++) s[i] = (slot){0, -1};
}

static void view_init(step_view *x, const theory *t, long step, const fc_event *ev, int n) {
    memset(x, 0, sizeof *x);
    x->t = t;
    x->step = step;
    x->ev = ev;
    x->n = n;
    size_t ks = (size_t)t->K * (size_t)t->ns, ku = (size_t)t->K * (size_t)t->nu * N_PER_UNIT;
    x->fwd = mallocCheck(ks * sizeof(slot));
    x->bwd = mallocCheck(ks * sizeof(slot));
    x->per_unit = mallocCheck(ku * sizeof(slot));
    x->h2d = mallocCheck((size_t)t->nu * sizeof(slot));
    x->optim = mallocCheck((size_t)t->nu * sizeof(slot));
    clear_slots(x->fwd, ks);
    clear_slots(x->bwd, ks);
    clear_slots(x->per_unit, ku);
    clear_slots(x->h2d, (size_t)t->nu);
    clear_slots(x->optim, (size_t)t->nu);
    x->norm = (slot){0, -1};
    x->waited_by = mallocCheck((size_t)(n + 1) * sizeof(int));
    x->alive_before = mallocCheck((size_t)(n + 1) * sizeof(int));
    for (int i = 0; i <= n; i++) x->waited_by[i] = -1;
}

static void view_free(step_view *x) {
    free(x->fwd);
    free(x->bwd);
    free(x->per_unit);
    free(x->h2d);
    free(x->optim);
    free(x->waited_by);
    free(x->alive_before);
}

static int wait_of(const step_view *x, int i) { return i >= 0 ? x->waited_by[i] : -1; }

// ---------------------------------------------------------------------------
// pass 1: every event on its own, in order: kind, bytes, dtype, group, waits,
// the gather state of each unit, the limiter, h2d before all-gather

// The all_reduce of unit u (not the norm): no_shard's gradient, or a hybrid
// replica's, in backward and reduce_dtype. Returns the per-unit slot kind, or
// -1 after a finding.
static int classify_all_reduce(const step_view *x, int i) {
    const theory *t = x->t;
    const fc_event *v = &x->ev[i];
    const fc_unit_layout *l = &t->lay[v->unit];
    int kind;
    fc_group group;
    size_t a, b;  // the bytes it may carry
    if (!t->g.sharded) {
        // a real all_reduce needs no padding; the reference's is a padded reduce_scatter + all_gather
        kind = AR_WORLD, group = FC_GROUP_WORLD, a = l->numel * t->rsz, b = l->padded * t->rsz;
    } else if (t->g.hybrid && t->g.R > 1) {
        // this rank's chunk across the replicas, whole or its valid part
        kind = AR_REPL, group = FC_GROUP_REPLICATE, a = l->shard * t->rsz, b = l->own_valid * t->rsz;
    } else {
        fc_findings_add(t->out, "step %ld #%d: all_reduce of unit %d over %s, which %s has none of", x->step, i,
                        v->unit, fc_group_name(v->group), fc_strategy_name(t->cfg->strategy));
        return -1;
    }
    EXPECT(t,
           v->group == group && (v->bytes == a || v->bytes == b) && v->dtype == t->cfg->reduce_dtype &&
               v->phase == FC_PHASE_BACKWARD,
           "step %ld #%d: %s of unit %d: expected %zu or %zu bytes %s over %s in backward; got %zu bytes %s over %s "
           "in %s",
           x->step, i, PER_UNIT_NAME[kind], v->unit, a, b, fc_prec_name(t->cfg->reduce_dtype), fc_group_name(group),
           v->bytes, fc_prec_name(v->dtype), fc_group_name(v->group), fc_phase_name(v->phase));
    return kind;
}

// Every enum of the event within its range.
static int well_formed(const fc_event *v) {
    return (unsigned)v->op < FC_OP_COUNT && (unsigned)v->of < FC_OP_COUNT && (unsigned)v->group <= FC_GROUP_REPLICATE &&
           (unsigned)v->phase <= FC_PHASE_OPTIM && (unsigned)v->dtype <= FC_PREC_FP16;
}

// Returns the number of events of no expected kind.
static int scan_events(step_view *x) {
    const theory *t = x->t;
    const fc_run_config *c = t->cfg;
    long step = x->step;
    int other = 0, alive = 0;
    int *state = callocCheck((size_t)t->nu, sizeof(int));  // 0 not gathered, 1 issued, 2 waited
    int *h2d_pending = callocCheck((size_t)t->nu, sizeof(int));
    for (int i = 0; i < x->n; i++) {
        const fc_event *v = &x->ev[i];
        x->alive_before[i] = alive;
        EXPECT(t, v->order == i, "step %ld: event %d has order %d", step, i, v->order);
        if (!well_formed(v)) {  // a port's log is input: no name lookup out of range
            fc_findings_add(t->out, "step %ld #%d: malformed event (op %d, of %d, group %d, phase %d, dtype %d)", step,
                            i, (int)v->op, (int)v->of, (int)v->group, (int)v->phase, (int)v->dtype);
            other++;
            continue;
        }
        int u = v->unit, k = v->micro;
        // compute, gathers, frees and gradient traffic belong to one micro-batch and one unit
        int per_micro = v->op != FC_OP_OPTIM && v->op != FC_OP_WAIT && v->op != FC_OP_H2D &&
                        !(v->op == FC_OP_ALL_REDUCE && u == -1);
        if (per_micro && !(valid_unit(t, u) && k >= 0 && k < t->K)) {
            fc_findings_add(t->out, "step %ld #%d: %s of unit %d in micro-batch %d (units 0..%d, micro-batches 0..%d)",
                            step, i, fc_op_name(v->op), u, k, t->nu - 1, t->K - 1);
            other++;
            continue;
        }
        switch (v->op) {
        case FC_OP_FORWARD:
        case FC_OP_BACKWARD: {
            int s = v->stage, fwd = v->op == FC_OP_FORWARD;
            if (s < 0 || s >= t->ns || unit_of(t, s) != u) {
                fc_findings_add(t->out, "step %ld #%d: %s of stage %d with unit %d: the model's stage %d uses unit %d",
                                step, i, fc_op_name(v->op), s, u, s, s >= 0 && s < t->ns ? unit_of(t, s) : -1);
                other++;
                break;
            }
            EXPECT(t, v->phase == (fwd ? FC_PHASE_FORWARD : FC_PHASE_BACKWARD),
                   "step %ld #%d: %s of stage %d in phase %s", step, i, fc_op_name(v->op), s, fc_phase_name(v->phase));
            put(fwd ? S_FWD(x, k, s) : S_BWD(x, k, s), i);
            if (t->g.sharded)
                EXPECT(
                    t, state[u] == 2,
                    "step %ld micro %d #%d: %s of stage %d runs on unit %d whose all_gather is %s (expected: waited)",
                    step, k, i, fc_op_name(v->op), s, u, state[u] == 0 ? "not issued (or freed)" : "not yet waited");
            break;
        }
        case FC_OP_ALL_GATHER: {
            size_t want = t->lay[u].padded * t->psz;
            EXPECT(t, t->g.sharded, "step %ld #%d: all_gather of unit %d, but %s gathers nothing", step, i, u,
                   fc_strategy_name(c->strategy));
            EXPECT(t, v->bytes == want && v->dtype == c->param_dtype && shard_group_ok(t, v->group),
                   "step %ld #%d: all_gather of unit %d: expected %zu bytes %s over the shard group; got %zu bytes %s "
                   "over %s",
                   step, i, u, want, fc_prec_name(c->param_dtype), v->bytes, fc_prec_name(v->dtype),
                   fc_group_name(v->group));
            EXPECT(t, state[u] == 0, "step %ld micro %d #%d: all_gather of unit %d while it is already gathered", step,
                   k, i, u);
            if (v->phase == FC_PHASE_FORWARD)
                put(S_UNIT(x, k, u, AG_FWD), i);
            else if (v->phase == FC_PHASE_BACKWARD)
                put(S_UNIT(x, k, u, AG_BWD), i);
            else {
                fc_findings_add(t->out, "step %ld #%d: all_gather of unit %d in phase %s", step, i, u,
                                fc_phase_name(v->phase));
                other++;
            }
            // the limiter's bound: a prefetch only while fewer than two units are alive
            if (v->prefetch)
                EXPECT(
                    t, fc_limiter_allows_prefetch(c, alive),
                    "step %ld micro %d #%d: limit_all_gathers: prefetched all_gather of unit %d issued with %d units "
                    "gathered (a prefetch is allowed only while fewer than 2 are)",
                    step, k, i, u, alive);
            if (c->cpu_offload) {
                EXPECT(t, h2d_pending[u] > 0,
                       "step %ld #%d: cpu_offload: all_gather of unit %d without an h2d of its shard before it", step,
                       i, u);
                if (h2d_pending[u] > 0) h2d_pending[u]--;
            }
            if (state[u] == 0) alive++;
            state[u] = 1;
            break;
        }
        case FC_OP_FREE:
            EXPECT(t, t->g.sharded, "step %ld #%d: free of unit %d, but %s gathers nothing", step, i, u,
                   fc_strategy_name(c->strategy));
            EXPECT(t, state[u] == 2, "step %ld micro %d #%d: free of unit %d whose all_gather is %s", step, k, i, u,
                   state[u] == 0 ? "not issued" : "not waited");
            if (v->phase == FC_PHASE_FORWARD)
                put(S_UNIT(x, k, u, FREE_FWD), i);
            else if (v->phase == FC_PHASE_BACKWARD)
                put(S_UNIT(x, k, u, FREE_BWD), i);
            else {
                fc_findings_add(t->out, "step %ld #%d: free of unit %d in phase %s", step, i, u,
                                fc_phase_name(v->phase));
                other++;
            }
            if (state[u]) alive--;
            state[u] = 0;
            break;
        case FC_OP_REDUCE_SCATTER: {
            size_t want = t->lay[u].padded * t->rsz;
            EXPECT(t, t->g.sharded, "step %ld #%d: reduce_scatter of unit %d under no_shard (expected an all_reduce)",
                   step, i, u);
            EXPECT(t,
                   v->bytes == want && v->dtype == c->reduce_dtype && shard_group_ok(t, v->group) &&
                       v->phase == FC_PHASE_BACKWARD,
                   "step %ld #%d: reduce_scatter of unit %d: expected %zu bytes %s over the shard group in backward; "
                   "got %zu bytes %s over %s in %s",
                   step, i, u, want, fc_prec_name(c->reduce_dtype), v->bytes, fc_prec_name(v->dtype),
                   fc_group_name(v->group), fc_phase_name(v->phase));
            put(S_UNIT(x, k, u, RS), i);
            break;
        }
        case FC_OP_ALL_REDUCE:
            if (u == -1) {
                // the total norm: one scalar (an fp32 value, or an fp64 partial sum as the reference sends)
                fc_group want = t->g.sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD;
                EXPECT(t,
                       v->phase == FC_PHASE_CLIP && (v->bytes == 4 || v->bytes == 8) && v->dtype == FC_PREC_FP32 &&
                           (v->group == want || v->group == FC_GROUP_WORLD),
                       "step %ld #%d: norm all_reduce: expected phase clip, 4 or 8 bytes fp32 over %s; got phase %s, "
                       "%zu bytes %s over %s",
                       step, i, fc_group_name(want), fc_phase_name(v->phase), v->bytes, fc_prec_name(v->dtype),
                       fc_group_name(v->group));
                put(&x->norm, i);
            } else if (!valid_unit(t, u)) {
                fc_findings_add(t->out, "step %ld #%d: all_reduce of unit %d", step, i, u);
                other++;
            } else {
                int kind = classify_all_reduce(x, i);
                if (kind >= 0)
                    put(S_UNIT(x, k, u, kind), i);
                else
                    other++;
            }
            break;
        case FC_OP_WAIT: {
            int found = -1;
            for (int j = 0; j < i && found < 0; j++)
                if (x->ev[j].op == v->of && x->ev[j].unit == u && is_collective(v->of) && x->waited_by[j] < 0)
                    found = j;
            if (found < 0) {
                fc_findings_add(t->out, "step %ld #%d: wait of %s of unit %d with no earlier unfinished issue", step, i,
                                fc_op_name(v->of), u);
                break;
            }
            x->waited_by[found] = i;
            if (v->of == FC_OP_ALL_GATHER && valid_unit(t, u)) {
                EXPECT(t, state[u] == 1, "step %ld #%d: wait of the all_gather of unit %d, which is %s", step, i, u,
                       state[u] == 0 ? "freed" : "already waited");
                state[u] = 2;
            }
            break;
        }
        case FC_OP_H2D: {
            if (!c->cpu_offload || !valid_unit(t, u)) {
                fc_findings_add(t->out, "step %ld #%d: h2d of unit %d without cpu_offload", step, i, u);
                other++;
                break;
            }
            // the fp32 master shard, whole or its valid part
            size_t a = t->lay[u].shard * 4, b = t->lay[u].own_valid * 4;
            EXPECT(t, v->bytes == a || v->bytes == b,
                   "step %ld #%d: h2d of unit %d: expected %zu (or valid %zu) bytes, got %zu", step, i, u, a, b,
                   v->bytes);
            put(&x->h2d[u], i);
            h2d_pending[u]++;
            break;
        }
        case FC_OP_D2H: {
            EXPECT(t, c->cpu_offload, "step %ld #%d: d2h of unit %d without cpu_offload", step, i, u);
            // the reduced fp32 gradient: the valid part of the chunk, the whole chunk, or all it stores
            size_t a = t->lay[u].own_valid * 4, b = t->lay[u].shard * 4, s = t->lay[u].store * 4;
            EXPECT(t, v->bytes == a || v->bytes == b || v->bytes == s,
                   "step %ld #%d: d2h of unit %d: expected %zu, %zu or %zu bytes, got %zu", step, i, u, a, b, s,
                   v->bytes);
            put(S_UNIT(x, k, u, D2H), i);
            break;
        }
        case FC_OP_OPTIM:
            if (!valid_unit(t, u)) {
                fc_findings_add(t->out, "step %ld #%d: optim of unit %d", step, i, u);
                other++;
                break;
            }
            EXPECT(t, v->phase == FC_PHASE_OPTIM, "step %ld #%d: optim of unit %d in phase %s", step, i, u,
                   fc_phase_name(v->phase));
            put(&x->optim[u], i);
            break;
        default:  // COUNT; well_formed excludes it
            other++;
        }
    }
    x->alive_before[x->n] = alive;
    for (int i = 0; i < x->n; i++)
        if (is_collective(x->ev[i].op))
            EXPECT(t, x->waited_by[i] >= 0, "step %ld #%d: %s of unit %d is never waited", step, i,
                   fc_op_name(x->ev[i].op), x->ev[i].unit);
    if (t->g.sharded)
        for (int u = 0; u < t->nu; u++)
            EXPECT(t, state[u] == 0, "step %ld ends with unit %d still gathered (expected every unit freed)", step, u);
    free(state);
    free(h2d_pending);
    return other;
}

// ---------------------------------------------------------------------------
// pass 2: how many of each event, per micro-batch, stage and unit. Returns
// 1 when every count is right (pass 3 then finds each event in its slot).

static int check_counts(step_view *x) {
    const theory *t = x->t;
    const fc_run_config *c = t->cfg;
    long step = x->step;
    int ok = 1;
    for (int k = 0; k < t->K; k++) {
        int sy = sync_micro(t, k);
        for (int s = 0; s < t->ns; s++)
            if (S_FWD(x, k, s)->n != 1 || S_BWD(x, k, s)->n != 1) {
                ok = 0;
                fc_findings_add(t->out,
                                "step %ld micro %d stage %d: expected 1 forward and 1 backward compute, got %d and %d",
                                step, k, s, S_FWD(x, k, s)->n, S_BWD(x, k, s)->n);
            }
        for (int u = 0; u < t->nu; u++) {
            int want[N_PER_UNIT];
            want[AG_FWD] = t->g.sharded;
            want[AG_BWD] = want[FREE_FWD] = reshards(t, u);
            want[FREE_BWD] = t->g.sharded;
            want[RS] = t->g.sharded && sy;
            want[AR_WORLD] = !t->g.sharded && sy;
            want[AR_REPL] = t->g.hybrid && t->g.R > 1 && sy;
            want[D2H] = c->cpu_offload && sy;
            for (int q = 0; q < N_PER_UNIT; q++)
                if (S_UNIT(x, k, u, q)->n != want[q]) {
                    ok = 0;
                    fc_findings_add(t->out, "step %ld micro %d unit %d%s: expected %d %s, got %d", step, k, u,
                                    u == t->m.root_unit ? " (root)" : "", want[q], PER_UNIT_NAME[q],
                                    S_UNIT(x, k, u, q)->n);
                }
        }
    }
    for (int u = 0; u < t->nu; u++) {
        int gathers = 0;
        for (int k = 0; k < t->K; k++) gathers += S_UNIT(x, k, u, AG_FWD)->n + S_UNIT(x, k, u, AG_BWD)->n;
        int want_h2d = c->cpu_offload ? gathers : 0;
        if (x->h2d[u].n != want_h2d) {
            ok = 0;
            fc_findings_add(t->out, "step %ld unit %d: expected %d h2d (one per all_gather), got %d", step, u, want_h2d,
                            x->h2d[u].n);
        }
        if (x->optim[u].n != 1) {
            ok = 0;
            fc_findings_add(t->out, "step %ld unit %d: expected 1 optim event, got %d", step, u, x->optim[u].n);
        }
    }
    if (x->norm.n != 1) {
        ok = 0;
        fc_findings_add(t->out, "step %ld: expected 1 norm all_reduce (unit -1, phase clip), got %d", step, x->norm.n);
    }
    return ok;
}

// ---------------------------------------------------------------------------
// pass 3: order, per micro-batch

// Where forward (backward) stage s of micro-batch k has ended: its compute
// and, when it is the unit's last stage of the pass and the unit is freed
// there, that free. The next stage's work (its at-need gather) comes after.
static int end_fwd(step_view *x, int k, int s) {
    int u = unit_of(x->t, s), e = S_FWD(x, k, s)->at;
    if (s == x->t->st[u].last_fwd && reshards(x->t, u) && S_UNIT(x, k, u, FREE_FWD)->at > e)
        e = S_UNIT(x, k, u, FREE_FWD)->at;
    return e;
}

static int end_bwd(step_view *x, int k, int s) {
    int u = unit_of(x->t, s), e = S_BWD(x, k, s)->at;
    if (s == x->t->st[u].last_bwd && x->t->g.sharded && S_UNIT(x, k, u, FREE_BWD)->at > e)
        e = S_UNIT(x, k, u, FREE_BWD)->at;
    return e;
}

// Compute order, and the gradient path of every unit: reduce after the last
// backward compute, the replica all_reduce after the reduce_scatter
// completed, d2h after the reduction completed, the norm after every
// reduction and the optimizer after its unit's (and, when it clips, the norm).
static void check_compute_and_reduce_order(step_view *x, int k) {
    const theory *t = x->t;
    long step = x->step;
    int sy = sync_micro(t, k);
    for (int s = 0; s + 1 < t->ns; s++) {
        EXPECT(t, S_FWD(x, k, s)->at < S_FWD(x, k, s + 1)->at, "step %ld micro %d: forward of stage %d after stage %d",
               step, k, s, s + 1);
        EXPECT(t, S_BWD(x, k, s + 1)->at < S_BWD(x, k, s)->at, "step %ld micro %d: backward of stage %d after stage %d",
               step, k, s + 1, s);
    }
    EXPECT(t, S_FWD(x, k, t->ns - 1)->at < S_BWD(x, k, t->ns - 1)->at,
           "step %ld micro %d: backward starts before forward ends", step, k);
    if (k + 1 < t->K)
        EXPECT(t, S_BWD(x, k, 0)->at < S_FWD(x, k + 1, 0)->at, "step %ld: micro-batch %d starts before %d ends", step,
               k + 1, k);
    for (int u = 0; u < t->nu; u++) {
        int lastb = S_BWD(x, k, t->st[u].last_bwd)->at, fin = -1;
        if (sy) {
            int red = S_UNIT(x, k, u, t->g.sharded ? RS : AR_WORLD)->at;
            EXPECT(t, red > lastb, "step %ld micro %d: %s of unit %d (#%d) before its last backward compute (#%d)",
                   step, k, t->g.sharded ? "reduce_scatter" : "all_reduce", u, red, lastb);
            fin = red;
            if (t->g.hybrid && t->g.R > 1) {
                int ar = S_UNIT(x, k, u, AR_REPL)->at;
                EXPECT(
                    t, ar > wait_of(x, red),
                    "step %ld micro %d: replica all_reduce of unit %d (#%d) before its reduce_scatter completed (#%d)",
                    step, k, u, ar, wait_of(x, red));
                fin = ar;
            }
            if (t->cfg->cpu_offload)
                EXPECT(t, S_UNIT(x, k, u, D2H)->at > wait_of(x, fin),
                       "step %ld micro %d: d2h of unit %d (#%d) before its gradient reduction completed (#%d)", step, k,
                       u, S_UNIT(x, k, u, D2H)->at, wait_of(x, fin));
        }
        if (k == t->K - 1) {
            EXPECT(t, x->norm.at > wait_of(x, fin),
                   "step %ld: norm all_reduce (#%d) before unit %d's gradient reduction completed (#%d)", step,
                   x->norm.at, u, wait_of(x, fin));
            EXPECT(t, x->optim[u].at > wait_of(x, fin),
                   "step %ld: optim of unit %d (#%d) before its gradient reduction completed (#%d)", step, u,
                   x->optim[u].at, wait_of(x, fin));
            // without clipping the optimizer does not need the norm
            if (t->cfg->clip_grad_norm > 0)
                EXPECT(t, x->optim[u].at > wait_of(x, x->norm.at),
                       "step %ld: optim of unit %d (#%d) before the norm all_reduce completed (#%d)", step, u,
                       x->optim[u].at, wait_of(x, x->norm.at));
        }
    }
}

// Frees after the unit's last forward stage (where it reshards) and after its
// last backward stage.
static void check_free_order(step_view *x, int k) {
    const theory *t = x->t;
    for (int u = 0; u < t->nu; u++) {
        if (reshards(t, u))
            EXPECT(t, S_UNIT(x, k, u, FREE_FWD)->at > S_FWD(x, k, t->st[u].last_fwd)->at,
                   "step %ld micro %d: forward free of unit %d (#%d) before its last forward compute (#%d)", x->step, k,
                   u, S_UNIT(x, k, u, FREE_FWD)->at, S_FWD(x, k, t->st[u].last_fwd)->at);
        EXPECT(t, S_UNIT(x, k, u, FREE_BWD)->at > S_BWD(x, k, t->st[u].last_bwd)->at,
               "step %ld micro %d: backward free of unit %d (#%d) before its last backward compute (#%d)", x->step, k,
               u, S_UNIT(x, k, u, FREE_BWD)->at, S_BWD(x, k, t->st[u].last_bwd)->at);
    }
}

// A position in the step for a message: "#12", or "the start" for -1.
static const char *pos(char buf[24], int i) {
    if (i < 0) return "the start";
    snprintf(buf, 24, "#%d", i);
    return buf;
}

// One prefetchable all-gather at `ag`. With the policy on (`on`), a flagged
// prefetch in the window (lo, hi). With the limiter, an unflagged all-gather
// is one the limiter held back: allowed only where it had to (two units
// gathered at the opportunity `opp`), and then gathered at need (after
// need_lo). The flag decides which, as a held-back unit gathered at need may
// sit where a prefetch could. With the policy off, at need and unflagged.
static void check_prefetch(step_view *x, int k, const char *what, int v, int ag, int on, int lo, int hi, int opp,
                           int need_lo) {
    const theory *t = x->t;
    int pf = x->ev[ag].prefetch, alive = x->alive_before[opp];
    char a[24], b[24];
    if (!on) {
        EXPECT(t, ag > need_lo && !pf,
               "step %ld micro %d: %s off: all_gather of unit %d (#%d, prefetch=%d) expected at need, after %s, not "
               "flagged",
               x->step, k, what, v, ag, pf, pos(a, need_lo));
    } else if (pf || !t->cfg->limit_all_gathers) {
        EXPECT(t, ag > lo && ag < hi && pf,
               "step %ld micro %d: %s: all_gather of unit %d (#%d, prefetch=%d) expected after %s and before #%d, "
               "flagged prefetch",
               x->step, k, what, v, ag, pf, pos(a, lo), hi);
    } else {
        EXPECT(t, !fc_limiter_allows_prefetch(t->cfg, alive),
               "step %ld micro %d: %s with limit_all_gathers: unit %d not prefetched (after %s, before #%d) although "
               "only %d unit(s) were gathered",
               x->step, k, what, v, pos(a, lo), hi, alive);
        EXPECT(t, ag > need_lo,
               "step %ld micro %d: %s with limit_all_gathers: unit %d held back, so expected at need after %s; its "
               "all_gather is #%d",
               x->step, k, what, v, pos(b, need_lo), ag);
    }
}

// Forward: the unit of stage 0 at need; every other unit v at its
// opportunity p (the stage whose next unit it is): forward_prefetch issues
// it after stage p-1 ended and before stage p's compute; without it, it is
// gathered after stage p ended.
static void check_forward_gathers(step_view *x, int k) {
    const theory *t = x->t;
    for (int v = 0; v < t->nu; v++) {
        int ag = S_UNIT(x, k, v, AG_FWD)->at, p = t->fwd_opp[v];
        if (p < 0) {
            EXPECT(t, !x->ev[ag].prefetch,
                   "step %ld micro %d: all_gather of unit %d, the first forward unit, is flagged prefetch", x->step, k,
                   v);
            continue;
        }
        int X = S_FWD(x, k, p)->at, lo = p > 0 ? end_fwd(x, k, p - 1) : -1;
        check_prefetch(x, k, "forward_prefetch", v, ag, t->cfg->forward_prefetch, lo, X, X, end_fwd(x, k, p));
    }
}

// Backward (strategies that reshard after forward): each unit v freed after
// forward is gathered again. Its opportunity p is the backward stage before
// its first backward stage, of unit u. BACKWARD_PRE applies when p is u's
// first backward stage: v's all-gather between the end of stage p+1 (u
// gathered) and p's compute. BACKWARD_POST applies when p is u's last
// backward stage: after p's compute, before u's reduce_scatter. Otherwise, or
// with none, v is gathered at need: after stage p ended and u's gradient
// reduction was issued.
static void check_backward_gathers(step_view *x, int k) {
    const theory *t = x->t;
    int sy = sync_micro(t, k), fwd_end = end_fwd(x, k, t->ns - 1);
    for (int v = 0; v < t->nu; v++) {
        if (!reshards(t, v)) continue;
        int ag = S_UNIT(x, k, v, AG_BWD)->at, p = t->bwd_opp[v];
        if (p < 0) {  // the first unit backward uses
            EXPECT(t, ag > fwd_end && !x->ev[ag].prefetch,
                   "step %ld micro %d: backward all_gather of unit %d (#%d, prefetch=%d), the first backward unit, "
                   "expected after the forward pass (#%d), not flagged",
                   x->step, k, v, ag, x->ev[ag].prefetch, fwd_end);
            continue;
        }
        int u = unit_of(t, p), X = S_BWD(x, k, p)->at;
        int pre_opp = p == t->st[u].first_bwd, post_opp = p == t->st[u].last_bwd;
        int rs = post_opp && sy ? S_UNIT(x, k, u, RS)->at : -1;
        int need_lo = end_bwd(x, k, p);
        if (rs > need_lo) need_lo = rs;
        if (t->cfg->backward_prefetch == FC_PREFETCH_PRE && pre_opp) {
            int lo = p + 1 < t->ns ? end_bwd(x, k, p + 1) : fwd_end;
            int agu = reshards(t, u) ? S_UNIT(x, k, u, AG_BWD)->at : -1;  // u's own gather comes first
            if (agu > lo) lo = agu;
            check_prefetch(x, k, "backward_prefetch pre", v, ag, 1, lo, X, X, need_lo);
        } else if (t->cfg->backward_prefetch == FC_PREFETCH_POST && post_opp) {
            int hi = sy ? rs : S_BWD(x, k, p - 1)->at;
            check_prefetch(x, k, "backward_prefetch post", v, ag, 1, X, hi, X, need_lo);
        } else {
            check_prefetch(x, k, "backward_prefetch", v, ag, 0, 0, 0, X, need_lo);
        }
    }
}

static void check_step(const theory *t, long step, const fc_event *ev, int n) {
    step_view x;
    view_init(&x, t, step, ev, n);
    int other = scan_events(&x);
    EXPECT(t, other == 0, "step %ld: %d event(s) of no expected kind", step, other);
    if (check_counts(&x))
        for (int k = 0; k < t->K; k++) {
            check_compute_and_reduce_order(&x, k);
            if (!t->g.sharded) continue;
            check_free_order(&x, k);
            check_forward_gathers(&x, k);
            check_backward_gathers(&x, k);
        }
    view_free(&x);
}

int fc_theory_check_schedule(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, fc_findings *out) {
    int before = out->n;
    if (cfg->strategy == FC_STRATEGY_LOCAL) return 0;  // one process, nothing scheduled
    theory t;
    theory_init(&t, cfg, W, rank, out);
    if (log->n == 0) fc_findings_add(out, "empty comm log (expected %d step(s))", cfg->steps);
    size_t b = 0;
    long first = log->n ? log->ev[0].step : 0;
    for (long step = first; step < first + cfg->steps; step++) {
        size_t e = b;
        while (e < log->n && log->ev[e].step == step) e++;
        if (e == b) {
            fc_findings_add(out, "no events for step %ld", step);
            continue;
        }
        check_step(&t, step, log->ev + b, (int)(e - b));
        b = e;
    }
    EXPECT(&t, b == log->n, "%zu event(s) after step %ld, the last of the run", log->n - b, first + cfg->steps - 1);
    theory_free(&t);
    return out->n - before;
}

// ---------------------------------------------------------------------------
// P11

// The peak of gathered parameters the comm log shows: P_u in param_dtype from
// a unit's all_gather until its free.
static size_t log_gathered_peak(const theory *t, const fc_comm_log *log) {
    int *held = callocCheck((size_t)t->nu, sizeof(int));
    size_t cur = 0, peak = 0;
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        if (!valid_unit(t, e->unit)) continue;
        size_t bytes = t->lay[e->unit].padded * t->psz;
        if (e->op == FC_OP_ALL_GATHER && !held[e->unit]) {
            held[e->unit] = 1;
            cur += bytes;
            if (cur > peak) peak = cur;
        } else if (e->op == FC_OP_FREE && held[e->unit]) {
            held[e->unit] = 0;
            cur -= bytes;
        }
    }
    free(held);
    return peak;
}

// The most unsharded gradient the schedule needs at once, by the log: unit u's
// padded gradient, at most fp32, from its first backward compute until its
// reduction (reduce_scatter, or no_shard's all_reduce) completed; under
// no_sync it stays across the micro-batches that do not reduce.
static size_t log_grads_bound(const theory *t, const fc_comm_log *log) {
    int *live = callocCheck((size_t)t->nu, sizeof(int));
    size_t cur = 0, peak = 0;
    long step = log->n ? log->ev[0].step : 0;
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        if (e->step != step) {  // a new step starts with no unsharded gradient
            memset(live, 0, (size_t)t->nu * sizeof(int));
            cur = 0;
            step = e->step;
        }
        if (!valid_unit(t, e->unit)) continue;
        size_t bytes = t->lay[e->unit].padded * 4;
        int reduced =
            e->op == FC_OP_WAIT && (e->of == FC_OP_REDUCE_SCATTER || (e->of == FC_OP_ALL_REDUCE && !t->g.sharded));
        if (e->op == FC_OP_BACKWARD && !live[e->unit]) {
            live[e->unit] = 1;
            cur += bytes;
            if (cur > peak) peak = cur;
        } else if (reduced && live[e->unit]) {
            live[e->unit] = 0;
            cur -= bytes;
        }
    }
    free(live);
    return peak;
}

// What the prefetch policy lets a sharded schedule hold of gathered
// parameters (bytes), from the config alone: at least the root (gathered
// from the first forward stage to the end of backward) with the largest
// other unit; at most that with prefetch off or the limiter on (with a root,
// two units: the root and one other), else the root and the largest pair of
// units adjacent in use order (one computing, the next prefetched).
// shard_grad_op keeps every unit from forward until its backward: all of them.
static void gathered_bounds(const theory *t, size_t *lo, size_t *hi) {
    const fc_model *m = &t->m;
    size_t root = m->root_unit >= 0 ? t->lay[m->root_unit].padded : 0, max1 = 0, pair = 0, sum = 0;
    int prev = -1;
    for (int s = 0; s < t->ns; s++) {  // units in order of first use
        int u = unit_of(t, s);
        if (t->st[u].first_fwd != s) continue;
        sum += t->lay[u].padded;
        if (u == m->root_unit) continue;
        if (t->lay[u].padded > max1) max1 = t->lay[u].padded;
        if (prev >= 0 && t->lay[prev].padded + t->lay[u].padded > pair) pair = t->lay[prev].padded + t->lay[u].padded;
        prev = u;
    }
    if (pair < max1) pair = max1;
    const fc_run_config *c = t->cfg;
    if (!fc_strategy_reshards(c->strategy)) {
        *lo = *hi = sum * t->psz;
        return;
    }
    *lo = (root + max1) * t->psz;
    if (!c->forward_prefetch && c->backward_prefetch == FC_PREFETCH_NONE)
        *hi = *lo;
    else if (c->limit_all_gathers)
        *hi = (m->root_unit >= 0 ? root + max1 : pair) * t->psz;
    else
        *hi = (root + pair) * t->psz;
}

static int log_has_unit_collective(const fc_comm_log *log) {
    for (size_t i = 0; i < log->n; i++)
        if (is_collective(log->ev[i].op) && log->ev[i].unit >= 0) return 1;
    return 0;
}

int fc_theory_check_memory(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, const fc_mem_stats *mem,
                           fc_findings *out) {
    int before = out->n;
    if (cfg->strategy == FC_STRATEGY_LOCAL) return 0;
    theory t;
    theory_init(&t, cfg, W, rank, out);
    const size_t(*peak)[FC_MEM_COUNT] = mem->peak;
    const size_t *dev = peak[FC_LOC_DEVICE], *host = peak[FC_LOC_HOST];

    // shards: exact, fp32, where the strategy keeps them
    const char *names[2];
    size_t shard = 0;
    for (int u = 0; u < t.nu; u++) shard += t.lay[u].store * sizeof(float);
    fc_mem_loc on = cfg->cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE,
               off = cfg->cpu_offload ? FC_LOC_DEVICE : FC_LOC_HOST;
    fc_mem_cat cats[3] = {FC_MEM_PARAM_SHARD, FC_MEM_GRAD_SHARD, FC_MEM_OPTIM_STATE};
    size_t want[3] = {shard, shard, (size_t)fc_optim_state_names(&cfg->optim, names) * shard};
    for (int i = 0; i < 3; i++) {
        EXPECT(&t, peak[on][cats[i]] == want[i], "peak %s %s: expected %zu bytes (the sharded formula), got %zu",
               fc_mem_loc_name(on), fc_mem_cat_name(cats[i]), want[i], peak[on][cats[i]]);
        EXPECT(&t, peak[off][cats[i]] == 0, "peak %s %s: expected 0 bytes, got %zu", fc_mem_loc_name(off),
               fc_mem_cat_name(cats[i]), peak[off][cats[i]]);
    }

    // gathered parameters: what the schedule holds
    size_t gp = dev[FC_MEM_GATHERED_PARAMS];
    if (t.g.sharded) {
        size_t in_log = log_gathered_peak(&t, log), lo, hi;
        gathered_bounds(&t, &lo, &hi);
        EXPECT(&t, gp == in_log,
               "peak device gathered_params: expected %zu bytes, the peak of gathered units in the comm log; got %zu",
               in_log, gp);
        EXPECT(&t, in_log >= lo && in_log <= hi,
               "the comm log holds up to %zu bytes of gathered parameters; the prefetch policy allows %zu..%zu", in_log,
               lo, hi);
    } else {
        // no_shard computes on its own fp32 parameters, or on a param_dtype
        // copy of them (all at once, or unit by unit as FSDP's NO_SHARD does)
        size_t all = 0;
        for (int u = 0; u < t.nu; u++) all += t.lay[u].numel * t.psz;
        if (cfg->param_dtype == FC_PREC_FP32)
            EXPECT(&t, gp == 0, "peak device gathered_params: no_shard in fp32 needs none, got %zu bytes", gp);
        else
            EXPECT(&t, gp > 0 && gp <= all,
                   "peak device gathered_params: no_shard in %s needs a compute copy of 1..%zu bytes, got %zu",
                   fc_prec_name(cfg->param_dtype), all, gp);
    }

    // Unsharded gradients. The old theory demanded the reference's own value
    // (the root's and one unit's gradient in param_dtype, freed as its
    // reduction is issued); FSDP may keep one until its reduction completes
    // and in fp32, so the neutral rule is a bound from the comm log.
    size_t gg = dev[FC_MEM_GATHERED_GRADS], bound = log_grads_bound(&t, log);
    EXPECT(&t, gg <= bound,
           "peak device gathered_grads: expected at most %zu bytes (what the comm log's schedule needs), got %zu",
           bound, gg);
    if (t.g.sharded)
        EXPECT(&t, gg > 0,
               "peak device gathered_grads: expected > 0 (a sharded backward needs unsharded gradients), got 0");
    for (int c = FC_MEM_GATHERED_PARAMS; c <= FC_MEM_GATHERED_GRADS; c++)
        EXPECT(&t, host[c] == 0, "peak host %s: expected 0 (compute is on the device), got %zu",
               fc_mem_cat_name((fc_mem_cat)c), host[c]);

    // Activations and communication buffers are the implementation's own
    // (layout, precision, fusion): reported, never compared with a formula.
    EXPECT(&t, dev[FC_MEM_ACTIVATIONS] + host[FC_MEM_ACTIVATIONS] > 0, "activations: expected a nonzero peak, got 0");
    if (log_has_unit_collective(log))
        EXPECT(&t, dev[FC_MEM_COMM_BUFFERS] + host[FC_MEM_COMM_BUFFERS] > 0,
               "comm_buffers: expected a nonzero peak (the comm log has collectives), got 0");

    // the total's peak lies between the largest category's and their sum
    for (int l = 0; l < FC_LOC_COUNT; l++) {
        size_t max = 0, sum = 0;
        for (int c = 0; c < FC_MEM_COUNT; c++) {
            sum += peak[l][c];
            if (peak[l][c] > max) max = peak[l][c];
        }
        EXPECT(&t, mem->peak_total[l] >= max && mem->peak_total[l] <= sum,
               "peak %s total %zu: expected between the largest category's peak %zu and the sum of peaks %zu",
               fc_mem_loc_name((fc_mem_loc)l), mem->peak_total[l], max, sum);
    }
    theory_free(&t);
    return out->n - before;
}
