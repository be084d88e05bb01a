// oracle/theory.c — see theory.h. The schedule check (P10): its driver, step
// by step, the theory of one configuration at one rank and the index of a
// step, which the passes fill and read (theory_internal.h); the passes are in
// theory_events.c (each event, the counts) and theory_prefetch.c (the order,
// prefetch, the limiter), the memory check (P11) in theory_memory.c; the
// findings and the APIs' names are the bottom layer, findings.c.
//
// The theory, per step of one rank's comm log (G ranks in the reduction
// layout, S_u and P_u = S_u*G unit u's chunk and padded size, all from
// fc_unit_layout_of; K micro-batches, of which the "sync" ones reduce
// gradients: every one, or with no_sync only the last):
//  - counts: per micro-batch one forward and one backward compute per stage;
//    sharded strategies all-gather every unit in forward and, where
//    fc_rule_frees_after_forward says the unit was freed after its last forward
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
//  - prefetch (docs/contract.md §5): each unit has one prefetch opportunity
//    (fc_rule_opportunities): in forward the first stage of the unit before it,
//    in backward the stage where backward reaches the unit before it; with
//    FSDP2's explicit lists of D units, of the unit D before it.
//    With the policy on, its all-gather is issued in that stage's window and
//    flagged prefetch; otherwise at need, after the stage ended, unflagged.
//  - the limiter: a prefetch is issued only while fc_rule_prefetch_allowed,
//    and one is held back (gathered at need, unflagged) only when it does not.
//  - activation checkpointing (fc_rule_checkpointed): per micro-batch one
//    recompute (forward compute in phase recompute) per stage of every
//    checkpointed unit, after the forward pass, in forward order, before the
//    unit's first backward compute, on a gathered unit. Where the recompute
//    gathers the unit itself (fc_rule_recompute_gathers: FSDP1, outside), the
//    unit has two all-gathers in backward: the recompute's, which backward
//    prefetch may issue, freed in phase recompute after its last recompute,
//    then backward's own, at need.
// Where FSDP leaves a choice to the implementation, the theory accepts each
// choice (e.g. BACKWARD_POST may free the unit before or after prefetching
// the next, as PyTorch frees first and the reference after).
#include "theory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rules.h"
#include "theory_internal.h"

// ---------------------------------------------------------------------------
// the theory of one configuration at one rank

void theory_init(theory *t, const fc_run_config *cfg, int W, int rank, fc_sched_api api, fc_findings *out) {
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->api = api;
    t->bwd_prefetch = fc_rule_backward_prefetch_as(api, cfg);
    t->per_param = api == FC_API_TORCH_FSDP2 || cfg->fsdp_version == 2;
    t->out = out;
    fc_model_build_run(&t->m, cfg);
    // the oracle's own rules (rules.h), never core/layout.c's: see rules.h
    t->g = fc_rule_groups(cfg, W, rank);
    t->nu = t->m.n_units;
    t->ns = t->m.n_stages;
    t->K = cfg->grad_accum;
    t->psz = fc_prec_size(cfg->param_dtype);
    t->rsz = fc_prec_size(cfg->reduce_dtype);
    t->st = callocCheck((size_t)t->nu, sizeof *t->st);
    t->lay = callocCheck((size_t)t->nu, sizeof *t->lay);
    t->fwd_opp = callocCheck((size_t)t->nu, sizeof *t->fwd_opp);
    t->bwd_opp = callocCheck((size_t)t->nu, sizeof *t->bwd_opp);
    t->ckpt = callocCheck((size_t)t->nu, sizeof *t->ckpt);
    t->rec_gathers = callocCheck((size_t)t->nu, sizeof *t->rec_gathers);
    t->frozen_store = callocCheck((size_t)t->nu, sizeof *t->frozen_store);
    t->frozen_real = callocCheck((size_t)t->nu, sizeof *t->frozen_real);
    t->trains = callocCheck((size_t)t->nu, sizeof *t->trains);
    for (int u = 0; u < t->nu; u++) {
        t->st[u] = fc_rule_stages(&t->m, u);
        t->ckpt[u] = fc_rule_checkpointed(cfg, &t->m, u);
        t->rec_gathers[u] = t->g.sharded && fc_rule_recompute_gathers_as(api, cfg, &t->m, u);
        t->lay[u] = fc_rule_layout(t->m.units[u].numel, &t->g);
        if (t->per_param && t->g.sharded) {
            // per-parameter shards (rules.h): no flat chunk, every rank's shard the same size
            size_t S = fc_rule_fsdp2_shard(&t->m, u, t->g.F);
            t->lay[u].shard = t->lay[u].store = S;
            t->lay[u].own_valid = fc_rule_fsdp2_valid(&t->m, u, t->g.F, t->g.shard_rank);
            t->lay[u].padded = S * (size_t)t->g.F;
            t->lay[u].own_off = (size_t)t->g.shard_rank * S;
        }
        t->frozen_store[u] = fc_rule_frozen_store(&t->m, u, &t->g, t->per_param, 1);
        t->frozen_real[u] = fc_rule_frozen_store(&t->m, u, &t->g, t->per_param, 0);
        t->trains[u] = fc_rule_unit_trains(&t->m, u);
    }
    // each unit's prefetch opportunity, in each pass's own order
    fc_rule_opportunities(&t->m, fc_rule_prefetch_depth(cfg, 1), fc_rule_prefetch_depth(cfg, 0), t->fwd_opp, t->bwd_opp);
}

void theory_free(theory *t) {
    free(t->st);
    free(t->lay);
    free(t->fwd_opp);
    free(t->bwd_opp);
    free(t->ckpt);
    free(t->rec_gathers);
    free(t->frozen_store);
    free(t->frozen_real);
    free(t->trains);
    fc_model_free(&t->m);
}

// ---------------------------------------------------------------------------
// one step of the log, indexed

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
    x->rec = mallocCheck(ks * sizeof(slot));
    x->per_unit = mallocCheck(ku * sizeof(slot));
    x->h2d = mallocCheck((size_t)t->nu * sizeof(slot));
    x->optim = mallocCheck((size_t)t->nu * sizeof(slot));
    clear_slots(x->fwd, ks);
    clear_slots(x->bwd, ks);
    clear_slots(x->rec, ks);
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
    free(x->rec);
    free(x->per_unit);
    free(x->h2d);
    free(x->optim);
    free(x->waited_by);
    free(x->alive_before);
}

// Pass 1 and 2 over one step; pass 3 only once every event is in its slot.
static void check_step(const theory *t, long step, const fc_event *ev, int n) {
    step_view x;
    view_init(&x, t, step, ev, n);
    int other = theory_scan_events(&x);
    EXPECT(t, other == 0, "step %ld: %d event(s) of no expected kind", step, other);
    if (theory_check_counts(&x))
        for (int k = 0; k < t->K; k++) theory_check_order(&x, k);
    view_free(&x);
}

int fc_theory_check_schedule(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, fc_findings *out) {
    return fc_theory_check_schedule_as(cfg, W, rank, FC_API_REFERENCE, log, out);
}

int fc_theory_check_schedule_as(const fc_run_config *cfg, int W, int rank, fc_sched_api api, const fc_comm_log *log,
                                fc_findings *out) {
    int before = out->n;
    if (cfg->strategy == FC_STRATEGY_LOCAL) return 0;  // one process, nothing scheduled
    // the two writings of the rules agree for this configuration (rules.h)
    fc_rules_disagree(cfg, W, rank, out);
    theory t;
    theory_init(&t, cfg, W, rank, api, out);
    if (log->n == 0) fc_findings_add(out, "empty comm log (expected %d step(s))", cfg->steps);
    size_t b = 0;
    long first = log->n ? log->ev[0].step : 0;
    t.first_step = first;
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
