// oracle/compare_model.c — the 16-bit rounding model: what each gradient,
// gradient norm and momentum element may differ by, from the magnitudes of the
// terms that formed it (reference/magnitude.c), and how a whole tensor is
// judged under that noise (its projection on A). Its constants are
// FC_CMP_MODEL (compare_policy.c); its policy line is printed by compare_print.c.
#include "compare.h"
#include "compare_model.h"
#include "layout.h"  // fc_divide_factors

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------
// 16-bit comparisons: each element by what the arithmetic can do to it
//
// In lockstep both sides start a step from the same state, so a gradient
// element differs only by the rounding its own computation went through. Every
// 16-bit rounding of a partial sum of that element (a rank's gradient produced
// in param_dtype, a reduction's cast, divide and adds in reduce_dtype, a
// micro-batch's accumulation) moves it by at most u times the partial sum,
// and every partial sum is bounded by mag, the sum of the magnitudes of the
// terms that formed the element (a weight's |x|^T |dy|, a bias's sum of |dy|:
// the magnitude pass, reference/magnitude.c, run from the same state on the
// same batch). With n roundings on the two sides together (side_of()),
// Higham's bound gamma_n sum |x_i| gives, per element,
//     |a - b| <= n u mag + act_scale L s u scale_A + eta   (+ fp32's row at the tensor's scale)
// u = 2^-8 (bf16) or 2^-11 (fp16), the unit roundoff; eta what underflows
// into subnormals may add (side_of()). A side with 16-bit
// parameters that computes its activations in 16 bits too (PyTorch's mixed
// precision; s of them: 0 to 2) has a dy that carries errors the element's
// own terms do not count: act_roundings more roundings per layer above (the
// input gradient crossed them), and an error relative to the whole tensor
// (scale_A = max |A| of the tensor, A's alone) that grows with the L layers
// the input gradient crossed. The reference computes its activations
// in fp32 from the 16-bit parameters it gathers (fc_cmp_ctx.a_act32,
// b_act32): it adds neither.
// Momentum states carry their gradient's allowance through the update
// (exp_avg: (1 - beta1) coef allow; exp_avg_sq: (1 - beta2) coef^2 (2|g| + allow) allow),
// the gradient norm the norm of the allowances.
//
// The whole tensor: rounding errors are independent across elements and of
// either sign. A tensor scaled by (1 + delta) is found by the weighted least
// squares estimate of delta,
//     delta = <B - A, A>_w / <A, A>_w,   w_i = 1 / t_i^2,
// t_i the element's whole allowance (its row and what rounding explains):
// each element counts by how sharply it was judged, |a_i| / t_i, so a tensor
// whose magnitudes span decades (exp_avg_sq = (1 - beta2) g^2) is not judged
// by its few largest elements alone. Every element passed, |b_i - a_i| <= t_i,
// so <B - A, A>_w is a sum of independent terms each within |a_i| / t_i: by
// Hoeffding's inequality it exceeds proj_sigmas sqrt(<A, A>_w) with
// probability below 2 exp(-proj_sigmas^2 / 2). From proj_empirical_n
// elements on, the noise is measured instead, from the residual r = (B - A) -
// delta A: sum (w_i r_i a_i)^2, when smaller (a t-test). What is not
// independent is a scalar an implementation rounds once and applies to every
// element (1/W, a loss scale, in 16 bits: up to u/2 of relative error each):
// proj_floor u allows for them. The whole-tensor sensitivity is proj_floor u
// plus the noise term.

// The unit roundoff of a precision: 2^-8 (bf16, 8 significant bits), 2^-11 (fp16).
double fc_cmp_unit_roundoff(fc_prec p) { return p == FC_PREC_BF16 ? 0x1p-8 : p == FC_PREC_FP16 ? 0x1p-11 : 0x1p-24; }

// Whether dividing by f can round relative to the quotient: a power of two
// divides exactly, but for underflow (side_of()).
static int inexact_divide(double f) {
    int e;
    return frexp(f, &e) != 0.5;
}

// Below the smallest normal a rounding errs by up to half the subnormal
// spacing, whatever the magnitudes: fp16 2^-25 (its smallest normal is 6.1e-5,
// and gradients of 1e-6 are common), bf16 2^-134 (fp32's range).
static double half_subnormal(fc_prec p) { return p == FC_PREC_FP16 ? 0x1p-25 : p == FC_PREC_BF16 ? 0x1p-134 : 0; }

// The layers the input gradient crosses on its way down.
static int depth_of(const fc_run_config *c) { return c->model.kind == FC_MODEL_MLP ? c->model.n_layers : c->model.n_layer; }

// What one side's arithmetic may do to a gradient element.
//  n: its 16-bit roundings, each of a partial sum bounded by the element's
//     magnitude: per micro-batch, the gradient produced in param_dtype, and
//     in reduce_dtype the cast (when the gradient was produced in another
//     dtype), the pre-divide and the post-divide (when their factor is not a
//     power of two: fc_divide_factors), and the W - 1 adds of the reduction;
//     with 16-bit parameters also act_roundings per layer when the side computes its
//     activations in 16 bits (act16): the input gradient a layer receives has
//     crossed every layer above it.
//  eta: the absolute error its underflows may add: per micro-batch, the
//     gradient produced in param_dtype, and in reduce_dtype the cast and each
//     divide by a factor other than 1 (power of two or not; additions of
//     subnormals are exact).
//  act16: 1 when it has 16-bit parameters and computes its activations in 16
//     bits (the act_scale term).
typedef struct {
    int n, act16;
    double eta;
} side_rounding;

static side_rounding side_of(const fc_run_config *c, int W, double divide_by, int act16) {
    int K = c->grad_accum > 0 ? c->grad_accum : 1;
    side_rounding r = {0, c->param_dtype != FC_PREC_FP32 && act16, 0};
    if (c->param_dtype != FC_PREC_FP32) r.n += K + (r.act16 ? FC_CMP_MODEL.act_roundings * depth_of(c) : 0);
    r.eta += K * half_subnormal(c->param_dtype);
    if (c->reduce_dtype != FC_PREC_FP32) {
        double pre, post;
        fc_divide_factors(c->divide, divide_by > 0 ? divide_by : fc_divide_by(c, W), &pre, &post);
        int cast = c->param_dtype != c->reduce_dtype;
        r.n += K * ((W - 1) + cast + inexact_divide(pre) + inexact_divide(post));
        r.eta += K * (cast + (pre != 1) + (post != 1)) * half_subnormal(c->reduce_dtype);
    }
    return r;
}

// Both sides together: A's config and world (B's config at W = 1 when the
// context has none, what `compare` re-runs), then B's; n at least 1.
static side_rounding both_sides(const fc_cmp_ctx *c) {
    const fc_run_config *al = c->a_layout ? c->a_layout : c->layout;
    side_rounding a = side_of(al, c->a_layout ? c->a_world : 1, c->a_divide_by, !c->a_act32);
    side_rounding b = side_of(c->layout, c->world, 0, !c->b_act32);
    int n = a.n + b.n;
    return (side_rounding){n > 0 ? n : 1, a.act16 + b.act16, a.eta + b.eta};
}

// Whether this step is judged by the 16-bit model: a 16-bit default policy,
// the expected side's magnitudes known, and both sides starting from the same
// parameters (in lockstep, or the first step from one init).
int fc_cmp_rounding_model(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    // from bit-identical parameters only: one fp32 ULP apart, a parameter can
    // round to another 16-bit value, and every activation after it moves by u
    return a->grad_mag && fc_cmp_policy_magnitudes(c->policy) && r->prev_diff == 0;
}

int fc_cmp_impl_act32(const char *impl) { return impl && !strcmp(impl, "reference"); }

// The floor's coefficient per side (FC_CMP_MODEL): act_scale per layer the
// input gradient crosses, and few_scale sqrt(few_tokens / NT) for a step of
// NT tokens, whose few terms per element average nothing out.
static double floor_coef(const fc_cmp_ctx *c) {
    const fc_run_config *l = c->layout;
    double nt = (double)l->global_batch * (l->model.kind == FC_MODEL_MLP || l->seq_len < 1 ? 1 : l->seq_len);
    return FC_CMP_MODEL.act_scale * depth_of(l) + FC_CMP_MODEL.few_scale * sqrt(FC_CMP_MODEL.few_tokens / fc_dmax(nt, 1));
}

// [n_units]: the largest |g| of each unit's gradient elements (A's, released as read).
static double *unit_max_of(const fc_cmp_ctx *c, const fc_trace_step *a) {
    const fc_model *m = c->m;
    const float *g = a->grads;
    double *um = callocCheck((size_t)m->n_units, sizeof(double));
    for (int q = 0; q < m->n_params; q++) {
        const fc_param *pq = &m->params[q];
        for (size_t i = pq->offset; i < pq->offset + pq->numel; i++)
            if (isfinite(g[i])) um[pq->unit] = fc_dmax(um[pq->unit], fabs((double)g[i]));
        fc_cmp_release(a, g, pq->offset, pq->numel);
    }
    return um;
}

// In fp32, a side whose arithmetic is not the reference's (PyTorch, a port)
// sums in another order: an element formed by cancellation of larger terms
// (a softmax's input gradient, say) can then differ by u times those terms,
// which no row relative to its own tensor allows when the tensor is all
// cancellation (a LoRA B's first gradient). The terms reach at most the
// largest gradient of the element's unit, so each element is allowed
// floor_coef s u times that: nothing for a tensor within a few decades of
// its unit's largest, all of a tensor below u of it. Not where the step is
// not judged by it: 16 bits, bitwise, an override, both sides the reference,
// or steps that do not start from the same parameters.
static int floor32_applies(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    const fc_cmp_policy *p = c->policy;
    if (p->prec != FC_PREC_FP32 || p->bitwise || p->overridden || r->prev_diff != 0 || !a->grads) return 0;
    return !c->a_act32 + !c->b_act32 > 0;  // the sides computing with another arithmetic
}

fc_cmp_grad_plan fc_cmp_grad_plan_of(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    fc_cmp_grad_plan g = {r->magnitudes ? 1 : floor32_applies(c, a, r) ? 2 : 0, NULL};
    if (g.mode) g.unit_max = unit_max_of(c, a);
    return g;
}

void fc_cmp_grad_plan_free(fc_cmp_grad_plan *g) {
    free(g->unit_max);
    g->unit_max = NULL;
}

// Parameter p's gradient allowance under g into out [params[p].numel]: the
// 16-bit model's, n u mag + coef s u scale_A + coef s u32 unit_A + the
// underflows (FC_CMP_MODEL, floor_coef), or fp32's floor, coef s u32 unit_A.
static void grad_allow_into(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_grad_plan *g, int p,
                            double *out) {
    const fc_param *q = &c->m->params[p];
    size_t lo = q->offset, hi = q->offset + q->numel;
    int par = q->numel > FC_CMP_BLOCK;  // elementwise, and max is exact: no order to keep
    if (g->mode == 2) {
        int s = !c->a_act32 + !c->b_act32;
        double coef = floor_coef(c) * s * fc_cmp_unit_roundoff(FC_PREC_FP32);
        for (size_t i = lo; i < hi; i++) out[i - lo] = coef * g->unit_max[q->unit];
        return;
    }
    side_rounding sr = both_sides(c);
    double u = fc_cmp_unit_roundoff(c->policy->prec), k = sr.n * u;
    // sides that compute in 16 bits: the input gradients they propagate carry
    // errors relative to the tensor, not to the element's own terms; and an
    // element formed by cancellation, errors of fp32 sums relative to its unit
    // (floor32_applies)
    double coef = floor_coef(c) * sr.act16, floor16 = coef * u, floor32 = coef * fc_cmp_unit_roundoff(FC_PREC_FP32);
    double scale = 0;  // A's: B's own values must not widen what B is allowed
#pragma omp parallel for schedule(static) reduction(max : scale) if (par)
    for (size_t i = lo; i < hi; i++)
        if (isfinite(a->grads[i])) scale = fc_dmax(scale, fabs((double)a->grads[i]));
    double fl = floor16 * scale + floor32 * g->unit_max[q->unit];
#pragma omp parallel for schedule(static) if (par)
    for (size_t i = lo; i < hi; i++) out[i - lo] = k * fabs((double)a->grad_mag[i]) + fl + sr.eta;
}

double *fc_cmp_grad_allow(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_grad_plan *g, int p) {
    if (!g->mode) return NULL;
    double *out = fc_cmp_scratch(c->m->params[p].numel);
    grad_allow_into(c, a, g, p, out);
    return out;
}

double *fc_cmp_grad_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    if (!r->magnitudes) return NULL;
    fc_cmp_grad_plan g = {1, unit_max_of(c, a)};
    double *allow = fc_cmp_scratch(c->m->numel);
    for (int p = 0; p < c->m->n_params; p++)
        if (c->only <= 0 || p == c->only - 1) grad_allow_into(c, a, &g, p, allow + c->m->params[p].offset);
    fc_cmp_grad_plan_free(&g);
    return allow;
}

// A rounding of a layer's output y (relative u) moves the loss, to first
// order, by u sum |dL/dy y|; for y = W x + b that is at most sum |dy W x| +
// |dy b| = sum_i mag_i |p_i| over the layer's parameters, which the magnitude
// pass gives (mag_i: the sum of |terms| of gradient element i). Each side that
// computes its activations in 16 bits rounds act_roundings times per layer;
// the reference, in fp32, adds nothing (so two of its runs keep fp32's row).
// The roundings are independent and of either sign, so, as the projection
// test (proj_sigmas), the allowance is proj_sigmas standard deviations of
// their sum, c_i = k u mag_i |p_i| each, when that is below the sum of all.
double fc_cmp_loss_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    if (!r->magnitudes || !a->prev_params) return -1;
    side_rounding sr = both_sides(c);
    if (sr.act16 == 0) return 0;
    double sum = 0, sq = 0;
    for (size_t i = 0; i < c->m->numel; i++) {
        if (!isfinite(a->grad_mag[i]) || !isfinite(a->prev_params[i])) continue;
        double t = fabs((double)a->grad_mag[i]) * fabs((double)a->prev_params[i]);
        sum += t, sq += t * t;
    }
    double k = sr.act16 * FC_CMP_MODEL.act_roundings * fc_cmp_unit_roundoff(c->policy->prec);
    double spread = FC_CMP_MODEL.proj_sigmas * sqrt(sq);
    return k * (spread < sum ? spread : sum);
}

// What a momentum state may differ by when its gradient may differ by
// allow_g: the state's update carries it (and each side clips by its own
// norm: the coefficients' difference times |g|). NULL for other states.
double *fc_cmp_state_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b,
                               const char *state, const double *allow_g, int p) {
    const fc_optim_config *o = c->optim;
    if (!allow_g || !o || !a->grads) return NULL;
    int sq = 0;
    double w;
    if (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg")) w = 1.0 - o->beta1;
    else if (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg_sq")) w = 1.0 - o->beta2, sq = 1;
    else if (o->kind == FC_OPT_SGD && !strcmp(state, "momentum_buffer")) w = 1.0 - o->dampening;
    else return NULL;
    double ca = fc_cmp_clip_coef(c, a), dc = fabs(ca - fc_cmp_clip_coef(c, b));
    size_t off = c->m->params[p].offset, n = c->m->params[p].numel;
    double *allow = fc_cmp_scratch(n);
#pragma omp parallel for schedule(static) if (n > FC_CMP_BLOCK)
    for (size_t j = 0; j < n; j++) {
        double g = fabs((double)a->grads[off + j]), dg = ca * allow_g[j] + dc * g;
        allow[j] = sq ? w * (2 * ca * g + dg) * dg : w * dg;  // v: (1 - beta2) ((g + dg)^2 - g^2)
    }
    return allow;
}

double fc_cmp_state_common(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, const char *state,
                           int rounding) {
    const fc_optim_config *o = c->optim;
    if (!o) return 0;
    int sq = o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg_sq");
    int momentum = sq || (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg")) ||
                   (o->kind == FC_OPT_SGD && !strcmp(state, "momentum_buffer"));
    double ca = fc_cmp_clip_coef(c, a);
    if (!momentum || !(ca > 0)) return 0;
    double rel = fabs(ca - fc_cmp_clip_coef(c, b)) / ca;
    // the projection's floor (proj_floor u, a scalar rounded once into every
    // gradient element) counts once for g and once more for g^2
    double twice = sq && rounding ? FC_CMP_MODEL.proj_floor * fc_cmp_unit_roundoff(c->policy->prec) : 0;
    return sq ? rel * (2 + rel) + twice : rel;  // (c (1 + rel))^2 = c^2 (1 + 2 rel + rel^2)
}

#define NORM_CHUNK 64  // blocks read between releases: 16 MB of each side's gradients

// What the two gradients explain of the two norms: |norm(A) - norm(B)| <=
// norm(A - B), for every norm (the reverse triangle inequality), so a norm
// that differs by more than its gradients do was not computed from them: a
// partial counted twice, a group missed, an eps added per rank. Element
// differences in double; equal elements (an inf on both sides too) add 0, a
// non-finite difference makes it inf (the gradients' own check names it).
static double norm_allowance(const fc_cmp_ctx *c, const float *ga, const float *gb, const fc_trace_step *sa,
                             const fc_trace_step *sb) {
    if (!ga || !gb) return INFINITY;  // nothing to bound it by
    fc_norm_type t = c->layout ? c->layout->norm_type : FC_NORM_2;
    size_t n = c->m->numel, nb = fc_cmp_blocks(n);
    double *part = callocCheck(nb, sizeof(double));  // [nb] each block's share, in block order below
    for (size_t k0 = 0; k0 < nb; k0 += NORM_CHUNK) {
        size_t k1 = k0 + NORM_CHUNK < nb ? k0 + NORM_CHUNK : nb;
#pragma omp parallel for schedule(static) if (k1 - k0 > 1)
        for (size_t k = k0; k < k1; k++) {
            double acc = 0;
            for (size_t i = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, n); i < hi; i++) {
                if (ga[i] == gb[i]) continue;
                double d = fabs((double)ga[i] - (double)gb[i]);
                if (!isfinite(d)) {
                    acc = INFINITY;
                    break;
                }
                acc = t == FC_NORM_INF ? fc_dmax(acc, d) : t == FC_NORM_1 ? acc + d : acc + d * d;
            }
            part[k] = acc;
        }
        size_t lo = k0 * FC_CMP_BLOCK, hi = fc_cmp_block_end(k1 - 1, n);
        fc_cmp_release(sa, ga, lo, hi - lo);
        fc_cmp_release(sb, gb, lo, hi - lo);
    }
    double acc = 0;
    for (size_t k = 0; k < nb; k++) acc = t == FC_NORM_INF ? fc_dmax(acc, part[k]) : acc + part[k];
    free(part);
    return t == FC_NORM_2 ? sqrt(acc) : acc;
}

double fc_cmp_norm_allowance(const fc_cmp_ctx *c, const float *ga, const float *gb) {
    return norm_allowance(c, ga, gb, NULL, NULL);
}

double fc_cmp_norm_allowance_of(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b) {
    return norm_allowance(c, a->grads, b->grads, a, b);
}

// The whole tensor of n elements under rounding noise (FC_CMP_MODEL):
// allow[i] what rounding explains of element i, row what its row allows at the
// tensor's scale; ntol the row's own whole-tensor tolerance.
fc_cmp_proj fc_cmp_projection(const fc_cmp_policy *p, double ntol, const float *a, const float *b,
                              const double *allow, double row, size_t n) {
    size_t nb = fc_cmp_blocks(n);
    double *part = callocCheck(3 * nb, sizeof(double));  // [nb][3]: <B - A, A>_w, <A, A>_w, the residual's
    size_t *used = callocCheck(nb, sizeof(size_t));
#pragma omp parallel for schedule(static) if (nb > 1)
    for (size_t k = 0; k < nb; k++)
        for (size_t i = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, n); i < hi; i++) {
            double t = allow[i] + row;
            if (!isfinite(a[i]) || !isfinite(b[i]) || !(t > 0)) continue;
            double w = 1 / (t * t);
            part[3 * k] += w * ((double)b[i] - (double)a[i]) * (double)a[i];
            part[3 * k + 1] += w * (double)a[i] * (double)a[i];
            used[k]++;
        }
    double num = 0, aw = 0;  // <B - A, A>_w, <A, A>_w
    size_t n_used = 0;
    for (size_t k = 0; k < nb; k++) num += part[3 * k], aw += part[3 * k + 1], n_used += used[k];
    fc_cmp_proj r = {0, 0};
    if (!(aw > 0)) {
        r.delta = num != 0 ? INFINITY : 0;  // A is zero where it was judged: B must be too
        free(part);
        free(used);
        return r;
    }
    r.delta = num / aw;
    double noise = aw;  // Hoeffding: sum (|a_i| / t_i)^2
    if (n_used >= FC_CMP_MODEL.proj_empirical_n) {
#pragma omp parallel for schedule(static) if (nb > 1)
        for (size_t k = 0; k < nb; k++)
            for (size_t i = k * FC_CMP_BLOCK, hi = fc_cmp_block_end(k, n); i < hi; i++) {
                double t = allow[i] + row;
                if (!isfinite(a[i]) || !isfinite(b[i]) || !(t > 0)) continue;
                double ri = ((double)b[i] - (double)a[i]) - r.delta * (double)a[i];
                double term = ri * (double)a[i] / (t * t);
                part[3 * k + 2] += term * term;
            }
        double emp = 0;
        for (size_t k = 0; k < nb; k++) emp += part[3 * k + 2];
        if (emp < noise) noise = emp;
    }
    free(part);
    free(used);
    r.allowed = FC_CMP_MODEL.proj_sigmas * sqrt(noise) / aw + FC_CMP_MODEL.proj_floor * fc_cmp_unit_roundoff(p->prec) + ntol;
    return r;
}
