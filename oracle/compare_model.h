// oracle/compare_model.h — private to the comparison engine's files
// (compare*.c): the bottom layer's scratch (compare_base.c), the 16-bit
// model's constants (compare_policy.c), what the engine asks of the 16-bit
// model (compare_model.c) and of the optimizer's explanations
// (compare_optim.c). The public interface is compare.h.
#ifndef FC_COMPARE_MODEL_H
#define FC_COMPARE_MODEL_H

#include <stddef.h>

#include "compare.h"

static inline double fc_dmax(double a, double b) { return a > b ? a : b; }

// Large tensors are judged in blocks of FC_CMP_BLOCK elements on OpenMP
// threads. Every sum over a tensor is added within each block in element
// order, then over the blocks in block order: no verdict and no printed
// figure depends on the thread count, and a tensor of one block is summed as
// a plain loop would. Block k is [k B, min((k + 1) B, n)).
enum { FC_CMP_BLOCK = 1 << 16 };
static inline size_t fc_cmp_blocks(size_t n) { return n ? (n + FC_CMP_BLOCK - 1) / FC_CMP_BLOCK : 1; }
static inline size_t fc_cmp_block_end(size_t k, size_t n) {
    return (k + 1) * FC_CMP_BLOCK < n ? (k + 1) * FC_CMP_BLOCK : n;
}

// --- scratch for the per-element allowances (compare_base.c) ---

// The [numel] double arrays below (1 GB each at gpt2-124m, up to four a step)
// come from here and go back with fc_cmp_scratch_release: a released one is
// kept for the next request of its size or less, since every step asks for the
// same ones. From malloc each would be an mmap of its own whose pages the kernel
// zeroes at every first touch: a step of gpt2-124m's compare faulted 4 GB in.
// Not thread-safe (compare calls it from one thread; OpenMP only inside).
double *fc_cmp_scratch(size_t n);
void fc_cmp_scratch_release(double *p);  // NULL: nothing

// --- the 16-bit model's constants (compare_policy.c holds them, once) ---

// How the model bounds what rounding does, per element and per tensor (u the
// unit roundoff of the comparison's precision; the measurements behind each:
// docs/measurements/tolerance-calibration.md).
typedef struct {
    int act_roundings;        // extra roundings per layer above an element, for a side whose activations are 16-bit
    double act_scale;         // that side's error relative to the tensor: this times L u max|A| (L: the layers)
    double few_scale;         // and this times sqrt(few_tokens / NT) u max|A| for a step of NT tokens
    double few_tokens;
    double proj_sigmas;       // the projection on A may reach this many standard deviations of its noise
    size_t proj_empirical_n;  // from this many judged elements on, the noise is also measured from the residual
    double proj_floor;        // times u: scalars a side rounds once and applies to every element (1/W, a loss scale)
} fc_cmp_model_consts;
extern const fc_cmp_model_consts FC_CMP_MODEL;

// --- the 16-bit model (compare_model.c) ---

// The unit roundoff of a precision: 2^-8 (bf16), 2^-11 (fp16), 2^-24 (fp32).
double fc_cmp_unit_roundoff(fc_prec p);
// Whether this step is judged by the model (a 16-bit default policy, A's
// magnitudes known, both sides starting from bit-identical parameters).
int fc_cmp_rounding_model(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// Per element of the flat parameter vector [numel]: what rounding may move a
// gradient element by; NULL when the step is not judged by the model. Every [numel] array
// here and below comes from fc_cmp_scratch: release it with fc_cmp_scratch_release.
double *fc_cmp_grad_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// [numel]: in fp32, what another arithmetic's order may move an element
// formed by cancellation by (act_scale L s u times its unit's largest
// gradient); NULL where it does not apply.
double *fc_cmp_grad_floor32(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// The loss's allowance (absolute) under the model: what the 16-bit roundings
// of the sides computing their activations in 16 bits move it by; -1 when the
// step is not judged by the model.
double fc_cmp_loss_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// [numel]: the same carried into a momentum state (exp_avg, exp_avg_sq,
// momentum_buffer); NULL for other states or without allow_g.
double *fc_cmp_state_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b,
                               const char *state, const double *allow_g);
// The relative scale of a whole momentum state that the two sides' clip
// coefficients explain: every element of the step's term carries the same
// coefficient, so its relative difference is common to the tensor (twice it
// for exp_avg_sq, a square; under the 16-bit model (rounding) its projection
// floor twice too). 0 for other states.
double fc_cmp_state_common(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, const char *state,
                           int rounding);
// The gradient norm's allowance from the gradients: norm(ga - gb) [numel each]
// in the layout's norm type; inf when a side has no gradients.
double fc_cmp_norm_allowance(const fc_cmp_ctx *c, const float *ga, const float *gb);
// The whole tensor under rounding noise: delta, the weighted projection of B -
// A on A (w_i = 1 / (allow_i + row)^2), and what |delta| may reach.
typedef struct {
    double delta, allowed;
} fc_cmp_proj;
fc_cmp_proj fc_cmp_projection(const fc_cmp_policy *p, double ntol, const float *a, const float *b,
                              const double *allow, double row, size_t n);

// --- what the optimizer explains (compare_optim.c) ---

// [numel]: what each parameter element may differ by from the two sides'
// optimizer inputs; NULL when they are not all there.
double *fc_cmp_optimizer_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b);
// The clip coefficient a side applied to its gradient (1 without clipping).
double fc_cmp_clip_coef(const fc_cmp_ctx *c, const fc_trace_step *s);
// [numel]: the magnitude of the two terms a momentum state sums; NULL for other states.
double *fc_cmp_momentum_terms(const fc_cmp_ctx *c, const fc_trace_step *a, const char *state);

#endif
