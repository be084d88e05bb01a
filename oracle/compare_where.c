// oracle/compare_where.c — where an element lives and how far apart two
// floats are: ULP distance and the ULP at a scale, the rank that owns a
// parameter element or a sample under a layout, and its description.
#include "compare.h"
#include "compare_model.h"

#include "layout.h"

#include <math.h>
#include <string.h>

// ---------------------------------------------------------------------------
// element metrics

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// Sign-magnitude -> two's-complement-like line: non-negative floats keep their
// bits, negative ones are mirrored below zero, so -0 and +0 both land on 0.
static int64_t ordered(float x) {
    uint32_t u = float_bits(x);
    return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}

uint64_t fc_ulp_distance(float a, float b) {
    int na = isnan(a), nb = isnan(b);
    if (na || nb) return na && nb ? 0 : UINT64_MAX;
    int64_t d = ordered(a) - ordered(b);
    return (uint64_t)(d < 0 ? -d : d);
}

double fc_ulp_at(double x) {
    if (!(x > 0) || isinf(x)) return x == 0 ? ldexp(1.0, -149) : INFINITY;
    int e;
    frexp(x, &e);  // x = f * 2^e, f in [0.5, 1): the binade's ULP is 2^(e - 1 - 23)
    return e - 24 < -149 ? ldexp(1.0, -149) : ldexp(1.0, e - 24);
}

// ---------------------------------------------------------------------------
// owners

fc_owner fc_cmp_param_owner(const fc_model *m, const fc_run_config *cfg, int world, int param, size_t index) {
    fc_owner o;
    memset(&o, 0, sizeof o);
    o.world = world;
    o.sample = o.micro_batch = -1;
    if (param < 0 || param >= m->n_params || world < 1) return o;
    const fc_param *p = &m->params[param];
    o.unit = p->unit;
    o.unit_numel = m->units[p->unit].numel;
    o.unit_offset = p->unit_offset + index;
    if (!fc_strategy_sharded(cfg->strategy)) {
        o.kind = FC_OWNER_REPLICATED;
        return o;
    }
    fc_groups g = fc_groups_of(cfg, world, 0);
    if (g.F < 1 || world % g.F != 0) return o;  // not a valid layout: no owner to name
    // docs/contract.md §5 (core/layout.h): rank j of a shard group holds chunk j of the
    // unit, in the run's layout (FSDP1's flat chunks, FSDP2's rows)
    const fc_layout_ops *lay = fc_layout_of(fc_layout_kind_of(cfg));
    o.kind = FC_OWNER_SHARD;
    o.group_size = g.F;
    o.n_groups = g.R;
    o.shard_size = lay->chunk_size(m, p->unit, g.G);
    o.shard = lay->owner(m, p->unit, g.G, o.unit_offset);
    o.rank = o.shard;  // shard groups are consecutive ranks: group g is ranks g*F .. g*F+F-1
    return o;
}

fc_owner fc_cmp_batch_owner(const fc_run_config *cfg, int world, int sample) {
    fc_owner o;
    memset(&o, 0, sizeof o);
    o.world = world;
    o.micro_batch = -1;
    o.sample = sample;
    if (world < 1 || cfg->global_batch % world != 0) return o;
    // every rank is a data-parallel rank; rank r reads samples [r*B/W, (r+1)*B/W)
    o.kind = FC_OWNER_DATA;
    o.per_rank = cfg->global_batch / world;
    o.rank = sample / o.per_rank;
    if (cfg->grad_accum > 1 && o.per_rank % cfg->grad_accum == 0)
        o.micro_batch = (sample % o.per_rank) / (o.per_rank / cfg->grad_accum);
    return o;
}

static const char *unit_label(const fc_model *m, int u, char *buf, size_t cap) {
    if (u < 0 || u >= m->n_units) snprintf(buf, cap, "?");
    else if (!m->units[u].name[0]) snprintf(buf, cap, "the root unit");
    else snprintf(buf, cap, "unit %s", m->units[u].name);
    return buf;
}

void fc_owner_format(const fc_owner *o, const fc_model *m, const fc_run_config *cfg, char *buf, size_t cap) {
    const char *strategy = fc_strategy_name(cfg->strategy);
    char unit[96];
    switch (o->kind) {
    case FC_OWNER_NONE:
        if (o->sample >= 0) snprintf(buf, cap, "unknown (sample %d; no valid data layout)", o->sample);
        else snprintf(buf, cap, "no single rank (a global value, the same on every rank)");
        return;
    case FC_OWNER_REPLICATED:
        snprintf(buf, cap, "every rank (replicated: %s holds full parameters on all %d rank%s; %s, element %zu of %zu)",
                 strategy, o->world, o->world == 1 ? "" : "s", unit_label(m, o->unit, unit, sizeof unit),
                 o->unit_offset, o->unit_numel);
        return;
    case FC_OWNER_SHARD: {
        size_t k = (size_t)snprintf(buf, cap, "rank %d (%s shard %d of %d", o->rank, strategy, o->shard, o->group_size);
        if (o->n_groups > 1 && k < cap) {
            k += (size_t)snprintf(buf + k, cap - k, " of shard group 0, replicated on rank%s",
                                  o->n_groups > 2 ? "s" : "");
            for (int g = 1; g < o->n_groups && k < cap; g++) {
                if (g > 4) {  // a long list says nothing more than its pattern
                    int last = o->shard + (o->n_groups - 1) * o->group_size;
                    k += (size_t)snprintf(buf + k, cap - k, " ... %d (every %d-th)", last, o->group_size);
                    break;
                }
                k += (size_t)snprintf(buf + k, cap - k, "%s %d", g > 1 ? "," : "", o->shard + g * o->group_size);
            }
        }
        if (k < cap)
            snprintf(buf + k, cap - k, "; %s, element %zu of %zu, shard size %zu)",
                     unit_label(m, o->unit, unit, sizeof unit), o->unit_offset, o->unit_numel, o->shard_size);
        return;
    }
    case FC_OWNER_DATA: {
        size_t k = (size_t)snprintf(buf, cap, "rank %d (reads sample %d of the global batch: %d sample%s per rank",
                                    o->rank, o->sample, o->per_rank, o->per_rank == 1 ? "" : "s");
        if (o->micro_batch >= 0 && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, ", micro-batch %d of %d", o->micro_batch, cfg->grad_accum);
        if (k < cap) snprintf(buf + k, cap - k, ")");
        return;
    }
    }
}
