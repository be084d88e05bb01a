// oracle/compare_cmd.c — `fsdpcheck compare DIR_A DIR_B`: reads two traces a
// step and a tensor set at a time, compares them through the engine
// (compare.h), prints the table and the first divergence, and with --report
// writes the same as Markdown.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "escape.h"
#include "fileio.h"
#include "layout.h"  // fc_divide_by
#include "rerun.h"
#include "threads.h"
#include "tracefile.h"

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

static double parse_tol(const char *flag, const char *v) {
    char *end;
    if (!*v || strpbrk(v, "xXiInN")) fc_die(FC_EXIT_USAGE, "%s: '%s' is not a finite decimal number", flag, v);
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || !isfinite(x) || x < 0)
        fc_die(FC_EXIT_USAGE, "%s: '%s' is not a finite non-negative number", flag, v);
    return x;
}

static void describe_run(const fc_trace *t, char *buf, size_t cap) {
    const fc_run_config *c = &t->cfg;
    snprintf(buf, cap, "%s%s, %s, W=%d, param/reduce %s/%s, steps %ld..%ld", t->impl,
             t->planned ? "'s plan, no step run" : "", fc_strategy_name(c->strategy), t->world_size,
             fc_prec_name(c->param_dtype), fc_prec_name(c->reduce_dtype), t->first_step, t->first_step + t->steps - 1);
}

// Markdown text in a table cell, escaped as the sweep's report escapes it.
static void md_text(FILE *f, const char *s) { fc_escape(s, SIZE_MAX, FC_ESC_MD_TEXT, fc_esc_to_file, f); }

static void write_report(const char *path, fc_trace *ta, fc_trace *tb, const fc_cmp_policy *pol,
                         const fc_cmp_result *res, int n_res, const fc_cmp_divergence *first) {
    char tmp[1200];
    fc_error e;
    FILE *f = fc_open_tmp(path, tmp, sizeof tmp, &e);
    if (!f) fc_die(FC_EXIT_USAGE, "--report %s: %s", path, e.msg);
    fc_trace *tr[2] = {ta, tb};
    fprintf(f, "# fsdpcheck compare\n\n**Result: %s**\n\n", first->found ? "FAIL" : "PASS");
    fprintf(f, "| | A (expected) | B (under test) |\n|---|---|---|\n");
    const char *rows[] = {"trace", "implementation", "strategy", "world size", "shard group", "param / reduce dtype",
                          "steps"};
    for (int row = 0; row < 7; row++) {
        fprintf(f, "| %s |", rows[row]);
        for (int s = 0; s < 2; s++) {
            const fc_trace *t = tr[s];
            fputc(' ', f);
            switch (row) {
            case 0: md_text(f, t->dir); break;
            case 1: md_text(f, t->impl); break;
            case 2: fputs(fc_strategy_name(t->cfg.strategy), f); break;
            case 3: fprintf(f, "%d", t->world_size); break;
            case 4:
                if (t->cfg.strategy == FC_STRATEGY_LOCAL || t->cfg.strategy == FC_STRATEGY_NO_SHARD) fputs("-", f);
                else fprintf(f, "%d", t->cfg.shard_group ? t->cfg.shard_group : t->world_size);
                break;
            case 5: fprintf(f, "%s / %s", fc_prec_name(t->cfg.param_dtype), fc_prec_name(t->cfg.reduce_dtype)); break;
            default: fprintf(f, "%ld..%ld", t->first_step, t->first_step + t->steps - 1); break;
            }
            fputs(" |", f);
        }
        fputc('\n', f);
    }
    fprintf(f, "\n## Tolerance policy (%s)\n\n| kind | lockstep (%s) | diverged (%s) |\n|---|---|---|\n",
            pol->bitwise ? "--bitwise" : pol->overridden ? "--rtol/--atol override" : fc_prec_name(pol->prec),
            fc_prec_name(pol->prec), fc_prec_name(pol->prec_div));
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        char t[64], u[64];
        fc_cmp_fmt_kind_tol((fc_cmp_kind)k, &pol->tol[k], t, sizeof t);
        fc_cmp_fmt_kind_tol((fc_cmp_kind)k, &pol->div[k], u, sizeof u);
        fprintf(f, "| %s | %s | %s |\n", fc_cmp_kind_name((fc_cmp_kind)k), t, u);
    }
    fprintf(f, "\nAn element passes when |A - B| <= atol + rtol * scale, scale = max(max|A|, max|B|) of its tensor "
               "(parameters: beyond what the two sides' optimizer inputs explain); a tensor when ||A - B|| <= ntol * "
               "||A||. NaN matches only NaN.\n");
    if (first->found) {
        fprintf(f, "\n## First divergence\n\n```\n");
        fc_cmp_print_divergence(f, first);
        fprintf(f, "```\n");
    }
    fprintf(f, "\n## Per step\n\n| step | kind | tensors | max abs err | max err/scale | ULP at scale | norm ratio "
               "| of tolerance | row | result |\n|---:|---|---:|---:|---:|---:|---:|---:|---|---|\n");
    for (int i = 0; i < n_res; i++)
        for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
            const fc_cmp_kind_stats *s = &res[i].kinds[k];
            if (!s->n_tensors) continue;
            char a[32], b[32], u[32], n[32], h[32];
            fprintf(f, "| %ld | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", res[i].step,
                    fc_cmp_kind_name((fc_cmp_kind)k), s->n_tensors, fc_cmp_fmt_err(s->max_abs, a, sizeof a),
                    fc_cmp_fmt_err(s->max_scaled, b, sizeof b), fc_cmp_fmt_err(s->max_ulp, u, sizeof u),
                    fc_cmp_fmt_err(s->norm_ratio, n, sizeof n), fc_cmp_fmt_err(s->headroom, h, sizeof h),
                    res[i].lockstep ? "lockstep" : "diverged", s->n_failed ? "**FAIL**" : "pass");
        }
    fprintf(f, "\n## Per tensor\n\n| step | tensor | elements | scale | max abs err | max err/scale | ULP at "
               "scale | norm ratio | outside tolerance | result |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < n_res; i++)
        for (int j = 0; j < res[i].n_tensors; j++) {
            const fc_cmp_tensor *t = &res[i].tensors[j];
            char sc[32], a[32], b[32], u[32], n[32];
            fprintf(f, "| %ld | ", res[i].step);
            md_text(f, t->name);
            fprintf(f, " | %zu | %s | %s | %s | %s | %s | %zu%s | %s", t->numel, fc_cmp_fmt_err(t->scale, sc, sizeof sc),
                    fc_cmp_fmt_err(t->max_abs, a, sizeof a), fc_cmp_fmt_err(t->max_scaled, b, sizeof b),
                    fc_cmp_fmt_err(t->max_ulp, u, sizeof u), fc_cmp_fmt_err(t->norm_ratio, n, sizeof n), t->n_bad,
                    t->norm_bad ? " + norm" : "", t->pass ? "pass" : "**FAIL**");
            if (t->note[0]) {
                fputs(": ", f);
                md_text(f, t->note);
            }
            fputs(" |\n", f);
        }
    if (ferror(f)) {
        fc_abort_tmp(f, tmp);
        fc_die(FC_EXIT_USAGE, "--report %s: write failed", path);
    }
    if (fc_commit_tmp(f, tmp, path, FC_DURABLE, &e)) fc_die(FC_EXIT_USAGE, "--report %s: %s", path, e.msg);
}

// A re-run of B's first step starts from B's initial weights: they must be
// A's, bit for bit (a plan's are what B was given to start from). Else the
// verdict is FAIL there, naming the first element that differs.
static void same_init(const fc_trace *ta, const float *a, const float *b) {
    const fc_model *m = &ta->model;
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

int fc_cmd_compare(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL}, *report = NULL;
    int n_dirs = 0, bitwise = 0, has_rtol = 0, has_atol = 0, same_compute = 0, trajectory = 0, threads = 0;
    double rtol = 0, atol = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) {
            if (n_dirs == 2)
                fc_die(FC_EXIT_USAGE, "compare: unexpected argument '%s' (it takes two trace directories)", arg);
            dirs[n_dirs++] = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        char name[32];
        if (len >= sizeof name) fc_die(FC_EXIT_USAGE, "compare: unknown flag %s (see fsdpcheck compare --help)", arg);
        memcpy(name, arg, len);
        name[len] = '\0';
        int takes_value = !strcmp(name, "--rtol") || !strcmp(name, "--atol") || !strcmp(name, "--report") ||
                          !strcmp(name, "--threads");
        int is_switch = !strcmp(name, "--bitwise") || !strcmp(name, "--help") || !strcmp(name, "--same-compute") ||
                        !strcmp(name, "--trajectory");
        if (!takes_value && !is_switch)
            fc_die(FC_EXIT_USAGE, "compare: unknown flag %s (see fsdpcheck compare --help)", name);
        if (is_switch && eq) fc_die(FC_EXIT_USAGE, "%s takes no value", name);
        const char *v = NULL;
        if (takes_value) {
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else fc_die(FC_EXIT_USAGE, "%s needs a value", name);
            if (!*v) fc_die(FC_EXIT_USAGE, "%s: empty value", name);
        }
        if (!strcmp(name, "--help")) {
            compare_usage(stdout);
            return FC_EXIT_PASS;
        } else if (!strcmp(name, "--bitwise")) {
            bitwise = 1;
        } else if (!strcmp(name, "--same-compute")) {
            same_compute = 1;
        } else if (!strcmp(name, "--trajectory")) {
            trajectory = 1;
        } else if (!strcmp(name, "--rtol")) {
            rtol = parse_tol(name, v), has_rtol = 1;
        } else if (!strcmp(name, "--atol")) {
            atol = parse_tol(name, v), has_atol = 1;
        } else if (!strcmp(name, "--threads")) {
            fc_error te;
            if (fc_threads_parse(v, &threads, &te)) fc_die(FC_EXIT_USAGE, "compare %s", te.msg);
        } else {
            report = v;
        }
    }
    if (n_dirs != 2) fc_die(FC_EXIT_USAGE, "compare needs two trace directories, DIR_A and DIR_B (got %d)", n_dirs);
    fc_threads_setup(threads, 1);  // one process: MPI is not started here
    if (bitwise && (has_rtol || has_atol))
        fc_die(FC_EXIT_USAGE,
               "--bitwise and --rtol/--atol exclude each other (bitwise means rtol = atol = 0 and equal bits)");

    fc_trace ta, tb;
    fc_error e;
    if (fc_trace_open(dirs[0], &ta, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    if (fc_trace_open(dirs[1], &tb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    char b_init[1100];  // what a re-run starts from before its first step loads B's state: read, not computed
    fc_trace_init_file(&tb, b_init, sizeof b_init);
    if (!fc_model_config_equal(&ta.cfg.model, &tb.cfg.model)) {
        char ma[300], mb[300];
        fc_model_config_describe(&ta.cfg.model, ma, sizeof ma);
        fc_model_config_describe(&tb.cfg.model, mb, sizeof mb);
        fc_die(FC_EXIT_USAGE, "%s and %s trained different models (%s vs %s): nothing to compare", dirs[0], dirs[1],
               ma, mb);
    }
    // the same parameters must train on both sides: a frozen one is judged exactly
    for (int i = 0; i < ta.model.n_params; i++)
        if (ta.model.params[i].frozen != tb.model.params[i].frozen)
            fc_die(FC_EXIT_USAGE, "%s and %s froze different parameters (--freeze '%s' vs '%s': %s is %s in the first): "
                   "nothing to compare", dirs[0], dirs[1], ta.cfg.freeze, tb.cfg.freeze, ta.model.params[i].name,
                   ta.model.params[i].frozen ? "frozen" : "trained");
    long lo = ta.first_step > tb.first_step ? ta.first_step : tb.first_step;
    long hi_a = ta.first_step + ta.steps, hi_b = tb.first_step + tb.steps;
    long hi = hi_a < hi_b ? hi_a : hi_b;
    if (lo >= hi)
        fc_die(FC_EXIT_USAGE, "%s has steps %ld..%ld and %s has steps %ld..%ld: no step in common", dirs[0],
               ta.first_step, hi_a - 1, dirs[1], tb.first_step, hi_b - 1);

    fc_cmp_policy pol;
    if (same_compute) {
        if (ta.world_size != tb.world_size || ta.cfg.global_batch != tb.cfg.global_batch ||
            ta.cfg.grad_accum != tb.cfg.grad_accum || ta.cfg.param_dtype != tb.cfg.param_dtype || strcmp(ta.impl, tb.impl))
            fc_die(FC_EXIT_USAGE, "--same-compute: the traces must come from one implementation at one world size, "
                                  "batch, accumulation and param_dtype (%s W=%d vs %s W=%d)", ta.impl, ta.world_size,
                   tb.impl, tb.world_size);
        fc_cmp_policy_same_compute(&pol, &ta.cfg, &tb.cfg);
    } else {
        fc_cmp_policy_defaults(&pol, fc_cmp_precision(&ta.cfg, &tb.cfg));
    }
    fc_cmp_policy_override(&pol, has_rtol, rtol, has_atol, atol);
    if (bitwise) fc_cmp_policy_bitwise(&pol);
    // the same model, so one registry describes both; B's config is the layout

    // Bitwise and same-compute comparisons judge the recorded trajectories:
    // equal bits stay equal, and runs of one arithmetic stay in lockstep by
    // themselves (a re-run in this one process would have another).
    int lock = !trajectory && !bitwise && !same_compute;
    // B's first step re-run too, from B's init and zero optimizer state (A a plan: rerun.h)
    int first_rerun = lock && fc_rerun_first_step(&ta, &tb, lo);
    // the tensor sets each side must hold (`run --trace-tensors first` keeps its first step's, a plan
    // none): B's every compared step; A's too, but in lockstep only a first step that is not re-run
    long a_needs = lock ? (lo == tb.first_step && !first_rerun ? lo + 1 : lo) : hi;
    const fc_trace *short_side = tb.first_step + tb.tensor_steps < hi     ? &tb
                                 : ta.first_step + ta.tensor_steps < a_needs ? &ta
                                                                             : NULL;
    if (short_side && short_side->planned)
        fc_die(FC_EXIT_USAGE, "%s: a plan (fsdpcheck plan) ran no step and holds no tensors: %s", short_side->dir,
               short_side == &tb ? "the trace under test (B) records every step it is judged on"
                                 : "compare a run against it in lockstep (no --trajectory, --bitwise or --same-compute)");
    if (short_side)
        fc_die(FC_EXIT_USAGE, "%s holds the tensors of steps %ld..%ld only (run --trace-tensors first): %s",
               short_side->dir, short_side->first_step, short_side->first_step + short_side->tensor_steps - 1,
               short_side == &tb ? "the trace under test (B) records every step it is judged on"
                                 : "as the expected side (A), compare it in lockstep (no --trajectory, --bitwise or "
                                   "--same-compute)");
    char da[400], db[400], mdesc[300];
    describe_run(&ta, da, sizeof da);
    describe_run(&tb, db, sizeof db);
    fc_model_config_describe(&ta.cfg.model, mdesc, sizeof mdesc);
    printf("fsdpcheck compare\n  A: %s (%s)\n  B: %s (%s)\n  model %s: %zu parameters in %d units; comparing steps "
           "%ld..%ld\n",
           dirs[0], da, dirs[1], db, mdesc, ta.model.numel, ta.model.n_units, lo, hi - 1);
    fc_cmp_print_policy(stdout, &pol);
    fc_cmp_print_header(stdout);

    fc_rerun rr;
    if (lock && fc_rerun_open(&rr, &ta.cfg, ta.world_size, b_init, &e))
        fc_die(FC_EXIT_USAGE, "compare: the reference cannot re-run %s's config for lockstep (%s): compare the "
                              "recorded trajectories with --trajectory", dirs[0], e.msg);
    printf("steps judged %s\n",
           !lock         ? "along the recorded trajectories (--trajectory, --bitwise or --same-compute)"
           : first_rerun ? "in lockstep: each step re-run by the reference from B's recorded state, the first from "
                           "B's initial weights (A's, bit for bit) and zero optimizer state (A's config, one process)"
                         : "in lockstep: each step after B's first re-run by the reference from B's recorded state "
                           "(A's config, one process)");

    // Each side's step and the one before it as views of their files (tracefile.h:
    // the sets in place, nothing copied); before the first compared step, the
    // initial parameters or the step before it (for B, with its state: what a
    // lockstep re-run starts from). In lockstep A's steps are the re-run's own
    // sets (rerun.h: the local reference's, lent in place), kept until its next step.
    size_t numel = ta.model.numel;
    fc_trace_view cur[2], prev[2];
    memset(cur, 0, sizeof cur);
    memset(prev, 0, sizeof prev);
    const float *prev_params[2] = {NULL, NULL}, *b_prev_state[2] = {NULL, NULL};
    fc_trace *tr[2] = {&ta, &tb};
    int b_has_prev_state = 0;
    for (int side = 0; side < 2; side++) {
        fc_trace *t = tr[side];
        if (lo == t->first_step) {
            if (fc_trace_view_init(t, &prev[side], &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            prev_params[side] = prev[side].sets[0];
        } else if (side == 0 && lock && lo > tb.first_step) {
            // B's step before the first compared one is read next, and the first step re-run from it
        } else {
            fc_trace_step ps;
            fc_batch pb;
            if (fc_trace_view_step(t, lo - 1, NULL, &prev[side], &ps, &pb, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
            fc_batch_free(&pb);
            prev_params[side] = ps.params;
            if (side == 1) b_prev_state[0] = ps.state[0], b_prev_state[1] = ps.state[1];
            b_has_prev_state = side == 1;
        }
    }
    float *zero_state = NULL;  // [numel]: a fresh optimizer's state, where the first step is re-run
    if (first_rerun) {
        same_init(&ta, prev[0].sets[0], prev[1].sets[0]);
        zero_state = callocCheck(numel, sizeof(float));
        b_prev_state[0] = b_prev_state[1] = zero_state;
        b_has_prev_state = 1;
    }
    fc_cmp_ctx ctx = {&tb.model, &pol, &tb.cfg, tb.world_size, &ta.cfg.optim, &ta.cfg, ta.world_size,
                      fc_cmp_impl_act32(ta.impl), fc_cmp_impl_act32(tb.impl), 0, 0};
    // 16 bits in lockstep: each step's gradient magnitudes, from the state it starts from (compare.h)
    fc_rerun mag;
    memset(&mag, 0, sizeof mag);
    float *mag_buf = NULL;
    if (lock && fc_cmp_policy_magnitudes(&pol)) {
        if (fc_magnitude_open(&mag, &ta.cfg, ta.world_size, b_init, &e))
            fc_die(FC_EXIT_USAGE, "compare: the magnitude pass cannot run %s's config (%s): use --trajectory", dirs[0],
                   e.msg);
        mag_buf = mallocCheck(numel * sizeof(float));
    }
    int n_res = (int)(hi - lo);
    fc_cmp_result *res = callocCheck((size_t)n_res, sizeof *res);
    fc_cmp_divergence first = {0};
    long failed_steps = 0;
    for (long s = lo; s < hi; s++) {
        fc_cmp_result *r = &res[s - lo];
        fc_trace_step st[2];
        fc_batch bat[2];
        int rerun = lock && b_has_prev_state;  // A's tensors of this step come from the re-run
        for (int side = 0; side < 2; side++) {
            // a re-run step needs A's batch alone: its tensors are not read at all
            int rc = side == 0 && rerun ? fc_trace_read_step(tr[0], s, NULL, prev_params[0], &st[0], &bat[0], &e)
                                        : fc_trace_view_step(tr[side], s, prev_params[side], &cur[side], &st[side],
                                                             &bat[side], &e);
            if (rc) fc_die(FC_EXIT_USAGE, "%s", e.msg);
        }
        fc_trace_step sa = st[0];
        if (rerun) {  // A's step s, re-run from B's state after s - 1
            if (fc_rerun_step(&rr, s, prev_params[1], b_prev_state, NULL, &sa, &e))
                fc_die(FC_EXIT_USAGE, "compare: the lockstep re-run of step %ld failed: %s", s, e.msg);
            sa.batch = st[0].batch;  // the recorded batch: the data must still be A's, exactly
        }
        ctx.a_world = rerun ? 1 : ta.world_size;                  // the re-run is one process
        ctx.a_divide_by = rerun ? fc_divide_by(&rr.cfg, 1) : 0;  // dividing by F / W where F was set
        ctx.a_act32 = rerun || fc_cmp_impl_act32(ta.impl);  // ... of the reference
        if (mag_buf) {
            // the magnitudes depend on the parameters and the batch; the state only travels along
            if (fc_magnitude_step(&mag, s, sa.prev_params, (const float *const *)sa.state, mag_buf, &e))
                fc_die(FC_EXIT_USAGE, "compare: the magnitude pass of step %ld failed: %s", s, e.msg);
            sa.grad_mag = mag_buf;
        }
        fc_compare_step(&ctx, &sa, &st[1], r);
        // this step's parameters (and B's state) are the next one's start; a re-run's are its own
        for (int side = 0; side < 2; side++) {
            fc_batch_free(&bat[side]);
            prev_params[side] = side ? st[1].params : sa.params;
            if (side == 0 && rerun) continue;
            fc_trace_view_close(&prev[side]);
            prev[side] = cur[side];
            memset(&cur[side], 0, sizeof cur[side]);
        }
        b_prev_state[0] = st[1].state[0], b_prev_state[1] = st[1].state[1];
        b_has_prev_state = 1;
        fc_cmp_print_rows(stdout, r);
        if (!r->pass) {
            failed_steps++;
            if (!first.found) first = r->first;
        }
    }
    if (lock) fc_rerun_close(&rr);
    fc_rerun_close(&mag);
    free(mag_buf);
    free(zero_state);
    for (int side = 0; side < 2; side++) fc_trace_view_close(&prev[side]);
    if (first.found) {
        fc_cmp_print_divergence(stdout, &first);
        printf("FAIL: %ld of %d steps differ beyond the policy\n", failed_steps, n_res);
    } else {
        printf("PASS: %d step%s agree within the policy\n", n_res, n_res == 1 ? "" : "s");
    }
    if (report) {
        write_report(report, &ta, &tb, &pol, res, n_res, &first);
        printf("report written to %s\n", report);
    }
    for (int i = 0; i < n_res; i++) fc_cmp_result_free(&res[i]);
    free(res);
    fc_trace_close(&ta);
    fc_trace_close(&tb);
    return first.found ? FC_EXIT_FAIL : FC_EXIT_PASS;
}
