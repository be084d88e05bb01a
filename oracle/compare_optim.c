// oracle/compare_optim.c — what the optimizer explains: a parameter's
// allowance from each side's own optimizer inputs, a momentum state's terms,
// the clip coefficient each side applied.
#include "compare.h"
#include "compare_model.h"

#include "clip.h"
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float *state_of(const fc_trace_step *s, const char *name) {
    int i = fc_cmp_find_state(s, name);
    return i >= 0 ? s->state[i] : NULL;
}

// What each element of parameter p may differ by because the optimizer
// explains it (compare.h): the previous parameters' difference carried
// through the step, plus the difference of the two sides' updates, each
// computed from that side's own optimizer inputs. NULL when the inputs are
// not all there.
double *fc_cmp_optimizer_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, int p) {
    const fc_optim_config *o = c->optim;
    if (!o || c->policy->bitwise || !a->prev_params || !b->prev_params) return NULL;
    size_t off = c->m->params[p].offset, n = c->m->params[p].numel;
    long t = a->step + 1;  // optimizer steps taken after this one
    if (o->kind == FC_OPT_ADAMW) {
        const float *ma = state_of(a, "exp_avg"), *va = state_of(a, "exp_avg_sq");
        const float *mb = state_of(b, "exp_avg"), *vb = state_of(b, "exp_avg_sq");
        if (!ma || !va || !mb || !vb) return NULL;
        // p_t = p_{t-1} * decay + neg_step * m / (sqrt(v) / bc2_sqrt + eps)  (core/optim.h)
        fc_adamw_coeffs k = fc_adamw_coeffs_at(o, t);
        double *allow = fc_cmp_scratch(n);
#pragma omp parallel for schedule(static) if (n > FC_CMP_BLOCK)
        for (size_t j = 0; j < n; j++) {
            size_t i = off + j;
            double ua = k.neg_step * (double)ma[i] / (sqrt((double)va[i]) / k.bc2_sqrt + k.eps);
            double ub = k.neg_step * (double)mb[i] / (sqrt((double)vb[i]) / k.bc2_sqrt + k.eps);
            double dp = fabs((double)a->prev_params[i] - (double)b->prev_params[i]);
            allow[j] = fabs((double)k.decay) * dp + fabs(ua - ub);
        }
        return allow;
    }
    // SGD: p_t = p_{t-1} - lr * (buf | g + wd p), buf = momentum * buf + (1 - dampening) (g + wd p)
    const float *ba = state_of(a, "momentum_buffer"), *bb = state_of(b, "momentum_buffer");
    if (o->momentum != 0 && (!ba || !bb)) return NULL;
    if (!a->grads || !b->grads) return NULL;
    double *allow = fc_cmp_scratch(n);
#pragma omp parallel for schedule(static) if (n > FC_CMP_BLOCK)
    for (size_t j = 0; j < n; j++) {
        size_t i = off + j;
        double dp = fabs((double)a->prev_params[i] - (double)b->prev_params[i]);
        double dg = fabs((double)a->grads[i] - (double)b->grads[i]) + o->weight_decay * dp;
        double du = o->momentum == 0 ? dg : o->nesterov ? dg + o->momentum * fabs((double)ba[i] - bb[i])
                                                         : fabs((double)ba[i] - (double)bb[i]);
        allow[j] = dp + o->lr * du;
    }
    return allow;
}

// The gradient the optimizer of one side took (the trace's is before
// clipping): g * the clip coefficient of that side's recorded norm.
double fc_cmp_clip_coef(const fc_cmp_ctx *c, const fc_trace_step *s) {
    float max_norm = c->layout ? c->layout->clip_grad_norm : 0;
    if (max_norm <= 0 || !s->has_norm) return 1;
    float coef = fc_clip_coef(max_norm, s->grad_norm);
    return fc_clip_applies(max_norm, coef) ? (double)coef : 1;
}

// A momentum state is a sum of two terms: m_t = beta1 m_{t-1} + w g_t (AdamW's
// exp_avg, w = 1 - beta1; SGD's momentum_buffer, w = 1 - dampening, g + wd p),
// so the terms' magnitude, |beta1 m_{t-1}| + |w g_t| = |m_t - w g_t| + w |g_t|,
// follows from this step alone. Rounding in either term is relative to them,
// not to m_t, which cancellation can make arbitrarily smaller (a 2-element
// bias of mlp-micro under bf16: m_t at 1/20 of its terms). Per element, from
// A, the expected side only: B's own state would let an error in B's m_t
// raise the scale it is judged against. NULL for other states or without the
// inputs.
double *fc_cmp_momentum_terms(const fc_cmp_ctx *c, const fc_trace_step *a, const char *state, int p) {
    const fc_optim_config *o = c->optim;
    if (!o || c->policy->bitwise || !a->grads) return NULL;
    double w, wd = 0;
    if (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg")) {
        w = 1.0 - o->beta1;
    } else if (o->kind == FC_OPT_SGD && !strcmp(state, "momentum_buffer")) {
        w = 1.0 - o->dampening;
        wd = o->weight_decay;
        if (wd != 0 && !a->prev_params) return NULL;
    } else {
        return NULL;
    }
    const float *m = state_of(a, state);
    if (!m) return NULL;
    size_t off = c->m->params[p].offset, n = c->m->params[p].numel;
    double *terms = fc_cmp_scratch(n), coef = fc_cmp_clip_coef(c, a);
#pragma omp parallel for schedule(static) if (n > FC_CMP_BLOCK)
    for (size_t j = 0; j < n; j++) {
        size_t i = off + j;
        double g = coef * (double)a->grads[i] + (wd != 0 ? wd * (double)a->prev_params[i] : 0);
        terms[j] = fabs((double)m[i] - w * g) + fabs(w * g);
    }
    return terms;
}
