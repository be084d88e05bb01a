// oracle/signature_engine.c — the signatures' engine (signature.h): which
// parameters failed, a candidate gradient finished into a whole step as the
// reference finishes one (norm, clip_grad_norm_, the optimizer), and judged
// against B by the comparison engine. The candidates are signature_shapes.c's,
// the driver signature.c's; both call down into this file only.
#include "signature_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "layout.h"
#include "optim.h"
#include "round.h"

// The parameter a compared tensor's name ("grad.X", "param.X", "optim.S.X") is of, -1 for none.
static int param_of(const fc_model *m, const fc_cmp_tensor *t) {
    if (t->kind != FC_CMP_GRAD && t->kind != FC_CMP_PARAM && t->kind != FC_CMP_OPTIM) return -1;
    const char *name = strchr(t->name, '.');
    if (name && t->kind == FC_CMP_OPTIM) name = strchr(name + 1, '.');
    if (!name) return -1;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name + 1)) return i;
    return -1;
}

static void mark_failed(fc_sig *s) {
    const fc_cmp_result *r = s->in->verdict;
    s->bad = callocCheck((size_t)s->m->n_params, 1);
    s->bad_grad = callocCheck((size_t)s->m->n_params, 1);
    for (int k = 0; k < r->n_tensors; k++) {
        const fc_cmp_tensor *t = &r->tensors[k];
        int i = t->pass ? -1 : param_of(s->m, t);
        if (i < 0) continue;
        s->bad[i] = 1;
        if (t->kind == FC_CMP_GRAD) s->bad_grad[i] = 1;
    }
    for (int i = 0; i < s->m->n_params; i++) {
        s->n_bad += s->bad[i];
        s->n_bad_grad += s->bad_grad[i];
        s->n_trained += !s->m->params[i].frozen;
    }
}

// The owner of every element under B's layout (the clip-by-one-rank's-norm shape needs it).
static void owners(fc_sig *s) {
    if (!s->sharded || s->W < 2) return;
    s->owner = mallocCheck(s->n * sizeof(int));
    for (int i = 0; i < s->m->n_params; i++) {
        const fc_param *p = &s->m->params[i];
        for (size_t k = 0; k < p->numel; k++) {
            fc_owner o = fc_cmp_param_owner(s->m, s->in->cfg, s->W, i, k);
            s->owner[p->offset + k] = o.kind == FC_OWNER_SHARD ? o.rank : 0;
        }
    }
}

void fc_sig_init(fc_sig *s, const fc_sig_input *in, fc_signature *out) {
    memset(s, 0, sizeof *s);
    s->in = in;
    s->m = in->m;
    s->n = in->m->numel;
    s->out = out;
    s->W = in->world;
    s->K = in->cfg->grad_accum > 0 ? in->cfg->grad_accum : 1;
    fc_groups g = fc_groups_of(in->cfg, in->world, 0);
    s->F = g.F, s->R = g.R, s->sharded = g.sharded;
    s->t = in->a->step + 1;
    s->loss = NAN;  // docs/contract.md §6: the step number is the optimizer's count before it
    // candidates come from another arithmetic than either side's: judged by the step's tolerances, never bits
    s->pol = *in->ctx->policy;
    if (s->pol.bitwise) fc_cmp_policy_defaults(&s->pol, s->pol.prec);
    s->ctx = *in->ctx;
    s->ctx.policy = &s->pol;
    s->zeros = callocCheck(s->n, sizeof(float));
    for (int i = 0; i < 2; i++) s->start[i] = in->state[i] ? in->state[i] : s->zeros;
    s->g = mallocCheck(s->n * sizeof(float));
    s->p = mallocCheck(s->n * sizeof(float));
    s->clip = mallocCheck(s->n * sizeof(float));
    for (int i = 0; i < in->a->n_state; i++) s->st[i] = mallocCheck(s->n * sizeof(float));
    mark_failed(s);
    owners(s);
}

void fc_sig_free(fc_sig *s) {
    free(s->bad);
    free(s->bad_grad);
    free(s->zeros);
    free(s->g);
    free(s->p);
    free(s->clip);
    free(s->st[0]);
    free(s->st[1]);
    free(s->owner);
}

fc_sig_finish fc_sig_finish_default(const fc_sig *s) {
    return (fc_sig_finish){.updates = 1, .t = s->t, .norm = -1};
}

// clip_grad_norm_ as the reference applies it, into s->clip: by the norm, or by each owner's coefficient.
static void clip(fc_sig *s, const fc_sig_finish *h, double norm) {
    const fc_run_config *c = s->in->cfg;
    memcpy(s->clip, s->g, s->n * sizeof(float));
    if (h->unclipped || !(c->clip_grad_norm > 0)) return;
    if (h->rank_coef && s->owner) {
        for (size_t i = 0; i < s->n; i++) {
            float coef = (float)h->rank_coef[s->owner[i]];
            if (fc_clip_applies(c->clip_grad_norm, coef)) s->clip[i] *= coef;
        }
        return;
    }
    float coef = fc_clip_coef(c->clip_grad_norm, norm);
    if (!fc_clip_applies(c->clip_grad_norm, coef)) return;
    for (size_t i = 0; i < s->n; i++) s->clip[i] *= coef;
}

// s->g finished into parameters and state (A's kept where nothing failed); the norm reported.
static double finish(fc_sig *s, const fc_sig_finish *h) {
    const fc_run_config *c = s->in->cfg;
    const fc_trace_step *a = s->in->a;
    double norm = h->norm >= 0 ? h->norm : fc_grad_norm(s->g, s->n, c->norm_type);
    clip(s, h, norm);
    memcpy(s->p, a->prev_params, s->n * sizeof(float));
    for (int i = 0; i < a->n_state; i++) memcpy(s->st[i], h->zero_state ? s->zeros : s->start[i], s->n * sizeof(float));
    for (int i = 0; i < s->m->n_params; i++) {
        const fc_param *p = &s->m->params[i];
        size_t o = p->offset, bytes = p->numel * sizeof(float);
        if (!s->bad[i]) {  // B matched A here: A's values, not this arithmetic's
            memcpy(s->p + o, a->params + o, bytes);
            for (int k = 0; k < a->n_state; k++) memcpy(s->st[k] + o, a->state[k] + o, bytes);
            continue;
        }
        if (p->frozen) continue;
        for (int u = 0; u < h->updates; u++)
            fc_optim_update(&c->optim, h->t + u, s->p + o, s->clip + o, a->n_state > 0 ? s->st[0] + o : NULL,
                            a->n_state > 1 ? s->st[1] + o : NULL, p->numel);
    }
    return norm;
}

// Whether B is the candidate within the signature's policy. kinds: what is judged.
static int judge(fc_sig *s, double norm, unsigned kinds) {
    fc_trace_step cand = *s->in->a;
    cand.grads = s->g;
    cand.params = s->p;
    for (int i = 0; i < cand.n_state; i++) cand.state[i] = s->st[i];
    cand.grad_norm = norm;
    if (!isnan(s->loss)) cand.loss = (float)s->loss;
    s->loss = NAN;
    fc_cmp_result r;
    fc_cmp_result_init(&r, cand.step);
    fc_compare_add(&s->ctx, &cand, s->in->b, kinds, &r);
    int pass = r.pass;
    fc_cmp_result_free(&r);
    return pass;
}

void fc_sig_record(fc_sig *s, const char *text) {
    fc_signature *o = s->out;
    size_t len = strlen(o->text), cap = sizeof o->text;
    const char *sep = o->n_match++ ? "; also: " : "";
    // what does not fit is cut: the first match is whole, the others are named after it
    for (const char *c = sep; *c && len + 1 < cap; c++) o->text[len++] = *c;
    for (const char *c = text; *c && len + 1 < cap; c++) o->text[len++] = *c;
    o->text[len] = '\0';
}

// The failing gradient tensors, when they are not all of the trained ones: " (in grad.X, grad.Y: 2 of 9 ...)".
static void where_text(const fc_sig *s, char *buf, size_t cap) {
    buf[0] = '\0';
    if (s->n_bad_grad >= s->n_trained) return;
    size_t len = (size_t)snprintf(buf, cap, " (in");
    int shown = 0;
    for (int i = 0; i < s->m->n_params && len < cap; i++) {
        if (!s->bad_grad[i]) continue;
        if (shown++ < 3) len += (size_t)snprintf(buf + len, cap - len, "%s grad.%s", shown > 1 ? "," : "", s->m->params[i].name);
    }
    if (len < cap)
        snprintf(buf + len, cap - len, "%s: %d of %d gradient tensors)", shown > 3 ? ", ..." : "", s->n_bad_grad,
                 s->n_trained);
}

void fc_sig_try_grad(fc_sig *s, const char *text) {
    const float *A = s->in->a->grads;
    int differs = 0;
    for (int i = 0; i < s->m->n_params; i++) {
        const fc_param *p = &s->m->params[i];
        size_t o = p->offset, bytes = p->numel * sizeof(float);
        if (!s->bad_grad[i] || p->frozen) memcpy(s->g + o, A + o, bytes);
        else differs |= memcmp(s->g + o, A + o, bytes) != 0;
    }
    if (!differs) {
        s->loss = NAN;
        return;
    }
    fc_sig_finish h = fc_sig_finish_default(s);
    // not the norm: where a reduction is broken the ranks' gradients differ, and which of them the
    // reported norm sums is the implementation's own business
    if (!judge(s, finish(s, &h), FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH) & ~FC_CMP_MASK(FC_CMP_NORM))) return;
    char where[300], full[FC_SIG_TEXT];
    where_text(s, where, sizeof where);
    snprintf(full, sizeof full, "%s%s", text, where);
    fc_sig_record(s, full);
}

void fc_sig_try_step(fc_sig *s, const fc_sig_finish *h, const char *text) {
    memcpy(s->g, s->in->a->grads, s->n * sizeof(float));
    if (judge(s, finish(s, h), FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH))) fc_sig_record(s, text);
}

int fc_sig_on_grid(const fc_sig *s, fc_prec prec) {
    size_t off_b = 0, off_a = 0, nonzero_a = 0;
    for (int i = 0; i < s->m->n_params; i++) {
        if (!s->bad_grad[i]) continue;
        const fc_param *p = &s->m->params[i];
        for (size_t k = p->offset; k < p->offset + p->numel; k++) {
            float a = s->in->a->grads[k], b = s->in->b->grads[k];
            off_b += fc_round(prec, b) != b;
            off_a += fc_round(prec, a) != a;
            nonzero_a += a != 0;
        }
    }
    // a 16-bit grid holds 1 in 2^16 fp32 values: A's gradient, reduced in fp32, is off it almost everywhere
    return s->n_bad_grad > 0 && off_b == 0 && 2 * off_a > nonzero_a;
}

int fc_sig_near_a(fc_sig *s) {
    fc_cmp_result r;
    fc_cmp_result_init(&r, s->in->a->step);
    fc_compare_add(&s->ctx, s->in->a, s->in->b, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &r);
    int pass = r.pass;
    fc_cmp_result_free(&r);
    return pass;
}
