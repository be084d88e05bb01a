// oracle/rules.c — see rules.h. Every rule here is a table or a closed form;
// none calls core/layout.c (fc_rules_disagree calls it only to compare).
#include "rules.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "clip.h"

// docs/contract.md §5's table, row for row.
static const fc_rule_row ROWS[] = {
    {FC_STRATEGY_LOCAL, 0, 0, 0},        {FC_STRATEGY_NO_SHARD, 0, 0, 0},
    {FC_STRATEGY_FULL_SHARD, 1, 1, 0},   {FC_STRATEGY_SHARD_GRAD_OP, 1, 0, 0},
    {FC_STRATEGY_HYBRID_SHARD, 1, 1, 1}, {FC_STRATEGY_HYBRID_SHARD_ZERO2, 1, 0, 1},
};

const fc_rule_row *fc_rule_row_of(fc_strategy s) {
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
        if (ROWS[i].strategy == s) return &ROWS[i];
    return &ROWS[0];  // unreachable for a validated config: local does nothing
}

fc_groups fc_rule_groups(const fc_run_config *cfg, int W, int rank) {
    const fc_rule_row *r = fc_rule_row_of(cfg->strategy);
    int F = 1;  // no_shard and local: every rank a replica of the whole model
    if (r->gathers) F = (r->hybrid && cfg->shard_group > 0) ? cfg->shard_group : W;
    fc_groups g = {.W = W, .rank = rank, .sharded = r->gathers, .hybrid = r->hybrid, .F = F};
    g.R = W / F;
    g.replica = rank / F;  // group g holds ranks gF .. gF + F - 1
    g.shard_rank = rank - g.replica * F;
    // the reduction layout: the shard group when sharded, else all W ranks
    g.G = r->gathers ? F : W;
    g.idx = r->gathers ? g.shard_rank : rank;
    // FSDP2's integer reshard_after_forward R: the post-forward mesh is the
    // (replicate, shard) mesh flattened into rows of R (torch's
    // mesh.view(-1, R)); R divides F, so a row lies inside one shard group
    g.PF = r->gathers && cfg->fsdp_version == 2 && cfg->reshard_after_forward > 0 ? cfg->reshard_after_forward : 0;
    g.pf_rank = g.PF ? g.shard_rank % g.PF : 0;
    return g;
}

fc_unit_layout fc_rule_layout(size_t numel, const fc_groups *g) {
    size_t G = (size_t)g->G;
    fc_unit_layout l = {.numel = numel};
    l.shard = numel / G + (numel % G != 0);
    l.padded = G * l.shard;
    l.own_off = (size_t)g->idx * l.shard;
    l.own_valid = l.own_off >= numel ? 0 : numel - l.own_off;
    if (l.own_valid > l.shard) l.own_valid = l.shard;
    l.store = g->sharded ? l.shard : numel;
    return l;
}

fc_unit_stages fc_rule_stages(const fc_model *m, int u) {
    // forward runs stages 0..n-1, backward n-1..0: a unit's first backward use
    // is its last forward one, and the other way round
    int lo = -1, hi = -1;
    for (int s = m->n_stages - 1; s >= 0; s--)
        if (m->stages[s].unit == u) {
            if (hi < 0) hi = s;
            lo = s;
        }
    return (fc_unit_stages){.first_fwd = lo, .last_fwd = hi, .first_bwd = hi, .last_bwd = lo};
}

int fc_rule_frees_after_forward(fc_strategy s, const fc_model *m, int u) {
    return fc_rule_row_of(s)->frees_after_fwd && u != m->root_unit;
}

int fc_rule_checkpointed(const fc_run_config *cfg, const fc_model *m, int u) {
    if (cfg->act_ckpt == FC_ACT_CKPT_NONE) return 0;
    return u != m->root_unit;
}

int fc_rule_recompute_gathers(const fc_run_config *cfg, const fc_model *m, int u) {
    static const int OUTSIDE_COSTS_A_GATHER[3] = {[1] = 1, [2] = 0};  // by fsdp_version
    if (cfg->act_ckpt != FC_ACT_CKPT_OUTSIDE || cfg->fsdp_version < 1 || cfg->fsdp_version > 2) return 0;
    return OUTSIDE_COSTS_A_GATHER[cfg->fsdp_version] && fc_rule_checkpointed(cfg, m, u) &&
           fc_rule_frees_after_forward(cfg->strategy, m, u);
}

int fc_rule_recompute_gathers_as(fc_sched_api api, const fc_run_config *cfg, const fc_model *m, int u) {
    return api == FC_API_REFERENCE && fc_rule_recompute_gathers(cfg, m, u);
}

int fc_rule_frees_after_forward_as(fc_sched_api api, fc_strategy s, const fc_model *m, int u) {
    if (api == FC_API_TORCH_FSDP2) return fc_rule_row_of(s)->frees_after_fwd;
    return fc_rule_frees_after_forward(s, m, u);
}

size_t fc_rule_fsdp2_shard(const fc_model *m, int u, int F) {
    size_t n = 0;
    const fc_unit *un = &m->units[u];
    for (int i = 0; i < un->n_params; i++) {
        const fc_param *p = &m->params[m->unit_params[un->first_param + i]];
        size_t d0 = (size_t)p->shape[0], rest = p->numel / d0;
        n += (d0 + (size_t)F - 1) / (size_t)F * rest;
    }
    return n;
}

size_t fc_rule_fsdp2_valid(const fc_model *m, int u, int F, int j) {
    size_t n = 0;
    const fc_unit *un = &m->units[u];
    for (int i = 0; i < un->n_params; i++) {
        const fc_param *p = &m->params[m->unit_params[un->first_param + i]];
        size_t d0 = (size_t)p->shape[0], c = (d0 + (size_t)F - 1) / (size_t)F, r0 = (size_t)j * c;
        size_t r1 = r0 + c < d0 ? r0 + c : d0;
        if (r0 < r1) n += (r1 - r0) * (p->numel / d0);
    }
    return n;
}

int fc_rule_unit_trains(const fc_model *m, int u) {
    const fc_unit *un = &m->units[u];
    int trains = 0;
    for (int i = 0; i < un->n_params; i++) trains |= !m->params[m->unit_params[un->first_param + i]].frozen;
    return trains;
}

size_t fc_rule_frozen_store(const fc_model *m, int u, const fc_groups *g, int per_param, int padded) {
    const fc_unit *un = &m->units[u];
    fc_unit_layout l = fc_rule_layout(un->numel, g);
    size_t lo = g->sharded ? l.own_off : 0, hi = g->sharded ? l.own_off + l.own_valid : un->numel, n = 0;
    if (!fc_rule_unit_trains(m, u) && padded && !per_param) return l.store;  // a frozen FlatParameter: padding and all
    for (int i = 0; i < un->n_params; i++) {
        const fc_param *p = &m->params[m->unit_params[un->first_param + i]];
        if (!p->frozen) continue;
        size_t d0 = (size_t)p->shape[0];
        if (per_param && g->sharded) {  // torch.chunk's rows of this rank, or all of them padded
            size_t c = (d0 + (size_t)g->F - 1) / (size_t)g->F, r0 = (size_t)g->shard_rank * c;
            size_t r1 = r0 + c < d0 ? r0 + c : d0;
            n += (padded ? c : r0 < r1 ? r1 - r0 : 0) * (p->numel / d0);
        } else {  // the parameter's range of the unit, inside this rank's chunk
            size_t a = p->unit_offset > lo ? p->unit_offset : lo;
            size_t b = p->unit_offset + p->numel < hi ? p->unit_offset + p->numel : hi;
            if (a < b) n += b - a;
        }
    }
    return n;
}

int fc_rule_keeps_through_no_sync(fc_sched_api api, fc_strategy s) {
    const fc_rule_row *r = fc_rule_row_of(s);
    return api == FC_API_TORCH_FSDP1 && r->gathers && !r->frees_after_fwd;
}

int fc_rule_norm_reduced(fc_sched_api api, const fc_run_config *cfg) {
    // no_shard: every rank holds the whole gradient, torch's clip is local
    return api == FC_API_REFERENCE || (cfg->clip_grad_norm > 0 && fc_rule_row_of(cfg->strategy)->gathers);
}

fc_prefetch fc_rule_backward_prefetch_as(fc_sched_api api, const fc_run_config *cfg) {
    return api == FC_API_TORCH_FSDP2 || cfg->fsdp_version == 2 ? FC_PREFETCH_PRE : cfg->backward_prefetch;
}

int fc_rule_forward_prefetches_as(fc_sched_api api, const fc_run_config *cfg, int first_iteration) {
    return cfg->forward_prefetch && !(api == FC_API_TORCH_FSDP1 && first_iteration);
}

int fc_rule_late_post_backward_as(fc_sched_api api, const fc_run_config *cfg, int first_iteration) {
    return api == FC_API_TORCH_FSDP1 && fc_rule_forward_prefetches_as(api, cfg, first_iteration);
}

int fc_rule_limits_gathered_as(fc_sched_api api, const fc_run_config *cfg) {
    return cfg->limit_all_gathers && api == FC_API_REFERENCE;
}

int fc_rule_norm_bytes_ok(fc_sched_api api, const fc_model *m, size_t bytes) {
    if (bytes == fc_prec_size(FC_PREC_FP32) || bytes == sizeof(double)) return 1;
    if (api == FC_API_REFERENCE && bytes == sizeof(fc_norm_part)) return 1;
    return api == FC_API_TORCH_FSDP2 && bytes == (size_t)m->n_params * fc_prec_size(FC_PREC_FP32);
}

// the units sorted by key (ascending), ties impossible: every unit has its own
// first and its own last stage
static int *units_by(const fc_model *m, const int *key) {
    int n = m->n_units, *order = mallocCheck((size_t)n * sizeof *order), k = 0;
    for (int u = 0; u < n; u++)
        if (key[u] >= 0) order[k++] = u;
    for (int i = 1; i < k; i++)  // insertion sort: a handful of units
        for (int j = i; j > 0 && key[order[j - 1]] > key[order[j]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    if (k < n) order[k] = -1;
    return order;
}

int fc_rule_prefetch_depth(const fc_run_config *cfg, int forward) {
    int d = forward ? cfg->forward_prefetch : cfg->fsdp_version == 2 ? cfg->backward_prefetch_depth : 1;
    return d > 1 ? d : 1;
}

void fc_rule_opportunities(const fc_model *m, int fwd_depth, int bwd_depth, int *fwd, int *bwd) {
    int n = m->n_units;
    int *first = mallocCheck((size_t)n * sizeof *first), *last_neg = mallocCheck((size_t)n * sizeof *last_neg);
    for (int u = 0; u < n; u++) {
        fc_unit_stages st = fc_rule_stages(m, u);
        first[u] = st.first_fwd;
        last_neg[u] =
            st.last_fwd < 0 ? -1 : m->n_stages - st.last_fwd;  // backward's order: last forward use, descending
        fwd[u] = bwd[u] = -1;
    }
    int *fo = units_by(m, first), *bo = units_by(m, last_neg);
    // forward: unit i's opportunity is the first forward stage of unit i - D
    // (of unit 0 when i <= D), the first whose list of the next D names it
    for (int i = 1; i < n && fo[i] >= 0; i++) fwd[fo[i]] = first[fo[i > fwd_depth ? i - fwd_depth : 0]];
    // backward: the stage where backward reaches unit i - D (its last forward stage)
    for (int i = 1; i < n && bo[i] >= 0; i++)
        bwd[bo[i]] = m->n_stages - last_neg[bo[i > bwd_depth ? i - bwd_depth : 0]];
    free(fo);
    free(bo);
    free(first);
    free(last_neg);
}

int fc_rule_prefetch_allowed(const fc_run_config *cfg, int alive) {
    if (!cfg->limit_all_gathers) return 1;
    return alive + 1 <= 2;  // the prefetched unit would be one more gathered
}

static int v2(int x) {  // the exponent of 2 in x > 0
    int a = 0;
    for (; x % 2 == 0; x /= 2) a++;
    return a;
}

static int ceil_log4(int x) {  // the smallest c with 4^c >= x
    int c = 0;
    for (long p = 1; p < x; p *= 4) c++;
    return c;
}

void fc_rule_divide(fc_divide d, double F, double *pre, double *post) {
    if (d == FC_DIVIDE_AVG) {
        *pre = F, *post = 1;
    } else if (d == FC_DIVIDE_SUM_THEN_DIVIDE) {
        *pre = 1, *post = F;
    } else if (F != (int)F || F < 1) {  // a fractional factor: 1 divides it, 2 does not
        *pre = 1, *post = F;
    } else {
        int W = (int)F, k = v2(W) + 1 < ceil_log4(W) ? v2(W) + 1 : ceil_log4(W);
        *pre = (double)(1 << k);
        *post = W / *pre;
    }
}

void fc_rule_samples(const fc_run_config *cfg, int W, int rank, int *first, int *count) {
    *count = cfg->global_batch / W;
    *first = rank * (cfg->global_batch / W);
}

// ---------------------------------------------------------------------------
// the two writings side by side

#define DIFFER(what, fmt, core_v, rule_v)                                                                             \
    fc_findings_add(out, "rules: %s: core/layout.c says " fmt ", the oracle's rules (oracle/rules.c) say " fmt, what, \
                    core_v, rule_v)

static int groups_differ(const fc_groups *a, const fc_groups *b) {
    return a->W != b->W || a->rank != b->rank || a->sharded != b->sharded || a->hybrid != b->hybrid || a->F != b->F ||
           a->R != b->R || a->shard_rank != b->shard_rank || a->replica != b->replica || a->G != b->G ||
           a->idx != b->idx || a->PF != b->PF || a->pf_rank != b->pf_rank;
}

// The whole table, whatever this case's strategy: a rule wrong for one
// strategy can also keep that strategy out of the sweep (the draw redraws
// what the config validator, which asks core/layout.c, refuses).
static void disagree_table(fc_findings *out) {
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        const fc_rule_row *row = &ROWS[i];
        const char *rname = fc_strategy_name(row->strategy);
        if (fc_strategy_sharded(row->strategy) != row->gathers)
            DIFFER(rname, "gathers=%d", fc_strategy_sharded(row->strategy), row->gathers);
        if (fc_strategy_hybrid(row->strategy) != row->hybrid)
            DIFFER(rname, "hybrid=%d", fc_strategy_hybrid(row->strategy), row->hybrid);
        if (fc_strategy_reshards(row->strategy) != row->frees_after_fwd)
            DIFFER(rname, "frees after forward=%d", fc_strategy_reshards(row->strategy), row->frees_after_fwd);
    }
}

// What every rank stores of unit u's frozen parameters, both layouts, over
// every shard group of 1..8 ranks, not only this case's (a pure function: the
// padding of a frozen FlatParameter appears only where its unit does not
// divide evenly).
static void disagree_frozen(const fc_run_config *cfg, const fc_model *m, int u, const char *what, fc_findings *out) {
    fc_run_config sc = *cfg;
    sc.strategy = FC_STRATEGY_FULL_SHARD, sc.shard_group = 0, sc.reshard_after_forward = 0;
    for (int G = 1; G <= 8 && m->n_frozen; G++)
        for (int r = 0; r < G; r++) {
            fc_groups gcr = fc_groups_of(&sc, G, r), grr = fc_rule_groups(&sc, G, r);
            for (int k = 0; k < FC_LAYOUT_COUNT; k++) {
                size_t fc = fc_unit_frozen_store(fc_layout_of((fc_layout_kind)k), m, u, &gcr),
                       fr = fc_rule_frozen_store(m, u, &grr, k == FC_LAYOUT_PER_PARAM, 1);
                if (fc != fr && k == FC_LAYOUT_PER_PARAM)
                    DIFFER(what, "FSDP2 frozen store of %zu elements (some G <= 8, rank)", fc, fr);
                if (fc != fr && k == FC_LAYOUT_FLAT)
                    DIFFER(what, "FSDP1 frozen store of %zu elements (some G <= 8, rank)", fc, fr);
            }
        }
}

// Unit u's layout (flat, FSDP2's rows, frozen stores, its chunk) under this
// case's groups: core/layout.c's gc, the rules' gr.
static void disagree_layout(const fc_run_config *cfg, const fc_model *m, int u, const fc_groups *gc,
                            const fc_groups *gr, fc_findings *out) {
    char what[96];
    snprintf(what, sizeof what, "unit %d (%zu elements) over G=%d, chunk %d", u, m->units[u].numel, gr->G, gr->idx);
    fc_unit_layout lc = fc_unit_layout_of(m->units[u].numel, gr), lr = fc_rule_layout(m->units[u].numel, gr);
    if (lc.shard != lr.shard || lc.padded != lr.padded || lc.own_off != lr.own_off || lc.own_valid != lr.own_valid ||
        lc.store != lr.store)
        fc_findings_add(out,
                        "rules: layout of %s: core/layout.c says S=%zu P=%zu offset %zu valid %zu store %zu, the "
                        "oracle's rules (oracle/rules.c) say S=%zu P=%zu offset %zu valid %zu store %zu",
                        what, lc.shard, lc.padded, lc.own_off, lc.own_valid, lc.store, lr.shard, lr.padded, lr.own_off,
                        lr.own_valid, lr.store);
    if (cfg->fsdp_version == 2 && gr->sharded) {  // FSDP2: every rank's chunk is its padded rows
        size_t sc = fc_unit_layout_in(fc_layout_of(FC_LAYOUT_PER_PARAM), m, u, gc).shard,
               sr = fc_rule_fsdp2_shard(m, u, gr->F);
        if (sc != sr) DIFFER(what, "FSDP2 chunk of %zu elements", sc, sr);
    }
    disagree_frozen(cfg, m, u, what, out);
    size_t first = 0, count = 0;
    fc_flat_chunk(m->units[u].numel, gr->G, gr->idx, &first, &count);
    if (first != lr.own_off || count != lr.own_valid) DIFFER(what, "chunk at %zu", first, lr.own_off);
}

// Unit u's stages (core/layout.c's are st), and what the strategy does to it.
static void disagree_unit(const fc_run_config *cfg, const fc_model *m, int u, const fc_unit_stages *st,
                          fc_findings *out) {
    char what[96];
    fc_unit_stages sr = fc_rule_stages(m, u);
    snprintf(what, sizeof what, "stages of unit %d", u);
    if (st->first_fwd != sr.first_fwd || st->last_fwd != sr.last_fwd || st->first_bwd != sr.first_bwd ||
        st->last_bwd != sr.last_bwd)
        fc_findings_add(out,
                        "rules: %s: core/layout.c says forward %d..%d backward %d..%d, the oracle's rules "
                        "(oracle/rules.c) say forward %d..%d backward %d..%d",
                        what, st->first_fwd, st->last_fwd, st->first_bwd, st->last_bwd, sr.first_fwd, sr.last_fwd,
                        sr.first_bwd, sr.last_bwd);
    snprintf(what, sizeof what, "unit %d under %s", u, fc_strategy_name(cfg->strategy));
    if (fc_reshard_after_forward(cfg->strategy, m, u) != fc_rule_frees_after_forward(cfg->strategy, m, u))
        DIFFER(what, "freed after forward=%d", fc_reshard_after_forward(cfg->strategy, m, u),
               fc_rule_frees_after_forward(cfg->strategy, m, u));
    if (fc_unit_checkpointed(cfg, m, u) != fc_rule_checkpointed(cfg, m, u))
        DIFFER(what, "checkpointed=%d", fc_unit_checkpointed(cfg, m, u), fc_rule_checkpointed(cfg, m, u));
    if (fc_recompute_gathers(cfg, m, u) != fc_rule_recompute_gathers(cfg, m, u))
        DIFFER(what, "recompute gathers=%d", fc_recompute_gathers(cfg, m, u), fc_rule_recompute_gathers(cfg, m, u));
}

// core/layout.c's prefetch lists: the stage whose list first names each unit
// (lists at a unit's first stage of the pass; a unit already in flight is
// skipped), into first[nu] (-1: none).
static void core_list_stages(const fc_model *m, const fc_unit_stages *st, int forward, int depth, int *first) {
    int *list = mallocCheck((size_t)m->n_units * sizeof *list);
    for (int u = 0; u < m->n_units; u++) first[u] = -1;
    for (int i = 0; i < m->n_stages; i++) {
        int s = forward ? i : m->n_stages - 1 - i;
        if ((forward ? st[m->stages[s].unit].first_fwd : st[m->stages[s].unit].first_bwd) != s) continue;
        int k = fc_prefetch_units(m, st, s, forward, depth > 1 ? depth : 1, list);
        for (int j = 0; j < k; j++)
            if (first[list[j]] < 0) first[list[j]] = s;
    }
    free(list);
}

// Prefetch: core/layout.c's lists against the rules' opportunities; the limiter.
static void disagree_prefetch(const fc_run_config *cfg, const fc_model *m, const fc_unit_stages *st,
                              fc_findings *out) {
    int nu = m->n_units;
    int *fo = mallocCheck((size_t)nu * sizeof *fo), *bo = mallocCheck((size_t)nu * sizeof *bo);
    int *core_fo = mallocCheck((size_t)nu * sizeof *core_fo), *core_bo = mallocCheck((size_t)nu * sizeof *core_bo);
    fc_rule_opportunities(m, fc_rule_prefetch_depth(cfg, 1), fc_rule_prefetch_depth(cfg, 0), fo, bo);
    core_list_stages(m, st, 1, fc_forward_prefetch_count(cfg), core_fo);
    core_list_stages(m, st, 0, fc_backward_prefetch_count(cfg), core_bo);
    char what[96];
    for (int u = 0; u < nu; u++) {
        snprintf(what, sizeof what, "forward prefetch of unit %d (lists of %d)", u, fc_rule_prefetch_depth(cfg, 1));
        if (core_fo[u] != fo[u]) DIFFER(what, "at stage %d", core_fo[u], fo[u]);
        snprintf(what, sizeof what, "backward prefetch of unit %d (lists of %d)", u, fc_rule_prefetch_depth(cfg, 0));
        if (core_bo[u] != bo[u]) DIFFER(what, "at stage %d", core_bo[u], bo[u]);
    }
    free(fo);
    free(bo);
    free(core_fo);
    free(core_bo);
    for (int alive = 0; alive <= 3; alive++)
        if (fc_limiter_allows_prefetch(cfg, alive) != fc_rule_prefetch_allowed(cfg, alive)) {
            snprintf(what, sizeof what, "limit_all_gathers=%d with %d unit(s) gathered", cfg->limit_all_gathers, alive);
            DIFFER(what, "prefetch allowed=%d", fc_limiter_allows_prefetch(cfg, alive),
                   fc_rule_prefetch_allowed(cfg, alive));
        }
}

// The divide factors of every mode: the run's factor (W, or FSDP2's
// set_gradient_divide_factor), and one set to 2W + 1 as another run of this
// config could set it.
static void disagree_divide(const fc_run_config *cfg, int W, fc_findings *out) {
    char what[96];
    fc_run_config fcfg = *cfg;
    if (!(fcfg.gradient_divide_factor > 0)) fcfg.gradient_divide_factor = 2.0 * W + 1;
    for (int k = 0; k < 6; k++) {
        const fc_run_config *c = k < 3 ? cfg : &fcfg;
        int d = k % 3;
        double pc, qc, pr, qr;
        double F = c->gradient_divide_factor > 0 ? c->gradient_divide_factor : W;
        if (fc_divide_by(c, W) != F) {
            snprintf(what, sizeof what, "the divide factor (set: %g) at W=%d", c->gradient_divide_factor, W);
            DIFFER(what, "%g", fc_divide_by(c, W), F);
        }
        fc_divide_factors((fc_divide)d, fc_divide_by(c, W), &pc, &qc);
        fc_rule_divide((fc_divide)d, F, &pr, &qr);
        if (pc != pr || qc != qr) {
            snprintf(what, sizeof what, "divide %s by %g at W=%d", fc_divide_name((fc_divide)d), F, W);
            fc_findings_add(out,
                            "rules: %s: core/layout.c says pre %g post %g, the oracle's rules (oracle/rules.c) say "
                            "pre %g post %g",
                            what, pc, qc, pr, qr);
        }
    }
}

int fc_rules_disagree(const fc_run_config *cfg, int W, int rank, fc_findings *out) {
    int before = out->n;
    disagree_table(out);
    fc_groups gc = fc_groups_of(cfg, W, rank), gr = fc_rule_groups(cfg, W, rank);
    if (groups_differ(&gc, &gr))
        fc_findings_add(out,
                        "rules: groups of %s at W=%d rank %d: core/layout.c says F=%d R=%d G=%d idx=%d shard_rank=%d "
                        "replica=%d, the oracle's rules (oracle/rules.c) say F=%d R=%d G=%d idx=%d shard_rank=%d "
                        "replica=%d",
                        fc_strategy_name(cfg->strategy), W, rank, gc.F, gc.R, gc.G, gc.idx, gc.shard_rank, gc.replica,
                        gr.F, gr.R, gr.G, gr.idx, gr.shard_rank, gr.replica);
    fc_model m;
    fc_model_build_run(&m, cfg);
    fc_unit_stages *st = mallocCheck((size_t)m.n_units * sizeof *st);
    for (int u = 0; u < m.n_units; u++) st[u] = fc_unit_stages_of(&m, u);
    for (int u = 0; u < m.n_units; u++) {
        disagree_layout(cfg, &m, u, &gc, &gr, out);
        disagree_unit(cfg, &m, u, &st[u], out);
    }
    disagree_prefetch(cfg, &m, st, out);
    disagree_divide(cfg, W, out);
    int fc0, cc, fr, cr;
    fc_rank_samples(cfg, W, rank, &fc0, &cc);
    fc_rule_samples(cfg, W, rank, &fr, &cr);
    if (fc0 != fr || cc != cr) {
        char what[96];
        snprintf(what, sizeof what, "samples of rank %d of %d (global batch %d)", rank, W, cfg->global_batch);
        DIFFER(what, "first %d", fc0, fr);
    }
    free(st);
    fc_model_free(&m);
    return out->n - before;
}
