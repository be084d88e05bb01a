// oracle/props.c — see props.h.
#include "props.h"

#include "rerun.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *NAMES[FC_NPROP] = {
    "", "== local ground truth", "no_shard == full_shard == shard_grad_op", "hybrid == full_shard",
    "prefetch == none", "world-size invariance", "accumulation == joined batch", "checkpoint round trip",
    "clip_grad_norm == local", "mixed precision FSDP == DDP", "comm log == theory", "memory == formula",
    "determinism", "finite differences", "cpu_offload == none",
    "activation checkpointing == none"};

const char *fc_prop_name(int p) { return p > 0 && p < FC_NPROP ? NAMES[p] : "?"; }

void fc_props_record(fc_props *r, int p, int ok, const char *fmt, ...) {
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

int fc_props_lowest(unsigned mask) {
    for (int p = 1; p < FC_NPROP; p++)
        if (mask & (1u << p)) return p;
    return 0;
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

int fc_props_compare(fc_props *r, int p, const fc_props_pair *pair, const fc_run_result *tested, int t0,
                     const fc_run_result *expected, int e0, int n, int bitwise, const char *against) {
    const fc_run_result *failed = !tested->ok ? tested : !expected->ok ? expected
                                : pair->lock && n > 1 && !pair->lock->ok ? pair->lock : NULL;
    if (failed) {
        fc_props_record(r, p, 0, "vs %s: run failed: %s", against, failed->error);
        return 0;
    }
    fc_model m;
    fc_model_build_run(&m, pair->cfg);
    fc_cmp_policy pol;
    if (pair->same_compute) fc_cmp_policy_same_compute(&pol, pair->cfg, pair->against);
    else fc_cmp_policy_defaults(&pol, fc_cmp_precision(pair->cfg, pair->against));
    if (bitwise) fc_cmp_policy_bitwise(&pol);
    fc_cmp_ctx ctx = {&m, &pol, pair->cfg, pair->W, &pair->against->optim, pair->against,
                      pair->against_W > 0 ? pair->against_W : pair->W, expected->act32, tested->act32, 0, 0};
    int ok = 1;
    // 16 bits: each step's gradient magnitudes, from the state it starts from (compare.h)
    fc_rerun mag;
    memset(&mag, 0, sizeof mag);
    float *mag_buf = NULL;
    if (fc_cmp_policy_magnitudes(&pol)) {
        fc_error e;
        if (fc_magnitude_open(&mag, pair->against, pair->against_W > 0 ? pair->against_W : pair->W, NULL, &e)) {
            fc_props_record(r, p, 0, "vs %s: the magnitude pass cannot run this config: %s", against, e.msg);
            ok = 0;
        } else {
            mag_buf = mallocCheck(m.numel * sizeof(float));
        }
    }
    {
        // the parameters both start from: equal up to rounding (the same init,
        // or a checkpoint loaded into what the other run held at that step)
        fc_trace_step a = fc_run_trace_step(expected, e0), b = fc_run_trace_step(tested, t0);
        fc_trace_step sa = {.step = a.step, .params = a.prev_params}, sb = {.step = a.step, .params = b.prev_params};
        fc_cmp_result res;
        fc_cmp_result_init(&res, a.step);
        fc_compare_add(&ctx, &sa, &sb, FC_CMP_MASK(FC_CMP_PARAM), &res);
        if (!res.pass) {
            char what[600];
            describe(&res.first, what, sizeof what);
            fc_props_record(r, p, 0, "vs %s: the parameters before the first compared step differ: %s", against, what);
            ok = 0;
        }
        fc_cmp_result_free(&res);
    }
    for (int k = 0; k < n && ok; k++) {
        fc_trace_step a = pair->lock && k > 0 ? fc_run_trace_step(pair->lock, k) : fc_run_trace_step(expected, e0 + k);
        fc_trace_step b = fc_run_trace_step(tested, t0 + k);
        b.step = a.step;  // judged as the same step (a resumed run numbers its own)
        ctx.a_act32 = pair->lock && k > 0 ? pair->lock->act32 : expected->act32;
        if (mag_buf) {
            fc_error e;
            // the magnitudes depend on the parameters and the batch; the state only travels along
            if (fc_magnitude_step(&mag, a.step, a.prev_params, (const float *const *)a.state, mag_buf, &e)) {
                fc_props_record(r, p, 0, "vs %s: the magnitude pass of step %ld failed: %s", against, a.step, e.msg);
                ok = 0;
                break;
            }
            a.grad_mag = mag_buf;
        }
        fc_cmp_result res;  // runs in memory carry no batch: the data are core/data.c's, shared
        fc_cmp_result_init(&res, a.step);
        fc_compare_add(&ctx, &a, &b, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &res);
        for (int kind = 0; kind < FC_CMP_KIND_COUNT; kind++) {
            const fc_cmp_kind_stats *s = &res.kinds[kind];
            r->max_abs[p] = dmax(r->max_abs[p], s->max_abs);
            r->max_scaled[p] = dmax(r->max_scaled[p], s->max_scaled);
            r->max_ulp[p] = dmax(r->max_ulp[p], s->max_ulp);
            if (!bitwise) r->headroom[p] = dmax(r->headroom[p], s->headroom);
        }
        if (!res.pass) {
            char what[600];
            describe(&res.first, what, sizeof what);
            fc_props_record(r, p, 0, "vs %s (%s%s): %s", against, bitwise ? "bitwise" : fc_prec_name(res.lockstep ? pol.prec : pol.prec_div),
                            bitwise ? "" : res.lockstep ? ", lockstep" : ", diverged", what);
            ok = 0;
        }
        fc_cmp_result_free(&res);
    }
    r->checked |= 1u << p;
    free(mag_buf);
    fc_rerun_close(&mag);
    fc_model_free(&m);
    return ok;
}
