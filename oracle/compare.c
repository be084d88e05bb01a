// oracle/compare.c — the comparison engine (see compare.h); the `fsdpcheck
// compare` command that reads two traces through it is compare_cmd.c.
#include "compare.h"

#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------
// the tolerance policy
//
// Defaults per precision and kind. An element b passes against the expected a
// when |a - b| <= atol + rtol * |a|. Every row starts from PyTorch's
// torch.testing.assert_close defaults for its dtype (fp32 1.3e-6 / 1e-5, bf16
// 1.6e-2 / 1e-5, fp16 1e-3 / 1e-5); a comparison's precision is the least
// precise param_dtype / reduce_dtype of the two runs (fc_cmp_precision). The
// batch is the data itself and is always compared bit for bit: a mismatch there
// means the two runs trained on different samples.
//
//   kind   fp32 rtol / atol    bf16 rtol / atol    fp16 rtol / atol
//   batch  exact               exact               exact
//   loss   1.3e-6 / 1e-5       1.6e-2 / 1e-5       1e-3 / 1e-5
//   grad   1.3e-6 / 1e-5       1.6e-2 / 4e-3 (w)   1e-3 / 1e-3 (w)
//   param  1.3e-6 / 1e-5       1.6e-2 / 5e-3 (w)   1e-3 / 5e-3 (w)
//   optim  1.3e-6 / 1e-5       1.6e-2 / 5e-4 (w)   1e-3 / 2e-4 (w)
//
// (w) = widened from assert_close's atol 1e-5, with the measurement that made
// it necessary. Measured on the reference: no_shard W=1 against full_shard W=2
// and hybrid_shard(2) W=4 (a different rounding order of the same math, as a
// port has), mlp-tiny and gpt2-tiny, seeds 1234/7/3, param/reduce bf16/bf16,
// bf16/fp32 and fp16/fp16, 3-6 AdamW or SGD steps, with grad accumulation and
// clipping; the atol each needed on top of the dtype's rtol:
//   bf16: grad 9.1e-4, param 2.0e-3, optim 1.5e-4, loss 0
//   fp16: grad 2.4e-4, param 1.1e-3, optim 3.9e-5, loss 0
//   fp32: grad 3.1e-8, param 3.7e-7, optim 6.8e-9, loss 0 (so fp32 stays at 1e-5)
// Gradients near zero differ by a rounding of the largest terms that summed
// to them (bf16 epsilon 2^-8 of |g| ~ 0.2), which no rtol covers. Parameters:
// AdamW's m / sqrt(v) turns a rounding-level difference in a near-zero
// gradient into a flip of a +-lr update, so the worst element is ~2 lr
// (lr 1e-3 here): a run with a larger lr or many more steps needs --atol.
// The defaults keep a 2.5-5x margin over these figures.
#define EXACT {0, 0, 1}
#define TOL(r, a) {r, a, 0}
const fc_tol FC_CMP_DEFAULTS[3][FC_CMP_KIND_COUNT] = {
    [FC_PREC_FP32] = {[FC_CMP_BATCH] = EXACT, [FC_CMP_LOSS] = TOL(1.3e-6, 1e-5), [FC_CMP_GRAD] = TOL(1.3e-6, 1e-5),
                      [FC_CMP_PARAM] = TOL(1.3e-6, 1e-5), [FC_CMP_OPTIM] = TOL(1.3e-6, 1e-5)},
    [FC_PREC_BF16] = {[FC_CMP_BATCH] = EXACT, [FC_CMP_LOSS] = TOL(1.6e-2, 1e-5), [FC_CMP_GRAD] = TOL(1.6e-2, 4e-3),
                      [FC_CMP_PARAM] = TOL(1.6e-2, 5e-3), [FC_CMP_OPTIM] = TOL(1.6e-2, 5e-4)},
    [FC_PREC_FP16] = {[FC_CMP_BATCH] = EXACT, [FC_CMP_LOSS] = TOL(1e-3, 1e-5), [FC_CMP_GRAD] = TOL(1e-3, 1e-3),
                      [FC_CMP_PARAM] = TOL(1e-3, 5e-3), [FC_CMP_OPTIM] = TOL(1e-3, 2e-4)},
};

static const char *KIND_NAMES[FC_CMP_KIND_COUNT] = {"batch", "loss", "grad", "param", "optim"};

const char *fc_cmp_kind_name(fc_cmp_kind k) { return k < FC_CMP_KIND_COUNT ? KIND_NAMES[k] : "?"; }

// How loose a precision is: fp32 < fp16 (11-bit significand) < bf16 (8-bit).
static int looseness(fc_prec p) { return p == FC_PREC_BF16 ? 2 : p == FC_PREC_FP16 ? 1 : 0; }

fc_prec fc_cmp_precision(const fc_run_config *a, const fc_run_config *b) {
    fc_prec all[4] = {a->param_dtype, a->reduce_dtype, b->param_dtype, b->reduce_dtype}, p = FC_PREC_FP32;
    for (int i = 0; i < 4; i++)
        if (looseness(all[i]) > looseness(p)) p = all[i];
    return p;
}

void fc_cmp_policy_defaults(fc_cmp_policy *p, fc_prec prec) {
    memset(p, 0, sizeof *p);
    p->prec = prec;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = FC_CMP_DEFAULTS[prec][k];
}

void fc_cmp_policy_override(fc_cmp_policy *p, int has_rtol, double rtol, int has_atol, double atol) {
    if (!has_rtol && !has_atol) return;
    p->overridden = 1;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        if (p->tol[k].exact) continue;  // the batch stays exact: it is data, not arithmetic
        if (has_rtol) p->tol[k].rtol = rtol;
        if (has_atol) p->tol[k].atol = atol;
    }
}

void fc_cmp_policy_bitwise(fc_cmp_policy *p) {
    p->bitwise = 1;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = (fc_tol)EXACT;
}

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

int fc_cmp_close(float a, float b, const fc_tol *t) {
    if (t->exact) return float_bits(a) == float_bits(b);
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs((double)a - (double)b) <= t->atol + t->rtol * fabs((double)a);
}

double fc_cmp_abs_err(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0.0 : INFINITY;
    if (isinf(a) || isinf(b)) return a == b ? 0.0 : INFINITY;
    return fabs((double)a - (double)b);
}

double fc_cmp_rel_err(float a, float b) {
    double d = fc_cmp_abs_err(a, b);
    if (d == 0) return 0;
    if (isinf(d) || a == 0) return INFINITY;
    return d / fabs((double)a);
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
    // DESIGN §5 (core/layout.h): rank j of a shard group owns chunk j of the unit
    fc_unit_layout l = fc_unit_layout_of(o.unit_numel, &g);
    o.kind = FC_OWNER_SHARD;
    o.group_size = g.F;
    o.n_groups = g.R;
    o.shard_size = l.shard;
    o.shard = (int)(o.unit_offset / o.shard_size);
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

// ---------------------------------------------------------------------------
// results

void fc_cmp_result_init(fc_cmp_result *r, long step) {
    memset(r, 0, sizeof *r);
    r->step = step;
    r->pass = 1;
}

void fc_cmp_result_free(fc_cmp_result *r) {
    free(r->tensors);
    memset(r, 0, sizeof *r);
}

static fc_cmp_tensor *new_tensor(fc_cmp_result *r, fc_cmp_kind kind, const char *name, size_t numel) {
    if (r->n_tensors == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->tensors = reallocCheck(r->tensors, (size_t)r->cap * sizeof *r->tensors);
    }
    fc_cmp_tensor *t = &r->tensors[r->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->numel = numel;
    return t;
}

static void finish_tensor(fc_cmp_result *r, const fc_cmp_tensor *t) {
    fc_cmp_kind_stats *k = &r->kinds[t->kind];
    k->n_tensors++;
    if (t->max_abs > k->max_abs) k->max_abs = t->max_abs;
    if (t->max_rel > k->max_rel) k->max_rel = t->max_rel;
    if (t->max_ulp > k->max_ulp) k->max_ulp = t->max_ulp;
    if (!t->pass) {
        k->n_failed++;
        r->pass = 0;
    }
}

// A tensor that cannot be compared element by element (a shape mismatch, a
// state only one side has): it fails, and `note` says why.
static void fail_note(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name, const char *note) {
    fc_cmp_tensor *t = new_tensor(r, kind, name, 0);
    snprintf(t->note, sizeof t->note, "%s", note);
    t->max_abs = t->max_rel = INFINITY;
    t->max_ulp = UINT64_MAX;
    t->pass = 0;
    finish_tensor(r, t);
    if (r->first.found) return;
    fc_cmp_divergence *d = &r->first;
    memset(d, 0, sizeof *d);
    d->found = 1;
    d->step = r->step;
    d->kind = kind;
    d->index = -1;
    d->tol = c->policy->tol[kind];
    snprintf(d->tensor, sizeof d->tensor, "%s", name);
    snprintf(d->note, sizeof d->note, "%s", note);
}

// What a divergence needs to know about where its element lives.
typedef struct {
    int ndim;
    long long shape[2];
    int param;         // registry index for a parameter-shaped tensor, else -1
    int batch_row;     // elements per sample for a batch tensor, else 0
    const char *note;  // added to the divergence (e.g. "different data")
} where_info;

static void set_divergence(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name,
                           const where_info *w, size_t i, int is_float, double a, double b, uint32_t abits,
                           uint32_t bbits, double abs_err, double rel_err, uint64_t ulp) {
    fc_cmp_divergence *d = &r->first;
    memset(d, 0, sizeof *d);
    d->found = 1;
    d->step = r->step;
    d->kind = kind;
    snprintf(d->tensor, sizeof d->tensor, "%s", name);
    d->index = (long long)i;
    d->ndim = w->ndim;
    d->shape[0] = w->shape[0];
    d->shape[1] = w->shape[1];
    if (w->ndim == 2) {
        d->multi[0] = (long long)i / w->shape[1];
        d->multi[1] = (long long)i % w->shape[1];
    } else if (w->ndim == 1) {
        d->multi[0] = (long long)i;
    }
    d->is_float = is_float;
    d->a = a;
    d->b = b;
    d->a_bits = abits;
    d->b_bits = bbits;
    d->abs_err = abs_err;
    d->rel_err = rel_err;
    d->ulp = ulp;
    d->tol = c->policy->tol[kind];
    if (w->param >= 0) d->owner = fc_cmp_param_owner(c->m, c->layout, c->world, w->param, i);
    else if (w->batch_row > 0) d->owner = fc_cmp_batch_owner(c->layout, c->world, (int)(i / (size_t)w->batch_row));
    else {
        memset(&d->owner, 0, sizeof d->owner);
        d->owner.sample = d->owner.micro_batch = -1;
    }
    fc_owner_format(&d->owner, c->m, c->layout, d->owner_text, sizeof d->owner_text);
    if (w->note) snprintf(d->note, sizeof d->note, "%s", w->note);
}

// One element's errors into t's maxima; a bad element counts, and the first
// bad one is remembered for the divergence.
static void tally(fc_cmp_tensor *t, size_t i, double abs_err, double rel_err, uint64_t ulp, int bad,
                  size_t *first_bad) {
    if (abs_err > t->max_abs) t->max_abs = abs_err;
    if (rel_err > t->max_rel) t->max_rel = rel_err;
    if (ulp > t->max_ulp) t->max_ulp = ulp;
    if (bad) {
        t->n_bad++;
        if (*first_bad == SIZE_MAX) *first_bad = i;
    }
}

// Finishes t; says whether its first bad element is the comparison's first
// divergence (none was found before).
static int close_tensor(fc_cmp_result *r, fc_cmp_tensor *t, size_t first_bad) {
    t->pass = t->n_bad == 0;
    finish_tensor(r, t);
    return first_bad != SIZE_MAX && !r->first.found;
}

static void cmp_floats(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name,
                       const where_info *w, const float *a, const float *b, size_t n) {
    const fc_tol *tol = &c->policy->tol[kind];
    fc_cmp_tensor *t = new_tensor(r, kind, name, n);
    size_t first_bad = SIZE_MAX;
    for (size_t i = 0; i < n; i++)
        tally(t, i, fc_cmp_abs_err(a[i], b[i]), fc_cmp_rel_err(a[i], b[i]), fc_ulp_distance(a[i], b[i]),
              !fc_cmp_close(a[i], b[i], tol), &first_bad);
    if (close_tensor(r, t, first_bad)) {
        size_t i = first_bad;
        set_divergence(c, r, kind, name, w, i, 1, a[i], b[i], float_bits(a[i]), float_bits(b[i]),
                       fc_cmp_abs_err(a[i], b[i]), fc_cmp_rel_err(a[i], b[i]), fc_ulp_distance(a[i], b[i]));
    }
}

// Token ids and class ids: exact, with the integer distance as "ULP".
static void cmp_ints(const fc_cmp_ctx *c, fc_cmp_result *r, const char *name, const where_info *w,
                     const int32_t *a, const int32_t *b, size_t n) {
    fc_cmp_tensor *t = new_tensor(r, FC_CMP_BATCH, name, n);
    size_t first_bad = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i]) continue;
        double d = fabs((double)a[i] - (double)b[i]), rel = a[i] ? d / fabs((double)a[i]) : INFINITY;
        tally(t, i, d, rel, (uint64_t)d, 1, &first_bad);
    }
    if (close_tensor(r, t, first_bad)) {
        size_t i = first_bad;
        double d = fabs((double)a[i] - (double)b[i]);
        set_divergence(c, r, FC_CMP_BATCH, name, w, i, 0, a[i], b[i], (uint32_t)a[i], (uint32_t)b[i], d,
                       a[i] ? d / fabs((double)a[i]) : INFINITY, (uint64_t)d);
    }
}

#define DIFFERENT_DATA "the runs trained on different data"

static void cmp_batch(const fc_cmp_ctx *c, fc_cmp_result *r, const fc_batch *a, const fc_batch *b) {
    int gpt2 = a->kind == FC_MODEL_GPT2;
    int in_cols = gpt2 ? a->T : a->in_dim;
    if (a->kind != b->kind || a->B != b->B || a->T != b->T || a->in_dim != b->in_dim) {
        char note[200];
        snprintf(note, sizeof note, "batch shapes differ: A [%d, %d], B [%d, %d] (%s)", a->B, in_cols, b->B,
                 gpt2 ? b->T : b->in_dim, DIFFERENT_DATA);
        fail_note(c, r, FC_CMP_BATCH, "batch.input", note);
        fail_note(c, r, FC_CMP_BATCH, "batch.target", note);
        return;
    }
    where_info w = {2, {a->B, in_cols}, -1, in_cols, DIFFERENT_DATA};
    size_t n = (size_t)a->B * (size_t)in_cols;
    // mlp features are floats, but still data: the batch tolerance is exact
    if (gpt2) cmp_ints(c, r, "batch.input", &w, a->input, b->input, n);
    else cmp_floats(c, r, FC_CMP_BATCH, "batch.input", &w, a->features, b->features, n);
    where_info wt = {gpt2 ? 2 : 1, {a->B, gpt2 ? a->T : 0}, -1, gpt2 ? a->T : 1, DIFFERENT_DATA};
    cmp_ints(c, r, "batch.target", &wt, a->target, b->target, gpt2 ? n : (size_t)a->B);
}

static void cmp_set(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *prefix, const float *a,
                    const float *b) {
    const fc_model *m = c->m;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        char name[200];
        snprintf(name, sizeof name, "%s.%s", prefix, p->name);
        where_info w = {p->ndim, {p->shape[0], p->shape[1]}, i, 0, NULL};
        cmp_floats(c, r, kind, name, &w, a + p->offset, b + p->offset, p->numel);
    }
}

int fc_cmp_find_state(const fc_trace_step *s, const char *name) {
    for (int i = 0; i < s->n_state; i++)
        if (!strcmp(s->state_names[i], name)) return i;
    return -1;
}

void fc_compare_add(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, unsigned kinds,
                    fc_cmp_result *r) {
    if (kinds & FC_CMP_MASK(FC_CMP_BATCH)) cmp_batch(c, r, a->batch, b->batch);
    if (kinds & FC_CMP_MASK(FC_CMP_LOSS)) {
        where_info w = {0, {0, 0}, -1, 0, NULL};
        cmp_floats(c, r, FC_CMP_LOSS, "loss", &w, &a->loss, &b->loss, 1);
    }
    if (kinds & FC_CMP_MASK(FC_CMP_GRAD)) cmp_set(c, r, FC_CMP_GRAD, "grad", a->grads, b->grads);
    if (kinds & FC_CMP_MASK(FC_CMP_PARAM)) cmp_set(c, r, FC_CMP_PARAM, "param", a->params, b->params);
    if (kinds & FC_CMP_MASK(FC_CMP_OPTIM)) {
        // A's states in A's order, then any that only B has
        for (int i = 0; i < a->n_state; i++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "optim.%s", a->state_names[i]);
            int j = fc_cmp_find_state(b, a->state_names[i]);
            if (j >= 0) {
                cmp_set(c, r, FC_CMP_OPTIM, prefix, a->state[i], b->state[j]);
            } else {
                char note[200];
                snprintf(note, sizeof note, "optimizer state \"%s\" is in A, not in B", a->state_names[i]);
                fail_note(c, r, FC_CMP_OPTIM, prefix, note);
            }
        }
        for (int j = 0; j < b->n_state; j++) {
            if (fc_cmp_find_state(a, b->state_names[j]) >= 0) continue;
            char prefix[64], note[200];
            snprintf(prefix, sizeof prefix, "optim.%s", b->state_names[j]);
            snprintf(note, sizeof note, "optimizer state \"%s\" is in B, not in A", b->state_names[j]);
            fail_note(c, r, FC_CMP_OPTIM, prefix, note);
        }
    }
}

void fc_compare_step(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r) {
    fc_cmp_result_init(r, a->step);
    fc_compare_add(c, a, b, FC_CMP_ALL, r);
}

// ---------------------------------------------------------------------------
// printing

const char *fc_cmp_fmt_err(double x, char *buf, size_t cap) {
    if (isinf(x)) snprintf(buf, cap, "inf");
    else if (x == 0) snprintf(buf, cap, "0");
    else snprintf(buf, cap, "%.3g", x);
    return buf;
}

const char *fc_cmp_fmt_ulp(uint64_t u, char *buf, size_t cap) {
    if (u == UINT64_MAX) snprintf(buf, cap, "inf");
    else snprintf(buf, cap, "%llu", (unsigned long long)u);
    return buf;
}

void fc_cmp_fmt_tol(const fc_tol *t, char *buf, size_t cap) {
    if (t->exact) snprintf(buf, cap, "exact");
    else snprintf(buf, cap, "rtol %g atol %g", t->rtol, t->atol);
}

void fc_cmp_print_policy(FILE *f, const fc_cmp_policy *p) {
    if (p->bitwise) {
        fprintf(f, "policy: --bitwise (A is expected): identical bits in every kind\n");
        return;
    }
    fprintf(f, "policy: %s (A is expected; |A - B| <= atol + rtol * |A|):",
            p->overridden ? "--rtol/--atol override" : fc_prec_name(p->prec));
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        char t[64];
        fc_cmp_fmt_tol(&p->tol[k], t, sizeof t);
        fprintf(f, "%s %s %s", k ? ";" : "", KIND_NAMES[k], t);
    }
    fputc('\n', f);
}

void fc_cmp_print_header(FILE *f) {
    fprintf(f, "%6s  %-5s  %7s  %11s  %11s  %10s  %s\n", "step", "kind", "tensors", "max abs err", "max rel err",
            "max ULP", "result");
}

void fc_cmp_print_rows(FILE *f, const fc_cmp_result *r) {
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        const fc_cmp_kind_stats *s = &r->kinds[k];
        if (s->n_tensors == 0) continue;
        char a[32], b[32], u[32];
        fprintf(f, "%6ld  %-5s  %7d  %11s  %11s  %10s  ", r->step, KIND_NAMES[k], s->n_tensors,
                fc_cmp_fmt_err(s->max_abs, a, sizeof a), fc_cmp_fmt_err(s->max_rel, b, sizeof b),
                fc_cmp_fmt_ulp(s->max_ulp, u, sizeof u));
        if (s->n_failed) fprintf(f, "FAIL (%d of %d tensors)\n", s->n_failed, s->n_tensors);
        else fprintf(f, "pass\n");
    }
}

static void format_value(const fc_cmp_divergence *d, double v, uint32_t bits, char *buf, size_t cap) {
    if (!d->is_float) snprintf(buf, cap, "%.0f", v);
    else if (isnan(v)) snprintf(buf, cap, "%snan (0x%08x)", signbit(v) ? "-" : "", bits);
    else snprintf(buf, cap, "%.9g (0x%08x)", v, bits);
}

static void format_index(const fc_cmp_divergence *d, char *buf, size_t cap) {
    if (d->ndim == 2)
        snprintf(buf, cap, "element %lld [%lld, %lld] of shape [%lld, %lld]", d->index, d->multi[0], d->multi[1],
                 d->shape[0], d->shape[1]);
    else if (d->ndim == 1)
        snprintf(buf, cap, "element %lld [%lld] of shape [%lld]", d->index, d->multi[0], d->shape[0]);
    else
        snprintf(buf, cap, "the scalar");
}

void fc_cmp_print_divergence(FILE *f, const fc_cmp_divergence *d) {
    if (!d->found) return;
    if (d->index < 0) {
        fprintf(f, "first divergence: step %ld, %s: %s\n", d->step, d->tensor, d->note);
        return;
    }
    char idx[160], va[64], vb[64], ae[32], re[32], u[32], tol[64];
    format_index(d, idx, sizeof idx);
    format_value(d, d->a, d->a_bits, va, sizeof va);
    format_value(d, d->b, d->b_bits, vb, sizeof vb);
    fc_cmp_fmt_tol(&d->tol, tol, sizeof tol);
    fprintf(f, "first divergence: step %ld, tensor %s, %s\n", d->step, d->tensor, idx);
    fprintf(f, "  A = %s\n  B = %s\n", va, vb);
    fprintf(f, "  error: abs %s, rel %s, %s ULP; allowed: %s\n", fc_cmp_fmt_err(d->abs_err, ae, sizeof ae),
            fc_cmp_fmt_err(d->rel_err, re, sizeof re), fc_cmp_fmt_ulp(d->ulp, u, sizeof u), tol);
    fprintf(f, "  owner under B's layout: %s\n", d->owner_text);
    if (d->note[0]) fprintf(f, "  note: %s\n", d->note);
}
