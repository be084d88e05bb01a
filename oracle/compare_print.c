// oracle/compare_print.c — the comparison's printed form, the top layer of the
// engine's files (nothing below prints): the policy and the 16-bit model's
// line, the rows table and the first divergence with its owner.
#include "compare.h"
#include "compare_model.h"

#include <math.h>
#include <string.h>

const char *fc_cmp_fmt_err(double x, char *buf, size_t cap) {
    if (isinf(x)) snprintf(buf, cap, "inf");
    else if (x == 0) snprintf(buf, cap, "0");
    else snprintf(buf, cap, "%.3g", x);
    return buf;
}

void fc_cmp_fmt_tol(const fc_tol *t, char *buf, size_t cap) {
    if (t->exact) snprintf(buf, cap, "exact");
    else if (t->atol > 0) snprintf(buf, cap, "rtol %g ntol %g atol %g", t->rtol, t->ntol, t->atol);
    else if (t->ntol > 0) snprintf(buf, cap, "rtol %g ntol %g", t->rtol, t->ntol);
    else snprintf(buf, cap, "rtol %g", t->rtol);
    size_t n = strlen(buf);
    // a diverged row grows with the previous parameters' relative difference
    if (!t->exact && t->kappa > 0 && n < cap) snprintf(buf + n, cap - n, ", each + %g x prev dP", t->kappa);
}

void fc_cmp_fmt_kind_tol(fc_cmp_kind k, const fc_tol *t, char *buf, size_t cap) {
    fc_cmp_fmt_tol(t, buf, cap);
    size_t n = strlen(buf);
    // the norm's own rounding, plus what its gradients explain (compare.c)
    if (k == FC_CMP_NORM && !t->exact && n < cap) snprintf(buf + n, cap - n, " + ||gA - gB||");
}

void fc_cmp_print_header(FILE *f) {
    fprintf(f, "%6s  %-4s  %8s  %-5s  %7s  %11s  %12s  %11s  %11s  %8s  %s\n", "step", "row", "prev dP", "kind",
            "tensors", "max abs err", "max err/scale", "ULP@scale", "norm ratio", "of tol", "result");
}

void fc_cmp_print_rows(FILE *f, const fc_cmp_result *r) {
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        const fc_cmp_kind_stats *s = &r->kinds[k];
        if (s->n_tensors == 0) continue;
        char a[32], b[32], u[32], n[32], h[32], pd[32];
        fprintf(f, "%6ld  %-4s  %8s  %-5s  %7d  %11s  %12s  %11s  %11s  %8s  ", r->step, r->lockstep ? "lock" : "div",
                r->prev_diff < 0 ? "?" : fc_cmp_fmt_err(r->prev_diff, pd, sizeof pd), fc_cmp_kind_name((fc_cmp_kind)k), s->n_tensors,
                fc_cmp_fmt_err(s->max_abs, a, sizeof a), fc_cmp_fmt_err(s->max_scaled, b, sizeof b),
                fc_cmp_fmt_err(s->max_ulp, u, sizeof u), fc_cmp_fmt_err(s->norm_ratio, n, sizeof n),
                k == FC_CMP_BATCH ? "-" : fc_cmp_fmt_err(s->headroom, h, sizeof h));
        if (s->n_failed) fprintf(f, "FAIL (%d of %d tensors)\n", s->n_failed, s->n_tensors);
        else fprintf(f, "pass\n");
    }
}

static void format_value(const fc_cmp_divergence *d, double v, uint32_t bits, char *buf, size_t cap) {
    if (!d->is_float) snprintf(buf, cap, "%.0f", v);
    else if (d->is_float == 2) snprintf(buf, cap, "%.17g", v);  // a double: 17 digits tell any two apart
    else if (isnan(v)) snprintf(buf, cap, "%snan (0x%08x)", signbit(v) ? "-" : "", bits);
    else snprintf(buf, cap, "%.9g (0x%08x)", v, bits);  // 9 digits tell every pair of floats apart
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
    char idx[160], va[64], vb[64], ae[32], sc[32], se[32], u[32], al[32], ex[32], nr[32], tol[64];
    format_index(d, idx, sizeof idx);
    format_value(d, d->a, d->a_bits, va, sizeof va);
    format_value(d, d->b, d->b_bits, vb, sizeof vb);
    fc_cmp_fmt_tol(&d->tol, tol, sizeof tol);
    fprintf(f, "first divergence: step %ld, tensor %s, %s%s\n", d->step, d->tensor, idx,
            d->whole_tensor ? " (its largest error: the tensor fails as a whole)" : "");
    fprintf(f, "  A = %s\n  B = %s\n", va, vb);
    if (d->tol.exact) {
        fprintf(f, "  error: abs %s; allowed: exact\n", fc_cmp_fmt_err(d->abs_err, ae, sizeof ae));
    } else {
        fprintf(f, "  error: abs %s", fc_cmp_fmt_err(d->abs_err, ae, sizeof ae));
        if (d->explained > 0)
            fprintf(f, " (of which %s explains %s)", d->rounding ? "16-bit rounding of its terms" : "the optimizer",
                    fc_cmp_fmt_err(d->explained, ex, sizeof ex));
        fprintf(f, " = %s of the tensor's scale %s, %s ULP at that scale; allowed %s (%s)\n",
                fc_cmp_fmt_err(d->scaled, se, sizeof se), fc_cmp_fmt_err(d->scale, sc, sizeof sc),
                fc_cmp_fmt_err(d->ulp, u, sizeof u), fc_cmp_fmt_err(d->allowed, al, sizeof al), tol);
        if (d->whole_tensor)
            fprintf(f, "  whole tensor: %s = %s, allowed %.3g\n",
                    d->projection ? "|<B - A, A>_w| / <A, A>_w (16-bit rounding: its projection on A, w = 1/allowance^2)" : "||A - B|| / ||A||",
                    fc_cmp_fmt_err(d->norm_ratio, nr, sizeof nr), d->norm_allowed);
    }
    fprintf(f, "  owner under B's layout: %s\n", d->owner_text);
    if (d->note[0]) fprintf(f, "  note: %s\n", d->note);
}

// The policy line that states the 16-bit model (nothing when it does not apply).
static void print_model(FILE *f, const fc_cmp_policy *p) {
    if (!fc_cmp_policy_magnitudes(p)) return;
    fprintf(f, "  %s, steps both sides start from equal parameters: grad, norm and optim per element within fp32's "
               "row + n u mag + k s u max|A| + k s u32 max|A_unit|, k = %g L + %g sqrt(%g / NT) (mag: the magnitude "
               "pass; n: the 16-bit roundings of both sides; L: the model's layers; NT: the step's tokens; s: sides "
               "computing activations in 16 bits, PyTorch's mixed precision or a port's, not the reference; A_unit: "
               "the element's unit), the whole tensor by its projection on A weighted by 1/allowance^2; the loss "
               "within fp32's row + %d s u sum mag |p| (p: the parameters the step starts from); the %s rows below "
               "judge only the rest (--trajectory, or other starts)\n",
            fc_prec_name(p->prec), FC_CMP_MODEL.act_scale, FC_CMP_MODEL.few_scale, FC_CMP_MODEL.few_tokens,
            FC_CMP_MODEL.act_roundings, fc_prec_name(p->prec));
}

void fc_cmp_print_policy(FILE *f, const fc_cmp_policy *p) {
    if (p->bitwise) {
        fprintf(f, "policy: --bitwise (A is expected): identical bits in every kind\n");
        return;
    }
    fprintf(f, "policy: %s (A is expected; per element |A - B| <= atol + rtol * scale, scale = max|A|, max|B| of "
               "the tensor (of the terms they sum for exp_avg and momentum_buffer); per tensor ||A - B|| <= ntol * "
               "||A||; parameters also allow what the optimizer explains)\n",
            p->overridden ? "--rtol/--atol override" : fc_prec_name(p->prec));
    print_model(f, p);
    for (int row = 0; row < 2; row++) {
        const fc_tol *t = row ? p->div : p->tol;
        fprintf(f, "  %s (%s):", row ? "diverged" : "lockstep", fc_prec_name(row ? p->prec_div : p->prec));
        for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
            char s[64];
            fc_cmp_fmt_kind_tol((fc_cmp_kind)k, &t[k], s, sizeof s);
            fprintf(f, "%s %s %s", k ? ";" : "", fc_cmp_kind_name((fc_cmp_kind)k), s);
        }
        fputc('\n', f);
    }
}
