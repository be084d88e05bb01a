// oracle/sensitivity.c — `fsdpcheck sensitivity DIR_A DIR_B [--step N]`: the
// smallest error the comparison engine catches, published (docs/contract.md §8).
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

#include "compare_cmd.h"
#include "flags.h"
#include "threads.h"

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
// so the verdict is the same, at the cost of one tensor instead of the model.
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

typedef struct {
    const char *dirs[2];
    long step;  // -1: the first step both traces hold
    int n_dirs, same_compute, trajectory, threads;
} sens_args;

// A step number as strtol reads it (sensitivity has always taken "" as step 0).
static long parse_step(const char *v) {
    char *end;
    long step = strtol(v, &end, 10);
    if (*end || step < 0) fc_die(FC_EXIT_USAGE, "sensitivity --step: '%s' is not a step number", v);
    return step;
}

// sensitivity's flags into o; 1 when --help was asked for (and printed).
static int parse_args(int argc, char **argv, sens_args *o) {
    enum { HELP, SAME_COMPUTE, TRAJECTORY, STEP, THREADS };
    static const fc_flag flags[] = {
        [HELP] = {"--help", FC_FLAG_SWITCH},       [SAME_COMPUTE] = {"--same-compute", FC_FLAG_SWITCH},
        [TRAJECTORY] = {"--trajectory", FC_FLAG_SWITCH}, [STEP] = {"--step", FC_FLAG_VALUE},
        [THREADS] = {"--threads", FC_FLAG_VALUE},
    };
    static const fc_flag_words words = {"sensitivity: ", "", "sensitivity: ", " (see fsdpcheck sensitivity --help)"};
    *o = (sens_args){.step = -1};
    fc_flags it = fc_flags_begin(argc, argv, flags, FC_FLAGS_COUNT(flags), &words, FC_FLAGS_SHORT);
    fc_error te;
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        switch (id) {
        case FC_FLAGS_ARG:
            if (o->n_dirs == 2) fc_die(FC_EXIT_USAGE, "sensitivity: unexpected argument '%s'", it.arg);
            o->dirs[o->n_dirs++] = it.arg;
            break;
        case HELP:
            printf("usage: fsdpcheck sensitivity DIR_A DIR_B [--step N] [--same-compute] [--trajectory] [--threads N]\n"
                   "  the smallest perturbation of B that the comparison engine catches, per kind,\n"
                   "  with A's step judged as `compare` judges it: in lockstep, re-run by the reference\n"
                   "  from B's state after the step before (unless --trajectory or --same-compute)\n"
                   "  --threads N: OpenMP threads (default: the node's cores); no result depends on it\n");
            return 1;
        case SAME_COMPUTE: o->same_compute = 1; break;
        case TRAJECTORY: o->trajectory = 1; break;
        case STEP: o->step = parse_step(it.value); break;
        case THREADS:
            if (fc_flag_int(it.name, it.value, 1, FC_THREADS_MAX, &o->threads, &te))
                fc_die(FC_EXIT_USAGE, "sensitivity %s", te.msg);
            break;
        }
    }
    if (o->n_dirs != 2) fc_die(FC_EXIT_USAGE, "sensitivity needs two trace directories, DIR_A and DIR_B");
    return 0;
}

// The step judged, A's and B's sides in memory (B's are perturbed in place).
typedef struct {
    long step;
    int lock, first_rerun;      // A's step re-run from B's state before it (rerun.h); B's first one too
    float *mem;                 // [12 numel], named below
    float *a[4], *b[4];         // A's and B's sets of the step, in fc_trace_read_step's order
    float *prev[2];             // A's and B's parameters before it
    float *b_prev_state[2];     // B's optimizer state before it
    fc_trace_step sa, sb;
    fc_batch bat[2];
    float *mag_buf;             // [numel] the step's gradient magnitudes, or NULL
} judged;

static void alloc_step(judged *j, size_t numel) {
    float *mem = j->mem = mallocCheck(12 * numel * sizeof(float));
    for (int k = 0; k < 4; k++) j->a[k] = mem + k * numel, j->b[k] = mem + (5 + k) * numel;
    j->prev[0] = mem + 4 * numel, j->prev[1] = mem + 9 * numel;
    j->b_prev_state[0] = mem + 10 * numel, j->b_prev_state[1] = mem + 11 * numel;
}

// The step's tensors and what each side starts it from. In lockstep, as
// `compare` judges it, A's step is re-run from B's state before it, so of
// A's step only the batch is read (a trace of `run --trace-tensors first`
// holds no more), and nothing of the step before.
static void read_step(judged *j, fc_trace_pair *p) {
    fc_trace *tr[2] = {&p->a, &p->b};
    fc_error e;
    if (j->first_rerun) memset(j->b_prev_state[0], 0, 2 * p->a.model.numel * sizeof(float));  // a fresh optimizer's
    for (int side = 0; side < 2; side++) {
        fc_trace *t = tr[side];
        if (side == 0 && j->lock) continue;
        if (j->step == t->first_step) {
            if (fc_trace_read_init(t, j->prev[side], &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
        } else {
            fc_trace_step ps;
            fc_batch pb;
            float *const pbufs[4] = {side ? j->b[0] : j->a[0], j->prev[side], side ? j->b_prev_state[0] : j->a[2],
                                     side ? j->b_prev_state[1] : j->a[3]};
            if (fc_trace_read_step(t, j->step - 1, pbufs, NULL, &ps, &pb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            fc_batch_free(&pb);
        }
    }
    if (fc_trace_read_step(&p->a, j->step, j->lock ? NULL : j->a, j->prev[0], &j->sa, &j->bat[0], &e) ||
        fc_trace_read_step(&p->b, j->step, j->b, j->prev[1], &j->sb, &j->bat[1], &e))
        fc_die(FC_EXIT_USAGE, "%s", e.msg);
}

// A's side as `compare` judges it: re-run in lockstep, and with the step's
// gradient magnitudes in 16 bits; the context the engine judges it in.
static fc_cmp_ctx judge_a(judged *j, const fc_trace_pair *p, const fc_cmp_policy *pol, int magnitudes) {
    fc_error e;
    fc_rerun rr;  // closed after the magnitude pass: the last to close finalises a singleton MPI
    memset(&rr, 0, sizeof rr);
    if (j->lock) {
        const float *const state[2] = {j->b_prev_state[0], j->b_prev_state[1]};
        if (fc_pair_rerun_open(&rr, p, &e) || fc_rerun_step(&rr, j->step, j->prev[1], state, j->a, &j->sa, &e))
            fc_die(FC_EXIT_USAGE, "sensitivity: the lockstep re-run of step %ld failed (%s): use --trajectory", j->step,
                   e.msg);
        j->sa.batch = &j->bat[0];
    }
    fc_cmp_ctx ctx = fc_pair_ctx(p, pol, j->lock ? &rr : NULL);
    if (magnitudes && fc_cmp_policy_magnitudes(pol)) {
        fc_rerun mr;
        j->mag_buf = mallocCheck(p->a.model.numel * sizeof(float));
        if (fc_pair_magnitude_open(&mr, p, &e) ||
            fc_magnitude_step(&mr, j->step, j->sa.prev_params, (const float *const *)j->sa.state, j->mag_buf, &e))
            fc_die(FC_EXIT_USAGE, "sensitivity: the magnitude pass of step %ld failed (%s): use --trajectory", j->step,
                   e.msg);
        fc_rerun_close(&mr);
        j->sa.grad_mag = j->mag_buf;
    }
    fc_rerun_close(&rr);
    return ctx;
}

// Every kind's row: the loss, the gradient norm, then the largest tensors.
static void measure_kinds(probe *p, judged *j, const fc_trace_pair *tp) {
    fc_trace_step *sb = &j->sb;
    {  // the loss: a scalar, relative
        float keep = sb->loss;
        perturbation q = {.x = &sb->loss, .keep = &keep, .n = 1, .scale = fabs((double)keep)};
        printf("%-6s %-44s %10d  ", "loss", "loss", 1);
        print_delta(smallest(p, FC_CMP_LOSS, &q));
        printf("\n");
    }
    // the total gradient norm (both traces carry it): a double scalar, relative
    if (j->sa.has_norm && sb->has_norm) {
        perturbation q = {.n = 1, .scale = fabs(sb->grad_norm), .dx = &sb->grad_norm, .dkeep = sb->grad_norm};
        printf("%-6s %-44s %10d  ", "norm", "grad_norm", 1);
        print_delta(smallest(p, FC_CMP_NORM, &q));
        printf("\n");
    }
    const fc_model *m = &tp->b.model;
    measure(p, FC_CMP_GRAD, j->b[0], m, "grad", 0);
    measure(p, FC_CMP_PARAM, j->b[1], m, "param", tp->a.cfg.optim.lr);
    for (int i = 0; i < sb->n_state; i++) {
        char name[64];
        snprintf(name, sizeof name, "optim.%s", sb->state_names[i]);
        measure(p, FC_CMP_OPTIM, j->b[2 + i], m, name, 0);
    }
    if (m->n_frozen) {  // by --freeze, or by LoRA (its base; the two exclude each other)
        char why[300];
        if (tp->b.cfg.model.lora_r) snprintf(why, sizeof why, "LoRA's base");
        else snprintf(why, sizeof why, "--freeze '%s'", tp->b.cfg.freeze);
        printf("frozen: %d parameter tensors (%s): value, gradient and optimizer state judged exactly, any change "
               "fails\n", m->n_frozen, why);
    }
}

int fc_cmd_sensitivity(int argc, char **argv) {
    sens_args o;
    if (parse_args(argc, argv, &o)) return FC_EXIT_PASS;
    // Every probe allocates and frees its allowances (hundreds of MB at gpt2-124m):
    // kept on the heap, they are reused instead of faulted in afresh from mmap.
    (void)mallopt(M_MMAP_MAX, 0);
    (void)mallopt(M_TRIM_THRESHOLD, INT_MAX);
    fc_threads_setup(o.threads, 1);  // one process: MPI is not started here
    fc_trace_pair tp;
    fc_pair_open(&tp, o.dirs[0], o.dirs[1]);
    const fc_trace *ta = &tp.a, *tb = &tp.b;
    if (!fc_model_config_equal(&ta->cfg.model, &tb->cfg.model))
        fc_die(FC_EXIT_USAGE, "%s and %s trained different models", o.dirs[0], o.dirs[1]);
    judged j = {.step = o.step < 0 ? fc_pair_first_step(&tp) : o.step};
    if (j.step < fc_pair_first_step(&tp) || j.step >= ta->first_step + ta->steps || j.step >= tb->first_step + tb->steps)
        fc_die(FC_EXIT_USAGE, "sensitivity --step %ld: not in both traces", j.step);
    size_t numel = ta->model.numel;
    alloc_step(&j, numel);
    // B's first step re-run too where A is a plan: from B's init and zero state (rerun.h)
    int recorded = o.trajectory || o.same_compute;
    j.first_rerun = !recorded && fc_rerun_first_step(ta, tb, j.step);
    j.lock = !recorded && (j.step > tb->first_step || j.first_rerun);
    read_step(&j, &tp);
    fc_cmp_policy pol;
    fc_cmp_policy_of(&pol, &tp.a.cfg, &tp.b.cfg, o.same_compute);
    fc_cmp_ctx ctx = judge_a(&j, &tp, &pol, !recorded);
    fc_cmp_result r;
    fc_cmp_result_init(&r, j.step);
    fc_compare_add(&ctx, &j.sa, &j.sb, FC_CMP_ALL, &r);
    probe p = {&ctx, &j.sa, &j.sb, &r, {0}};
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) p.unperturbed[k] = -1;
    printf("fsdpcheck sensitivity: %s vs %s, step %ld%s, %s row (%s), model %s (%zu parameters)\n", o.dirs[0],
           o.dirs[1], j.step, j.lock ? " (A re-run from B's state)" : "", r.lockstep ? "lockstep" : "diverged",
           fc_prec_name(r.lockstep ? pol.prec : pol.prec_div), ta->model.cfg.name, numel);
    printf("the smallest delta caught (the comparison of A with B perturbed fails; resolution 1.26x):\n");
    printf("%-6s %-44s %10s  %12s  %12s  %12s\n", "kind", "tensor", "elements", "elem@max", "elem@median",
           "whole tensor");
    measure_kinds(&p, &j, &tp);
    int pass = r.pass;
    fc_cmp_result_free(&r);
    fc_batch_free(&j.bat[0]);
    fc_batch_free(&j.bat[1]);
    free(j.mem);
    free(j.mag_buf);
    fc_pair_close(&tp);
    if (!pass) printf("note: A and B differ beyond the policy at this step already (compare says FAIL)\n");
    return FC_EXIT_PASS;
}
