// oracle/compare.h — the comparison engine: the one tolerance policy, per-tensor
// error statistics, the first divergence and the rank that owns it (docs/contract.md §8).
//
// Every judgement fsdpcheck makes goes through it: `compare DIR_A DIR_B`
// (compare_cmd.c) on two traces, `check` and `sweep` and the MPI property
// programs on runs they hold in memory. A is the expected side (the
// reference), B the side under test; the owner of a divergent element is
// computed under B's layout.
//
// The policy (compare_policy.c holds its numbers, once; the 16-bit model is
// compare_model.c; the measurements are docs/measurements/tolerance-calibration.md):
//  - An element's error is judged against its tensor's scale, not against
//    itself and not against a fixed absolute floor: with s = max(max|A|, max|B|)
//    over the tensor, b passes when |a - b| <= atol + rtol * s, where atol is
//    0 unless --atol sets one. A tensor that is all zero on both sides has
//    s = 0 and must match exactly. Scalars (loss, gradient norm) have s = |a|.
//  - The whole tensor must also pass ||A - B||_2 <= ntol * ||A||_2, which
//    catches a small error spread over every element.
//  - Parameters after an optimizer step may differ, beyond the rounding of the
//    step itself, by what the two sides' own optimizer inputs explain: the
//    previous parameters' difference, carried by the step (AdamW's decay,
//    SGD's identity), plus the difference of the two updates, computed per
//    element from each side's optimizer state (AdamW: lr m_hat / (sqrt(v_hat)
//    + eps); SGD: lr times the momentum buffer or gradient). An element whose
//    gradient sits at rounding noise can legitimately flip an AdamW update of
//    +-lr; anything else added to a parameter is an error.
//  - Infinities must be equal; NaN matches NaN only. The batch is exact (it is
//    the data: a mismatch means the runs trained on different samples).
//  - rtol and ntol per kind and precision; the precision of a comparison is
//    the least precise param_dtype / reduce_dtype of the two runs. --rtol,
//    --atol replace them for every float kind; --bitwise requires identical
//    bits everywhere.
#ifndef FC_COMPARE_H
#define FC_COMPARE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "config.h"
#include "data.h"
#include "dtype.h"
#include "model.h"
#include "trace.h"

// Comparison kinds, in the order a step is compared: the batch first (if the
// data differ, nothing after it can agree), then what the data produce.
typedef enum {
    FC_CMP_BATCH,   // batch.input, batch.target: always bitwise
    FC_CMP_LOSS,    // the global mean loss
    FC_CMP_NORM,    // clip_grad_norm's total gradient norm (when both sides report it)
    FC_CMP_GRAD,    // grad.<name>
    FC_CMP_PARAM,   // param.<name>
    FC_CMP_OPTIM,   // optim.<state>.<name>
    FC_CMP_KIND_COUNT
} fc_cmp_kind;

#define FC_CMP_ALL ((1u << FC_CMP_KIND_COUNT) - 1)
#define FC_CMP_MASK(k) (1u << (k))

const char *fc_cmp_kind_name(fc_cmp_kind k);  // "batch", "loss", ...

typedef struct {
    double rtol;         // element: |a - b| <= atol + rtol * scale
    double atol;         // 0 unless --atol
    double ntol;         // tensor: ||A - B||_2 <= ntol * ||A||_2 (0: not checked, as for scalars)
    int exact;           // bitwise equality required (batch, or --bitwise)
    double kappa;        // diverged rows: rtol and ntol grow by kappa times the relative difference
                         // of the parameters the step started from (a gradient moves with its inputs)
} fc_tol;

// The documented defaults, two rows per precision (compare_policy.c; the
// measurements: docs/measurements/tolerance-calibration.md):
// FC_CMP_LOCKSTEP[precision][kind] for a step both runs start
// from the same parameters (up to the parameter tolerance: the first step of
// two runs from one init, and every step while they stay in lockstep), and
// FC_CMP_DIVERGED for a step after AdamW has legitimately turned a
// noise-level gradient into a parameter difference beyond rounding, which
// 16-bit compute then carries into every later gradient.
extern const fc_tol FC_CMP_LOCKSTEP[3][FC_CMP_KIND_COUNT];
extern const fc_tol FC_CMP_DIVERGED[3][FC_CMP_KIND_COUNT];

typedef struct {
    fc_prec prec;        // the precision the lockstep row came from
    fc_prec prec_div;    // the precision the diverged row came from
    fc_tol tol[FC_CMP_KIND_COUNT];   // lockstep
    fc_tol div[FC_CMP_KIND_COUNT];   // diverged
    double lockstep;     // the runs start a step in lockstep while their parameters differ by at most
                         // this much of each tensor's scale (the default parameter rtol; no flag changes it)
    int bitwise;         // --bitwise: every kind exact
    int overridden;      // --rtol/--atol replaced the defaults of the float kinds
} fc_cmp_policy;

// The precision a comparison of two runs is judged at: the least precise of
// both configs' param_dtype and reduce_dtype (bf16 < fp16 < fp32), since
// gradients reduced in bf16 carry bf16 rounding even with fp32 parameters.
fc_prec fc_cmp_precision(const fc_run_config *a, const fc_run_config *b);
void fc_cmp_policy_defaults(fc_cmp_policy *p, fc_prec prec);
// Two runs that share their per-rank arithmetic (one implementation at one W
// on one data split, differing only in the reduction tree, prefetch or
// offload) differ in lockstep only by their reductions: the lockstep row is
// the reduce_dtype's, the diverged row the least precise dtype's.
void fc_cmp_policy_same_compute(fc_cmp_policy *p, const fc_run_config *a, const fc_run_config *b);
// The default policy of a comparison of a with b: fc_cmp_policy_same_compute
// when they share their per-rank arithmetic, else the defaults of fc_cmp_precision.
void fc_cmp_policy_of(fc_cmp_policy *p, const fc_run_config *a, const fc_run_config *b, int same_compute);
// has_rtol/has_atol say which of the two replace the defaults of every float kind.
void fc_cmp_policy_override(fc_cmp_policy *p, int has_rtol, double rtol, int has_atol, double atol);
void fc_cmp_policy_bitwise(fc_cmp_policy *p);
// Whether steps judged in lockstep under p use the expected side's gradient
// magnitudes (fc_trace_step.grad_mag, the magnitude pass): a 16-bit default policy.
int fc_cmp_policy_magnitudes(const fc_cmp_policy *p);

// The spacing of fp32 values at x (> 0): 2^(floor(log2 x) - 23), the smallest
// subnormal below 2^-126. Errors are reported in these units at the tensor's
// scale ("ULP at scale"), not at each element, whose own ULP near zero says nothing.
double fc_ulp_at(double x);

// Distance between two floats in units in the last place, through the
// ordered-integer mapping (sign-magnitude bits -> a monotone integer line, on
// which +0 and -0 are the same point and adjacent floats, denormals included,
// are 1 apart; +-Inf are the ends of the line). Both NaN: 0. Exactly one NaN:
// UINT64_MAX ("infinitely far").
uint64_t fc_ulp_distance(float a, float b);
// |a - b| as reported: both NaN or equal infinities give 0, exactly one NaN
// (or one infinity) gives +Inf. Inline: it runs once per compared element.
static inline double fc_cmp_abs_err(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0.0 : INFINITY;
    if (isinf(a) || isinf(b)) return a == b ? 0.0 : INFINITY;
    return fabs((double)a - (double)b);
}

// Who holds an element under a layout.
typedef enum {
    FC_OWNER_NONE,        // a global value (the loss)
    FC_OWNER_REPLICATED,  // local / no_shard: every rank holds the full tensor
    FC_OWNER_SHARD,       // a sharded strategy: one rank per shard group
    FC_OWNER_DATA         // a batch element: the data-parallel rank reading that sample
} fc_owner_kind;

typedef struct {
    fc_owner_kind kind;
    int rank;             // SHARD: the owner in shard group 0; DATA: the reading rank
    int world;            // W of the layout
    // SHARD
    int unit;             // the parameter's FSDP unit
    size_t unit_numel;    // N_u, unpadded
    size_t unit_offset;   // the element's offset in the unit's FlatParameter
    int group_size;       // F: W (full_shard, shard_grad_op) or the shard group (hybrid)
    int n_groups;         // W / F; the element is replicated on rank + g*F for g >= 1
    size_t shard_size;    // S = ceil(N_u / F)
    int shard;            // unit_offset / S, the owner's rank inside its group
    // DATA
    int sample;           // index in the global batch
    int per_rank;         // samples per data-parallel rank (B / W)
    int micro_batch;      // which of the K micro-batches, -1 when K == 1
} fc_owner;

// The owner of element `index` (flat, within the tensor) of parameter `param`
// under cfg's strategy/shard group at world size `world`.
fc_owner fc_cmp_param_owner(const fc_model *m, const fc_run_config *cfg, int world, int param, size_t index);
// The rank that reads sample `sample` of the global batch.
fc_owner fc_cmp_batch_owner(const fc_run_config *cfg, int world, int sample);
// One line: "rank 1 (shard 1 of 2 of unit layers.0 ...)", "every rank (replicated: no_shard)", ...
void fc_owner_format(const fc_owner *o, const fc_model *m, const fc_run_config *cfg, char *buf, size_t cap);

// Statistics of one compared tensor.
typedef struct {
    char name[160];       // "grad.layers.0.weight"
    fc_cmp_kind kind;
    size_t numel;
    double scale;         // max(max|A|, max|B|) (a scalar: |a|)
    double max_abs;       // max |a - b|
    double max_scaled;    // max of the judged error / scale (for parameters: beyond what the optimizer explains)
    double max_ulp;       // the same in ULPs at the scale (fc_ulp_at)
    double norm_ratio;    // ||judged error||_2 / ||A||_2 (0 for scalars)
    double headroom;      // the largest judged error as a fraction of what was allowed (> 1: failed)
    size_t n_bad;         // elements outside tolerance (or differing bits when exact)
    int norm_bad;         // the tensor's norm check failed
    int pass;
    char note[200];       // why it could not be compared element-wise ("" if it was)
} fc_cmp_tensor;

typedef struct {
    int n_tensors, n_failed;
    double max_abs, max_scaled, max_ulp, norm_ratio, headroom;
} fc_cmp_kind_stats;

// The first element (in comparison order) that is outside tolerance.
typedef struct {
    int found;
    long step;
    fc_cmp_kind kind;
    char tensor[160];
    long long index;      // flat index within the tensor; -1 when `note` explains instead
    int ndim;
    long long multi[2];   // the multi-index, row-major
    long long shape[2];
    int is_float;         // values are floats (else int32)
    double a, b;          // both values (exact: float and int32 both fit in a double)
    uint32_t a_bits, b_bits;
    double abs_err;       // |a - b|
    double explained;     // of which the optimizer (parameters) or 16-bit rounding explains this much
    int rounding;         // explained is 16-bit rounding (the magnitude model), not the optimizer
    double scale;         // the tensor's scale
    double scaled;        // (abs_err - explained) / scale
    double ulp;           // the same in ULPs at the scale
    double allowed;       // atol + rtol * scale
    int whole_tensor;     // the element check passed but the tensor's norm did not
    double norm_ratio;    // then: ||A - B|| / ||A||, or with projection |<B - A, A>| / <A, A>
    double norm_allowed;  // and what it was allowed
    int projection;       // the whole tensor was judged by its projection on A (16-bit rounding)
    fc_tol tol;           // the tolerance it failed
    fc_owner owner;
    char owner_text[320];
    char note[200];
} fc_cmp_divergence;

typedef struct {
    long step;
    int lockstep;         // judged by the lockstep row (else the diverged row)
    int magnitudes;       // 16-bit: judged per element by the rounding its terms allow (compare_model.c)
    double prev_diff;     // the parameters before the step: max |A - B| / scale over the tensors (-1: unknown)
    fc_tol row[FC_CMP_KIND_COUNT];  // the tolerances this step is judged by
    int judged;           // lockstep, magnitudes, prev_diff and row are set
    int n_tensors, cap;
    fc_cmp_tensor *tensors;
    fc_cmp_kind_stats kinds[FC_CMP_KIND_COUNT];
    int pass;
    fc_cmp_divergence first;
} fc_cmp_result;

// What the comparison knows besides the tensors: the model both sets are in
// (model layout, m->numel floats per full set), the policy, B's layout, and
// the optimizer both ran (which bounds what a parameter may differ by).
typedef struct {
    const fc_model *m;
    const fc_cmp_policy *policy;
    const fc_run_config *layout;  // B's config: strategy, shard group, batch, grad accum
    int world;                    // B's world size
    const fc_optim_config *optim; // the optimizer of both runs; NULL: parameters get no optimizer allowance
    const fc_run_config *a_layout;// A's config and world size, for the 16-bit roundings A's side made
    int a_world;                  // (NULL: B's config at W = 1, what `compare` re-runs)
    // 1: that side computes its activations and input gradients in fp32 and
    // rounds only the parameters it gathers and the gradients it produces
    // (the built-in reference, reference/fsdp.c: fc_cmp_impl_act32); 0: in
    // param_dtype, as PyTorch's mixed precision does, and as is assumed of
    // any implementation that is not the reference.
    int a_act32, b_act32;
    // 0: every parameter's tensors are compared. i + 1: only parameter i's
    // (grad, param, optimizer states; the allowances are computed for its
    // elements only). sensitivity's probes perturb one tensor of B after the
    // whole comparison passed, so the others' verdicts cannot change: they
    // are not judged again. Never set by compare, check or sweep.
    int only;
    // What A's side divided its summed gradient by where A's config at
    // a_world does not say it: the lockstep re-run of a run that set FSDP2's
    // divide factor F runs one process with F / W (rerun.h). 0: fc_divide_by
    // of A's config at a_world.
    double a_divide_by;
} fc_cmp_ctx;

// The elements [*lo, *hi) the comparison covers: the whole model, or c->only's.
void fc_cmp_range(const fc_cmp_ctx *c, size_t *lo, size_t *hi);

// Whether the implementation a config or trace names ("implementation",
// cfg->impl) computes its activations in fp32 under 16-bit parameters: the
// built-in reference (and its fault catalogue) does.
int fc_cmp_impl_act32(const char *impl);

void fc_cmp_result_init(fc_cmp_result *r, long step);
// A result for the same step and the same previous parameters as base (its
// prev_params unchanged: sensitivity's probes): the lockstep verdict and the
// rows are base's, not judged again over the whole model.
void fc_cmp_result_init_as(fc_cmp_result *r, const fc_cmp_result *base);
void fc_cmp_result_free(fc_cmp_result *r);

// Compares the kinds in `kinds` (FC_CMP_MASK bits) of two full tensor sets of
// one step and appends to r. For each kind asked, both sides must provide it:
// batch (a non-NULL batch), grads, params, and for optim the state tensors
// of every name in state_names (a state one side lacks is a failure); the
// norm only when both sides have one. Parameters use each side's
// prev_params and optimizer state, when both sides have them, for the
// optimizer allowance. Tensors are compared in the order kind, then registry
// order, so the first divergence is the same whichever caller asks.
void fc_compare_add(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, unsigned kinds,
                    fc_cmp_result *r);
// fc_cmp_result_init + fc_compare_add of every kind.
void fc_compare_step(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r);
// Index of the optimizer state called name in s, -1 if s has none.
int fc_cmp_find_state(const fc_trace_step *s, const char *name);

// Printing (stdout of `compare`, and what `check`/`sweep` print).
void fc_cmp_print_policy(FILE *f, const fc_cmp_policy *p);
void fc_cmp_print_header(FILE *f);
void fc_cmp_print_rows(FILE *f, const fc_cmp_result *r);
void fc_cmp_print_divergence(FILE *f, const fc_cmp_divergence *d);
// Numbers as every table prints them: an error ("inf", "0" or 3 digits) and a
// tolerance ("exact" or "rtol R ntol N [atol A]").
const char *fc_cmp_fmt_err(double x, char *buf, size_t cap);
void fc_cmp_fmt_tol(const fc_tol *t, char *buf, size_t cap);
// The same for kind k's row (the norm's adds what its gradients explain).
void fc_cmp_fmt_kind_tol(fc_cmp_kind k, const fc_tol *t, char *buf, size_t cap);

#endif
