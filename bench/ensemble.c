// bench/ensemble.c — the two designs for judging a 16-bit gradient element,
// measured side by side on one pair of traces (issue: "measure at least a
// magnitude pass of the reference and a small ensemble of the reference"):
//
//   magnitude  what `compare` does (oracle/compare_model.c): one extra
//              reference step, the magnitude pass, gives each element its
//              allowance n u mag + 0.5 L s u max|A| + fp32's row;
//   ensemble   K reference runs of the same step whose reductions round in
//              other orders (other W, strategies, divides, accumulation:
//              MEMBER_DIR...) give each element its spread around their mean,
//              s_i = max_k |m_k,i - mean_i|, and the allowance c s_i + fp32's
//              row (UF-ECT's and hipDNN's k: c = 6).
//
// For each design it prints, over every gradient element of step 0 (all runs
// start it from the same init):
//   - what B (the implementation under test) uses of the allowance: the
//     largest |b - a| / allowance (> 1: a false alarm), and for the ensemble
//     the smallest c that would pass B;
//   - the sensitivity at the median element of the largest tensor (the
//     element of median |a|): its allowance / the tensor's scale, what
//     `fsdpcheck sensitivity` reports as elem@median;
//   - the cost, in reference steps, timed here: the magnitude pass against
//     one reference re-run, times K for the ensemble.
//
//   usage: fsdpcheck_ensemble A_DIR B_DIR MEMBER_DIR...
//     A_DIR the reference's trace (the expected side), B_DIR the trace judged,
//     MEMBER_DIR the ensemble: the reference at step 0 of the same training
//     (bench/ensemble.sh makes them). A member bitwise equal to B is left out
//     (B judged by an ensemble holding itself proves nothing).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compare.h"
#include "compare_model.h"  // fc_cmp_grad_allowance
#include "rerun.h"
#include "tracefile.h"

#define C_ENSEMBLE 6.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void die(const char *what, const fc_error *e) {
    fprintf(stderr, "fsdpcheck_ensemble: %s: %s\n", what, e->msg);
    exit(2);
}

// The gradients of step 0 of the trace in dir into grads[numel]; the trace stays open in t.
static void read_grads(const char *dir, fc_trace *t, float *grads, size_t numel) {
    fc_error e = {0};
    if (fc_trace_open(dir, t, &e)) die(dir, &e);
    if (t->first_step != 0 || t->model.numel != numel) {
        fprintf(stderr, "fsdpcheck_ensemble: %s: needs step 0 of a model of %zu parameters\n", dir, numel);
        exit(2);
    }
    fc_st_file f;
    if (fc_trace_step_open(t, 0, &f, &e)) die(dir, &e);
    if (fc_trace_read_set(t, &f, "grad", grads, &e)) die(dir, &e);
    fc_st_close(&f);
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: fsdpcheck_ensemble A_DIR B_DIR MEMBER_DIR...\n");
        return 2;
    }
    fc_trace ta, tb;
    fc_error e = {0};
    if (fc_trace_open(argv[1], &ta, &e)) die(argv[1], &e);
    const fc_model *m = &ta.model;
    size_t n = m->numel;
    float *a = mallocCheck(n * sizeof(float)), *b = mallocCheck(n * sizeof(float));
    float *init = mallocCheck(n * sizeof(float)), *mag = mallocCheck(n * sizeof(float));
    fc_trace_close(&ta);
    read_grads(argv[1], &ta, a, n);
    read_grads(argv[2], &tb, b, n);
    if (fc_trace_read_init(&ta, init, &e)) die(argv[1], &e);

    // the ensemble: its members' mean and spread per element
    int k_all = argc - 3, k = 0;
    float *mk = mallocCheck((size_t)k_all * n * sizeof(float));
    for (int j = 0; j < k_all; j++) {
        fc_trace tm;
        float *g = mk + (size_t)k * n;
        read_grads(argv[3 + j], &tm, g, n);
        fc_trace_close(&tm);
        if (!memcmp(g, b, n * sizeof(float))) {
            printf("member %s: bitwise B, left out\n", argv[3 + j]);
            continue;
        }
        int dup = 0;
        for (int i = 0; i < k && !dup; i++) dup = !memcmp(g, mk + (size_t)i * n, n * sizeof(float));
        printf("member %s%s\n", argv[3 + j], dup ? ": bitwise another member (kept: it costs a run)" : "");
        k++;
    }
    if (k < 2) {
        fprintf(stderr, "fsdpcheck_ensemble: needs 2 members besides B, got %d\n", k);
        return 2;
    }
    double *spread = mallocCheck(n * sizeof(double)), *mean = mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double s = 0, d = 0;
        for (int j = 0; j < k; j++) s += mk[(size_t)j * n + i];
        s /= k;
        for (int j = 0; j < k; j++) d = fmax(d, fabs(mk[(size_t)j * n + i] - s));
        mean[i] = s, spread[i] = d;
    }

    // the magnitude design: the pass from A's init, timed against one re-run
    float *zero = callocCheck(n, sizeof(float)), *bufs[4];
    for (int i = 0; i < 4; i++) bufs[i] = callocCheck(n, sizeof(float));
    const float *const state[2] = {zero, zero};
    fc_rerun rr, mr;
    fc_trace_step as = {0};
    if (fc_rerun_open(&rr, &ta.cfg, ta.world_size, NULL, &e) || fc_magnitude_open(&mr, &ta.cfg, ta.world_size, NULL, &e)) die("re-run", &e);
    double t0 = now_s();
    if (fc_rerun_step(&rr, 0, init, state, bufs, &as, &e)) die("re-run", &e);
    double t1 = now_s();
    if (fc_magnitude_step(&mr, 0, init, state, mag, &e)) die("magnitude pass", &e);
    double t2 = now_s();
    fc_rerun_close(&mr);
    fc_rerun_close(&rr);

    fc_cmp_policy pol;
    fc_cmp_policy_defaults(&pol, fc_cmp_precision(&ta.cfg, &tb.cfg));
    fc_cmp_ctx ctx = {m,         &pol, &tb.cfg, tb.world_size, &ta.cfg.optim, &ta.cfg, ta.world_size,
                      fc_cmp_impl_act32(ta.impl), fc_cmp_impl_act32(tb.impl), 0, 0};
    fc_trace_step st = {0};
    st.grads = a;
    st.grad_mag = mag;
    fc_cmp_result r;
    fc_cmp_result_init(&r, 0);
    r.magnitudes = 1;
    double *allow = fc_cmp_grad_allowance(&ctx, &st, &r);
    fc_cmp_result_free(&r);
    double rtol = FC_CMP_LOCKSTEP[FC_PREC_FP32][FC_CMP_GRAD].rtol;  // the row under the 16-bit model (compare.c)

    // B against each design, per tensor's scale (fp32's row at it)
    double use_mag = 0, c_need = 0, use_ens = 0;
    const char *worst_mag = "", *worst_ens = "";
    for (int p = 0; p < m->n_params; p++) {
        const fc_param *q = &m->params[p];
        double scale = 0;
        for (size_t i = q->offset; i < q->offset + q->numel; i++) scale = fmax(scale, fabs((double)a[i]));
        double row = rtol * scale;
        for (size_t i = q->offset; i < q->offset + q->numel; i++) {
            double dm = fabs((double)b[i] - a[i]), de = fabs((double)b[i] - mean[i]);
            double um = dm / (allow[i] + row), ue = dm / (C_ENSEMBLE * spread[i] + row);
            // the c that passes B: c s_i + row >= |b - mean| (against the mean, as the ensemble judges)
            double cn = de <= row ? 0 : spread[i] > 0 ? (de - row) / spread[i] : INFINITY;
            if (um > use_mag) use_mag = um, worst_mag = q->name;
            if (ue > use_ens) use_ens = ue, worst_ens = q->name;
            c_need = fmax(c_need, cn);
        }
    }
    // the sensitivity at the median element of the largest tensor
    int big = 0;
    for (int p = 1; p < m->n_params; p++)
        if (m->params[p].numel > m->params[big].numel) big = p;
    const fc_param *q = &m->params[big];
    double scale = 0, *mags = mallocCheck(q->numel * sizeof(double));
    size_t nz = 0;
    for (size_t i = q->offset; i < q->offset + q->numel; i++) {
        scale = fmax(scale, fabs((double)a[i]));
        if (a[i] != 0) mags[nz++] = fabs((double)a[i]);
    }
    qsort(mags, nz, sizeof(double), cmp_double);
    double med = nz ? mags[nz / 2] : 0;
    size_t im = q->offset;
    for (size_t i = q->offset; i < q->offset + q->numel; i++)
        if (fabs((double)a[i]) == med) {
            im = i;
            break;
        }
    double row = rtol * scale;
    double sens_mag = (allow[im] + row) / scale, sens_ens = (C_ENSEMBLE * spread[im] + row) / scale;
    double sens_need = (fmax(C_ENSEMBLE, c_need) * spread[im] + row) / scale;

    printf("A %s (%s, W=%d), B %s (%s, W=%d), %s; step 0, %zu gradient elements; ensemble of %d\n", argv[1],
           ta.impl, ta.world_size, argv[2], tb.impl, tb.world_size, fc_prec_name(pol.prec), n, k);
    printf("design     cost (reference steps)  B's largest use of it      sensitivity at %s's median element\n",
           q->name);
    printf("magnitude  %4.2f (pass %.3f s, re-run %.3f s)  %.3g (%s)   %.2g of the scale\n", (t2 - t1) / (t1 - t0),
           t2 - t1, t1 - t0, use_mag, worst_mag, sens_mag);
    printf("ensemble   %d x 1 (one run per member)        %.3g at c = %g (%s)   %.2g at c = %g\n", k, use_ens,
           C_ENSEMBLE, worst_ens, sens_ens, C_ENSEMBLE);
    printf("ensemble, c that passes B: %.3g            %.2g at c = max(%g, that)\n", c_need, sens_need, C_ENSEMBLE);
    free(mags);
    fc_cmp_scratch_release(allow);
    free(spread);
    free(mean);
    free(mk);
    for (int i = 0; i < 4; i++) free(bufs[i]);
    free(zero);
    free(a);
    free(b);
    free(init);
    free(mag);
    fc_trace_close(&ta);
    fc_trace_close(&tb);
    return 0;
}
