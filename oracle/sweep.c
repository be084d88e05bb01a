// oracle/sweep.c — `mpiexec -n W fsdpcheck sweep`: the conformance gate.
//
// Draws seeded random cases from the config space (sweep_draw.c) at every
// world size W' = 1..W (sub-communicators of the job), runs each with the
// implementation under test and checks every property of docs/contract.md §8 that
// applies (sweep_case.c: numbers through the one comparison engine, the
// schedule and memory through the one theory). The first failing case is
// shrunk (sweep_shrink.c) while it keeps failing, and a one-line command that
// replays it is printed. This file is the command: flags, the loop, the
// memory profile for the report's plot, the reports.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "flags.h"
#include "mpicheck.h"
#include "runner.h"
#include "sweep_internal.h"
#include "threads.h"
#include "watchdog.h"

// ---------------------------------------------------------------------------
// memory profile for the report's plot

static void memory_profile(const fc_sweep_ctx *x, fc_sweep_report *rep) {
    snprintf(rep->plot_model, sizeof rep->plot_model, "gpt2-tiny");
    const fc_strategy s[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_FULL_SHARD};
    for (int W = 1; W <= x->W && rep->n_points + 3 <= 64; W++) {
        for (int i = 0; i < 3; i++) {
            fc_run_config c;
            fc_run_config_defaults(&c);
            fc_sweep_set_model(&c, "gpt2-tiny");
            c.strategy = s[i];
            c.steps = 1;
            c.seq_len = 8;
            fc_sweep_set_batch(&c, W, 1);
            fc_model m;
            fc_model_build_run(&m, &c);
            rep->plot_numel = m.numel;
            fc_model_free(&m);
            MPI_Comm sub = x->sub[W];
            fc_mem_point pt = {s[i], W, 0, 0, 0, 0};
            if (sub != MPI_COMM_NULL) {
                fc_run_result r;
                fc_runner_run(x->tested, &c, sub, &r);
                const size_t *pk = r.mem.peak[FC_LOC_DEVICE];
                pt.param = pk[FC_MEM_PARAM_SHARD], pt.grad = pk[FC_MEM_GRAD_SHARD];
                pt.optim = pk[FC_MEM_OPTIM_STATE], pt.gathered = pk[FC_MEM_GATHERED_PARAMS];
                fc_runner_free(&r);
            }
            fc_mpi_barrier(MPI_COMM_WORLD);
            if (x->rank == 0) rep->points[rep->n_points++] = pt;
        }
    }
}

// ---------------------------------------------------------------------------
// the command

static void usage(FILE *f) {
    fputs("usage: mpiexec -n W fsdpcheck sweep [--impl reference|cuda|PATH.so] [--cases N] [--seed S]\n"
          "           [--inject FAULT] [--report FILE.md] [--junit FILE.xml] [--keep-going] [--quiet]\n"
          "           [--timeout S] [--threads N]\n"
          "  --threads N  OpenMP threads per rank for the reference's layers (default: the node's\n"
          "               cores / its ranks, at least 1); no result depends on it\n"
          "       mpiexec -n W fsdpcheck sweep --replay 'RUN FLAGS' [--impl X] [--inject FAULT] [--timeout S]\n"
          "  --timeout S  a case in which no rank makes progress for S seconds (a hung rank or\n"
          "               collective) fails as a timeout: the reports are written with it, one line\n"
          "               names where it hung, and every rank exits 3 (default 600)\n"
          "       mpiexec -n W fsdpcheck sweep --replay 'RUN FLAGS' --candidates\n"
          "  --candidates   prints the case's one-step simplifications, a line each: W<TAB>RUN FLAGS\n"
          "                 (what fsdpcheck-shrink-timeout tries on a case that hangs, one job each)\n",
          f);
}

// The command's flags.
typedef struct {
    int cases, keep_going, quiet, candidates, threads;
    double timeout;
    uint64_t seed;
    const char *impl, *report, *junit, *replay;
    fc_fault inject;
} sweep_flags;

// One sweep in progress. The watchdog's hook (core/watchdog.h) gets it as its
// context: when a case hangs, that case fails as a timeout and the reports
// are written with it.
typedef struct {
    fc_sweep_ctx x;
    sweep_flags f;
    fc_sweep_drawer draws;
    fc_sweep_report *rep;
    int current;                 // index of the case running, -1 outside the loop
    double t0;                   // when the sweep started
} sweep_run;

// The reproduce lines' flags past the case: --impl and --inject where not the defaults.
static void extra_flags(const sweep_run *sw, char *out, size_t cap) {
    const char *impl = sw->f.impl;
    fc_fault inject = sw->x.inject;
    snprintf(out, cap, "%s%s%s%s", strcmp(impl, "reference") ? " --impl " : "", strcmp(impl, "reference") ? impl : "",
             inject ? " --inject " : "", inject ? fc_fault_name(inject) : "");
}

static void on_timeout(const char *line, void *ctx) {
    sweep_run *sw = ctx;
    fc_sweep_report *rep = sw->rep;
    if (!rep || sw->current < 0) return;
    fc_case_result *r = &rep->cases[sw->current];
    r->index = sw->current;
    r->v.failed |= 1u << FC_P0_UNFINISHED;
    snprintf(r->v.detail, sizeof r->v.detail, "timeout: %s", line);
    rep->n = sw->current + 1;
    rep->n_failed++;
    printf("case %d timed out (W=%d): %s\n", sw->current, r->W, r->spec);
    char extra[700];
    extra_flags(sw, extra, sizeof extra);
    printf("reproduce: mpiexec -n %d fsdpcheck sweep --replay '%s' --timeout %g%s\n", r->W, r->spec, sw->f.timeout,
           extra);
    // a hung case ends this job: shrinking it takes one job per variant
    printf("shrink it: fsdpcheck-shrink-timeout %d '%s' %g%s\n", r->W, r->spec, sw->f.timeout, extra);
    fc_error e;
    if (sw->f.report && fc_report_markdown(rep, sw->f.report, &e)) fprintf(stderr, "fsdpcheck: --report: %s\n", e.msg);
    if (sw->f.junit && fc_report_junit(rep, sw->f.junit, &e)) fprintf(stderr, "fsdpcheck: --junit: %s\n", e.msg);
    fflush(stdout);
}

// ---------------------------------------------------------------------------
// flags

enum { F_HELP, F_KEEP_GOING, F_QUIET, F_CANDIDATES, F_IMPL, F_REPORT, F_JUNIT, F_REPLAY, F_CASES, F_SEED, F_INJECT,
       F_THREADS, F_TIMEOUT };
static const fc_flag FLAGS[] = {
    [F_HELP] = {"--help", FC_FLAG_SWITCH},      [F_KEEP_GOING] = {"--keep-going", FC_FLAG_SWITCH},
    [F_QUIET] = {"--quiet", FC_FLAG_SWITCH},    [F_CANDIDATES] = {"--candidates", FC_FLAG_SWITCH},
    [F_IMPL] = {"--impl", FC_FLAG_VALUE},       [F_REPORT] = {"--report", FC_FLAG_VALUE},
    [F_JUNIT] = {"--junit", FC_FLAG_VALUE},     [F_REPLAY] = {"--replay", FC_FLAG_VALUE},
    [F_CASES] = {"--cases", FC_FLAG_VALUE},     [F_SEED] = {"--seed", FC_FLAG_VALUE},
    [F_INJECT] = {"--inject", FC_FLAG_VALUE},   [F_THREADS] = {"--threads", FC_FLAG_VALUE},
    [F_TIMEOUT] = {"--timeout", FC_FLAG_VALUE},
};

// One flag (not --help) with its value into f; a bad value ends the job.
static void apply(sweep_flags *f, int rank, int id, const char *v) {
    char *end;
    fc_error e;
    switch (id) {
    case F_KEEP_GOING: f->keep_going = 1; break;
    case F_QUIET: f->quiet = 1; break;
    case F_CANDIDATES: f->candidates = 1; break;
    case F_IMPL: f->impl = v; break;
    case F_REPORT: f->report = v; break;
    case F_JUNIT: f->junit = v; break;
    case F_REPLAY: f->replay = v; break;
    case F_CASES:
        if (fc_flag_int(FLAGS[id].name, v, 1, 1000000, &f->cases, &e)) fc_die_all(rank, "sweep %s", e.msg);
        break;
    case F_SEED:  // strtoull's own forms ("+5", an overflow), which fc_flag_u64 refuses, as sweep has always taken them
        f->seed = strtoull(v, &end, 10);
        if (*end || !*v || *v == '-') fc_die_all(rank, "sweep --seed: '%s' is not a non-negative integer", v);
        break;
    case F_INJECT:
        if (fc_fault_parse(v, &f->inject) || f->inject == FC_FAULT_NONE)
            fc_die_all(rank, "sweep --inject: unknown fault '%s'", v);
        break;
    case F_THREADS:
        if (fc_flag_int(FLAGS[id].name, v, 1, FC_THREADS_MAX, &f->threads, &e)) fc_die_all(rank, "sweep %s", e.msg);
        break;
    case F_TIMEOUT:  // strtod's own forms (hex), which fc_flag_double refuses, as sweep has always taken them
        f->timeout = strtod(v, &end);
        if (*end || !*v || !(f->timeout >= 1 && f->timeout <= 604800))
            fc_die_all(rank, "sweep --timeout: '%s' is not a number of seconds in 1..604800", v);
        break;
    }
}

// Parses the command's flags into f; 1 when --help asked for the usage (printed).
// Every rank parses and only rank 0 prints, so the parser judges nothing
// (FC_FLAGS_PASS) and sweep's own misuse messages end the job through fc_die_all.
static int parse_flags(int argc, char **argv, int rank, sweep_flags *f) {
    *f = (sweep_flags){.cases = 300, .timeout = FC_DEFAULT_TIMEOUT, .seed = 1, .impl = "reference"};
    fc_flags it = fc_flags_begin(argc, argv, FLAGS, FC_FLAGS_COUNT(FLAGS), NULL, FC_FLAGS_PASS);
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        if (id == F_HELP) {
            if (rank == 0) usage(stdout);
            return 1;
        }
        // an unknown flag (or any other word) comes back as FC_FLAGS_ARG: sweep names it
        // unknown only when a value could follow it
        if (id == FC_FLAGS_ARG && it.i < argc)
            fc_die_all(rank, "sweep: unknown flag %s (see fsdpcheck sweep --help)", it.arg);
        if (id == FC_FLAGS_ARG || (FLAGS[id].kind == FC_FLAG_VALUE && !it.value))
            fc_die_all(rank, "sweep: %s needs a value (or is unknown: see fsdpcheck sweep --help)", it.arg);
        apply(f, rank, id, it.value);
    }
    if (f->candidates && !f->replay)
        fc_die_all(rank, "sweep --candidates: needs --replay 'RUN FLAGS' (the case to simplify)");
    return 0;
}

// How the implementation's own runs are judged, from what its table claims.
static void judged_text(const fc_sweep_ctx *x, char *out, size_t cap) {
    snprintf(out, cap, "%s claims %s: %s", x->tested->name,
             x->same_bits    ? "layout invariance and determinism"
             : x->repeatable ? "determinism, not layout invariance"
                             : "neither layout invariance nor determinism",
             x->same_bits    ? "its own runs on one reduction tree judged bitwise"
             : x->repeatable ? "its own runs judged per element by the policy, a case run twice bitwise"
                             : "its own runs, a case run twice included, judged per element by the policy");
}

// Starts the watchdog, resolves the implementations and makes the
// sub-communicators and the report; an error ends the job.
static void setup(sweep_run *sw) {
    fc_sweep_ctx *x = &sw->x;
    fc_error e;
    sw->f.threads = fc_threads_setup(sw->f.threads, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    if (fc_watchdog_start(MPI_COMM_WORLD, sw->f.timeout, &e)) fc_die_all(x->rank, "%s", e.msg);
    x->tested = fc_impl_resolve(sw->f.impl, &e);
    if (!x->tested) fc_die_all(x->rank, "%s", e.msg);
    x->ref = fc_reference_impl();
    x->tested_is_ref = x->tested == x->ref;
    x->same_bits = fc_impl_claims_same_bits(x->tested);
    x->repeatable = fc_impl_claims_repeatable(x->tested);
    x->inject = sw->f.inject;
    x->expect = (fc_prop)(fc_runner_act32(x->tested) ? fc_fault_property(x->inject)
                                                      : fc_fault_property_act16(x->inject));
    if (x->inject != FC_FAULT_NONE && !x->tested_is_ref && !(x->tested->features & FC_IMPL_FAULTS))
        fc_die_all(x->rank, "sweep --inject: %s has no fault catalogue built in (its table's features lack "
                            "FC_IMPL_FAULTS); inject into the reference or into a port built with it",
                   x->tested->name);
    fc_sweep_subs_make(x);
    fc_sweep_report *rep = callocCheck(1, sizeof *rep);
    snprintf(rep->impl, sizeof rep->impl, "%s", sw->f.impl);
    judged_text(x, rep->judged, sizeof rep->judged);
    rep->inject = x->inject;
    rep->seed = sw->f.seed;
    rep->world = x->W;
    sw->rep = rep;
    sw->t0 = fc_sweep_now();
}

// ---------------------------------------------------------------------------
// --replay: exactly one case, at this job's W

// The case --replay names: its run flags and the sweep's own --ckpt.
static void parse_replay(const sweep_run *sw, fc_run_args *ra, fc_case_ckpt *ck) {
    const fc_sweep_ctx *x = &sw->x;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", sw->f.replay);
    char *args[128];
    int n = 0;
    fc_error e;
    memset(ck, 0, sizeof *ck);
    for (char *tok = strtok(buf, " \t"); tok && n < 128; tok = strtok(NULL, " \t")) {
        if (strcmp(tok, "--ckpt") != 0) {
            args[n++] = tok;
            continue;
        }
        char *v = strtok(NULL, " \t"), kind[16] = "", strat[32] = "";
        if (!v || sscanf(v, "%15[a-z]:%d:%d:%31[a-z_0-9]", kind, &ck->at, &ck->W, strat) != 4 ||
            (strcmp(kind, "full") && strcmp(kind, "sharded")) || fc_strategy_parse(strat, &ck->strategy) ||
            ck->W < 1 || ck->W > x->W || ck->at < 1)
            fc_die_all(x->rank, "sweep --replay: --ckpt takes full|sharded:AT:W:STRATEGY with W <= the job's size");
        ck->on = 1;
        ck->sharded = !strcmp(kind, "sharded");
    }
    if (fc_cli_parse_run(n, args, ra, &e) != 0) fc_die_all(x->rank, "%s", e.msg);
    if (fc_run_config_validate_world(&ra->cfg, x->W, &e)) fc_die_all(x->rank, "%s", e.msg);
    if (ck->on && (ck->at >= ra->cfg.steps || ra->cfg.global_batch % (ck->W * ra->cfg.grad_accum)))
        fc_die_all(x->rank, "sweep --replay: --ckpt AT must be below --steps and W must divide the batch");
}

static int run_replay(sweep_run *sw) {
    const fc_sweep_ctx *x = &sw->x;
    fc_run_args ra;
    fc_case_ckpt ck;
    parse_replay(sw, &ra, &ck);
    if (sw->f.candidates) {
        for (int k = 0; x->rank == 0 && k < FC_SWEEP_N_SIMPLIFY; k++) {
            fc_run_config c2 = ra.cfg;
            fc_case_ckpt ck2 = ck;
            int W2 = x->W;
            if (!fc_sweep_simplify(k, &c2, &W2, &ck2)) continue;
            char spec[sizeof sw->rep->cases[0].spec];
            fc_sweep_case_spec(&c2, &ck2, spec, sizeof spec);
            printf("%d\t%s\n", W2, spec);
        }
        fc_watchdog_stop();
        return FC_EXIT_PASS;
    }
    fc_case_result r;
    fc_sweep_run_case(x, &ra.cfg, x->W, &ck, &r);
    fc_watchdog_stop();
    if (x->rank == 0) {
        for (int p = FC_P1_LOCAL; p < FC_NPROP; p++)
            if (r.v.checked & (1u << p))
                printf("P%-2d %-42s %s\n", p, fc_prop_name(p), r.v.failed & (1u << p) ? "FAIL" : "pass");
        if (r.v.failed) printf("%s\n", r.v.detail);
        if (r.v.failed && r.v.signature[0]) printf("signature: %s\n", r.v.signature);
        if (r.v.failed) printf("caught by P%d\n", fc_props_lowest(r.v.failed));
    }
    return r.v.failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
}

// ---------------------------------------------------------------------------
// the sweep

static void progress(const sweep_run *sw, int i, int W, const fc_run_config *c, int tty) {
    const fc_sweep_report *rep = sw->rep;
    int cases = sw->f.cases;
    if (sw->f.quiet || sw->x.rank != 0) return;
    if (!(tty || (i + 1) % 50 == 0 || rep->cases[i].v.failed || i + 1 == cases)) return;
    fprintf(stderr, "%s[%4d/%d] %5.1f s  passed %d  failed %d  (W=%d %s %s)%s", tty ? "\r" : "", i + 1, cases,
            fc_sweep_now() - sw->t0, rep->n - rep->n_failed, rep->n_failed, W, fc_strategy_name(c->strategy),
            c->model.name, tty ? "   " : "\n");
    fflush(stderr);
}

// Checks drawn cases until the first decisive failure (every case with
// --keep-going); returns its index, -1 if none.
static int run_cases(sweep_run *sw) {
    const fc_sweep_ctx *x = &sw->x;
    fc_sweep_report *rep = sw->rep;
    unsigned versions = x->tested->fsdp_versions & (x->inject ? fc_fault_versions(x->inject) : ~0u);
    sw->draws = (fc_sweep_drawer){.seed = sw->f.seed, .world = x->W, .fsdp_versions = versions,
                                  .features = x->tested->features, .inject = x->inject};
    int tty = isatty(STDERR_FILENO);
    int failed_at = -1;
    for (int i = 0; i < sw->f.cases; i++) {
        fc_run_config c;
        fc_case_ckpt ck;
        int W;
        fc_sweep_draw(&sw->draws, &c, &W, &ck);
        fc_case_result *r = &rep->cases[i];
        r->W = W;
        fc_sweep_case_spec(&c, &ck, r->spec, sizeof r->spec);
        sw->current = i;
        fc_sweep_run_case(x, &c, W, &ck, r);
        r->index = i;
        rep->n = i + 1;
        if (r->v.failed) rep->n_failed++;
        progress(sw, i, W, &c, tty);
        // With a fault injected, the failure the gate is after is the one the
        // catalogue expects to catch it: cases that fail only other
        // properties are counted, and the sweep goes on to one that fails it.
        int decisive = x->expect ? (r->v.failed >> x->expect) & 1 : r->v.failed != 0;
        if (decisive && failed_at < 0) failed_at = i;
        if (decisive && !sw->f.keep_going) break;
    }
    if (!sw->f.quiet && x->rank == 0 && tty) fputc('\n', stderr);
    if (failed_at < 0 && x->expect && rep->n_failed) {
        // no case failed the expected property: shrink the first failure anyway
        for (int i = 0; i < rep->n && failed_at < 0; i++)
            if (rep->cases[i].v.failed) failed_at = i;
    }
    return failed_at;
}

// Shrinks the failure at failed_at and writes the line that reproduces it.
static void shrink_failure(sweep_run *sw, int failed_at) {
    const fc_sweep_ctx *x = &sw->x;
    fc_sweep_report *rep = sw->rep;
    rep->have_shrunk = 1;
    rep->shrunk = rep->cases[failed_at];
    if (x->rank == 0)
        fprintf(stderr, "case %d failed (W=%d): %s\n  %s\n", failed_at, rep->shrunk.W, rep->shrunk.spec,
                rep->shrunk.v.detail);
    fc_sweep_shrink(x, &rep->shrunk, sw->f.quiet);
    // an injected fault is caught by the property the catalogue expects, if that failed
    unsigned failed = rep->shrunk.v.failed;
    rep->caught_by = x->expect && (failed >> x->expect) & 1 ? x->expect : fc_props_lowest(failed);
    int n = snprintf(rep->repro, sizeof rep->repro, "mpiexec -n %d fsdpcheck sweep --replay '%s'", rep->shrunk.W,
                     rep->shrunk.spec);  // under sizeof repro: spec is shorter
    extra_flags(sw, rep->repro + n, sizeof rep->repro - (size_t)n);
}

// Rank 0's summary lines and reports; returns rc, or FC_EXIT_USAGE when a report cannot be written.
static int summarize(const sweep_run *sw, int rc) {
    const fc_sweep_ctx *x = &sw->x;
    const fc_sweep_report *rep = sw->rep;
    const sweep_flags *f = &sw->f;
    int fsdp2 = 0;
    for (int i = 0; i < rep->n; i++) fsdp2 += rep->cases[i].cfg.fsdp_version == 2;
    printf("fsdpcheck sweep: %d cases (%d FSDP2%s) over W=1..%d, seed %llu, impl %s%s%s: %d passed, %d failed "
           "(%.1f s, %d threads per rank)\n",
           rep->n, fsdp2, x->tested->fsdp_versions & FC_IMPL_FSDP(2) ? "" : ": the implementation has FSDP1 only",
           x->W, (unsigned long long)f->seed, f->impl, x->inject ? ", injected " : "",
           x->inject ? fc_fault_name(x->inject) : "", rep->n - rep->n_failed, rep->n_failed, rep->seconds, f->threads);
    printf("judged: %s\n", rep->judged);
    if (rep->have_shrunk) {
        printf("minimal failing case (W=%d): %s\n  %s\n", rep->shrunk.W, rep->shrunk.spec, rep->shrunk.v.detail);
        if (rep->shrunk.v.signature[0]) printf("signature: %s\n", rep->shrunk.v.signature);
        printf("caught by P%d (%s)\n", rep->caught_by, fc_prop_name(rep->caught_by));
        printf("failed properties:");
        for (int p = FC_P1_LOCAL; p < FC_NPROP; p++)
            if ((rep->shrunk.v.failed >> p) & 1) printf(" P%d", p);
        if (x->expect) printf("; the fault catalogue expects P%d for %s", x->expect, fc_fault_name(x->inject));
        printf("\n");
        printf("reproduce: %s\n", rep->repro);
    }
    fc_error e;
    if (f->report && fc_report_markdown(rep, f->report, &e))
        fprintf(stderr, "fsdpcheck: --report: %s\n", e.msg), rc = FC_EXIT_USAGE;
    if (f->junit && fc_report_junit(rep, f->junit, &e))
        fprintf(stderr, "fsdpcheck: --junit: %s\n", e.msg), rc = FC_EXIT_USAGE;
    fflush(stdout);
    return rc;
}

static int run_sweep(sweep_run *sw) {
    const fc_sweep_ctx *x = &sw->x;
    fc_sweep_report *rep = sw->rep;
    rep->cases = callocCheck((size_t)sw->f.cases, sizeof(fc_case_result));
    fc_watchdog_on_timeout(on_timeout, sw);
    int failed_at = run_cases(sw);
    if (failed_at >= 0) shrink_failure(sw, failed_at);
    if (sw->f.report) memory_profile(x, rep);
    sw->current = -1;  // a hang from here on is no case's
    fc_watchdog_stop();
    rep->seconds = fc_sweep_now() - sw->t0;
    int rc = rep->n_failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
    char starved[200];
    if (fc_sweep_draw_starved(&sw->draws, starved, sizeof starved)) {  // every rank drew the same
        rc = FC_EXIT_FAIL;
        if (x->rank == 0) printf("fsdpcheck sweep: FAIL: %s\n", starved);
    }
    if (x->rank == 0) rc = summarize(sw, rc);
    fc_mpi_bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return rc;
}

int fc_cmd_sweep(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    sweep_run sw = {.current = -1};
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &sw.x.rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &sw.x.W));
    if (parse_flags(argc, argv, sw.x.rank, &sw.f)) {
        MPI_Finalize();
        return FC_EXIT_PASS;
    }
    setup(&sw);
    int rc = sw.f.replay ? run_replay(&sw) : run_sweep(&sw);
    free(sw.rep->cases);
    free(sw.rep);
    fc_sweep_subs_free(&sw.x);
    MPI_Finalize();
    return rc;
}
