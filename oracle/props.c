// oracle/props.c — see props.h.
#include "props.h"

#include "rerun.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[FC_NPROP] = {
    [FC_P0_UNFINISHED] = "",
    [FC_P1_LOCAL] = "== local ground truth",
    [FC_P2_NO_SHARD] = "no_shard == full_shard == shard_grad_op",
    [FC_P3_HYBRID] = "hybrid == full_shard",
    [FC_P4_PREFETCH] = "prefetch == none",
    [FC_P5_WORLD_SIZE] = "world-size invariance",
    [FC_P6_ACCUMULATION] = "accumulation == joined batch",
    [FC_P7_CHECKPOINT] = "checkpoint round trip",
    [FC_P8_CLIP] = "clip_grad_norm == local",
    [FC_P9_MIXED_PRECISION] = "mixed precision FSDP == DDP",
    [FC_P10_COMM_LOG] = "comm log == theory",
    [FC_P11_MEMORY] = "memory == formula",
    [FC_P12_DETERMINISM] = "determinism",
    [FC_P13_FINITE_DIFF] = "finite differences",
    [FC_P14_CPU_OFFLOAD] = "cpu_offload == none",
    [FC_P15_ACT_CKPT] = "activation checkpointing == none",
};

const char *fc_prop_name(int p) { return p > 0 && p < FC_NPROP ? NAMES[p] : "?"; }

void fc_props_record(fc_props *r, fc_prop p, int ok, const char *fmt, ...) {
    r->checked |= 1u << p;
    if (ok) return;
    r->failed |= 1u << p;
    if (r->detail[0]) return;
    int n = snprintf(r->detail, sizeof r->detail, "P%d ", p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail + n, sizeof r->detail - (size_t)n, fmt, ap);
    va_end(ap);
}

fc_prop fc_props_lowest(unsigned mask) {
    for (int p = FC_P1_LOCAL; p < FC_NPROP; p++)
        if (mask & (1u << p)) return (fc_prop)p;
    return FC_P0_UNFINISHED;
}

static double dmax(double a, double b) { return isnan(b) || b > a ? b : a; }

// The divergence in one line for the detail.
static void describe(const fc_cmp_divergence *d, char *buf, size_t cap) {
    if (d->index < 0) {
        snprintf(buf, cap, "step %ld, %.120s: %.200s", d->step, d->tensor, d->note);
        return;
    }
    char where[64] = "";
    if (d->ndim == 2) snprintf(where, sizeof where, "[%lld, %lld]", d->multi[0], d->multi[1]);
    else if (d->ndim == 1) snprintf(where, sizeof where, "[%lld]", d->multi[0]);
    if (d->is_float == 2)
        snprintf(buf, cap, "step %ld, %.120s: %.17g vs %.17g (error %.3g of its scale, allowed %.3g), owned by %.200s", d->step,
                 d->tensor, d->b, d->a, d->scaled, d->scale > 0 ? d->allowed / d->scale : 0.0, d->owner_text);
    else {
        char allowed[32];
        if (d->tol.exact) snprintf(allowed, sizeof allowed, "exact");
        else snprintf(allowed, sizeof allowed, "%.3g", d->scale > 0 ? d->allowed / d->scale : 0.0);
        snprintf(buf, cap,
                 "step %ld, %.120s%s: %.9g (0x%08x) vs %.9g (0x%08x), error %.3g of the tensor's scale %.3g "
                 "(%.3g ULP there; allowed %s)%s, owned by %.200s",
                 d->step, d->tensor, where, d->b, d->b_bits, d->a, d->a_bits, d->scaled, d->scale, d->ulp, allowed,
                 d->whole_tensor ? "; the tensor fails as a whole" : "", d->owner_text);
    }
}

// The run of j that failed, or NULL when every run it compares ran.
static const fc_run_result *failed_run(const fc_judgement *j) {
    const fc_run_result *t = j->tested.run, *x = j->expected.run;
    return !t->ok ? t : !x->ok ? x : j->lock && j->n > 1 && !j->lock->ok ? j->lock : NULL;
}

static int expected_world(const fc_judgement *j) { return j->expected.W > 0 ? j->expected.W : j->tested.W; }

// 16 bits: each step's gradient magnitudes, from the state it starts from (compare.h).
typedef struct {
    fc_rerun rerun;
    float *buf;  // [numel], NULL when the policy needs no magnitudes
} magnitudes;

// Opens the magnitude pass when the policy needs it; 0 (recorded) when it cannot run.
static int magnitudes_open(fc_props *r, const fc_judgement *j, const fc_model *m, const fc_cmp_policy *pol,
                           magnitudes *mag) {
    memset(mag, 0, sizeof *mag);
    if (!fc_cmp_policy_magnitudes(pol)) return 1;
    fc_error e;
    if (fc_magnitude_open(&mag->rerun, j->expected.cfg, expected_world(j), NULL, &e)) {
        fc_props_record(r, j->p, 0, "vs %s: the magnitude pass cannot run this config: %s", j->against, e.msg);
        return 0;
    }
    mag->buf = mallocCheck(m->numel * sizeof(float));
    return 1;
}

static void magnitudes_close(magnitudes *mag) {
    free(mag->buf);
    fc_rerun_close(&mag->rerun);
}

// The parameters both start from: equal up to rounding (the same init, or a
// checkpoint loaded into what the other run held at that step).
static int check_start(fc_props *r, const fc_judgement *j, const fc_cmp_ctx *ctx) {
    fc_trace_step a = fc_run_trace_step(j->expected.run, j->expected.at);
    fc_trace_step b = fc_run_trace_step(j->tested.run, j->tested.at);
    fc_trace_step sa = {.step = a.step, .params = a.prev_params}, sb = {.step = a.step, .params = b.prev_params};
    fc_cmp_result res;
    fc_cmp_result_init(&res, a.step);
    fc_compare_add(ctx, &sa, &sb, FC_CMP_MASK(FC_CMP_PARAM), &res);
    int ok = res.pass;
    if (!ok) {
        char what[600];
        describe(&res.first, what, sizeof what);
        fc_props_record(r, j->p, 0, "vs %s: the parameters before the first compared step differ: %s", j->against,
                        what);
    }
    fc_cmp_result_free(&res);
    return ok;
}

// The first failure's signature (signature.h): not of a run against itself (P12) or finite
// differences (P13). The step started from the tested run's state before it, or, where the tested run
// starts there (a resumed run, P7), from the expected run's: what the checkpoint was to restore.
static void signature(fc_props *r, const fc_judgement *j, const fc_cmp_ctx *ctx, const fc_cmp_result *res,
                      const fc_trace_step *a, const fc_trace_step *b, int k) {
    if (j->p == FC_P12_DETERMINISM || j->p == FC_P13_FINITE_DIFF) return;
    int t = j->tested.at + k, e = j->expected.at + k;
    fc_trace_step none = {0}, before = t > 0   ? fc_run_trace_step(j->tested.run, t - 1)
                                       : e > 0 ? fc_run_trace_step(j->expected.run, e - 1)
                                               : none;
    fc_sig_input in = {ctx->m, j->tested.cfg, j->tested.W, ctx, res, a, b,
                       {before.state[0], before.state[1]}, t > 0 ? before.grads : NULL, NULL, 1};
    fc_signature sig;
    fc_signature_find(&in, &sig);
    snprintf(r->signature, sizeof r->signature, "%s", sig.text);
}

// Step k of the comparison: its error magnitudes into r; 0 when it fails.
static int check_step(fc_props *r, const fc_judgement *j, fc_cmp_ctx *ctx, magnitudes *mag, int k) {
    const fc_run_result *x = j->lock && k > 0 ? j->lock : j->expected.run;
    fc_trace_step a = fc_run_trace_step(x, j->lock && k > 0 ? k : j->expected.at + k);
    fc_trace_step b = fc_run_trace_step(j->tested.run, j->tested.at + k);
    b.step = a.step;  // judged as the same step (a resumed run numbers its own)
    ctx->a_act32 = x->act32;
    fc_prop p = j->p;
    if (mag->buf) {
        fc_error e;
        // the magnitudes depend on the parameters and the batch; the state only travels along
        if (fc_magnitude_step(&mag->rerun, a.step, a.prev_params, (const float *const *)a.state, mag->buf, &e)) {
            fc_props_record(r, p, 0, "vs %s: the magnitude pass of step %ld failed: %s", j->against, a.step, e.msg);
            return 0;
        }
        a.grad_mag = mag->buf;
    }
    fc_cmp_result res;  // runs in memory carry no batch: the data are core/data.c's, shared
    fc_cmp_result_init(&res, a.step);
    fc_compare_add(ctx, &a, &b, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &res);
    for (int kind = 0; kind < FC_CMP_KIND_COUNT; kind++) {
        const fc_cmp_kind_stats *s = &res.kinds[kind];
        r->max_abs[p] = dmax(r->max_abs[p], s->max_abs);
        r->max_scaled[p] = dmax(r->max_scaled[p], s->max_scaled);
        r->max_ulp[p] = dmax(r->max_ulp[p], s->max_ulp);
        if (!j->bitwise) r->headroom[p] = dmax(r->headroom[p], s->headroom);
    }
    int ok = res.pass;
    if (!ok) {
        if (!r->detail[0]) signature(r, j, ctx, &res, &a, &b, k);  // this failure becomes the detail
        char what[600];
        describe(&res.first, what, sizeof what);
        const fc_cmp_policy *pol = ctx->policy;
        fc_props_record(r, p, 0, "vs %s (%s%s): %s", j->against,
                        j->bitwise ? "bitwise" : fc_prec_name(res.lockstep ? pol->prec : pol->prec_div),
                        j->bitwise ? "" : res.lockstep ? ", lockstep" : ", diverged", what);
    }
    fc_cmp_result_free(&res);
    return ok;
}

int fc_props_compare(fc_props *r, const fc_judgement *j) {
    const fc_run_result *failed = failed_run(j);
    if (failed) {
        fc_props_record(r, j->p, 0, "vs %s: run failed: %s", j->against, failed->error);
        return 0;
    }
    const fc_run_config *cfg = j->tested.cfg, *against = j->expected.cfg;
    fc_model m;
    fc_model_build_run(&m, cfg);
    fc_cmp_policy pol;
    fc_cmp_policy_of(&pol, cfg, against, j->same_compute);
    if (j->bitwise) fc_cmp_policy_bitwise(&pol);
    fc_cmp_ctx ctx = {&m, &pol, cfg, j->tested.W, &against->optim, against, expected_world(j),
                      j->expected.run->act32, j->tested.run->act32, 0, 0};
    magnitudes mag;
    int ok = magnitudes_open(r, j, &m, &pol, &mag);
    ok &= check_start(r, j, &ctx);
    for (int k = 0; k < j->n && ok; k++) ok = check_step(r, j, &ctx, &mag, k);
    r->checked |= 1u << j->p;
    magnitudes_close(&mag);
    fc_model_free(&m);
    return ok;
}
