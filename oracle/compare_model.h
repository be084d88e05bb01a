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

// The double arrays below, one tensor's allowances each (up to three at once),
// come from here and go back with fc_cmp_scratch_release: a released one is
// kept for the next request of its size or less, since every tensor of every
// step asks again. From malloc each would be an mmap of its own whose pages the
// kernel zeroes at every first touch.
// Not thread-safe (compare calls it from one thread; OpenMP only inside).
double *fc_cmp_scratch(size_t n);
void fc_cmp_scratch_release(double *p);  // NULL: nothing

// Tells s's owner that elements [off, off + n) of set (one of s's [numel]
// sets) are read for now (fc_trace_step.release): a mapped trace drops their
// pages, so a comparison holds one tensor of a step at a time, not the step.
// Nothing when s, set or the hook is NULL.
void fc_cmp_release(const fc_trace_step *s, const float *set, size_t off, size_t n);
// The same for elements [off, off + n) of every set of both steps.
void fc_cmp_release_all(const fc_trace_step *a, const fc_trace_step *b, size_t off, size_t n);

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
// gradient element by; NULL when the step is not judged by the model. The
// whole model at once (the engine asks fc_cmp_grad_allow per tensor); release
// it with fc_cmp_scratch_release.
double *fc_cmp_grad_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// A step's allowance of each gradient element, asked one parameter at a time:
// the 16-bit model's (rounding), else, in fp32, what another arithmetic's order
// may move an element formed by cancellation by (act_scale L s u times its
// unit's largest gradient), else none.
typedef struct {
    int mode;          // 0: none, 1: the 16-bit model (the whole tensor judged by its projection), 2: fp32's floor
    double *unit_max;  // [n_units] A's largest finite |g| per unit (NULL when mode is 0)
} fc_cmp_grad_plan;
fc_cmp_grad_plan fc_cmp_grad_plan_of(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
void fc_cmp_grad_plan_free(fc_cmp_grad_plan *g);
// [params[p].numel] from fc_cmp_scratch: parameter p's gradient allowance
// under g; NULL when g has none. Every per-parameter array here and below is
// indexed from the parameter's first element; release it with fc_cmp_scratch_release.
double *fc_cmp_grad_allow(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_grad_plan *g, int p);
// The loss's allowance (absolute) under the model: what the 16-bit roundings
// of the sides computing their activations in 16 bits move it by; -1 when the
// step is not judged by the model.
double fc_cmp_loss_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r);
// [params[p].numel]: parameter p's gradient allowance allow_g (the same
// indexing) carried into a momentum state (exp_avg, exp_avg_sq,
// momentum_buffer); NULL for other states or without allow_g.
double *fc_cmp_state_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b,
                               const char *state, const double *allow_g, int p);
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
// The same of two steps' gradients, released (fc_cmp_release) as they are read.
double fc_cmp_norm_allowance_of(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b);
// The whole tensor under rounding noise: delta, the weighted projection of B -
// A on A (w_i = 1 / (allow_i + row)^2), and what |delta| may reach.
typedef struct {
    double delta, allowed;
} fc_cmp_proj;
fc_cmp_proj fc_cmp_projection(const fc_cmp_policy *p, double ntol, const float *a, const float *b,
                              const double *allow, double row, size_t n);

// --- what the optimizer explains (compare_optim.c) ---

// [params[p].numel]: what each element of parameter p may differ by from the
// two sides' optimizer inputs; NULL when they are not all there.
double *fc_cmp_optimizer_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, int p);
// The clip coefficient a side applied to its gradient (1 without clipping).
double fc_cmp_clip_coef(const fc_cmp_ctx *c, const fc_trace_step *s);
// [params[p].numel]: the magnitude of the two terms a momentum state sums; NULL for other states.
double *fc_cmp_momentum_terms(const fc_cmp_ctx *c, const fc_trace_step *a, const char *state, int p);

#endif
