// oracle/compare_policy.c — the tolerance policy, numbers only: the rows every
// comparison is judged by, per kind and precision, and the 16-bit model's
// constants, each written once here; how a comparison's precision and policy
// are chosen. The model that uses the constants is compare_model.c; the
// policy's printed form is compare_print.c.
#include "compare.h"
#include "compare_model.h"

#include <string.h>

// ---------------------------------------------------------------------------
// the tolerance numbers, once
//
// Every number is a measured noise floor times a stated margin (10x for fp32,
// 2x for bf16 and fp16, 4x for the norm): docs/measurements/tolerance-calibration.md
// has the measurements, the commit and machine, and the scripts that redo them.
// The fields are fc_tol's (compare.h), each a fraction of the tensor's scale.
// A diverged row is its lockstep row with .kappa, how it grows with the
// parameters' relative difference d (rtol + kappa d, ntol + kappa d), so the
// shared rtol and ntol are written once below, per precision and kind.

#define EXACT_ROW {.exact = 1}
// The total gradient norm is judged by its own rounding (plus what its
// gradients explain, compare.c), the same at every precision and step: it is
// computed from fp32 gradients whatever the policy.
#define NORM_ROW {.rtol = 6e-7}
// Parameters beyond what the optimizer explains, at every precision: the
// explained part is their allowance (compare.h), so the row is fp32's.
#define PARAM_ROW {.rtol = 3.3e-6, .ntol = 9.4e-7}

#define FP32_LOSS .rtol = 1.2e-6
#define FP32_GRAD .rtol = 3.6e-5, .ntol = 1.5e-5
#define FP32_OPTIM .rtol = 4e-5, .ntol = 2.4e-5
#define BF16_GRAD .rtol = 0.4, .ntol = 0.34
#define BF16_OPTIM .rtol = 0.72, .ntol = 0.72
#define FP16_LOSS .rtol = 1.2e-5
#define FP16_GRAD .rtol = 0.08, .ntol = 0.083
#define FP16_OPTIM .rtol = 0.09, .ntol = 0.071

const fc_tol FC_CMP_LOCKSTEP[3][FC_CMP_KIND_COUNT] = {
    [FC_PREC_FP32] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {FP32_LOSS}, [FC_CMP_NORM] = NORM_ROW,
                      [FC_CMP_GRAD] = {FP32_GRAD}, [FC_CMP_PARAM] = PARAM_ROW, [FC_CMP_OPTIM] = {FP32_OPTIM}},
    [FC_PREC_BF16] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {.rtol = 1.8e-4}, [FC_CMP_NORM] = NORM_ROW,
                      [FC_CMP_GRAD] = {BF16_GRAD}, [FC_CMP_PARAM] = PARAM_ROW, [FC_CMP_OPTIM] = {BF16_OPTIM}},
    [FC_PREC_FP16] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {FP16_LOSS}, [FC_CMP_NORM] = NORM_ROW,
                      [FC_CMP_GRAD] = {FP16_GRAD}, [FC_CMP_PARAM] = PARAM_ROW, [FC_CMP_OPTIM] = {FP16_OPTIM}},
};

const fc_tol FC_CMP_DIVERGED[3][FC_CMP_KIND_COUNT] = {
    [FC_PREC_FP32] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {FP32_LOSS}, [FC_CMP_NORM] = NORM_ROW,
                      [FC_CMP_GRAD] = {FP32_GRAD, .kappa = 5.7}, [FC_CMP_PARAM] = PARAM_ROW,
                      [FC_CMP_OPTIM] = {FP32_OPTIM, .kappa = 4.3}},
    // the bf16 loss starts higher once diverged: a parameter difference of any
    // size can flip a bf16 cast of a weight by one bf16 step
    [FC_PREC_BF16] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {.rtol = 1.2e-3, .kappa = 1.5},
                      [FC_CMP_NORM] = NORM_ROW, [FC_CMP_GRAD] = {BF16_GRAD, .kappa = 2.3}, [FC_CMP_PARAM] = PARAM_ROW,
                      [FC_CMP_OPTIM] = {BF16_OPTIM, .kappa = 2.4}},
    [FC_PREC_FP16] = {[FC_CMP_BATCH] = EXACT_ROW, [FC_CMP_LOSS] = {FP16_LOSS, .kappa = 0.9}, [FC_CMP_NORM] = NORM_ROW,
                      [FC_CMP_GRAD] = {FP16_GRAD, .kappa = 1.6}, [FC_CMP_PARAM] = PARAM_ROW,
                      [FC_CMP_OPTIM] = {FP16_OPTIM, .kappa = 1.2}},
};

// The 16-bit model's numbers (the fields are documented in compare_model.h).
const fc_cmp_model_consts FC_CMP_MODEL = {
    .act_roundings = 4,
    .act_scale = 0.5,
    .few_scale = 4.7,
    .few_tokens = 8,
    .proj_sigmas = 6.0,
    .proj_empirical_n = 256,
    .proj_floor = 1.0,
};

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
    p->prec = p->prec_div = prec;
    p->lockstep = FC_CMP_LOCKSTEP[prec][FC_CMP_PARAM].rtol;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = FC_CMP_LOCKSTEP[prec][k], p->div[k] = FC_CMP_DIVERGED[prec][k];
}

void fc_cmp_policy_same_compute(fc_cmp_policy *p, const fc_run_config *a, const fc_run_config *b) {
    fc_run_config ra = *a, rb = *b;
    ra.param_dtype = rb.param_dtype = FC_PREC_FP32;  // the reductions alone
    fc_prec lock = fc_cmp_precision(&ra, &rb), div = fc_cmp_precision(a, b);
    fc_cmp_policy_defaults(p, div);
    p->prec = lock;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = FC_CMP_LOCKSTEP[lock][k];
}

void fc_cmp_policy_of(fc_cmp_policy *p, const fc_run_config *a, const fc_run_config *b, int same_compute) {
    if (same_compute) fc_cmp_policy_same_compute(p, a, b);
    else fc_cmp_policy_defaults(p, fc_cmp_precision(a, b));
}

void fc_cmp_policy_override(fc_cmp_policy *p, int has_rtol, double rtol, int has_atol, double atol) {
    if (!has_rtol && !has_atol) return;
    p->overridden = 1;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        if (p->tol[k].exact) continue;  // the batch stays exact: it is data, not arithmetic
        fc_tol *rows[2] = {&p->tol[k], &p->div[k]};
        for (int i = 0; i < 2; i++) {
            if (has_rtol) {
                // the norm check scales with the element check it accompanies
                if (rows[i]->rtol > 0) rows[i]->ntol *= rtol / rows[i]->rtol;
                rows[i]->rtol = rtol;
            }
            if (has_atol) rows[i]->atol = atol;
        }
    }
}

void fc_cmp_policy_bitwise(fc_cmp_policy *p) {
    p->bitwise = 1;
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = p->div[k] = (fc_tol)EXACT_ROW;
}

int fc_cmp_policy_magnitudes(const fc_cmp_policy *p) { return p->prec != FC_PREC_FP32 && !p->bitwise && !p->overridden; }

