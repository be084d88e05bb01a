// oracle/compare.c — the comparison engine (see compare.h): one step of two
// runs, tensor by tensor, under the policy (compare_policy.c), the 16-bit
// model (compare_model.c) and what the optimizer explains (compare_optim.c);
// the first divergence and where it lives (compare_where.c). Printing is
// compare_print.c; the `fsdpcheck compare` command is compare_cmd.c. The
// files are layers, each calling only those below it, so a change to one
// cannot come back through another: compare_base.c and compare_where.c;
// compare_policy.c (numbers) and compare_optim.c; compare_model.c; this
// engine; compare_print.c.
#include "compare.h"
#include "compare_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void fc_cmp_result_init(fc_cmp_result *r, long step) {
    memset(r, 0, sizeof *r);
    r->step = step;
    r->pass = 1;
    r->lockstep = 1;
    r->prev_diff = -1;
}

// Whether two runs start this step in lockstep: every tensor of the previous
// parameters within the lockstep parameter tolerance of its scale. Unknown
// previous parameters count as diverged, with nothing to grow the row by (so
// the diverged row at d = 0: a trace without its previous parameters is
// judged as tightly as one in lockstep, never more loosely).
static void set_rows(const fc_cmp_ctx *c, fc_cmp_result *r) {
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        fc_tol t = r->lockstep ? c->policy->tol[k] : c->policy->div[k];
        // the 16-bit model: per-element allowances on top of fp32's row
        if (r->magnitudes && (k == FC_CMP_LOSS || k == FC_CMP_GRAD || k == FC_CMP_NORM || k == FC_CMP_OPTIM))
            t = FC_CMP_LOCKSTEP[FC_PREC_FP32][k];
        double grow = r->lockstep || r->prev_diff < 0 ? 0 : t.kappa * r->prev_diff;
        t.rtol += grow;
        if (t.ntol > 0) t.ntol += grow;
        t.kappa = 0;  // applied: the row is what this step is judged by
        r->row[k] = t;
    }
}

static void judge_lockstep(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r) {
    r->judged = 1;
    if (!a->prev_params || !b->prev_params) {
        r->lockstep = 0;
        set_rows(c, r);
        return;
    }
    double worst = 0;
    for (int i = 0; i < c->m->n_params; i++) {
        const fc_param *p = &c->m->params[i];
        const float *x = a->prev_params + p->offset, *y = b->prev_params + p->offset;
        size_t nb = fc_cmp_blocks(p->numel);
        double *sd = callocCheck(2 * nb, sizeof(double));  // [nb][2] each block's scale and max |x - y|
#pragma omp parallel for schedule(static) if (nb > 1)
        for (size_t k = 0; k < nb; k++) {
            double sc = 0, dk = 0;
            for (size_t j = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, p->numel); j < hi; j++) {
                sc = fc_dmax(sc, fc_dmax(fabs((double)x[j]), fabs((double)y[j])));
                dk = fc_dmax(dk, fc_cmp_abs_err(x[j], y[j]));
            }
            sd[2 * k] = sc, sd[2 * k + 1] = dk;
        }
        double scale = 0, d = 0;
        for (size_t k = 0; k < nb; k++) scale = fc_dmax(scale, sd[2 * k]), d = fc_dmax(d, sd[2 * k + 1]);
        free(sd);
        fc_cmp_release(a, a->prev_params, p->offset, p->numel);
        fc_cmp_release(b, b->prev_params, p->offset, p->numel);
        worst = fc_dmax(worst, scale > 0 ? d / scale : d > 0 ? INFINITY : 0);
    }
    r->prev_diff = worst;
    r->lockstep = worst <= c->policy->lockstep;
    r->magnitudes = fc_cmp_rounding_model(c, a, r);
    set_rows(c, r);
}

void fc_cmp_result_init_as(fc_cmp_result *r, const fc_cmp_result *base) {
    fc_cmp_result_init(r, base->step);
    r->lockstep = base->lockstep;
    r->magnitudes = base->magnitudes;
    r->prev_diff = base->prev_diff;
    memcpy(r->row, base->row, sizeof r->row);
    r->judged = base->judged;
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
    k->max_abs = fc_dmax(k->max_abs, t->max_abs);
    k->max_scaled = fc_dmax(k->max_scaled, t->max_scaled);
    k->max_ulp = fc_dmax(k->max_ulp, t->max_ulp);
    k->norm_ratio = fc_dmax(k->norm_ratio, t->norm_ratio);
    k->headroom = fc_dmax(k->headroom, t->headroom);
    if (!t->pass) {
        k->n_failed++;
        r->pass = 0;
    }
}

// A tensor that cannot be compared element by element (a shape mismatch, a
// state only one side has): it fails, and `note` says why.
static void fail_note(fc_cmp_result *r, fc_cmp_kind kind, const char *name, const char *note) {
    fc_cmp_tensor *t = new_tensor(r, kind, name, 0);
    snprintf(t->note, sizeof t->note, "%s", note);
    t->max_abs = t->max_scaled = t->max_ulp = t->headroom = INFINITY;
    t->pass = 0;
    finish_tensor(r, t);
    if (r->first.found) return;
    fc_cmp_divergence *d = &r->first;
    memset(d, 0, sizeof *d);
    d->found = 1;
    d->step = r->step;
    d->kind = kind;
    d->index = -1;
    d->tol = *&r->row[kind];
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

static void set_where(const fc_cmp_ctx *c, fc_cmp_divergence *d, const where_info *w, size_t i) {
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
    if (w->param >= 0) d->owner = fc_cmp_param_owner(c->m, c->layout, c->world, w->param, i);
    else if (w->batch_row > 0) d->owner = fc_cmp_batch_owner(c->layout, c->world, (int)(i / (size_t)w->batch_row));
    else {
        memset(&d->owner, 0, sizeof d->owner);
        d->owner.sample = d->owner.micro_batch = -1;
    }
    fc_owner_format(&d->owner, c->m, c->layout, d->owner_text, sizeof d->owner_text);
    if (w->note) snprintf(d->note, sizeof d->note, "%s", w->note);
}

static fc_cmp_divergence *new_divergence(fc_cmp_result *r, fc_cmp_kind kind, const char *name, const fc_tol *tol) {
    fc_cmp_divergence *d = &r->first;
    memset(d, 0, sizeof *d);
    d->found = 1;
    d->step = r->step;
    d->kind = kind;
    d->tol = *tol;
    snprintf(d->tensor, sizeof d->tensor, "%s", name);
    return d;
}

// What an element may differ by beyond its row, and what it is measured against.
typedef struct {
    const double *explained;  // [n] or NULL: explained by the optimizer (parameters) or by 16-bit rounding
    const double *terms;      // [n] or NULL: the magnitude of the terms the element sums (a momentum
                              // state: momentum_terms), which the scale and the norm check measure against
    int rounding;             // explained is rounding noise: the whole tensor is judged by its projection
    double common;            // a relative scale of the whole tensor both sides explain (fc_cmp_state_common)
} elem_allow;

static const elem_allow NO_ALLOW = {NULL, NULL, 0, 0};

// One block's share of a tensor's statistics (cmp_floats; compare_model.h).
typedef struct {
    double scale, norm_a, norm_t;                         // pass 1
    double max_abs, max_e, headroom, norm_e;              // pass 2
    size_t n_bad, first_bad;
    double first_excess;
} cmp_block;

// What cmp_floats' passes find of a tensor, the blocks' shares added in block order.
typedef struct {
    double scale, norm_a;  // pass 1: the largest finite magnitude; ||A||^2 (||terms||^2 where larger)
    double allowed, ulp;   // the row at that scale (atol + rtol * scale), the ULP at the scale
    double max_e, norm_e;  // pass 2: the largest error nothing explains, and the sum of its squares
    size_t first_bad;      // the first element outside tolerance, SIZE_MAX if none
    double first_excess;   // what was explained of that element
    double n_allowed;      // what the whole-tensor check allowed
} float_pass;

// Pass 1: the tensor's scale, its largest finite magnitude on either side (or
// of the terms its elements sum), and the squared norms of A and the terms.
static void scale_pass(const float *a, const float *b, const double *terms, size_t n, cmp_block *bl, float_pass *fp) {
    size_t nb = fc_cmp_blocks(n);
#pragma omp parallel for schedule(static) if (nb > 1)
    for (size_t k = 0; k < nb; k++) {
        double sc = 0, na = 0, nt = 0;  // in registers: bl[] could alias a[] as far as the compiler knows
        for (size_t i = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, n); i < hi; i++) {
            if (isfinite(a[i])) sc = fc_dmax(sc, fabs((double)a[i])), na += (double)a[i] * a[i];
            if (isfinite(b[i])) sc = fc_dmax(sc, fabs((double)b[i]));
            if (terms && isfinite(terms[i])) sc = fc_dmax(sc, terms[i]), nt += terms[i] * terms[i];
        }
        bl[k].scale = sc, bl[k].norm_a = na, bl[k].norm_t = nt;
    }
    double scale = 0, norm_a = 0, norm_t = 0;
    for (size_t k = 0; k < nb; k++) scale = fc_dmax(scale, bl[k].scale), norm_a += bl[k].norm_a, norm_t += bl[k].norm_t;
    fp->scale = scale;
    fp->norm_a = fc_dmax(norm_a, norm_t);
}

// Pass 2: every element against fp->allowed plus what allow explains of it.
static void element_pass(const fc_tol *tol, const float *a, const float *b, const double *allow, size_t n,
                         cmp_block *bl, fc_cmp_tensor *t, float_pass *fp) {
    size_t nb = fc_cmp_blocks(n);
    double allowed = fp->allowed;
#pragma omp parallel for schedule(static) if (nb > 1)
    for (size_t k = 0; k < nb; k++) {
        cmp_block q = {0};  // a local: see pass 1
        q.first_bad = SIZE_MAX;
        for (size_t i = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, n); i < hi; i++) {
            double d = fc_cmp_abs_err(a[i], b[i]);
            double ex = allow && isfinite(d) ? allow[i] : 0;
            double e = d > ex ? d - ex : 0;  // the error nothing explains
            int bad = tol->exact ? memcmp(&a[i], &b[i], sizeof(float)) != 0 : !(e <= allowed);
            q.max_abs = fc_dmax(q.max_abs, d);
            q.max_e = fc_dmax(q.max_e, e);
            // headroom: the error against everything it was allowed (the row and what is explained)
            if (!tol->exact)
                q.headroom = fc_dmax(q.headroom, allowed + ex > 0 ? d / (allowed + ex) : d > 0 ? INFINITY : 0);
            q.norm_e += e * e;
            if (bad) {
                q.n_bad++;
                if (q.first_bad == SIZE_MAX) q.first_bad = i, q.first_excess = ex;
            }
        }
        bl[k] = q;
    }
    fp->first_bad = SIZE_MAX, fp->first_excess = 0, fp->norm_e = 0, fp->max_e = 0;
    for (size_t k = 0; k < nb; k++) {
        const cmp_block *q = &bl[k];
        t->max_abs = fc_dmax(t->max_abs, q->max_abs);
        fp->max_e = fc_dmax(fp->max_e, q->max_e);
        t->headroom = fc_dmax(t->headroom, q->headroom);
        fp->norm_e += q->norm_e;
        t->n_bad += q->n_bad;
        if (fp->first_bad == SIZE_MAX && q->first_bad != SIZE_MAX)
            fp->first_bad = q->first_bad, fp->first_excess = q->first_excess;
    }
}

// The whole tensor (not for scalars, nor when exact): under rounding noise its
// weighted projection on A (compare_model.c), else its error's norm against
// A's, which catches an error spread thinly over every element.
static void whole_tensor(const fc_cmp_ctx *c, const fc_tol *tol, const elem_allow *al, const float *a, const float *b,
                         size_t n, fc_cmp_tensor *t, float_pass *fp) {
    if (al->rounding) {
        // norm_ratio reports |delta|
        fc_cmp_proj pj = fc_cmp_projection(c->policy, tol->ntol + al->common, a, b, al->explained, fp->allowed, n);
        t->norm_ratio = fabs(pj.delta);
        t->norm_bad = !(t->norm_ratio <= pj.allowed);
        t->headroom = fc_dmax(t->headroom, pj.allowed > 0 ? t->norm_ratio / pj.allowed : pj.delta != 0 ? INFINITY : 0);
        fp->n_allowed = pj.allowed;
    } else if (tol->ntol > 0) {
        double norm_a = sqrt(fp->norm_a), norm_e = sqrt(fp->norm_e);  // (||terms|| where it is larger)
        t->norm_ratio = norm_a > 0 ? norm_e / norm_a : norm_e > 0 ? INFINITY : 0;
        double na = tol->ntol * norm_a + tol->atol * sqrt((double)n);
        t->norm_bad = !(norm_e <= na);
        t->headroom = fc_dmax(t->headroom, na > 0 ? norm_e / na : norm_e > 0 ? INFINITY : 0);
        fp->n_allowed = tol->ntol;
    }
}

// The first divergence in a failed float tensor: the element that failed; for
// a tensor failing as a whole, its worst element.
static void float_divergence(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name,
                             const where_info *w, const fc_tol *tol, const elem_allow *al, const float *a,
                             const float *b, size_t n, const fc_cmp_tensor *t, const float_pass *fp) {
    const double *allow = al->explained;
    fc_cmp_divergence *d = new_divergence(r, kind, name, tol);
    size_t i = fp->first_bad;
    double first_excess = fp->first_excess;
    if (i == SIZE_MAX) {
        d->whole_tensor = 1;
        d->projection = al->rounding;
        d->norm_ratio = t->norm_ratio;
        d->norm_allowed = fp->n_allowed;
        double worst = -1;
        for (size_t j = 0; j < n; j++) {
            double dj = fc_cmp_abs_err(a[j], b[j]) - (allow ? allow[j] : 0);
            if (dj > worst) worst = dj, i = j, first_excess = allow ? allow[j] : 0;
        }
    }
    uint32_t ab, bb;
    memcpy(&ab, &a[i], 4);
    memcpy(&bb, &b[i], 4);
    d->is_float = 1;
    d->a = a[i];
    d->b = b[i];
    d->a_bits = ab;
    d->b_bits = bb;
    d->abs_err = fc_cmp_abs_err(a[i], b[i]);
    d->explained = first_excess < d->abs_err ? first_excess : d->abs_err;
    d->rounding = al->rounding;
    d->scale = fp->scale;
    d->allowed = fp->allowed;
    double e = d->abs_err - d->explained;
    d->scaled = fp->scale > 0 ? e / fp->scale : e > 0 ? INFINITY : 0;
    d->ulp = e / fp->ulp;
    set_where(c, d, w, i);
}

// Compares n floats of one tensor under its row and the allowances in al.
static void cmp_floats(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name,
                       const where_info *w, const float *a, const float *b, size_t n, const elem_allow *al) {
    const fc_tol *tol = &r->row[kind];
    // A frozen parameter (docs/contract.md §2) is never stepped and has no gradient or
    // optimizer state: each side holds its start bits and zeros, whatever
    // the precision, so any difference at all is an error.
    fc_tol frozen;
    if (w->param >= 0 && c->m->params[w->param].frozen) {
        frozen = *tol;
        frozen.exact = 1;
        tol = &frozen;
    }
    fc_cmp_tensor *t = new_tensor(r, kind, name, n);
    cmp_block *bl = callocCheck(fc_cmp_blocks(n), sizeof *bl);  // [nb]
    float_pass fp;
    scale_pass(a, b, al->terms, n, bl, &fp);
    t->scale = fp.scale;
    fp.allowed = tol->atol + tol->rtol * fp.scale, fp.ulp = fc_ulp_at(fp.scale);
    element_pass(tol, a, b, al->explained, n, bl, t, &fp);
    free(bl);
    // dividing by a positive constant keeps the order: max(e) / scale is max(e / scale)
    if (fp.scale > 0) t->max_scaled = fp.max_e / fp.scale, t->max_ulp = fp.max_e / fp.ulp;
    else if (fp.max_e > 0) t->max_scaled = t->max_ulp = INFINITY;
    fp.n_allowed = 0;
    if (w->ndim != 0 && !tol->exact) whole_tensor(c, tol, al, a, b, n, t, &fp);
    t->pass = t->n_bad == 0 && !t->norm_bad;
    finish_tensor(r, t);
    if (t->pass || r->first.found) return;
    float_divergence(c, r, kind, name, w, tol, al, a, b, n, t, &fp);
}

// Token ids and class ids: exact.
static void cmp_ints(const fc_cmp_ctx *c, fc_cmp_result *r, const char *name, const where_info *w,
                     const int32_t *a, const int32_t *b, size_t n) {
    fc_cmp_tensor *t = new_tensor(r, FC_CMP_BATCH, name, n);
    size_t first_bad = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        t->max_abs = fc_dmax(t->max_abs, d);
        if (a[i] == b[i]) continue;
        t->n_bad++;
        if (first_bad == SIZE_MAX) first_bad = i;
    }
    t->pass = t->n_bad == 0;
    finish_tensor(r, t);
    if (t->pass || r->first.found) return;
    size_t i = first_bad;
    fc_cmp_divergence *d = new_divergence(r, FC_CMP_BATCH, name, &c->policy->tol[FC_CMP_BATCH]);
    d->a = a[i];
    d->b = b[i];
    d->a_bits = (uint32_t)a[i];
    d->b_bits = (uint32_t)b[i];
    d->abs_err = fabs((double)a[i] - (double)b[i]);
    set_where(c, d, w, i);
}

#define DIFFERENT_DATA "the runs trained on different data"

static void cmp_batch(const fc_cmp_ctx *c, fc_cmp_result *r, const fc_batch *a, const fc_batch *b) {
    int gpt2 = a->kind != FC_MODEL_MLP;  // token ids (gpt2, llama)
    int in_cols = gpt2 ? a->T : a->in_dim;
    if (a->kind != b->kind || a->B != b->B || a->T != b->T || a->in_dim != b->in_dim) {
        char note[200];
        snprintf(note, sizeof note, "batch shapes differ: A [%d, %d], B [%d, %d] (%s)", a->B, in_cols, b->B,
                 gpt2 ? b->T : b->in_dim, DIFFERENT_DATA);
        fail_note(r, FC_CMP_BATCH, "batch.input", note);
        fail_note(r, FC_CMP_BATCH, "batch.target", note);
        return;
    }
    where_info w = {2, {a->B, in_cols}, -1, in_cols, DIFFERENT_DATA};
    size_t n = (size_t)a->B * (size_t)in_cols;
    // mlp features are floats, but still data: the batch tolerance is exact
    if (gpt2) cmp_ints(c, r, "batch.input", &w, a->input, b->input, n);
    else cmp_floats(c, r, FC_CMP_BATCH, "batch.input", &w, a->features, b->features, n, &NO_ALLOW);
    where_info wt = {gpt2 ? 2 : 1, {a->B, gpt2 ? a->T : 0}, -1, gpt2 ? a->T : 1, DIFFERENT_DATA};
    cmp_ints(c, r, "batch.target", &wt, a->target, b->target, gpt2 ? n : (size_t)a->B);
}

// The gradient norm is a double: judged in double, against its own magnitude
// (the row: the rounding of the norm's own computation) plus extra, what the
// two sides' gradients explain (fc_cmp_norm_allowance).
static void cmp_norm(const fc_cmp_ctx *c, fc_cmp_result *r, double a, double b, double extra) {
    const fc_tol *tol = &r->row[FC_CMP_NORM];
    fc_cmp_tensor *t = new_tensor(r, FC_CMP_NORM, "grad_norm", 1);
    double d = isnan(a) || isnan(b) ? (isnan(a) && isnan(b) ? 0 : INFINITY) : a == b ? 0 : fabs(a - b);
    double scale = fc_dmax(fabs(a), fabs(b)), allowed = tol->atol + tol->rtol * scale + extra;
    int bad = tol->exact ? memcmp(&a, &b, sizeof a) != 0 : !(d <= allowed);
    t->scale = scale;
    t->max_abs = d;
    t->max_scaled = scale > 0 ? d / scale : d > 0 ? INFINITY : 0;
    t->max_ulp = d / fc_ulp_at(scale);
    if (!tol->exact) t->headroom = allowed > 0 ? d / allowed : d > 0 ? INFINITY : 0;
    t->n_bad = (size_t)bad;
    t->pass = !bad;
    finish_tensor(r, t);
    if (t->pass || r->first.found) return;
    fc_cmp_divergence *dv = new_divergence(r, FC_CMP_NORM, "grad_norm", tol);
    dv->is_float = 2;  // a double
    dv->a = a;
    dv->b = b;
    dv->abs_err = d;
    dv->scale = scale;
    dv->scaled = t->max_scaled;
    dv->ulp = t->max_ulp;
    dv->allowed = allowed;
    where_info w = {0, {0, 0}, -1, 0, NULL};
    set_where(c, dv, &w, 0);
}

// What a set's tensors are allowed (cmp_set): kind's allowances, computed one
// tensor at a time so that a step holds one tensor's, not the model's.
typedef struct {
    fc_cmp_kind kind;            // GRAD, OPTIM or PARAM
    const fc_cmp_grad_plan *g;   // the step's gradient allowance
    const char *state;           // OPTIM: the state's name
    double common;               // OPTIM: fc_cmp_state_common
} set_allow;

// Parameter p's allowances into *al; held[2] gets the scratch arrays to release.
static void tensor_allow(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, const set_allow *s,
                         int p, elem_allow *al, double *held[2]) {
    *al = NO_ALLOW;
    held[0] = held[1] = NULL;
    if (s->kind == FC_CMP_PARAM) {
        al->explained = held[0] = fc_cmp_optimizer_allowance(c, a, b, p);
        return;
    }
    double *allow_g = fc_cmp_grad_allow(c, a, s->g, p);
    int rounding = s->g->mode == 1;  // the 16-bit model: its whole-tensor test is the projection
    if (s->kind == FC_CMP_GRAD) {
        *al = (elem_allow){held[0] = allow_g, NULL, rounding, 0};
        return;
    }
    held[0] = fc_cmp_momentum_terms(c, a, s->state, p);
    held[1] = fc_cmp_state_allowance(c, a, b, s->state, allow_g, p);
    fc_cmp_scratch_release(allow_g);
    *al = (elem_allow){held[1], held[0], rounding && held[1] != NULL, s->common};
}

// Sets a_set and b_set of steps a and b, tensor by tensor; each tensor's
// elements of both steps are released once it is judged.
static void cmp_set(const fc_cmp_ctx *c, fc_cmp_result *r, const char *prefix, const fc_trace_step *a,
                    const fc_trace_step *b, const float *a_set, const float *b_set, const set_allow *s) {
    const fc_model *m = c->m;
    for (int i = 0; i < m->n_params; i++) {
        if (c->only > 0 && i != c->only - 1) continue;
        const fc_param *p = &m->params[i];
        char name[200];
        snprintf(name, sizeof name, "%s.%s", prefix, p->name);
        where_info w = {p->ndim, {p->shape[0], p->shape[1]}, i, 0, NULL};
        elem_allow at;
        double *held[2];
        tensor_allow(c, a, b, s, i, &at, held);
        cmp_floats(c, r, s->kind, name, &w, a_set + p->offset, b_set + p->offset, p->numel, &at);
        fc_cmp_scratch_release(held[0]);
        fc_cmp_scratch_release(held[1]);
        fc_cmp_release_all(a, b, p->offset, p->numel);
    }
}

// The optimizer states: A's in A's order, then any that only B has.
static void cmp_states(const fc_cmp_ctx *c, fc_cmp_result *r, const fc_trace_step *a, const fc_trace_step *b,
                       const fc_cmp_grad_plan *g) {
    for (int i = 0; i < a->n_state; i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "optim.%s", a->state_names[i]);
        int j = fc_cmp_find_state(b, a->state_names[i]);
        if (j >= 0) {
            double common = fc_cmp_state_common(c, a, b, a->state_names[i], g->mode == 1);
            set_allow s = {FC_CMP_OPTIM, g, a->state_names[i], common};
            cmp_set(c, r, prefix, a, b, a->state[i], b->state[j], &s);
        } else {
            char note[200];
            snprintf(note, sizeof note, "optimizer state \"%s\" is in A, not in B", a->state_names[i]);
            fail_note(r, FC_CMP_OPTIM, prefix, note);
        }
    }
    for (int j = 0; j < b->n_state; j++) {
        if (fc_cmp_find_state(a, b->state_names[j]) >= 0) continue;
        char prefix[64], note[200];
        snprintf(prefix, sizeof prefix, "optim.%s", b->state_names[j]);
        snprintf(note, sizeof note, "optimizer state \"%s\" is in B, not in A", b->state_names[j]);
        fail_note(r, FC_CMP_OPTIM, prefix, note);
    }
}

void fc_compare_add(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, unsigned kinds,
                    fc_cmp_result *r) {
    if (!r->judged) judge_lockstep(c, a, b, r);
    if (kinds & FC_CMP_MASK(FC_CMP_BATCH)) {
        if (a->batch && b->batch) cmp_batch(c, r, a->batch, b->batch);
        else fail_note(r, FC_CMP_BATCH, "batch", "the batch was asked for but one side has none");
    }
    where_info scalar = {0, {0, 0}, -1, 0, NULL};
    if (kinds & FC_CMP_MASK(FC_CMP_LOSS)) {
        double allow_loss = fc_cmp_loss_allowance(c, a, r);
        elem_allow al = {allow_loss >= 0 ? &allow_loss : NULL, NULL, 0, 0};
        cmp_floats(c, r, FC_CMP_LOSS, "loss", &scalar, &a->loss, &b->loss, 1, &al);
    }
    fc_cmp_grad_plan g = fc_cmp_grad_plan_of(c, a, r);
    if ((kinds & FC_CMP_MASK(FC_CMP_NORM)) && a->has_norm && b->has_norm)
        cmp_norm(c, r, a->grad_norm, b->grad_norm, fc_cmp_norm_allowance_of(c, a, b));
    if (kinds & FC_CMP_MASK(FC_CMP_GRAD)) {
        set_allow s = {FC_CMP_GRAD, &g, NULL, 0};
        cmp_set(c, r, "grad", a, b, a->grads, b->grads, &s);
    }
    // optimizer state before parameters: the parameters' allowance is computed
    // from each side's state, so a wrong state is named first, as itself
    if (kinds & FC_CMP_MASK(FC_CMP_OPTIM)) cmp_states(c, r, a, b, &g);
    if (kinds & FC_CMP_MASK(FC_CMP_PARAM)) {
        set_allow s = {FC_CMP_PARAM, &g, NULL, 0};
        cmp_set(c, r, "param", a, b, a->params, b->params, &s);
    }
    fc_cmp_grad_plan_free(&g);
}

void fc_compare_step(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r) {
    fc_cmp_result_init(r, a->step);
    fc_compare_add(c, a, b, FC_CMP_ALL, r);
}
