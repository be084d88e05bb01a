// oracle/theory_events.c — the events a step of the comm log must hold:
// pass 1 checks every event on its own (its bytes, dtype, group and phase,
// the gather state of its unit, the limiter's bound, h2d before all-gather),
// through one expectation function per op taken from a table, and files it in
// its slot of the step's index; pass 2 counts the slots against what the
// config implies per micro-batch, stage and unit. The rules are theory.c's.
#include <stdlib.h>

#include "check.h"
#include "clip.h"
#include "theory_internal.h"

static const char *PER_UNIT_NAME[N_PER_UNIT] = {
    "forward all_gather", "backward all_gather", "forward free",          "backward free",
    "reduce_scatter",     "all_reduce(world)",   "all_reduce(replicate)", "d2h",
    "recompute all_gather", "recompute free"};

static void put(slot *s, int i) {
    if (s->n++ == 0) s->at = i;
}

// The shard group's collectives: logged as "shard", or as "world" where the
// shard group is the world.
static int shard_group_ok(const theory *t, fc_group g) {
    return g == FC_GROUP_SHARD || (g == FC_GROUP_WORLD && t->g.F == t->g.W);
}

// ---------------------------------------------------------------------------
// the bytes each event may carry

static size_t reduce_scatter_bytes(const theory *t, int u) { return t->lay[u].padded * t->rsz; }

// A unit's fp32 shard at this rank: the whole chunk S_u, its valid part, and
// all the rank stores of it.
typedef struct {
    size_t whole, valid, stored;
} shard_bytes;

static shard_bytes fp32_shard_bytes(const theory *t, int u) {
    const fc_unit_layout *l = &t->lay[u];
    return (shard_bytes){fp32_bytes(l->shard), fp32_bytes(l->own_valid), fp32_bytes(l->store)};
}

// ---------------------------------------------------------------------------
// pass 1: one expectation per op

// A unit's all-gather as the scan has seen it so far.
typedef enum {
    GATHER_NONE,    // not issued, or freed
    GATHER_ISSUED,  // issued, not yet waited
    GATHER_WAITED,  // waited: the unit may compute and be freed
} gather_state;

// What the scan carries from one event to the next.
typedef struct {
    step_view *x;
    const theory *t;
    long step;
    gather_state *state;  // [nu]
    int *h2d_pending;     // [nu] h2d copies not yet used by an all_gather
    int alive;            // units gathered (issued and not freed)
} event_scan;

// Checks event i (v) of its op, files it in its slot and moves the scan's
// state on. Returns 1 when the event is of no expected kind, else 0.
typedef int (*expect_fn)(event_scan *sc, int i, const fc_event *v);

static int expect_compute(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    int u = v->unit, k = v->micro, s = v->stage, fwd = v->op == FC_OP_FORWARD;
    if (s < 0 || s >= t->ns || unit_of(t, s) != u) {
        fc_findings_add(t->out, "step %ld #%d: %s of stage %d with unit %d: the model's stage %d uses unit %d",
                        sc->step, i, fc_op_name(v->op), s, u, s, s >= 0 && s < t->ns ? unit_of(t, s) : -1);
        return 1;
    }
    int rec = fwd && v->phase == FC_PHASE_RECOMPUTE;  // activation checkpointing's recompute
    EXPECT(t, rec || v->phase == (fwd ? FC_PHASE_FORWARD : FC_PHASE_BACKWARD),
           "step %ld #%d: %s of stage %d in phase %s", sc->step, i, fc_op_name(v->op), s, fc_phase_name(v->phase));
    EXPECT(t, !rec || t->ckpt[u], "step %ld #%d: recompute of stage %d, whose unit %d is not checkpointed (%s)",
           sc->step, i, s, u, fc_act_ckpt_name(t->cfg->act_ckpt));
    put(rec ? rec_slot(sc->x, k, s) : fwd ? fwd_slot(sc->x, k, s) : bwd_slot(sc->x, k, s), i);
    if (t->g.sharded)
        EXPECT(t, sc->state[u] == GATHER_WAITED,
               "step %ld micro %d #%d: %s of stage %d runs on unit %d whose all_gather is %s (expected: waited)",
               sc->step, k, i, fc_op_name(v->op), s, u,
               sc->state[u] == GATHER_NONE ? "not issued (or freed)" : "not yet waited");
    return 0;
}

// All-gathers and frees belong to forward, backward or a recompute: files
// event i in the slot of its phase. A unit whose recompute gathers it has two
// all-gathers in backward; the first is the recompute's (in phase recompute,
// or backward where backward prefetch issued it). Returns 1 (after a finding)
// in any other phase.
static int put_by_phase(event_scan *sc, int i, const fc_event *v, int fwd_kind, int bwd_kind, int rec_kind) {
    int u = v->unit, kind;
    if (v->phase == FC_PHASE_FORWARD)
        kind = fwd_kind;
    else if (v->phase == FC_PHASE_RECOMPUTE)
        kind = rec_kind;
    else if (v->phase == FC_PHASE_BACKWARD)
        kind = rec_kind == AG_REC && sc->t->rec_gathers[u] && !unit_slot(sc->x, v->micro, u, AG_REC)->n ? rec_kind
                                                                                                          : bwd_kind;
    else {
        fc_findings_add(sc->t->out, "step %ld #%d: %s of unit %d in phase %s", sc->step, i, fc_op_name(v->op), u,
                        fc_phase_name(v->phase));
        return 1;
    }
    put(unit_slot(sc->x, v->micro, u, kind), i);
    return 0;
}

static int expect_all_gather(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    const fc_run_config *c = t->cfg;
    int u = v->unit, k = v->micro;
    size_t want = gathered_bytes(t, u);
    EXPECT(t, t->g.sharded, "step %ld #%d: all_gather of unit %d, but %s gathers nothing", sc->step, i, u,
           fc_strategy_name(c->strategy));
    // FSDP2's integer reshard_after_forward: backward rebuilds a unit freed
    // after forward from the slices of its group of PF ranks, the same bytes
    int from_slices = t->g.PF && v->phase == FC_PHASE_BACKWARD && reshards(t, u);
    EXPECT(t,
           v->bytes == want && v->dtype == c->param_dtype &&
               (from_slices ? v->group == FC_GROUP_POST_FORWARD : shard_group_ok(t, v->group)),
           "step %ld #%d: all_gather of unit %d: expected %zu bytes %s over %s; got %zu bytes %s over %s", sc->step, i,
           u, want, fc_prec_name(c->param_dtype), from_slices ? "the post-forward group" : "the shard group", v->bytes,
           fc_prec_name(v->dtype), fc_group_name(v->group));
    EXPECT(t, sc->state[u] == GATHER_NONE, "step %ld micro %d #%d: all_gather of unit %d while it is already gathered",
           sc->step, k, i, u);
    int other = put_by_phase(sc, i, v, AG_FWD, AG_BWD, AG_REC);
    // the limiter's bound: a prefetch only while fewer than two units are alive
    if (v->prefetch && fc_rule_limits_gathered_as(t->api, c))
        EXPECT(t, fc_rule_prefetch_allowed(c, sc->alive),
               "step %ld micro %d #%d: limit_all_gathers: prefetched all_gather of unit %d issued with %d units "
               "gathered (a prefetch is allowed only while fewer than 2 are)",
               sc->step, k, i, u, sc->alive);
    if (c->cpu_offload) {
        EXPECT(t, sc->h2d_pending[u] > 0,
               "step %ld #%d: cpu_offload: all_gather of unit %d without an h2d of its shard before it", sc->step, i,
               u);
        if (sc->h2d_pending[u] > 0) sc->h2d_pending[u]--;
    }
    if (sc->state[u] == GATHER_NONE) sc->alive++;
    sc->state[u] = GATHER_ISSUED;
    return other;
}

static int expect_free(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    int u = v->unit, k = v->micro;
    EXPECT(t, t->g.sharded, "step %ld #%d: free of unit %d, but %s gathers nothing", sc->step, i, u,
           fc_strategy_name(t->cfg->strategy));
    EXPECT(t, sc->state[u] == GATHER_WAITED, "step %ld micro %d #%d: free of unit %d whose all_gather is %s", sc->step,
           k, i, u, sc->state[u] == GATHER_NONE ? "not issued" : "not waited");
    int other = put_by_phase(sc, i, v, FREE_FWD, FREE_BWD, FREE_REC);
    if (sc->state[u] != GATHER_NONE) sc->alive--;
    sc->state[u] = GATHER_NONE;
    return other;
}

static int expect_reduce_scatter(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    const fc_run_config *c = t->cfg;
    int u = v->unit;
    size_t want = reduce_scatter_bytes(t, u);
    EXPECT(t, t->g.sharded, "step %ld #%d: reduce_scatter of unit %d under no_shard (expected an all_reduce)", sc->step,
           i, u);
    EXPECT(
        t,
        v->bytes == want && v->dtype == c->reduce_dtype && shard_group_ok(t, v->group) && v->phase == FC_PHASE_BACKWARD,
        "step %ld #%d: reduce_scatter of unit %d: expected %zu bytes %s over the shard group in backward; "
        "got %zu bytes %s over %s in %s",
        sc->step, i, u, want, fc_prec_name(c->reduce_dtype), v->bytes, fc_prec_name(v->dtype), fc_group_name(v->group),
        fc_phase_name(v->phase));
    put(unit_slot(sc->x, v->micro, u, RS), i);
    return 0;
}

// The total norm's all_reduce (unit -1), in phase clip over the shard group
// or the world.
static int expect_norm_all_reduce(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    fc_group want = t->g.sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD;
    EXPECT(t,
           v->phase == FC_PHASE_CLIP && fc_rule_norm_bytes_ok(t->api, &t->m, v->bytes) && v->dtype == FC_PREC_FP32 &&
               (v->group == want || v->group == FC_GROUP_WORLD),
           "step %ld #%d: norm all_reduce: expected phase clip, 4 or 8 bytes (reference: or %zu; %s: or 4 per parameter) "
           "fp32 over %s; "
           "got phase %s, "
           "%zu bytes %s over %s",
           sc->step, i, sizeof(fc_norm_part), fc_sched_api_name(t->api), fc_group_name(want), fc_phase_name(v->phase), v->bytes,
           fc_prec_name(v->dtype), fc_group_name(v->group));
    put(&sc->x->norm, i);
    return 0;
}

// The all_reduce of unit u (not the norm): no_shard's gradient, or a hybrid
// replica's, in backward and reduce_dtype.
static int expect_all_reduce(event_scan *sc, int i, const fc_event *v) {
    if (v->unit == -1) return expect_norm_all_reduce(sc, i, v);
    const theory *t = sc->t;
    int u = v->unit;
    if (!valid_unit(t, u)) {
        fc_findings_add(t->out, "step %ld #%d: all_reduce of unit %d", sc->step, i, u);
        return 1;
    }
    const fc_unit_layout *l = &t->lay[u];
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
        fc_findings_add(t->out, "step %ld #%d: all_reduce of unit %d over %s, which %s has none of", sc->step, i, u,
                        fc_group_name(v->group), fc_strategy_name(t->cfg->strategy));
        return 1;
    }
    EXPECT(t,
           v->group == group && (v->bytes == a || v->bytes == b) && v->dtype == t->cfg->reduce_dtype &&
               v->phase == FC_PHASE_BACKWARD,
           "step %ld #%d: %s of unit %d: expected %zu or %zu bytes %s over %s in backward; got %zu bytes %s over %s "
           "in %s",
           sc->step, i, PER_UNIT_NAME[kind], u, a, b, fc_prec_name(t->cfg->reduce_dtype), fc_group_name(group),
           v->bytes, fc_prec_name(v->dtype), fc_group_name(v->group), fc_phase_name(v->phase));
    put(unit_slot(sc->x, v->micro, u, kind), i);
    return 0;
}

// A wait completes the earliest unfinished issue of its collective and unit.
static int expect_wait(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    step_view *x = sc->x;
    int u = v->unit, found = -1;
    for (int j = 0; j < i && found < 0; j++)
        if (x->ev[j].op == v->of && x->ev[j].unit == u && is_collective(v->of) && x->waited_by[j] < 0) found = j;
    if (found < 0) {
        fc_findings_add(t->out, "step %ld #%d: wait of %s of unit %d with no earlier unfinished issue", sc->step, i,
                        fc_op_name(v->of), u);
        return 0;
    }
    x->waited_by[found] = i;
    if (v->of == FC_OP_ALL_GATHER && valid_unit(t, u)) {
        EXPECT(t, sc->state[u] == GATHER_ISSUED, "step %ld #%d: wait of the all_gather of unit %d, which is %s",
               sc->step, i, u, sc->state[u] == GATHER_NONE ? "freed" : "already waited");
        sc->state[u] = GATHER_WAITED;
    }
    return 0;
}

static int expect_h2d(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    int u = v->unit;
    if (!t->cfg->cpu_offload || !valid_unit(t, u)) {
        fc_findings_add(t->out, "step %ld #%d: h2d of unit %d without cpu_offload", sc->step, i, u);
        return 1;
    }
    // the fp32 master shard, whole or its valid part
    shard_bytes want = fp32_shard_bytes(t, u);
    EXPECT(t, v->bytes == want.whole || v->bytes == want.valid,
           "step %ld #%d: h2d of unit %d: expected %zu (or valid %zu) bytes, got %zu", sc->step, i, u, want.whole,
           want.valid, v->bytes);
    put(&sc->x->h2d[u], i);
    sc->h2d_pending[u]++;
    return 0;
}

static int expect_d2h(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    int u = v->unit;
    EXPECT(t, t->cfg->cpu_offload, "step %ld #%d: d2h of unit %d without cpu_offload", sc->step, i, u);
    // the reduced fp32 gradient: the valid part of the chunk, the whole chunk, or all it stores
    shard_bytes want = fp32_shard_bytes(t, u);
    EXPECT(t, v->bytes == want.valid || v->bytes == want.whole || v->bytes == want.stored,
           "step %ld #%d: d2h of unit %d: expected %zu, %zu or %zu bytes, got %zu", sc->step, i, u, want.valid,
           want.whole, want.stored, v->bytes);
    put(unit_slot(sc->x, v->micro, u, D2H), i);
    return 0;
}

static int expect_optim(event_scan *sc, int i, const fc_event *v) {
    const theory *t = sc->t;
    int u = v->unit;
    if (!valid_unit(t, u)) {
        fc_findings_add(t->out, "step %ld #%d: optim of unit %d", sc->step, i, u);
        return 1;
    }
    EXPECT(t, v->phase == FC_PHASE_OPTIM, "step %ld #%d: optim of unit %d in phase %s", sc->step, i, u,
           fc_phase_name(v->phase));
    // the optimizer steps this rank's real elements of the unit, fp32: its
    // chunk's (FSDP2: its torch.chunk rows of every parameter), or the whole
    // unit under no_shard. 0 is "not measured": a torch loop's log (one
    // optimizer.step() for every unit) has no per-unit figure to give.
    // A frozen parameter's elements are not stepped (docs/contract.md §2).
    const fc_unit_layout *l = &t->lay[u];
    size_t want = fp32_bytes((t->g.sharded ? l->own_valid : l->numel) - t->frozen_real[u]);
    EXPECT(t, v->bytes == want || v->bytes == 0,
           "step %ld #%d: optim of unit %d: expected %zu bytes (the fp32 elements this rank owns), got %zu", sc->step,
           i, u, want, v->bytes);
    put(&sc->x->optim[u], i);
    return 0;
}

static const expect_fn OP_EXPECTATION[FC_OP_COUNT] = {
    [FC_OP_ALL_GATHER] = expect_all_gather,
    [FC_OP_REDUCE_SCATTER] = expect_reduce_scatter,
    [FC_OP_ALL_REDUCE] = expect_all_reduce,
    [FC_OP_WAIT] = expect_wait,
    [FC_OP_FORWARD] = expect_compute,
    [FC_OP_BACKWARD] = expect_compute,
    [FC_OP_FREE] = expect_free,
    [FC_OP_H2D] = expect_h2d,
    [FC_OP_D2H] = expect_d2h,
    [FC_OP_OPTIM] = expect_optim,
};

// Every enum of the event within its range.
static int well_formed(const fc_event *v) {
    return (unsigned)v->op < FC_OP_COUNT && (unsigned)v->of < FC_OP_COUNT && (unsigned)v->group < FC_GROUP_COUNT &&
           (unsigned)v->phase < FC_PHASE_COUNT && (unsigned)v->dtype <= FC_PREC_FP16;
}

// Compute, gathers, frees and gradient traffic belong to one micro-batch and
// one unit; the optimizer, waits, h2d and the norm's all_reduce do not.
static int per_micro(const fc_event *v) {
    return v->op != FC_OP_OPTIM && v->op != FC_OP_WAIT && v->op != FC_OP_H2D &&
           !(v->op == FC_OP_ALL_REDUCE && v->unit == -1);
}

int theory_scan_events(step_view *x) {
    const theory *t = x->t;
    long step = x->step;
    int other = 0;
    event_scan sc = {.x = x,
                     .t = t,
                     .step = step,
                     .state = callocCheck((size_t)t->nu, sizeof(gather_state)),
                     .h2d_pending = callocCheck((size_t)t->nu, sizeof(int))};
    for (int i = 0; i < x->n; i++) {
        const fc_event *v = &x->ev[i];
        x->alive_before[i] = sc.alive;
        EXPECT(t, v->order == i, "step %ld: event %d has order %d", step, i, v->order);
        if (!well_formed(v)) {  // a port's log is input: no name lookup out of range
            fc_findings_add(t->out, "step %ld #%d: malformed event (op %d, of %d, group %d, phase %d, dtype %d)", step,
                            i, (int)v->op, (int)v->of, (int)v->group, (int)v->phase, (int)v->dtype);
            other++;
            continue;
        }
        int u = v->unit, k = v->micro;
        if (per_micro(v) && !(valid_unit(t, u) && k >= 0 && k < t->K)) {
            fc_findings_add(t->out, "step %ld #%d: %s of unit %d in micro-batch %d (units 0..%d, micro-batches 0..%d)",
                            step, i, fc_op_name(v->op), u, k, t->nu - 1, t->K - 1);
            other++;
            continue;
        }
        other += OP_EXPECTATION[v->op](&sc, i, v);
    }
    x->alive_before[x->n] = sc.alive;
    for (int i = 0; i < x->n; i++)
        if (is_collective(x->ev[i].op))
            EXPECT(t, x->waited_by[i] >= 0, "step %ld #%d: %s of unit %d is never waited", step, i,
                   fc_op_name(x->ev[i].op), x->ev[i].unit);
    if (t->g.sharded)
        for (int u = 0; u < t->nu; u++)
            EXPECT(t, sc.state[u] == GATHER_NONE,
                   "step %ld ends with unit %d still gathered (expected every unit freed)", step, u);
    free(sc.state);
    free(sc.h2d_pending);
    return other;
}

// ---------------------------------------------------------------------------
// pass 2: how many of each event, per micro-batch, stage and unit

int theory_check_counts(step_view *x) {
    const theory *t = x->t;
    const fc_run_config *c = t->cfg;
    long step = x->step;
    int ok = 1;
    for (int k = 0; k < t->K; k++) {
        int syncs = sync_micro(t, k);  // micro-batch k reduces gradients
        for (int s = 0; s < t->ns; s++) {
            if (fwd_slot(x, k, s)->n != 1 || bwd_slot(x, k, s)->n != 1) {
                ok = 0;
                fc_findings_add(t->out,
                                "step %ld micro %d stage %d: expected 1 forward and 1 backward compute, got %d and %d",
                                step, k, s, fwd_slot(x, k, s)->n, bwd_slot(x, k, s)->n);
            }
            int rec = t->ckpt[unit_of(t, s)];
            if (rec_slot(x, k, s)->n != rec) {
                ok = 0;
                fc_findings_add(t->out, "step %ld micro %d stage %d (unit %d): expected %d recompute%s, got %d", step,
                                k, s, unit_of(t, s), rec, rec ? " (activation checkpointing)" : "",
                                rec_slot(x, k, s)->n);
            }
        }
        for (int u = 0; u < t->nu; u++) {
            int want[N_PER_UNIT];
            want[AG_FWD] = gathers_in_forward(t, k);
            want[AG_BWD] = want[FREE_FWD] = reshards(t, u);
            want[FREE_BWD] = frees_in_backward(t, k);
            int reduces = syncs && t->trains[u];  // a unit with no trainable parameter has no gradient
            want[RS] = t->g.sharded && reduces;
            want[AR_WORLD] = !t->g.sharded && reduces;
            want[AR_REPL] = t->g.hybrid && t->g.R > 1 && reduces;
            want[D2H] = c->cpu_offload && reduces;
            want[AG_REC] = want[FREE_REC] = t->rec_gathers[u];
            for (int q = 0; q < N_PER_UNIT; q++)
                if (unit_slot(x, k, u, q)->n != want[q]) {
                    ok = 0;
                    fc_findings_add(t->out, "step %ld micro %d unit %d%s: expected %d %s, got %d", step, k, u,
                                    u == t->m.root_unit ? " (root)" : "", want[q], PER_UNIT_NAME[q],
                                    unit_slot(x, k, u, q)->n);
                }
        }
    }
    for (int u = 0; u < t->nu; u++) {
        int gathers = 0;
        for (int k = 0; k < t->K; k++)
            gathers += unit_slot(x, k, u, AG_FWD)->n + unit_slot(x, k, u, AG_BWD)->n + unit_slot(x, k, u, AG_REC)->n;
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
    int norms = fc_rule_norm_reduced(t->api, c);
    if (x->norm.n != norms) {
        ok = 0;
        fc_findings_add(t->out, "step %ld: expected %d norm all_reduce (unit -1, phase clip%s), got %d", step, norms,
                        norms ? "" : ": no norm collective in this torch loop", x->norm.n);
    }
    return ok;
}
