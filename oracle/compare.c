// oracle/compare.c — the comparison engine (see compare.h); the `fsdpcheck
// compare` command that reads two traces through it is compare_cmd.c.
#include "compare.h"

#include "clip.h"
#include "layout.h"
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------
// the tolerance policy
//
// Every constant is a measured noise floor times a stated margin. The floors
// are the largest legitimate differences bench/calibrate.sh found, 2026-11-23:
//  - the reference against itself over world sizes 1..8, full_shard,
//    no_shard, shard_grad_op with prefetch, hybrid trees (W, F) = (4,2) (6,2)
//    (6,3) (8,2) (8,4), accumulation with and without no_sync, clipping with
//    norm types 1, 2 and inf, the three divide modes, FULL and SHARDED
//    checkpoints loaded at another W and strategy, seeds 1, 7 and 1234,
//    gpt2-tiny (T=16) and mlp-tiny, global batch 24, 4 AdamW steps: 648 runs,
//    10752 per-step comparisons;
//  - sweep-like small cases (global batch 12 and 24, T=8, 3 steps, W=1..4,
//    hybrid, seeds 1..8): 640 runs, 6144 comparisons;
//  - PyTorch FSDP1 and FSDP2 (adapters/torch, torch 2.15 on the CPU, W=1, 2,
//    4, every strategy, accumulation, clipping, bf16, fp16) against the
//    reference;
//  - one gpt2-124m step (B=4, T=64), local against full_shard at W=2;
//  - mlp-micro (dims 3-2-2, 14 parameters: tensors of 2 to 6 elements), the
//    small-batch block with 16-bit policies, seeds 1..12: 792 runs, 6048
//    comparisons (FSDPCHECK_CALIBRATE_SMALL_MODELS=mlp-micro; added after a
//    sweep's bf16 P7 case failed at 0.073 of a 6-element bias's scale).
// "err" is the largest element error over its tensor's scale, "norm" the
// largest ||A - B|| / ||A||. A step is "lock" while the two runs start it
// from parameters that agree within the parameter rtol; "div" after AdamW has
// turned a noise-level gradient into a parameter difference (up to 2 lr per
// element) that every later gradient then feels.
//
// Diverged rows: the lockstep row, grown by kappa times the relative
// difference d of the parameters the step started from (the largest
// |A - B| / scale over the parameter tensors): rtol + kappa * d, ntol +
// kappa * d. A gradient moves with its inputs; kappa is the largest
// (err - lockstep floor) / d measured over every diverged step, times the
// margin. Measured at one sample per rank (the sweep's smallest batches: fp32
// diverged gradients reached 1.14e-4 of the scale at d = 2e-4):
//   kappa    fp32 (10x)          bf16 (2x)           fp16 (2x)
//   loss     0 (0)               0.77 (1.5)          0.45 (0.9)
//   grad     0.567 (5.7)         1.15 (2.3)          0.82 (1.6)
//   optim    0.434 (4.3)         1.2 (2.4)           0.6 (1.2)
// Parameters keep their row: what the optimizer explains is their allowance.
//
// fp32, margin 10x:
//   kind   lock err / norm (ref)    div err / norm (ref)     torch err   124m err / norm      rtol / ntol
//   loss   1.18e-07                 1.05e-07                 1.0e-07     0                    1.2e-6
//   grad   3.56e-06 / 1.49e-06      1.14e-04 / 5.85e-05      2.2e-06     8.72e-07 / 3.23e-07  3.6e-5 / 1.5e-5
//   param  3.25e-07 / 9.38e-08 (*)  2.25e-07 / 8.44e-08      -           3.21e-07 / 5.62e-08  3.3e-6 / 9.4e-7
//   optim  3.95e-06 / 2.41e-06      2.00e-04 / 9.04e-05      2.6e-06     1.69e-06 / 7.33e-07  4e-5 / 2.4e-5
//   norm   (the gradients' noise: it is their norm)                                           3.6e-5
// (*) beyond what the optimizer explains (compare.h): without that allowance
// an AdamW element whose gradient sits at rounding noise moves by up to 2 lr.
//
// bf16 and fp16: the floors are the arithmetic of 16-bit rounding itself.
// Tiny tensors set them: in a 2-element bias the per-sample contributions
// cancel to 1/20 of their size, and each was rounded to 16 bits on its own
// rank (mlp-micro, one sample per rank, W=3: 0.199 of the scale in bf16).
// Momentum states are judged against the two terms they sum (momentum_terms:
// without that, exp_avg cancelled to 0.495 of its own scale in bf16).
// Every partial sum of a 16-bit reduction, and every per-rank gradient
// produced in param_dtype, rounds at 2^-9 (bf16) or 2^-12 (fp16) of its own
// magnitude, which cancellation across ranks makes several times the
// tensor's; a real 16-bit implementation (torch) rounds every activation too,
// where the reference emulates the casts FSDP makes; and AdamW flips feed
// into 16-bit compute. Measured (ref: the largest over both calibration sets):
//   bf16   lock err / norm (ref)   div err / norm (ref)    torch err (lock)   micro lock / div err       rtol / ntol (2x the largest)
//   loss   1.19e-07                1.46e-05                2.1e-05            1.18e-07 / 5.91e-04 (**)   5e-5, diverged 1.2e-3
//   grad   1.38e-02 / 9.08e-03     8.70e-02 / 4.46e-02     5.1e-02            0.199 / 0.168; 0.135      0.4 / 0.34
//   optim  2.84e-02 / 2.53e-02     1.01e-01 / 6.25e-02     6.0e-02            0.358 / 0.36; 0.084       0.72 / 0.72
//   fp16
//   loss   1.87e-07                2.03e-05                2.5e-06            1.18e-07 / 0              1.2e-5
//   grad   2.01e-03 / 1.57e-03     3.36e-02 / 1.21e-02     1.6e-02            0.0397 / 0.0413; 0.0014   0.08 / 0.083
//   optim  3.72e-03 / 2.83e-03     3.10e-02 / 1.44e-02     1.2e-02            0.0453 / 0.0354; 0.0018   0.09 / 0.071
//   (micro: mlp-micro's lockstep err / norm; its diverged err. Optimizer
//   states: exp_avg_sq's relative error is twice its gradient's.)
//   (**) a parameter difference of 5e-6 flips a bf16 cast of a weight by one
//   bf16 step, whatever the size of the difference: the diverged bf16 loss
//   row starts at 2x that jump (1.2e-3), then grows by kappa d.
//   (16-bit parameters: 2.73e-07 / 1.07e-07 beyond the optimizer's allowance: fp32's row)
// The 16-bit margin is 2x, not 10x: 10x would pass errors of up to 100% of a
// tensor's scale, no check at all. What keeps 16-bit runs judged tightly is
// that two runs which share their per-rank arithmetic (P9: an implementation
// against its own no_shard under the same policy; P3, P4, P14) are judged by
// their reduce_dtype while they stay in lockstep (fc_cmp_policy_same_compute):
// there bf16 params with fp32 reduce differ by 1.75e-07 (grad) and 3.24e-07
// (optim) of the scale, inside fp32's lockstep row.
#define EXACT {0, 0, 0, 1, 0}
#define TOL(r, n) {r, 0, n, 0, 0}
#define TOLK(r, n, k) {r, 0, n, 0, k}
#define ROW(loss, norm, gr, gn, pr, pn, orr, on)                                                                     \
    {[FC_CMP_BATCH] = EXACT, [FC_CMP_LOSS] = TOL(loss, 0), [FC_CMP_NORM] = TOL(norm, 0), [FC_CMP_GRAD] = TOL(gr, gn), \
     [FC_CMP_PARAM] = TOL(pr, pn), [FC_CMP_OPTIM] = TOL(orr, on)}
const fc_tol FC_CMP_LOCKSTEP[3][FC_CMP_KIND_COUNT] = {
    [FC_PREC_FP32] = ROW(1.2e-6, 3.6e-5, 3.6e-5, 1.5e-5, 3.3e-6, 9.4e-7, 4e-5, 2.4e-5),
    [FC_PREC_BF16] = ROW(5e-5, 0.4, 0.4, 0.34, 3.3e-6, 9.4e-7, 0.72, 0.72),
    [FC_PREC_FP16] = ROW(1.2e-5, 0.08, 0.08, 0.083, 3.3e-6, 9.4e-7, 0.09, 0.071)};
#define DROW(loss, lk, norm, gr, gn, gk, pr, pn, orr, on, ok)                                                   \
    {[FC_CMP_BATCH] = EXACT, [FC_CMP_LOSS] = TOLK(loss, 0, lk), [FC_CMP_NORM] = TOLK(norm, 0, gk),                 \
     [FC_CMP_GRAD] = TOLK(gr, gn, gk), [FC_CMP_PARAM] = TOL(pr, pn), [FC_CMP_OPTIM] = TOLK(orr, on, ok)}
const fc_tol FC_CMP_DIVERGED[3][FC_CMP_KIND_COUNT] = {
    [FC_PREC_FP32] = DROW(1.2e-6, 0, 3.6e-5, 3.6e-5, 1.5e-5, 5.7, 3.3e-6, 9.4e-7, 4e-5, 2.4e-5, 4.3),
    [FC_PREC_BF16] = DROW(1.2e-3, 1.5, 0.4, 0.4, 0.34, 2.3, 3.3e-6, 9.4e-7, 0.72, 0.72, 2.4),
    [FC_PREC_FP16] = DROW(1.2e-5, 0.9, 0.08, 0.08, 0.083, 1.6, 3.3e-6, 9.4e-7, 0.09, 0.071, 1.2)};

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
// same batch). With n roundings on the two sides together (roundings()),
// Higham's bound gamma_n sum |x_i| gives, per element,
//     |a - b| <= n u mag + C_ACT_SCALE s u scale_A   (+ fp32's row at the tensor's scale)
// u = 2^-8 (bf16) or 2^-11 (fp16), the unit roundoff. A side with 16-bit
// parameters computes its activations in 16 bits too (s of them: 0 to 2), so
// its dy carries errors the element's own terms do not count: C_ACT more
// roundings per layer above (the input gradient crossed them), and an error
// relative to the whole tensor (scale_A = max |A| of the tensor, A's alone).
// Measured (2026-11-24, largest |a - b| over the bound without the margin):
//   reference W=2 vs W=4, gpt2-tiny, bf16/fp32, steps 0-1 (n u mag alone)   0.039 of it
//   PyTorch FSDP2 vs reference, gpt2-tiny (2 layers), bf16/fp32, 3 steps:
//     error 2.54 u mag (grad.transformer.h.1.ln_1.bias)              -> C_ACT 2: n = 10, 3.9x margin
//   PyTorch FSDP2 vs reference, gpt2-124m (12 layers), bf16/fp32, 3 steps:
//     error 13.6 u mag (grad.transformer.h.2.ln_1.bias, step 1)      -> C_ACT 2: n = 50, 3.7x margin
//     embedding rows: 3 bf16 ULPs of 0.03 = 2.65 u scale where the element's
//     own terms are 1000x smaller (the input gradient at the bottom of 12
//     bf16 layers)                                                   -> C_ACT_SCALE 3 per side: 2.3x margin
#define C_ACT 2
#define C_ACT_SCALE 3
// Momentum states carry their gradient's allowance through the update
// (exp_avg: (1 - beta1) coef allow; exp_avg_sq: (1 - beta2) coef^2 (2|g| + allow) allow),
// the gradient norm the norm of the allowances.
//
// The whole tensor: rounding errors are independent across elements and of
// either sign, so their projection on A, <B - A, A>, is a sum of independent
// terms each within allow_i |a_i|: by Hoeffding's inequality it exceeds
// K_PROJ sqrt(sum (allow_i a_i)^2) with probability below 2 exp(-K_PROJ^2 / 2)
// (K_PROJ = 6: 3e-8). From PROJ_EMPIRICAL_N elements on, the noise is
// measured instead, from the residual r = (B - A) - delta A (delta the
// projection's coefficient): sum (r_i a_i)^2, when smaller (a t-test at 6
// sigma). What is not independent is a scalar an implementation rounds once
// and applies to every element (1/W, a loss scale, in 16 bits: up to u/2 of
// relative error each): PROJ_FLOOR u of <A, A> allows two. A tensor scaled by
// (1 + delta) moves the projection by delta <A, A>: the whole-tensor
// sensitivity is PROJ_FLOOR u plus the noise term.
#define K_PROJ 6.0
#define PROJ_EMPIRICAL_N 256
#define PROJ_FLOOR 1.0

static const char *KIND_NAMES[FC_CMP_KIND_COUNT] = {"batch", "loss", "norm", "grad", "param", "optim"};

const char *fc_cmp_kind_name(fc_cmp_kind k) { return k < FC_CMP_KIND_COUNT ? KIND_NAMES[k] : "?"; }

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
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p->tol[k] = p->div[k] = (fc_tol)EXACT;
}

int fc_cmp_policy_magnitudes(const fc_cmp_policy *p) { return p->prec != FC_PREC_FP32 && !p->bitwise && !p->overridden; }

// ---------------------------------------------------------------------------
// element metrics

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// Sign-magnitude -> two's-complement-like line: non-negative floats keep their
// bits, negative ones are mirrored below zero, so -0 and +0 both land on 0.
static int64_t ordered(float x) {
    uint32_t u = float_bits(x);
    return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}

uint64_t fc_ulp_distance(float a, float b) {
    int na = isnan(a), nb = isnan(b);
    if (na || nb) return na && nb ? 0 : UINT64_MAX;
    int64_t d = ordered(a) - ordered(b);
    return (uint64_t)(d < 0 ? -d : d);
}

double fc_cmp_abs_err(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0.0 : INFINITY;
    if (isinf(a) || isinf(b)) return a == b ? 0.0 : INFINITY;
    return fabs((double)a - (double)b);
}

double fc_ulp_at(double x) {
    if (!(x > 0) || isinf(x)) return x == 0 ? ldexp(1.0, -149) : INFINITY;
    int e;
    frexp(x, &e);  // x = f * 2^e, f in [0.5, 1): the binade's ULP is 2^(e - 1 - 23)
    return e - 24 < -149 ? ldexp(1.0, -149) : ldexp(1.0, e - 24);
}

// ---------------------------------------------------------------------------
// owners

fc_owner fc_cmp_param_owner(const fc_model *m, const fc_run_config *cfg, int world, int param, size_t index) {
    fc_owner o;
    memset(&o, 0, sizeof o);
    o.world = world;
    o.sample = o.micro_batch = -1;
    if (param < 0 || param >= m->n_params || world < 1) return o;
    const fc_param *p = &m->params[param];
    o.unit = p->unit;
    o.unit_numel = m->units[p->unit].numel;
    o.unit_offset = p->unit_offset + index;
    if (!fc_strategy_sharded(cfg->strategy)) {
        o.kind = FC_OWNER_REPLICATED;
        return o;
    }
    fc_groups g = fc_groups_of(cfg, world, 0);
    if (g.F < 1 || world % g.F != 0) return o;  // not a valid layout: no owner to name
    // DESIGN §5 (core/layout.h): rank j of a shard group owns chunk j of the unit
    fc_unit_layout l = fc_unit_layout_of(o.unit_numel, &g);
    o.kind = FC_OWNER_SHARD;
    o.group_size = g.F;
    o.n_groups = g.R;
    o.shard_size = l.shard;
    o.shard = (int)(o.unit_offset / o.shard_size);
    o.rank = o.shard;  // shard groups are consecutive ranks: group g is ranks g*F .. g*F+F-1
    return o;
}

fc_owner fc_cmp_batch_owner(const fc_run_config *cfg, int world, int sample) {
    fc_owner o;
    memset(&o, 0, sizeof o);
    o.world = world;
    o.micro_batch = -1;
    o.sample = sample;
    if (world < 1 || cfg->global_batch % world != 0) return o;
    // every rank is a data-parallel rank; rank r reads samples [r*B/W, (r+1)*B/W)
    o.kind = FC_OWNER_DATA;
    o.per_rank = cfg->global_batch / world;
    o.rank = sample / o.per_rank;
    if (cfg->grad_accum > 1 && o.per_rank % cfg->grad_accum == 0)
        o.micro_batch = (sample % o.per_rank) / (o.per_rank / cfg->grad_accum);
    return o;
}

static const char *unit_label(const fc_model *m, int u, char *buf, size_t cap) {
    if (u < 0 || u >= m->n_units) snprintf(buf, cap, "?");
    else if (!m->units[u].name[0]) snprintf(buf, cap, "the root unit");
    else snprintf(buf, cap, "unit %s", m->units[u].name);
    return buf;
}

void fc_owner_format(const fc_owner *o, const fc_model *m, const fc_run_config *cfg, char *buf, size_t cap) {
    const char *strategy = fc_strategy_name(cfg->strategy);
    char unit[96];
    switch (o->kind) {
    case FC_OWNER_NONE:
        if (o->sample >= 0) snprintf(buf, cap, "unknown (sample %d; no valid data layout)", o->sample);
        else snprintf(buf, cap, "no single rank (a global value, the same on every rank)");
        return;
    case FC_OWNER_REPLICATED:
        snprintf(buf, cap, "every rank (replicated: %s holds full parameters on all %d rank%s; %s, element %zu of %zu)",
                 strategy, o->world, o->world == 1 ? "" : "s", unit_label(m, o->unit, unit, sizeof unit),
                 o->unit_offset, o->unit_numel);
        return;
    case FC_OWNER_SHARD: {
        size_t k = (size_t)snprintf(buf, cap, "rank %d (%s shard %d of %d", o->rank, strategy, o->shard, o->group_size);
        if (o->n_groups > 1 && k < cap) {
            k += (size_t)snprintf(buf + k, cap - k, " of shard group 0, replicated on rank%s",
                                  o->n_groups > 2 ? "s" : "");
            for (int g = 1; g < o->n_groups && k < cap; g++) {
                if (g > 4) {  // a long list says nothing more than its pattern
                    int last = o->shard + (o->n_groups - 1) * o->group_size;
                    k += (size_t)snprintf(buf + k, cap - k, " ... %d (every %d-th)", last, o->group_size);
                    break;
                }
                k += (size_t)snprintf(buf + k, cap - k, "%s %d", g > 1 ? "," : "", o->shard + g * o->group_size);
            }
        }
        if (k < cap)
            snprintf(buf + k, cap - k, "; %s, element %zu of %zu, shard size %zu)",
                     unit_label(m, o->unit, unit, sizeof unit), o->unit_offset, o->unit_numel, o->shard_size);
        return;
    }
    case FC_OWNER_DATA: {
        size_t k = (size_t)snprintf(buf, cap, "rank %d (reads sample %d of the global batch: %d sample%s per rank",
                                    o->rank, o->sample, o->per_rank, o->per_rank == 1 ? "" : "s");
        if (o->micro_batch >= 0 && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, ", micro-batch %d of %d", o->micro_batch, cfg->grad_accum);
        if (k < cap) snprintf(buf + k, cap - k, ")");
        return;
    }
    }
}

// ---------------------------------------------------------------------------
// the 16-bit rounding model (the constants above)

static double dmax(double a, double b) { return a > b ? a : b; }

// The unit roundoff of a precision: 2^-8 (bf16, 8 significant bits), 2^-11 (fp16).
static double unit_roundoff(fc_prec p) { return p == FC_PREC_BF16 ? 0x1p-8 : p == FC_PREC_FP16 ? 0x1p-11 : 0x1p-24; }

// The 16-bit roundings one side's gradient element goes through, each of a
// partial sum bounded by its magnitude: per micro-batch, the gradient produced
// in param_dtype, and in reduce_dtype the cast, the pre-divide, the W - 1
// adds of the reduction and the post-divide (W + 2); with 16-bit parameters
// also C_ACT per layer for the activations such a side computes in 16 bits:
// the input gradient a layer receives has crossed every layer above it. At least 1.
static int roundings(const fc_run_config *c, int W) {
    int K = c->grad_accum > 0 ? c->grad_accum : 1, n = 0;
    int depth = c->model.kind == FC_MODEL_GPT2 ? c->model.n_layer : c->model.n_layers;  // layers dy crosses
    if (c->param_dtype != FC_PREC_FP32) n += K + C_ACT * depth;
    if (c->reduce_dtype != FC_PREC_FP32) n += K * (W + 2);
    return n > 0 ? n : 1;
}

// Whether this step is judged by the 16-bit model: a 16-bit default policy,
// the expected side's magnitudes known, and both sides starting from the same
// parameters (in lockstep, or the first step from one init).
static int rounding_model(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    // from bit-identical parameters only: one fp32 ULP apart, a parameter can
    // round to another 16-bit value, and every activation after it moves by u
    return a->grad_mag && fc_cmp_policy_magnitudes(c->policy) && r->prev_diff == 0;
}

// n u: what one unit of magnitude may move a gradient element by.
static double rounding_coef(const fc_cmp_ctx *c) {
    const fc_run_config *al = c->a_layout ? c->a_layout : c->layout;
    int aw = c->a_layout ? c->a_world : 1;
    int n = roundings(al, aw) + roundings(c->layout, c->world);
    return n * unit_roundoff(c->policy->prec);
}

// ---------------------------------------------------------------------------
// results


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
        if (r->magnitudes && (k == FC_CMP_GRAD || k == FC_CMP_NORM || k == FC_CMP_OPTIM))
            t = FC_CMP_LOCKSTEP[FC_PREC_FP32][k];
        double grow = r->lockstep || r->prev_diff < 0 ? 0 : t.kappa * r->prev_diff;
        t.rtol += grow;
        if (t.ntol > 0) t.ntol += grow;
        t.kappa = 0;  // applied: the row is what this step is judged by
        r->row[k] = t;
    }
}

static void judge_lockstep(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r) {
    if (!a->prev_params || !b->prev_params) {
        r->lockstep = 0;
        set_rows(c, r);
        return;
    }
    double worst = 0;
    for (int i = 0; i < c->m->n_params; i++) {
        const fc_param *p = &c->m->params[i];
        const float *x = a->prev_params + p->offset, *y = b->prev_params + p->offset;
        double scale = 0, d = 0;
        for (size_t j = 0; j < p->numel; j++) {
            scale = dmax(scale, dmax(fabs((double)x[j]), fabs((double)y[j])));
            d = dmax(d, fc_cmp_abs_err(x[j], y[j]));
        }
        worst = dmax(worst, scale > 0 ? d / scale : d > 0 ? INFINITY : 0);
    }
    r->prev_diff = worst;
    r->lockstep = worst <= c->policy->lockstep;
    r->magnitudes = rounding_model(c, a, r);
    set_rows(c, r);
}

void fc_cmp_result_free(fc_cmp_result *r) {
    free(r->tensors);
    memset(r, 0, sizeof *r);
}

// The tolerance row of this step: lockstep unless the parameters the step
// started from already differed beyond the parameter tolerance.
static const fc_tol *row(const fc_cmp_ctx *c, const fc_cmp_result *r, fc_cmp_kind kind) {
    (void)c;
    return &r->row[kind];
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
    k->max_abs = dmax(k->max_abs, t->max_abs);
    k->max_scaled = dmax(k->max_scaled, t->max_scaled);
    k->max_ulp = dmax(k->max_ulp, t->max_ulp);
    k->norm_ratio = dmax(k->norm_ratio, t->norm_ratio);
    k->headroom = dmax(k->headroom, t->headroom);
    if (!t->pass) {
        k->n_failed++;
        r->pass = 0;
    }
}

// A tensor that cannot be compared element by element (a shape mismatch, a
// state only one side has): it fails, and `note` says why.
static void fail_note(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name, const char *note) {
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
    d->tol = *row(c, r, kind);
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
} elem_allow;

static const elem_allow NO_ALLOW = {NULL, NULL, 0};

// Compares n floats of one tensor under its row and the allowances in al.
static void cmp_floats(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *name,
                       const where_info *w, const float *a, const float *b, size_t n, const elem_allow *al) {
    const fc_tol *tol = row(c, r, kind);
    const double *allow = al->explained, *terms = al->terms;
    fc_cmp_tensor *t = new_tensor(r, kind, name, n);
    // the tensor's scale: its largest finite magnitude on either side
    double scale = 0, norm_a = 0, norm_t = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(a[i])) scale = dmax(scale, fabs((double)a[i])), norm_a += (double)a[i] * a[i];
        if (isfinite(b[i])) scale = dmax(scale, fabs((double)b[i]));
        if (terms && isfinite(terms[i])) scale = dmax(scale, terms[i]), norm_t += terms[i] * terms[i];
    }
    double aa = norm_a;  // <A, A>
    norm_a = dmax(norm_a, norm_t);
    int scalar = w->ndim == 0;
    t->scale = scale;
    double allowed = tol->atol + tol->rtol * scale, ulp = fc_ulp_at(scale), norm_e = 0;
    double proj = 0, noise = 0;  // <B - A, A> and sum (allow_i a_i)^2
    size_t first_bad = SIZE_MAX;
    double first_excess = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fc_cmp_abs_err(a[i], b[i]);
        double ex = allow && isfinite(d) ? allow[i] : 0;
        double e = d > ex ? d - ex : 0;  // the error nothing explains
        int bad = tol->exact ? memcmp(&a[i], &b[i], sizeof(float)) != 0 : !(e <= allowed);
        t->max_abs = dmax(t->max_abs, d);
        if (scale > 0) t->max_scaled = dmax(t->max_scaled, e / scale), t->max_ulp = dmax(t->max_ulp, e / ulp);
        else if (e > 0) t->max_scaled = t->max_ulp = INFINITY;
        // headroom: the error against everything it was allowed (the row and what is explained)
        if (!tol->exact) t->headroom = dmax(t->headroom, allowed + ex > 0 ? d / (allowed + ex) : d > 0 ? INFINITY : 0);
        norm_e += e * e;
        if (al->rounding && isfinite(d)) {
            proj += ((double)b[i] - (double)a[i]) * (double)a[i];
            noise += (ex * a[i]) * (ex * a[i]);
        }
        if (bad) {
            t->n_bad++;
            if (first_bad == SIZE_MAX) first_bad = i, first_excess = ex;
        }
    }
    double n_allowed = 0;
    if (!scalar && !tol->exact && al->rounding) {
        // the whole tensor under rounding noise: its projection on A (the
        // constants above); norm_ratio reports |<B - A, A>| / <A, A>
        double u = unit_roundoff(c->policy->prec);
        if (n >= PROJ_EMPIRICAL_N && aa > 0) {
            // enough elements to measure the noise itself: the residual after
            // the projection, r = (B - A) - delta A, delta = <B - A, A> / <A, A>
            double delta = proj / aa, emp = 0;
            for (size_t i = 0; i < n; i++) {
                if (!isfinite(a[i]) || !isfinite(b[i])) continue;
                double ri = ((double)b[i] - (double)a[i]) - delta * (double)a[i];
                emp += (ri * a[i]) * (ri * a[i]);
            }
            noise = dmax(0, emp < noise ? emp : noise);
        }
        n_allowed = K_PROJ * sqrt(noise) + (PROJ_FLOOR * u + tol->ntol) * aa;
        t->norm_ratio = aa > 0 ? fabs(proj) / aa : proj != 0 ? INFINITY : 0;
        t->norm_bad = !(fabs(proj) <= n_allowed);
        t->headroom = dmax(t->headroom, n_allowed > 0 ? fabs(proj) / n_allowed : proj != 0 ? INFINITY : 0);
        n_allowed = aa > 0 ? n_allowed / aa : 0;
    } else if (!scalar && !tol->exact && tol->ntol > 0) {
        // the whole tensor: an error spread thinly over every element
        norm_a = sqrt(norm_a), norm_e = sqrt(norm_e);  // (||terms|| where it is larger)
        t->norm_ratio = norm_a > 0 ? norm_e / norm_a : norm_e > 0 ? INFINITY : 0;
        double na = tol->ntol * norm_a + tol->atol * sqrt((double)n);
        t->norm_bad = !(norm_e <= na);
        t->headroom = dmax(t->headroom, na > 0 ? norm_e / na : norm_e > 0 ? INFINITY : 0);
        n_allowed = tol->ntol;
    }
    t->pass = t->n_bad == 0 && !t->norm_bad;
    finish_tensor(r, t);
    if (t->pass || r->first.found) return;
    fc_cmp_divergence *d = new_divergence(r, kind, name, tol);
    // the element that failed; for a tensor failing as a whole, its worst element
    size_t i = first_bad;
    if (i == SIZE_MAX) {
        d->whole_tensor = 1;
        d->projection = al->rounding;
        d->norm_ratio = t->norm_ratio;
        d->norm_allowed = n_allowed;
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
    d->scale = scale;
    d->allowed = allowed;
    double e = d->abs_err - d->explained;
    d->scaled = scale > 0 ? e / scale : e > 0 ? INFINITY : 0;
    d->ulp = e / ulp;
    set_where(c, d, w, i);
}

// Token ids and class ids: exact.
static void cmp_ints(const fc_cmp_ctx *c, fc_cmp_result *r, const char *name, const where_info *w,
                     const int32_t *a, const int32_t *b, size_t n) {
    fc_cmp_tensor *t = new_tensor(r, FC_CMP_BATCH, name, n);
    size_t first_bad = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        t->max_abs = dmax(t->max_abs, d);
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
    int gpt2 = a->kind == FC_MODEL_GPT2;
    int in_cols = gpt2 ? a->T : a->in_dim;
    if (a->kind != b->kind || a->B != b->B || a->T != b->T || a->in_dim != b->in_dim) {
        char note[200];
        snprintf(note, sizeof note, "batch shapes differ: A [%d, %d], B [%d, %d] (%s)", a->B, in_cols, b->B,
                 gpt2 ? b->T : b->in_dim, DIFFERENT_DATA);
        fail_note(c, r, FC_CMP_BATCH, "batch.input", note);
        fail_note(c, r, FC_CMP_BATCH, "batch.target", note);
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

// The gradient norm is a double: judged in double, against its own magnitude.
// extra: what 16-bit rounding explains (the norm of the gradients' allowances), else 0.
static void cmp_norm(const fc_cmp_ctx *c, fc_cmp_result *r, double a, double b, double extra) {
    const fc_tol *tol = row(c, r, FC_CMP_NORM);
    fc_cmp_tensor *t = new_tensor(r, FC_CMP_NORM, "grad_norm", 1);
    double d = isnan(a) || isnan(b) ? (isnan(a) && isnan(b) ? 0 : INFINITY) : a == b ? 0 : fabs(a - b);
    double scale = dmax(fabs(a), fabs(b)), allowed = tol->atol + tol->rtol * scale + extra;
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

static void cmp_set(const fc_cmp_ctx *c, fc_cmp_result *r, fc_cmp_kind kind, const char *prefix, const float *a,
                    const float *b, const elem_allow *al) {
    const fc_model *m = c->m;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        char name[200];
        snprintf(name, sizeof name, "%s.%s", prefix, p->name);
        where_info w = {p->ndim, {p->shape[0], p->shape[1]}, i, 0, NULL};
        elem_allow at = {al->explained ? al->explained + p->offset : NULL, al->terms ? al->terms + p->offset : NULL,
                         al->rounding};
        cmp_floats(c, r, kind, name, &w, a + p->offset, b + p->offset, p->numel, &at);
    }
}

int fc_cmp_find_state(const fc_trace_step *s, const char *name) {
    for (int i = 0; i < s->n_state; i++)
        if (!strcmp(s->state_names[i], name)) return i;
    return -1;
}

static const float *state_of(const fc_trace_step *s, const char *name) {
    int i = fc_cmp_find_state(s, name);
    return i >= 0 ? s->state[i] : NULL;
}

// What each parameter element may differ by because the optimizer explains
// it (compare.h): the previous parameters' difference carried through the
// step, plus the difference of the two sides' updates, each computed from
// that side's own optimizer inputs. NULL when the inputs are not all there.
static double *optimizer_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b) {
    const fc_optim_config *o = c->optim;
    if (!o || c->policy->bitwise || !a->prev_params || !b->prev_params) return NULL;
    size_t n = c->m->numel;
    long t = a->step + 1;  // optimizer steps taken after this one
    if (o->kind == FC_OPT_ADAMW) {
        const float *ma = state_of(a, "exp_avg"), *va = state_of(a, "exp_avg_sq");
        const float *mb = state_of(b, "exp_avg"), *vb = state_of(b, "exp_avg_sq");
        if (!ma || !va || !mb || !vb) return NULL;
        // p_t = p_{t-1} * decay + neg_step * m / (sqrt(v) / bc2_sqrt + eps)  (core/optim.h)
        fc_adamw_coeffs k = fc_adamw_coeffs_at(o, t);
        double *allow = mallocCheck(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            double ua = k.neg_step * (double)ma[i] / (sqrt((double)va[i]) / k.bc2_sqrt + k.eps);
            double ub = k.neg_step * (double)mb[i] / (sqrt((double)vb[i]) / k.bc2_sqrt + k.eps);
            double dp = fabs((double)a->prev_params[i] - (double)b->prev_params[i]);
            allow[i] = fabs((double)k.decay) * dp + fabs(ua - ub);
        }
        return allow;
    }
    // SGD: p_t = p_{t-1} - lr * (buf | g + wd p), buf = momentum * buf + (1 - dampening) (g + wd p)
    const float *ba = state_of(a, "momentum_buffer"), *bb = state_of(b, "momentum_buffer");
    if (o->momentum != 0 && (!ba || !bb)) return NULL;
    if (!a->grads || !b->grads) return NULL;
    double *allow = mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double dp = fabs((double)a->prev_params[i] - (double)b->prev_params[i]);
        double dg = fabs((double)a->grads[i] - (double)b->grads[i]) + o->weight_decay * dp;
        double du = o->momentum == 0 ? dg : o->nesterov ? dg + o->momentum * fabs((double)ba[i] - bb[i])
                                                         : fabs((double)ba[i] - (double)bb[i]);
        allow[i] = dp + o->lr * du;
    }
    return allow;
}

// The gradient the optimizer of one side took (the trace's is before
// clipping): g * the clip coefficient of that side's recorded norm.
static double clip_coef_of(const fc_cmp_ctx *c, const fc_trace_step *s) {
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
static double *momentum_terms(const fc_cmp_ctx *c, const fc_trace_step *a, const char *state) {
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
    size_t n = c->m->numel;
    double *terms = mallocCheck(n * sizeof(double)), coef = clip_coef_of(c, a);
    for (size_t i = 0; i < n; i++) {
        double g = coef * (double)a->grads[i] + (wd != 0 ? wd * (double)a->prev_params[i] : 0);
        terms[i] = fabs((double)m[i] - w * g) + fabs(w * g);
    }
    return terms;
}

// The 16-bit model's allowance of each gradient element, n u mag + C_ACT_SCALE
// s u scale_A (the constants above); NULL when the step is not judged by it.
static double *grad_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_cmp_result *r) {
    if (!r->magnitudes) return NULL;
    size_t n = c->m->numel;
    double k = rounding_coef(c), *allow = mallocCheck(n * sizeof(double));
    // sides that compute in 16 bits: the input gradients they propagate carry
    // errors relative to the tensor, not to the element's own terms
    const fc_run_config *al = c->a_layout ? c->a_layout : c->layout;
    int sides16 = (al->param_dtype != FC_PREC_FP32) + (c->layout->param_dtype != FC_PREC_FP32);
    double floor_coef = C_ACT_SCALE * sides16 * unit_roundoff(c->policy->prec);
    for (int p = 0; p < c->m->n_params; p++) {
        const fc_param *q = &c->m->params[p];
        double scale = 0;  // A's: B's own values must not widen what B is allowed
        for (size_t i = q->offset; i < q->offset + q->numel; i++)
            if (isfinite(a->grads[i])) scale = dmax(scale, fabs((double)a->grads[i]));
        for (size_t i = q->offset; i < q->offset + q->numel; i++)
            allow[i] = k * fabs((double)a->grad_mag[i]) + floor_coef * scale;
    }
    return allow;
}

// What a momentum state may differ by when its gradient may differ by
// allow_g: the state's update carries it (and each side clips by its own
// norm: the coefficients' difference times |g|). NULL for other states.
static double *state_allowance(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b,
                               const char *state, const double *allow_g) {
    const fc_optim_config *o = c->optim;
    if (!allow_g || !o || !a->grads) return NULL;
    int sq = 0;
    double w;
    if (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg")) w = 1.0 - o->beta1;
    else if (o->kind == FC_OPT_ADAMW && !strcmp(state, "exp_avg_sq")) w = 1.0 - o->beta2, sq = 1;
    else if (o->kind == FC_OPT_SGD && !strcmp(state, "momentum_buffer")) w = 1.0 - o->dampening;
    else return NULL;
    double ca = clip_coef_of(c, a), dc = fabs(ca - clip_coef_of(c, b));
    size_t n = c->m->numel;
    double *allow = mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double g = fabs((double)a->grads[i]), dg = ca * allow_g[i] + dc * g;
        allow[i] = sq ? w * (2 * ca * g + dg) * dg : w * dg;  // v: (1 - beta2) ((g + dg)^2 - g^2)
    }
    return allow;
}

// The gradient norm's allowance: |norm(A) - norm(B)| <= norm(A - B) <= norm(allow).
static double norm_allowance(const fc_cmp_ctx *c, const double *allow_g) {
    if (!allow_g) return 0;
    fc_norm_type t = c->layout ? c->layout->norm_type : FC_NORM_2;
    double acc = 0;
    for (size_t i = 0; i < c->m->numel; i++)
        acc = t == FC_NORM_INF ? dmax(acc, allow_g[i]) : t == FC_NORM_1 ? acc + allow_g[i] : acc + allow_g[i] * allow_g[i];
    return t == FC_NORM_2 ? sqrt(acc) : acc;
}

void fc_compare_add(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, unsigned kinds,
                    fc_cmp_result *r) {
    if (r->n_tensors == 0) judge_lockstep(c, a, b, r);
    if (kinds & FC_CMP_MASK(FC_CMP_BATCH)) {
        if (a->batch && b->batch) cmp_batch(c, r, a->batch, b->batch);
        else fail_note(c, r, FC_CMP_BATCH, "batch", "the batch was asked for but one side has none");
    }
    where_info scalar = {0, {0, 0}, -1, 0, NULL};
    if (kinds & FC_CMP_MASK(FC_CMP_LOSS)) cmp_floats(c, r, FC_CMP_LOSS, "loss", &scalar, &a->loss, &b->loss, 1, &NO_ALLOW);
    double *allow_g = grad_allowance(c, a, r);
    if ((kinds & FC_CMP_MASK(FC_CMP_NORM)) && a->has_norm && b->has_norm)
        cmp_norm(c, r, a->grad_norm, b->grad_norm, norm_allowance(c, allow_g));
    if (kinds & FC_CMP_MASK(FC_CMP_GRAD)) {
        elem_allow al = {allow_g, NULL, allow_g != NULL};
        cmp_set(c, r, FC_CMP_GRAD, "grad", a->grads, b->grads, &al);
    }
    // optimizer state before parameters: the parameters' allowance is computed
    // from each side's state, so a wrong state is named first, as itself
    if (kinds & FC_CMP_MASK(FC_CMP_OPTIM)) {
        // A's states in A's order, then any that only B has
        for (int i = 0; i < a->n_state; i++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "optim.%s", a->state_names[i]);
            int j = fc_cmp_find_state(b, a->state_names[i]);
            if (j >= 0) {
                double *terms = momentum_terms(c, a, a->state_names[i]);
                double *allow = state_allowance(c, a, b, a->state_names[i], allow_g);
                elem_allow al = {allow, terms, allow != NULL};
                cmp_set(c, r, FC_CMP_OPTIM, prefix, a->state[i], b->state[j], &al);
                free(allow);
                free(terms);
            } else {
                char note[200];
                snprintf(note, sizeof note, "optimizer state \"%s\" is in A, not in B", a->state_names[i]);
                fail_note(c, r, FC_CMP_OPTIM, prefix, note);
            }
        }
        for (int j = 0; j < b->n_state; j++) {
            if (fc_cmp_find_state(a, b->state_names[j]) >= 0) continue;
            char prefix[64], note[200];
            snprintf(prefix, sizeof prefix, "optim.%s", b->state_names[j]);
            snprintf(note, sizeof note, "optimizer state \"%s\" is in B, not in A", b->state_names[j]);
            fail_note(c, r, FC_CMP_OPTIM, prefix, note);
        }
    }
    if (kinds & FC_CMP_MASK(FC_CMP_PARAM)) {
        double *allow = optimizer_allowance(c, a, b);
        elem_allow al = {allow, NULL, 0};
        cmp_set(c, r, FC_CMP_PARAM, "param", a->params, b->params, &al);
        free(allow);
    }
    free(allow_g);
}

void fc_compare_step(const fc_cmp_ctx *c, const fc_trace_step *a, const fc_trace_step *b, fc_cmp_result *r) {
    fc_cmp_result_init(r, a->step);
    fc_compare_add(c, a, b, FC_CMP_ALL, r);
}

// ---------------------------------------------------------------------------
// printing

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

void fc_cmp_print_policy(FILE *f, const fc_cmp_policy *p) {
    if (p->bitwise) {
        fprintf(f, "policy: --bitwise (A is expected): identical bits in every kind\n");
        return;
    }
    fprintf(f, "policy: %s (A is expected; per element |A - B| <= atol + rtol * scale, scale = max|A|, max|B| of "
               "the tensor (of the terms they sum for exp_avg and momentum_buffer); per tensor ||A - B|| <= ntol * "
               "||A||; parameters also allow what the optimizer explains)\n",
            p->overridden ? "--rtol/--atol override" : fc_prec_name(p->prec));
    if (fc_cmp_policy_magnitudes(p))
        fprintf(f, "  %s, steps both sides start from equal parameters: grad, norm and optim per element within fp32's "
                   "row + n u mag + %d s u max|A| (mag: the magnitude pass; n: the 16-bit roundings of both sides; "
                   "s: sides computing in 16 bits), the whole tensor by its projection on A; the %s rows below "
                   "judge only the rest (--trajectory, or other starts)\n",
                fc_prec_name(p->prec), C_ACT_SCALE, fc_prec_name(p->prec));
    for (int row = 0; row < 2; row++) {
        const fc_tol *t = row ? p->div : p->tol;
        fprintf(f, "  %s (%s):", row ? "diverged" : "lockstep", fc_prec_name(row ? p->prec_div : p->prec));
        for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
            char s[64];
            fc_cmp_fmt_tol(&t[k], s, sizeof s);
            fprintf(f, "%s %s %s", k ? ";" : "", KIND_NAMES[k], s);
        }
        fputc('\n', f);
    }
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
                r->prev_diff < 0 ? "?" : fc_cmp_fmt_err(r->prev_diff, pd, sizeof pd), KIND_NAMES[k], s->n_tensors,
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
                    d->projection ? "|<B - A, A>| / <A, A> (16-bit rounding: its projection on A)" : "||A - B|| / ||A||",
                    fc_cmp_fmt_err(d->norm_ratio, nr, sizeof nr), d->norm_allowed);
    }
    fprintf(f, "  owner under B's layout: %s\n", d->owner_text);
    if (d->note[0]) fprintf(f, "  note: %s\n", d->note);
}
