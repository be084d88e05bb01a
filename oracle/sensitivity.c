// oracle/sensitivity.c — `fsdpcheck sensitivity DIR_A DIR_B [--step N]`: the
// smallest error the comparison engine catches, published (DESIGN §8).
//
// DIR_A and DIR_B are two traces of the same training that legitimately
// differ (another world size, strategy, implementation): the noise the policy
// must tolerate is there. For one step, and for each kind (loss, norm, grad,
// param, optim), B is perturbed in memory and compared with A by the same engine
// `compare` uses; the smallest perturbation that fails is found by bisection
// on a logarithmic scale:
//   one element   b[i] += delta * scale (the tensor's scale, max |A|, |B|), at
//                 the tensor's largest-magnitude element and at its median one
//                 (for parameters also in units of lr: the optimizer allowance
//                 is what an element may legitimately move by);
//   whole tensor  b *= (1 + delta) for every element.
// The tensor of each kind is the one with most elements (the loss: the loss;
// the gradient norm, when both traces carry it: b *= 1 + delta).
// A row reads "caught from delta = X": at X the comparison fails, at X / 1.26
// (the bisection's resolution) it passes.
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "layout.h"  // fc_divide_by
#include "rerun.h"
#include "threads.h"
#include "tracefile.h"

typedef struct {
    const fc_cmp_ctx *ctx;
    const fc_trace_step *a, *b;
    const fc_cmp_result *base;      // the whole comparison, unperturbed: its lockstep verdict holds for every probe
    int unperturbed[FC_CMP_KIND_COUNT];  // each kind's verdict as is: -1 unknown, 0 passes, 1 fails
} probe;

// Does the comparison of this step fail (for the kind of tensor perturbed)?
// only: 0, every tensor of the kind; i + 1, parameter i's alone (fc_cmp_ctx.only).
static int fails(const probe *p, fc_cmp_kind kind, int only) {
    fc_cmp_ctx c = *p->ctx;
    c.only = only;
    fc_cmp_result r;
    fc_cmp_result_init_as(&r, p->base);  // no probe perturbs the previous parameters
    fc_compare_add(&c, p->a, p->b, FC_CMP_MASK(kind), &r);
    int f = !r.pass;
    fc_cmp_result_free(&r);
    return f;
}

// The smallest delta in [1e-10, 1e2] for which apply(delta) makes the kind
// fail; restore() undoes it. Returns INFINITY if even 1e2 passes.
typedef struct {
    float *x;          // the tensor perturbed (in B)
    float *keep;       // its original values
    size_t n, at;      // elements; the element perturbed (one-element mode)
    double scale;
    int whole;
    double *dx, dkeep;  // a double scalar instead (the gradient norm), relative: dx = dkeep (1 + delta)
    int param;          // the parameter perturbed + 1 (0: a scalar, the loss or the norm)
} perturbation;

static void apply(const perturbation *q, double delta) {
    if (q->dx) *q->dx = q->dkeep * (1.0 + delta);
    else if (q->whole)
        for (size_t i = 0; i < q->n; i++) q->x[i] = (float)(q->keep[i] * (1.0 + delta));
    else
        q->x[q->at] = (float)(q->keep[q->at] + delta * q->scale);
}

static void restore(const perturbation *q) {
    if (q->dx) *q->dx = q->dkeep;
    else if (q->whole) memcpy(q->x, q->keep, q->n * sizeof(float));
    else q->x[q->at] = q->keep[q->at];
}

// The whole comparison of the kind runs once, unperturbed; when it passes, each
// probe judges only the perturbed tensor: the others are unchanged and passed,
// so the verdict is the same, at the cost of one tensor instead of the model
// (issue 18: gpt2-124m's sensitivity from 293 s).
static double smallest(probe *p, fc_cmp_kind kind, const perturbation *q) {
    // the whole kind unperturbed, once: each probe below assumes it passed
    if (p->unperturbed[kind] < 0) p->unperturbed[kind] = fails(p, kind, 0);
    if (p->unperturbed[kind]) return -1;  // it fails unperturbed: nothing to measure
    double lo = -10, hi = 2;            // log10 of delta
    apply(q, pow(10, hi));
    int f = fails(p, kind, q->param);
    restore(q);
    if (!f) return INFINITY;
    while (hi - lo > 0.1) {  // 10^0.1 = 1.26: the resolution
        double mid = 0.5 * (lo + hi);
        apply(q, pow(10, mid));
        f = fails(p, kind, q->param);
        restore(q);
        if (f) hi = mid;
        else lo = mid;
    }
    return pow(10, hi);
}

// The k-th smallest of v[n] (0-based; v is reordered): Wirth's selection,
// O(n) expected, instead of sorting a 38M-element tensor per kind.
static float select_kth(float *v, size_t n, size_t k) {
    long long l = 0, r = (long long)n - 1, kk = (long long)k;
    while (l < r) {
        float x = v[kk];
        long long i = l, j = r;
        do {
            while (v[i] < x) i++;
            while (x < v[j]) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j], v[j] = t;
                i++, j--;
            }
        } while (i <= j);
        if (j < kk) l = i;
        if (kk < i) r = j;
    }
    return v[kk];
}

// The median element of x[n] by magnitude, as a stable sort by |x| names it:
// the value v at position n / 2, then the last element equal to v. The median
// magnitude m comes by selection; among the elements of magnitude m, in their
// order, the stable sort puts the (n / 2 - #{|x| < m})-th at n / 2.
static size_t median_at(const float *x, size_t n) {
    float *mag = mallocCheck(n * sizeof(float));  // [n] |x|
    for (size_t i = 0; i < n; i++) mag[i] = fabsf(x[i]);
    float m = select_kth(mag, n, n / 2);
    free(mag);
    size_t below = 0, seen = 0, at = 0;
    for (size_t i = 0; i < n; i++) below += fabsf(x[i]) < m;
    float v = m;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) == m && seen++ == n / 2 - below) {
            v = x[i];
            break;
        }
    for (size_t i = 0; i < n; i++)
        if (x[i] == v) at = i;
    return at;
}

static void print_delta(double d) {
    if (d < 0) printf("%12s", "fails as is");
    else if (isinf(d)) printf("%12s", "> 1e2");
    else printf("%12.2g", d);
}

// One kind: its largest trainable tensor in B, perturbed at its largest and
// median element and whole (a frozen one is judged exactly: any change fails,
// and its zero gradient and state have no relative delta to measure).
static void measure(probe *p, fc_cmp_kind kind, float *base, const fc_model *m, const char *prefix,
                    double lr) {
    int best = -1;
    for (int i = 0; i < m->n_params; i++)
        if (!m->params[i].frozen && (best < 0 || m->params[i].numel > m->params[best].numel)) best = i;
    const fc_param *par = &m->params[best];
    perturbation q = {.x = base + par->offset, .n = par->numel, .param = best + 1};
    q.keep = mallocCheck(q.n * sizeof(float));
    memcpy(q.keep, q.x, q.n * sizeof(float));
    for (size_t i = 0; i < q.n; i++) q.scale = fmax(q.scale, fabs((double)q.keep[i]));
    // the elements: the largest |b| and the median |b|
    size_t at_max = 0, at_med = median_at(q.keep, q.n);
    for (size_t i = 0; i < q.n; i++)
        if (fabsf(q.keep[i]) > fabsf(q.keep[at_max])) at_max = i;
    char name[160];
    snprintf(name, sizeof name, "%s.%s", prefix, par->name);
    printf("%-6s %-44.44s %10zu", fc_cmp_kind_name(kind), name, q.n);
    double d[3];
    q.at = at_max;
    d[0] = smallest(p, kind, &q);
    q.at = at_med;
    d[1] = smallest(p, kind, &q);
    q.whole = 1;
    d[2] = smallest(p, kind, &q);
    for (int i = 0; i < 3; i++) {
        printf("  ");
        print_delta(d[i]);
    }
    if (kind == FC_CMP_PARAM && lr > 0 && d[0] >= 0 && !isinf(d[0]))
        printf("   (one element: %.2g lr at the largest, %.2g lr at the median)", d[0] * q.scale / lr,
               d[1] * q.scale / lr);
    printf("\n");
    free(q.keep);
}

int fc_cmd_sensitivity(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL};
    long step = -1;
    int n = 0, same_compute = 0, trajectory = 0, threads = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: fsdpcheck sensitivity DIR_A DIR_B [--step N] [--same-compute] [--trajectory] [--threads N]\n"
                   "  the smallest perturbation of B that the comparison engine catches, per kind,\n"
                   "  with A's step judged as `compare` judges it: in lockstep, re-run by the reference\n"
                   "  from B's state after the step before (unless --trajectory or --same-compute)\n"
                   "  --threads N: OpenMP threads (default: the node's cores); no result depends on it\n");
            return FC_EXIT_PASS;
        }
        if (!strcmp(argv[i], "--same-compute")) {
            same_compute = 1;
        } else if (!strcmp(argv[i], "--trajectory")) {
            trajectory = 1;
        } else if (!strcmp(argv[i], "--step") && i + 1 < argc) {
            char *end;
            step = strtol(argv[++i], &end, 10);
            if (*end || step < 0) fc_die(FC_EXIT_USAGE, "sensitivity --step: '%s' is not a step number", argv[i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            fc_error te;
            if (fc_threads_parse(argv[++i], &threads, &te)) fc_die(FC_EXIT_USAGE, "sensitivity %s", te.msg);
        } else if (!strcmp(argv[i], "--step") || !strcmp(argv[i], "--threads")) {
            fc_die(FC_EXIT_USAGE, "sensitivity: %s needs a value (see fsdpcheck sensitivity --help)", argv[i]);
        } else if (argv[i][0] == '-') {
            fc_die(FC_EXIT_USAGE, "sensitivity: unknown flag %s", argv[i]);
        } else if (n < 2) {
            dirs[n++] = argv[i];
        } else {
            fc_die(FC_EXIT_USAGE, "sensitivity: unexpected argument '%s'", argv[i]);
        }
    }
    if (n != 2) fc_die(FC_EXIT_USAGE, "sensitivity needs two trace directories, DIR_A and DIR_B");
    // Every probe allocates and frees its allowances, a few hundred MB of the
    // flat vector for gpt2-124m. From mmap each came back as fresh pages to
    // fault in and zero (13% of the time); from the heap, kept between probes,
    // they are reused: gpt2-124m, step 1 of W=1 vs W=2 traces, side by side,
    // 70.0 s before, 59.7 s and 61.7 s after, the same peak RSS (8.4 GiB).
    // A refused hint costs only that time.
    (void)mallopt(M_MMAP_MAX, 0);
    (void)mallopt(M_TRIM_THRESHOLD, INT_MAX);
    fc_threads_setup(threads, 1);  // one process: MPI is not started here
    fc_trace ta, tb;
    fc_error e;
    if (fc_trace_open(dirs[0], &ta, &e) || fc_trace_open(dirs[1], &tb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    char b_init[1100];  // what a re-run starts from before its first step loads B's state: read, not computed
    fc_trace_init_file(&tb, b_init, sizeof b_init);
    if (!fc_model_config_equal(&ta.cfg.model, &tb.cfg.model))
        fc_die(FC_EXIT_USAGE, "%s and %s trained different models", dirs[0], dirs[1]);
    long lo = ta.first_step > tb.first_step ? ta.first_step : tb.first_step;
    if (step < 0) step = lo;
    if (step < lo || step >= ta.first_step + ta.steps || step >= tb.first_step + tb.steps)
        fc_die(FC_EXIT_USAGE, "sensitivity --step %ld: not in both traces", step);
    size_t numel = ta.model.numel;
    float *mem = mallocCheck(12 * numel * sizeof(float));
    float *b_prev_state[2] = {mem + 10 * numel, mem + 11 * numel};  // B's state before the step
    float *ba[4] = {mem, mem + numel, mem + 2 * numel, mem + 3 * numel};
    float *bb[4] = {mem + 5 * numel, mem + 6 * numel, mem + 7 * numel, mem + 8 * numel};
    float *prev[2] = {mem + 4 * numel, mem + 9 * numel};
    fc_trace *tr[2] = {&ta, &tb};
    fc_trace_step sa, sb;
    fc_batch bat[2];
    // in lockstep as `compare` judges it: A's step re-run from B's state before
    // it, so of A's step only the batch is read (a trace of `run --trace-tensors
    // first` holds no more), and nothing of the step before
    // (B's first step too where A is a plan: from B's init and zero state, rerun.h)
    int first_rerun = !trajectory && !same_compute && fc_rerun_first_step(&ta, &tb, step);
    int lock = !trajectory && !same_compute && (step > tb.first_step || first_rerun);
    if (first_rerun) memset(b_prev_state[0], 0, 2 * numel * sizeof(float));  // a fresh optimizer's state
    for (int side = 0; side < 2; side++) {
        fc_trace *t = tr[side];
        if (side == 0 && lock) continue;
        if (step == t->first_step) {
            if (fc_trace_read_init(t, prev[side], &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
        } else {
            fc_trace_step ps;
            fc_batch pb;
            float *const pbufs[4] = {side ? bb[0] : ba[0], prev[side], side ? b_prev_state[0] : ba[2],
                                     side ? b_prev_state[1] : ba[3]};
            if (fc_trace_read_step(t, step - 1, pbufs, NULL, &ps, &pb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            fc_batch_free(&pb);
        }
    }
    if (fc_trace_read_step(&ta, step, lock ? NULL : ba, prev[0], &sa, &bat[0], &e) ||
        fc_trace_read_step(&tb, step, bb, prev[1], &sb, &bat[1], &e))
        fc_die(FC_EXIT_USAGE, "%s", e.msg);
    fc_rerun rr;  // closed after the magnitude pass: the last to close finalises a singleton MPI
    memset(&rr, 0, sizeof rr);
    if (lock) {
        const float *const state[2] = {b_prev_state[0], b_prev_state[1]};
        if (fc_rerun_open(&rr, &ta.cfg, ta.world_size, b_init, &e) || fc_rerun_step(&rr, step, prev[1], state, ba, &sa, &e))
            fc_die(FC_EXIT_USAGE, "sensitivity: the lockstep re-run of step %ld failed (%s): use --trajectory", step,
                   e.msg);
        sa.batch = &bat[0];
    }
    double a_divide_by = lock ? fc_divide_by(&rr.cfg, 1) : 0;  // the re-run's: F / W where F was set
    fc_cmp_policy pol;
    if (same_compute) fc_cmp_policy_same_compute(&pol, &ta.cfg, &tb.cfg);
    else fc_cmp_policy_defaults(&pol, fc_cmp_precision(&ta.cfg, &tb.cfg));
    // 16 bits, judged as `compare` judges them: with the step's gradient magnitudes
    float *mag_buf = NULL;
    if (!trajectory && !same_compute && fc_cmp_policy_magnitudes(&pol)) {
        fc_rerun mr;
        mag_buf = mallocCheck(numel * sizeof(float));
        if (fc_magnitude_open(&mr, &ta.cfg, ta.world_size, b_init, &e) ||
            fc_magnitude_step(&mr, step, sa.prev_params, (const float *const *)sa.state, mag_buf, &e))
            fc_die(FC_EXIT_USAGE, "sensitivity: the magnitude pass of step %ld failed (%s): use --trajectory", step,
                   e.msg);
        fc_rerun_close(&mr);
        sa.grad_mag = mag_buf;
    }
    fc_rerun_close(&rr);
    fc_cmp_ctx ctx = {&tb.model, &pol, &tb.cfg, tb.world_size, &ta.cfg.optim, &ta.cfg, lock ? 1 : ta.world_size,
                      lock || fc_cmp_impl_act32(ta.impl), fc_cmp_impl_act32(tb.impl), 0, a_divide_by};
    fc_cmp_result r;
    fc_cmp_result_init(&r, step);
    fc_compare_add(&ctx, &sa, &sb, FC_CMP_ALL, &r);
    probe p = {&ctx, &sa, &sb, &r, {0}};
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p.unperturbed[k] = -1;
    printf("fsdpcheck sensitivity: %s vs %s, step %ld%s, %s row (%s), model %s (%zu parameters)\n", dirs[0], dirs[1],
           step, lock ? " (A re-run from B's state)" : "", r.lockstep ? "lockstep" : "diverged", fc_prec_name(r.lockstep ? pol.prec : pol.prec_div),
           ta.model.cfg.name, numel);
    printf("the smallest delta caught (the comparison of A with B perturbed fails; resolution 1.26x):\n");
    printf("%-6s %-44s %10s  %12s  %12s  %12s\n", "kind", "tensor", "elements", "elem@max", "elem@median",
           "whole tensor");
    // the loss: a scalar, relative
    {
        float keep = sb.loss;
        perturbation q = {.x = &sb.loss, .keep = &keep, .n = 1, .scale = fabs((double)keep)};
        printf("%-6s %-44s %10d  ", "loss", "loss", 1);
        print_delta(smallest(&p, FC_CMP_LOSS, &q));
        printf("\n");
    }
    // the total gradient norm (both traces carry it): a double scalar, relative
    if (sa.has_norm && sb.has_norm) {
        perturbation q = {.n = 1, .scale = fabs(sb.grad_norm), .dx = &sb.grad_norm, .dkeep = sb.grad_norm};
        printf("%-6s %-44s %10d  ", "norm", "grad_norm", 1);
        print_delta(smallest(&p, FC_CMP_NORM, &q));
        printf("\n");
    }
    measure(&p, FC_CMP_GRAD, bb[0], &tb.model, "grad", 0);
    measure(&p, FC_CMP_PARAM, bb[1], &tb.model, "param", ta.cfg.optim.lr);
    for (int i = 0; i < sb.n_state; i++) {
        char name[64];
        snprintf(name, sizeof name, "optim.%s", sb.state_names[i]);
        measure(&p, FC_CMP_OPTIM, bb[2 + i], &tb.model, name, 0);
    }
    if (tb.model.n_frozen) {  // by --freeze, or by LoRA (its base; the two exclude each other)
        char why[300];
        if (tb.cfg.model.lora_r) snprintf(why, sizeof why, "LoRA's base");
        else snprintf(why, sizeof why, "--freeze '%s'", tb.cfg.freeze);
        printf("frozen: %d parameter tensors (%s): value, gradient and optimizer state judged exactly, any change "
               "fails\n", tb.model.n_frozen, why);
    }
    int pass = r.pass;
    fc_cmp_result_free(&r);
    fc_batch_free(&bat[0]);
    fc_batch_free(&bat[1]);
    free(mem);
    free(mag_buf);
    fc_trace_close(&ta);
    fc_trace_close(&tb);
    if (!pass) printf("note: A and B differ beyond the policy at this step already (compare says FAIL)\n");
    return FC_EXIT_PASS;
}
