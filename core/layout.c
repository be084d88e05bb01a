// core/layout.c — see layout.h.
#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int fc_strategy_sharded(fc_strategy s) { return s != FC_STRATEGY_LOCAL && s != FC_STRATEGY_NO_SHARD; }

int fc_strategy_hybrid(fc_strategy s) {
    return s == FC_STRATEGY_HYBRID_SHARD || s == FC_STRATEGY_HYBRID_SHARD_ZERO2;
}

int fc_strategy_reshards(fc_strategy s) { return s == FC_STRATEGY_FULL_SHARD || s == FC_STRATEGY_HYBRID_SHARD; }

fc_groups fc_groups_of(const fc_run_config *cfg, int W, int rank) {
    fc_groups g;
    g.W = W;
    g.rank = rank;
    g.sharded = fc_strategy_sharded(cfg->strategy);
    g.hybrid = fc_strategy_hybrid(cfg->strategy);
    g.F = !g.sharded ? 1 : g.hybrid && cfg->shard_group ? cfg->shard_group : W;
    g.R = W / g.F;
    g.shard_rank = rank % g.F;
    g.replica = rank / g.F;
    g.G = g.sharded ? g.F : W;
    g.idx = g.sharded ? g.shard_rank : rank;
    // torch's post-forward mesh, mesh.view(-1, R): rows of R consecutive ranks
    g.PF = g.sharded && cfg->fsdp_version == 2 ? cfg->reshard_after_forward : 0;
    g.pf_rank = g.PF ? rank % g.PF : 0;
    return g;
}

size_t fc_chunk_size(size_t n, int G) { return (n + (size_t)G - 1) / (size_t)G; }

void fc_flat_chunk(size_t n, int G, int j, size_t *first, size_t *count) {
    size_t S = fc_chunk_size(n, G), a = (size_t)j * S;
    *first = a;
    *count = a >= n ? 0 : (n - a < S ? n - a : S);
}

fc_unit_layout fc_unit_layout_of(size_t numel, const fc_groups *g) {
    fc_unit_layout l;
    l.numel = numel;
    l.shard = fc_chunk_size(numel, g->G);
    l.padded = l.shard * (size_t)g->G;
    fc_flat_chunk(numel, g->G, g->idx, &l.own_off, &l.own_valid);
    l.store = g->sharded ? l.shard : numel;
    return l;
}

fc_unit_stages fc_unit_stages_of(const fc_model *m, int u) {
    fc_unit_stages st = {-1, -1, -1, -1};
    for (int s = 0; s < m->n_stages; s++) {
        if (m->stages[s].unit != u) continue;
        if (st.first_fwd < 0) st.first_fwd = s;
        st.last_fwd = s;
    }
    st.first_bwd = st.last_fwd;
    st.last_bwd = st.first_fwd;
    return st;
}

int fc_reshard_after_forward(fc_strategy s, const fc_model *m, int u) {
    return fc_strategy_reshards(s) && u != m->root_unit;
}

int fc_unit_checkpointed(const fc_run_config *c, const fc_model *m, int u) {
    return c->act_ckpt != FC_ACT_CKPT_NONE && u != m->root_unit;
}

int fc_recompute_gathers(const fc_run_config *c, const fc_model *m, int u) {
    return fc_unit_checkpointed(c, m, u) && c->act_ckpt == FC_ACT_CKPT_OUTSIDE && c->fsdp_version == 1 &&
           fc_reshard_after_forward(c->strategy, m, u);
}

int fc_next_forward_unit(const fc_model *m, const fc_unit_stages *stages, int s) {
    for (int t = s + 1; t < m->n_stages; t++) {
        int v = m->stages[t].unit;
        if (stages[v].first_fwd == t) return v;
    }
    return -1;
}

int fc_next_backward_unit(const fc_model *m, const fc_unit_stages *stages, int s) {
    for (int t = s - 1; t >= 0; t--) {
        int v = m->stages[t].unit;
        if (stages[v].first_bwd == t) return v;
    }
    return -1;
}

int fc_prefetch_units(const fc_model *m, const fc_unit_stages *stages, int s, int forward, int n, int *out) {
    int k = 0;
    for (int t = s; k < n;) {  // t: the stage where the last unit listed is first used
        int v = forward ? fc_next_forward_unit(m, stages, t) : fc_next_backward_unit(m, stages, t);
        if (v < 0) break;
        out[k++] = v;
        t = forward ? stages[v].first_fwd : stages[v].first_bwd;
    }
    return k;
}

int fc_forward_prefetch_count(const fc_run_config *cfg) { return cfg->forward_prefetch; }

int fc_backward_prefetch_count(const fc_run_config *cfg) {
    if (cfg->fsdp_version == 2) return cfg->backward_prefetch_depth > 1 ? cfg->backward_prefetch_depth : 1;
    return cfg->backward_prefetch != FC_PREFETCH_NONE;
}

fc_prefetch fc_backward_prefetch_of(const fc_run_config *cfg) {
    return cfg->fsdp_version == 2 ? FC_PREFETCH_PRE : cfg->backward_prefetch;
}

int fc_limiter_allows_prefetch(const fc_run_config *cfg, int alive) { return !cfg->limit_all_gathers || alive < 2; }

double fc_predivide_factor(double F) {
    // torch's loop on a float factor: `while factor % f == 0 and factor / f > f`
    double f = 1;
    while (fmod(F, f) == 0 && F / f > f) f *= 2;
    return f;
}

double fc_divide_by(const fc_run_config *cfg, int W) {
    return cfg->gradient_divide_factor > 0 ? cfg->gradient_divide_factor : (double)W;
}

void fc_divide_factors(fc_divide d, double F, double *pre, double *post) {
    switch (d) {
    case FC_DIVIDE_AVG:  // each rank divides by F, then the sum
        *pre = F, *post = 1.0;
        return;
    case FC_DIVIDE_SUM_THEN_DIVIDE:
        *pre = 1.0, *post = F;
        return;
    case FC_DIVIDE_PREPOST:
        break;
    }
    *pre = fc_predivide_factor(F);
    *post = F / *pre;
}

void fc_rank_samples(const fc_run_config *cfg, int W, int rank, int *first, int *count) {
    *count = cfg->global_batch / W;
    *first = rank * *count;
}

// ---------------------------------------------------------------------------
// the two layouts, one interface

extern const fc_layout_ops fc_layout_flat, fc_layout_per_param;

const fc_layout_ops *fc_layout_of(fc_layout_kind k) {
    return k == FC_LAYOUT_PER_PARAM ? &fc_layout_per_param : &fc_layout_flat;
}

fc_layout_kind fc_layout_kind_of(const fc_run_config *cfg) {
    return cfg->fsdp_version == 2 ? FC_LAYOUT_PER_PARAM : FC_LAYOUT_FLAT;
}

int fc_layout_max_pieces(const fc_model *m, int u) {
    int n = m->units[u].n_params;
    return n > 1 ? n : 1;
}

fc_unit_layout fc_unit_layout_in(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g) {
    fc_unit_layout l = fc_unit_layout_of(m->units[u].numel, g);
    if (lay->wire_is_natural || !g->sharded) return l;
    l.shard = l.store = lay->chunk_size(m, u, g->G);
    l.padded = l.shard * (size_t)g->G;
    fc_piece *pc = mallocCheck((size_t)fc_layout_max_pieces(m, u) * sizeof *pc);
    int n = lay->pieces(m, u, g->G, g->idx, pc);
    l.own_valid = 0;
    l.own_off = n ? pc[0].unit_off : 0;
    for (int k = 0; k < n; k++) l.own_valid += pc[k].count;
    free(pc);
    return l;
}

size_t fc_unit_frozen_store(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g) {
    if (!m->n_frozen) return 0;
    size_t N = m->units[u].numel;
    if (!g->sharded) return N - fc_model_trainable_in(m, u, 0, N);
    if (lay->wire_is_natural) {
        fc_unit_layout l = fc_unit_layout_of(N, g);
        return fc_unit_trains(m, u) ? l.own_valid - fc_model_trainable_in(m, u, l.own_off, l.own_valid) : l.store;
    }
    size_t n = 0;
    const fc_unit *un = &m->units[u];
    for (int i = 0; i < un->n_params; i++) {
        const fc_param *p = &m->params[m->unit_params[un->first_param + i]];
        size_t d0 = (size_t)p->shape[0];
        if (p->frozen) n += fc_chunk_size(d0, g->G) * (p->numel / d0);
    }
    return n;
}

int fc_unit_frozen_slots(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g, fc_piece *out) {
    const fc_unit *un = &m->units[u];
    int n = 0;
    if (!m->n_frozen) return 0;
    if (!g->sharded) {  // the whole unit in its natural order
        for (int k = 0; k < un->n_params; k++) {
            const fc_param *p = &m->params[m->unit_params[un->first_param + k]];
            if (p->frozen) out[n++] = (fc_piece){p->unit_offset, p->unit_offset, p->numel};
        }
        return n;
    }
    fc_piece *all = mallocCheck((size_t)(un->n_params ? un->n_params : 1) * sizeof *all);
    int k = lay->slots(m, u, g->G, g->idx, all);
    for (int i = 0; i < k; i++) {
        int frozen;
        fc_model_run_at(m, u, all[i].unit_off, 1, &frozen);
        if (frozen) out[n++] = all[i];
    }
    free(all);
    return n;
}

int fc_layout_wire_pieces(const fc_layout_ops *lay, const fc_model *m, int u, int G, fc_piece *out) {
    size_t S = lay->chunk_size(m, u, G);
    int n = 0;
    for (int j = 0; j < G; j++) {
        int k = lay->pieces(m, u, G, j, out + n);
        for (int q = n; q < n + k; q++) out[q].chunk_off += (size_t)j * S;
        n += k;
    }
    return n;
}

// natural <-> wire over every chunk's pieces; to the wire, padding is zeroed first
static void copy_pieces(const fc_layout_ops *lay, const fc_model *m, int u, int G, const float *src, float *dst,
                        int to_wire) {
    if (to_wire) memset(dst, 0, lay->chunk_size(m, u, G) * (size_t)G * sizeof *dst);
    fc_piece *pc = mallocCheck((size_t)G * (size_t)fc_layout_max_pieces(m, u) * sizeof *pc);
    int n = fc_layout_wire_pieces(lay, m, u, G, pc);
    for (int k = 0; k < n; k++) {
        size_t w = pc[k].chunk_off, x = pc[k].unit_off;
        memcpy(dst + (to_wire ? w : x), src + (to_wire ? x : w), pc[k].count * sizeof *dst);
    }
    free(pc);
}

void fc_layout_to_natural(const fc_layout_ops *lay, const fc_model *m, int u, int G, const float *wire,
                          float *natural) {
    copy_pieces(lay, m, u, G, wire, natural, 0);
}

void fc_layout_to_wire(const fc_layout_ops *lay, const fc_model *m, int u, int G, const float *natural,
                       float *wire) {
    copy_pieces(lay, m, u, G, natural, wire, 1);
}
