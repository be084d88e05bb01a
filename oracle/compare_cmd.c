// oracle/compare_cmd.c — `fsdpcheck compare DIR_A DIR_B`: reads two traces a
// step and a tensor set at a time, compares them through the engine
// (compare.h), prints the table and the first divergence, and with --report
// writes the same as Markdown (compare_cmd_report.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare_cmd.h"
#include "flags.h"
#include "signature.h"
#include "threads.h"

static void compare_usage(FILE *f) {
    fputs("usage: fsdpcheck compare DIR_A DIR_B [--rtol R] [--atol A | --bitwise] [--trajectory] [--report FILE.md]\n"
          "  Compares two traces (run --trace DIR) step by step: batch (always exact), loss,\n"
          "  gradients, parameters and optimizer state. DIR_A is the expected side; the owner of\n"
          "  a divergent element is given under DIR_B's layout. An element's error is judged\n"
          "  against its tensor's scale (max |A|, |B|), and each tensor's error norm against ||A||.\n"
          "  Every step after B's first is judged in lockstep: the reference re-runs it, with A's\n"
          "  config in this process, from B's recorded parameters and optimizer state after the\n"
          "  step before, on the same batch (A's own tensors of that step are not used).\n"
          "  --trajectory         compare A's recorded steps instead (traces the reference cannot\n"
          "                       re-run); later steps are then judged by the looser diverged rows\n"
          "                       once the runs' parameters drift apart\n"
          "  --rtol R             the per-element tolerance relative to the tensor's scale, for\n"
          "                       every float kind (the norm tolerance scales with it)\n"
          "  --atol A             an absolute floor added to every element's tolerance (default 0)\n"
          "  --bitwise            require identical bits everywhere\n"
          "  --same-compute       the traces share their per-rank arithmetic (one implementation, one W\n"
          "                       and data split; only the reduction tree, prefetch or offload differ):\n"
          "                       judged by their reduce_dtype while in lockstep (P9's comparison);\n"
          "                       compares the trajectories (a re-run in one process has other arithmetic)\n"
          "  --report FILE.md     also write a Markdown report\n"
          "  --threads N          OpenMP threads for the lockstep re-run (default: the node's cores);\n"
          "                       no result depends on it\n"
          "exit codes: 0 pass, 1 mismatch, 2 bad input\n",
          f);
}

typedef struct {
    const char *dirs[2], *report;
    int n_dirs, bitwise, has_rtol, has_atol, same_compute, trajectory, threads;
    double rtol, atol;
} compare_args;

// A tolerance: a finite non-negative decimal (flags.h), out of range named as not finite.
static double parse_tol(const char *flag, const char *v) {
    double x;
    fc_error e;
    int rc = fc_flag_double(flag, v, &x, &e);
    if (rc == FC_FLAG_RANGE) fc_die(FC_EXIT_USAGE, "%s: '%s' is not a finite non-negative number", flag, v);
    if (rc) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    return x;
}

// compare's flags into o; 1 when --help was asked for (and printed).
static int parse_args(int argc, char **argv, compare_args *o) {
    enum { RTOL, ATOL, REPORT, THREADS, BITWISE, HELP, SAME_COMPUTE, TRAJECTORY };
    static const fc_flag flags[] = {
        [RTOL] = {"--rtol", FC_FLAG_VALUE},       [ATOL] = {"--atol", FC_FLAG_VALUE},
        [REPORT] = {"--report", FC_FLAG_VALUE},   [THREADS] = {"--threads", FC_FLAG_VALUE},
        [BITWISE] = {"--bitwise", FC_FLAG_SWITCH}, [HELP] = {"--help", FC_FLAG_SWITCH},
        [SAME_COMPUTE] = {"--same-compute", FC_FLAG_SWITCH}, [TRAJECTORY] = {"--trajectory", FC_FLAG_SWITCH},
    };
    static const fc_flag_words words = {"compare: ", " (see fsdpcheck compare --help)", "", ""};
    memset(o, 0, sizeof *o);
    fc_flags it = fc_flags_begin(argc, argv, flags, FC_FLAGS_COUNT(flags), &words, FC_FLAGS_EQUALS);
    fc_error te;
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        switch (id) {
        case FC_FLAGS_ARG:
            if (o->n_dirs == 2)
                fc_die(FC_EXIT_USAGE, "compare: unexpected argument '%s' (it takes two trace directories)", it.arg);
            o->dirs[o->n_dirs++] = it.arg;
            break;
        case HELP: compare_usage(stdout); return 1;
        case BITWISE: o->bitwise = 1; break;
        case SAME_COMPUTE: o->same_compute = 1; break;
        case TRAJECTORY: o->trajectory = 1; break;
        case RTOL: o->rtol = parse_tol(it.name, it.value), o->has_rtol = 1; break;
        case ATOL: o->atol = parse_tol(it.name, it.value), o->has_atol = 1; break;
        case THREADS:
            if (fc_flag_int(it.name, it.value, 1, FC_THREADS_MAX, &o->threads, &te))
                fc_die(FC_EXIT_USAGE, "compare %s", te.msg);
            break;
        case REPORT: o->report = it.value; break;
        }
    }
    if (o->n_dirs != 2) fc_die(FC_EXIT_USAGE, "compare needs two trace directories, DIR_A and DIR_B (got %d)", o->n_dirs);
    fc_threads_setup(o->threads, 1);  // one process: MPI is not started here
    if (o->bitwise && (o->has_rtol || o->has_atol))
        fc_die(FC_EXIT_USAGE,
               "--bitwise and --rtol/--atol exclude each other (bitwise means rtol = atol = 0 and equal bits)");
    return 0;
}

// The traces must be of one training (model, frozen parameters) with steps in
// common: [*lo, *hi).
static void check_same_training(const fc_trace_pair *p, long *lo, long *hi) {
    const fc_trace *ta = &p->a, *tb = &p->b;
    if (!fc_model_config_equal(&ta->cfg.model, &tb->cfg.model)) {
        char ma[300], mb[300];
        fc_model_config_describe(&ta->cfg.model, ma, sizeof ma);
        fc_model_config_describe(&tb->cfg.model, mb, sizeof mb);
        fc_die(FC_EXIT_USAGE, "%s and %s trained different models (%s vs %s): nothing to compare", p->dir_a,
               p->dir_b, ma, mb);
    }
    // the same parameters must train on both sides: a frozen one is judged exactly
    for (int i = 0; i < ta->model.n_params; i++)
        if (ta->model.params[i].frozen != tb->model.params[i].frozen)
            fc_die(FC_EXIT_USAGE, "%s and %s froze different parameters (--freeze '%s' vs '%s': %s is %s in the first): "
                   "nothing to compare", p->dir_a, p->dir_b, ta->cfg.freeze, tb->cfg.freeze, ta->model.params[i].name,
                   ta->model.params[i].frozen ? "frozen" : "trained");
    *lo = fc_pair_first_step(p);
    long hi_a = ta->first_step + ta->steps, hi_b = tb->first_step + tb->steps;
    *hi = hi_a < hi_b ? hi_a : hi_b;
    if (*lo >= *hi)
        fc_die(FC_EXIT_USAGE, "%s has steps %ld..%ld and %s has steps %ld..%ld: no step in common", p->dir_a,
               ta->first_step, hi_a - 1, p->dir_b, tb->first_step, hi_b - 1);
}

static void make_policy(fc_cmp_policy *pol, const fc_trace_pair *p, const compare_args *o) {
    const fc_trace *ta = &p->a, *tb = &p->b;
    if (o->same_compute && (ta->world_size != tb->world_size || ta->cfg.global_batch != tb->cfg.global_batch ||
                            ta->cfg.grad_accum != tb->cfg.grad_accum || ta->cfg.param_dtype != tb->cfg.param_dtype ||
                            strcmp(ta->impl, tb->impl)))
        fc_die(FC_EXIT_USAGE, "--same-compute: the traces must come from one implementation at one world size, "
                              "batch, accumulation and param_dtype (%s W=%d vs %s W=%d)", ta->impl, ta->world_size,
               tb->impl, tb->world_size);
    fc_cmp_policy_of(pol, &p->a.cfg, &p->b.cfg, o->same_compute);
    fc_cmp_policy_override(pol, o->has_rtol, o->rtol, o->has_atol, o->atol);
    if (o->bitwise) fc_cmp_policy_bitwise(pol);
}

// The tensor sets each side must hold (`run --trace-tensors first` keeps its first step's, a plan
// none): B's every compared step; A's too, but in lockstep only a first step that is not re-run.
static void check_tensors_held(const fc_trace_pair *p, int lock, int first_rerun, long lo, long hi) {
    const fc_trace *ta = &p->a, *tb = &p->b;
    long a_needs = lock ? (lo == tb->first_step && !first_rerun ? lo + 1 : lo) : hi;
    const fc_trace *short_side = tb->first_step + tb->tensor_steps < hi        ? tb
                                 : ta->first_step + ta->tensor_steps < a_needs ? ta
                                                                               : NULL;
    if (short_side && short_side->planned)
        fc_die(FC_EXIT_USAGE, "%s: a plan (fsdpcheck plan) ran no step and holds no tensors: %s", short_side->dir,
               short_side == tb ? "the trace under test (B) records every step it is judged on"
                                : "compare a run against it in lockstep (no --trajectory, --bitwise or --same-compute)");
    if (short_side)
        fc_die(FC_EXIT_USAGE, "%s holds the tensors of steps %ld..%ld only (run --trace-tensors first): %s",
               short_side->dir, short_side->first_step, short_side->first_step + short_side->tensor_steps - 1,
               short_side == tb ? "the trace under test (B) records every step it is judged on"
                                : "as the expected side (A), compare it in lockstep (no --trajectory, --bitwise or "
                                  "--same-compute)");
}

static void describe_run(const fc_trace *t, char *buf, size_t cap) {
    const fc_run_config *c = &t->cfg;
    snprintf(buf, cap, "%s%s, %s, W=%d, param/reduce %s/%s, steps %ld..%ld", t->impl,
             t->planned ? "'s plan, no step run" : "", fc_strategy_name(c->strategy), t->world_size,
             fc_prec_name(c->param_dtype), fc_prec_name(c->reduce_dtype), t->first_step, t->first_step + t->steps - 1);
}

static void print_header(const fc_trace_pair *p, const fc_cmp_policy *pol, long lo, long hi) {
    char da[400], db[400], mdesc[300];
    describe_run(&p->a, da, sizeof da);
    describe_run(&p->b, db, sizeof db);
    fc_model_config_describe(&p->a.cfg.model, mdesc, sizeof mdesc);
    printf("fsdpcheck compare\n  A: %s (%s)\n  B: %s (%s)\n  model %s: %zu parameters in %d units; comparing steps "
           "%ld..%ld\n",
           p->dir_a, da, p->dir_b, db, mdesc, p->a.model.numel, p->a.model.n_units, lo, hi - 1);
    fc_cmp_print_policy(stdout, pol);
    fc_cmp_print_header(stdout);
}

// A re-run of B's first step starts from B's initial weights: they must be
// A's, bit for bit (a plan's are what B was given to start from). Else the
// verdict is FAIL there, naming the first element that differs.
static void same_init(const fc_model *m, const float *a, const float *b) {
    if (!memcmp(a, b, m->numel * sizeof(float))) return;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        for (size_t k = 0; k < p->numel; k++) {
            float x = a[p->offset + k], y = b[p->offset + k];
            if (memcmp(&x, &y, sizeof x)) {
                printf("first divergence: the initial weights, tensor %s, element %zu: A %.9g, B %.9g\n"
                       "FAIL: B did not start from A's initial weights: a lockstep re-run of step 0 starts from "
                       "B's own, so they must be A's bit for bit\n",
                       p->name, k, (double)x, (double)y);
                exit(FC_EXIT_FAIL);
            }
        }
    }
}

// The walk over the compared steps [lo, hi). Each side's step and the one
// before it are views of their files (tracefile.h: the sets in place, nothing
// copied); before the first compared step, the initial parameters or the step
// before it (for B, with its state: what a lockstep re-run starts from). In
// lockstep A's steps are the re-run's own sets (rerun.h: the local
// reference's, lent in place), kept until its next step.
typedef struct {
    fc_trace_pair *p;
    const fc_cmp_policy *pol;
    int lock, first_rerun;
    long lo;
    fc_rerun rr, mag;   // the lockstep re-run (lock); the magnitude pass (mag_buf)
    float *mag_buf;     // [numel] the step's gradient magnitudes, or NULL
    float *zero_state;  // [numel] a fresh optimizer's state, where the first step is re-run
    fc_trace_view cur[2], prev[2];
    const float *prev_params[2], *b_prev_state[2];
    int b_has_prev_state;
    const float *b_prev_grads;  // B's gradients of the step before, while its view is open; NULL: none
    fc_signature sig;           // the first failing step's (signature.h)
} walk;

// fc_trace_step.release of the walk's steps: the views' pages under [p, p + n), whichever view holds them.
static void release_views(const void *arg, const float *p, size_t n) {
    const walk *w = arg;
    for (int side = 0; side < 2; side++) {
        fc_trace_view_release(&w->cur[side], p, n);
        fc_trace_view_release(&w->prev[side], p, n);
    }
}

// The re-run, announced with how the steps are judged.
static void open_rerun(walk *w) {
    fc_error e;
    memset(&w->rr, 0, sizeof w->rr);
    memset(&w->mag, 0, sizeof w->mag);
    if (w->lock && fc_pair_rerun_open(&w->rr, w->p, &e))
        fc_die(FC_EXIT_USAGE, "compare: the reference cannot re-run %s's config for lockstep (%s): compare the "
                              "recorded trajectories with --trajectory", w->p->dir_a, e.msg);
    // B's state the re-run starts from leaves the views' pages as it is copied in
    w->rr.release = release_views;
    w->rr.release_arg = w;
    printf("steps judged %s\n",
           !w->lock         ? "along the recorded trajectories (--trajectory, --bitwise or --same-compute)"
           : w->first_rerun ? "in lockstep: each step re-run by the reference from B's recorded state, the first from "
                              "B's initial weights (A's, bit for bit) and zero optimizer state (A's config, one process)"
                            : "in lockstep: each step after B's first re-run by the reference from B's recorded state "
                              "(A's config, one process)");
}

// What the first compared step starts from, on each side; the magnitude pass.
static void open_start(walk *w) {
    fc_trace *tr[2] = {&w->p->a, &w->p->b};
    fc_error e;
    for (int side = 0; side < 2; side++) {
        fc_trace *t = tr[side];
        if (w->lo == t->first_step) {
            if (fc_trace_view_init(t, &w->prev[side], &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            w->prev_params[side] = w->prev[side].sets[0];
        } else if (side == 0 && w->lock && w->lo > w->p->b.first_step) {
            // B's step before the first compared one is read next, and the first step re-run from it
        } else {
            fc_trace_step ps;
            fc_batch pb;
            if (fc_trace_view_step(t, w->lo - 1, NULL, &w->prev[side], &ps, &pb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            fc_batch_free(&pb);
            w->prev_params[side] = ps.params;
            if (side == 1) w->b_prev_state[0] = ps.state[0], w->b_prev_state[1] = ps.state[1], w->b_prev_grads = ps.grads;
            w->b_has_prev_state = side == 1;
        }
    }
    size_t numel = w->p->a.model.numel;
    if (w->first_rerun) {
        same_init(&w->p->a.model, w->prev[0].sets[0], w->prev[1].sets[0]);
        for (int side = 0; side < 2; side++) fc_trace_view_release_all(&w->prev[side]);
        w->zero_state = callocCheck(numel, sizeof(float));
        w->b_prev_state[0] = w->b_prev_state[1] = w->zero_state;
        w->b_has_prev_state = 1;
    }
    // 16 bits in lockstep: each step's gradient magnitudes, from the state it starts from (compare.h)
    if (w->lock && fc_cmp_policy_magnitudes(w->pol)) {
        if (fc_pair_magnitude_open(&w->mag, w->p, &e))
            fc_die(FC_EXIT_USAGE, "compare: the magnitude pass cannot run %s's config (%s): use --trajectory",
                   w->p->dir_a, e.msg);
        w->mag_buf = mallocCheck(numel * sizeof(float));
    }
}

// Step s judged into r; its parameters (and B's state) are the next one's start.
static void judge_step(walk *w, long s, fc_cmp_result *r) {
    fc_trace *tr[2] = {&w->p->a, &w->p->b};
    fc_trace_step st[2];
    fc_batch bat[2];
    fc_error e;
    int rerun = w->lock && w->b_has_prev_state;  // A's tensors of this step come from the re-run
    for (int side = 0; side < 2; side++) {
        // a re-run step needs A's batch alone: its tensors are not read at all
        int rc = side == 0 && rerun
                     ? fc_trace_read_step(tr[0], s, NULL, w->prev_params[0], &st[0], &bat[0], &e)
                     : fc_trace_view_step(tr[side], s, w->prev_params[side], &w->cur[side], &st[side], &bat[side], &e);
        if (rc) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    }
    fc_trace_step sa = st[0];
    if (rerun) {  // A's step s, re-run from B's state after s - 1
        if (fc_rerun_step(&w->rr, s, w->prev_params[1], w->b_prev_state, NULL, &sa, &e))
            fc_die(FC_EXIT_USAGE, "compare: the lockstep re-run of step %ld failed: %s", s, e.msg);
        sa.batch = st[0].batch;  // the recorded batch: the data must still be A's, exactly
    }
    for (int side = 0; side < 2; side++) {  // read a tensor at a time, as the engine releases them
        fc_trace_step *t = side ? &st[1] : &sa;
        t->release = release_views;
        t->release_arg = w;
    }
    fc_cmp_ctx ctx = fc_pair_ctx(w->p, w->pol, rerun ? &w->rr : NULL);
    if (w->mag_buf) {
        // the magnitudes depend on the parameters and the batch; the state only travels along
        if (fc_magnitude_step(&w->mag, s, sa.prev_params, (const float *const *)sa.state, w->mag_buf, &e))
            fc_die(FC_EXIT_USAGE, "compare: the magnitude pass of step %ld failed: %s", s, e.msg);
        sa.grad_mag = w->mag_buf;
    }
    // what the re-run started from is in it now: B's step before is read again only where a tensor is asked
    if (rerun) fc_trace_view_release_all(&w->prev[1]);
    fc_compare_step(&ctx, &sa, &st[1], r);
    // the first failure's kind, where both sides started from the same state (in lockstep, or at B's start)
    int same_start = rerun || (sa.prev_params && st[1].prev_params &&
                               !memcmp(sa.prev_params, st[1].prev_params, w->p->a.model.numel * sizeof(float)));
    if (!r->pass && !w->sig.text[0] && same_start) {
        fc_sig_input in = {&w->p->a.model, &w->p->b.cfg, w->p->b.world_size, &ctx, r, &sa, &st[1],
                           {w->b_has_prev_state ? w->b_prev_state[0] : NULL, w->b_has_prev_state ? w->b_prev_state[1] : NULL},
                           w->b_prev_grads, w->p->b_init[0] ? w->p->b_init : NULL, 1};
        fc_signature_find(&in, &w->sig);
    }
    for (int side = 0; side < 2; side++) {  // a re-run's parameters are its own
        fc_batch_free(&bat[side]);
        w->prev_params[side] = side ? st[1].params : sa.params;
        if (side == 0 && rerun) {  // nothing points into A's view of the step before any more
            fc_trace_view_close(&w->prev[0]);
            continue;
        }
        fc_trace_view_close(&w->prev[side]);
        w->prev[side] = w->cur[side];
        memset(&w->cur[side], 0, sizeof w->cur[side]);
    }
    w->b_prev_state[0] = st[1].state[0], w->b_prev_state[1] = st[1].state[1];
    w->b_has_prev_state = 1;
    w->b_prev_grads = st[1].grads;
}

static void close_walk(walk *w) {
    if (w->lock) fc_rerun_close(&w->rr);
    fc_rerun_close(&w->mag);
    free(w->mag_buf);
    free(w->zero_state);
    for (int side = 0; side < 2; side++) fc_trace_view_close(&w->prev[side]);
}

int fc_cmd_compare(int argc, char **argv) {
    compare_args o;
    if (parse_args(argc, argv, &o)) return FC_EXIT_PASS;
    fc_trace_pair p;
    fc_pair_open(&p, o.dirs[0], o.dirs[1]);
    long lo, hi;
    check_same_training(&p, &lo, &hi);
    fc_cmp_policy pol;
    make_policy(&pol, &p, &o);
    // Bitwise and same-compute comparisons judge the recorded trajectories:
    // equal bits stay equal, and runs of one arithmetic stay in lockstep by
    // themselves (a re-run in this one process would have another).
    walk w = {.p = &p, .pol = &pol, .lo = lo, .lock = !o.trajectory && !o.bitwise && !o.same_compute};
    // B's first step re-run too, from B's init and zero optimizer state (A a plan: rerun.h)
    w.first_rerun = w.lock && fc_rerun_first_step(&p.a, &p.b, lo);
    check_tensors_held(&p, w.lock, w.first_rerun, lo, hi);
    print_header(&p, &pol, lo, hi);
    open_rerun(&w);
    open_start(&w);
    int n_res = (int)(hi - lo);
    fc_cmp_result *res = callocCheck((size_t)n_res, sizeof *res);
    fc_cmp_divergence first = {0};
    long failed_steps = 0;
    for (long s = lo; s < hi; s++) {
        fc_cmp_result *r = &res[s - lo];
        judge_step(&w, s, r);
        fc_cmp_print_rows(stdout, r);
        if (!r->pass) {
            failed_steps++;
            if (!first.found) first = r->first;
        }
    }
    close_walk(&w);
    if (first.found) {
        fc_cmp_print_divergence(stdout, &first);
        if (w.sig.text[0]) fc_signature_print(stdout, &w.sig);
        printf("FAIL: %ld of %d steps differ beyond the policy\n", failed_steps, n_res);
    } else {
        printf("PASS: %d step%s agree within the policy\n", n_res, n_res == 1 ? "" : "s");
    }
    if (o.report) {
        fc_compare_write_report(o.report, &p, &pol, res, n_res, &first);
        printf("report written to %s\n", o.report);
    }
    for (int i = 0; i < n_res; i++) fc_cmp_result_free(&res[i]);
    free(res);
    fc_pair_close(&p);
    return first.found ? FC_EXIT_FAIL : FC_EXIT_PASS;
}
