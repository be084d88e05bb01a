// oracle/compare.h — the comparison engine: tolerance policy, per-tensor error
// statistics, the first divergence and the rank that owns it (DESIGN §8).
//
// `fsdpcheck compare DIR_A DIR_B` (compare_cmd.c) reads two traces through
// it; `check` and `sweep` call the same functions on tensors they hold in memory, so every
// report in fsdpcheck measures errors and names a divergence the same way.
//
// A is the expected side (the reference), B the side under test: relative
// errors and tolerances are relative to |A| (as torch.testing.assert_close's
// `expected`), and the owner of a divergent element is computed under B's
// layout (B's strategy, world size and shard group).
//
// Tolerance policy: every comparison kind has a default per precision in
// FC_CMP_DEFAULTS (compare.c; the table is also in README.md). An element
// passes when |a - b| <= atol + rtol * |a|; infinities must be equal; NaN
// matches NaN (torch's equal_nan=True: both sides overflowed in the same place).
// `batch` is always exact. Overrides (--rtol/--atol) replace rtol/atol of every
// float kind; bitwise mode requires identical bits everywhere.
#ifndef FC_COMPARE_H
#define FC_COMPARE_H

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
    FC_CMP_GRAD,    // grad.<name>
    FC_CMP_PARAM,   // param.<name>
    FC_CMP_OPTIM,   // optim.<state>.<name>
    FC_CMP_KIND_COUNT
} fc_cmp_kind;

#define FC_CMP_ALL ((1u << FC_CMP_KIND_COUNT) - 1)
#define FC_CMP_MASK(k) (1u << (k))

const char *fc_cmp_kind_name(fc_cmp_kind k);  // "batch", "loss", ...

typedef struct {
    double rtol, atol;
    int exact;           // bitwise equality required (batch, or --bitwise)
} fc_tol;

// The documented defaults: FC_CMP_DEFAULTS[precision][kind].
extern const fc_tol FC_CMP_DEFAULTS[3][FC_CMP_KIND_COUNT];

typedef struct {
    fc_prec prec;        // the precision row the defaults came from
    fc_tol tol[FC_CMP_KIND_COUNT];
    int bitwise;         // --bitwise: every kind exact
    int overridden;      // --rtol/--atol replaced the defaults of the float kinds
} fc_cmp_policy;

// The precision a comparison of two runs is judged at: the least precise of
// both configs' param_dtype and reduce_dtype (bf16 < fp16 < fp32), since
// gradients reduced in bf16 carry bf16 rounding even with fp32 parameters.
fc_prec fc_cmp_precision(const fc_run_config *a, const fc_run_config *b);
void fc_cmp_policy_defaults(fc_cmp_policy *p, fc_prec prec);
// has_rtol/has_atol say which of the two replace the defaults of every float kind.
void fc_cmp_policy_override(fc_cmp_policy *p, int has_rtol, double rtol, int has_atol, double atol);
void fc_cmp_policy_bitwise(fc_cmp_policy *p);

// Distance between two floats in units in the last place, through the
// ordered-integer mapping (sign-magnitude bits -> a monotone integer line, on
// which +0 and -0 are the same point and adjacent floats, denormals included,
// are 1 apart; +-Inf are the ends of the line). Both NaN: 0. Exactly one NaN:
// UINT64_MAX ("infinitely far").
uint64_t fc_ulp_distance(float a, float b);
// Whether b matches the expected a under t.
int fc_cmp_close(float a, float b, const fc_tol *t);
// |a - b| and |a - b| / |a| as reported: both NaN or equal infinities give 0,
// exactly one NaN (or one infinity) gives +Inf; a == 0 != b gives rel +Inf.
double fc_cmp_abs_err(float a, float b);
double fc_cmp_rel_err(float a, float b);

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
    double max_abs, max_rel;
    uint64_t max_ulp;
    size_t n_bad;         // elements outside tolerance (or differing bits when exact)
    int pass;
    char note[200];       // why it could not be compared element-wise ("" if it was)
} fc_cmp_tensor;

typedef struct {
    int n_tensors, n_failed;
    double max_abs, max_rel;
    uint64_t max_ulp;
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
    double abs_err, rel_err;
    uint64_t ulp;
    fc_tol tol;           // the tolerance it failed
    fc_owner owner;
    char owner_text[320];
    char note[200];
} fc_cmp_divergence;

typedef struct {
    long step;
    int n_tensors, cap;
    fc_cmp_tensor *tensors;
    fc_cmp_kind_stats kinds[FC_CMP_KIND_COUNT];
    int pass;
    fc_cmp_divergence first;
} fc_cmp_result;

// What the comparison knows besides the tensors: the model both sets are in
// (model layout, m->numel floats per full set), the policy, and B's layout.
typedef struct {
    const fc_model *m;
    const fc_cmp_policy *policy;
    const fc_run_config *layout;  // B's config: strategy, shard group, batch, grad accum
    int world;                    // B's world size
} fc_cmp_ctx;

void fc_cmp_result_init(fc_cmp_result *r, long step);
void fc_cmp_result_free(fc_cmp_result *r);

// Compares the kinds in `kinds` (FC_CMP_MASK bits) of two full tensor sets of
// one step and appends to r. For each kind asked, both sides must provide it:
// batch (a non-NULL batch), grads, params, and for optim the state tensors
// of every name in state_names (a state one side lacks is a failure). Tensors
// are compared in the order kind, then registry order, so the first
// divergence is the same whichever caller asks.
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
// Numbers as every table prints them: an error ("inf", "0" or 3 digits), a
// ULP distance ("inf" for UINT64_MAX) and a tolerance ("exact" or "rtol R atol A").
const char *fc_cmp_fmt_err(double x, char *buf, size_t cap);
const char *fc_cmp_fmt_ulp(uint64_t u, char *buf, size_t cap);
void fc_cmp_fmt_tol(const fc_tol *t, char *buf, size_t cap);

#endif
