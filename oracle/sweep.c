// oracle/sweep.c — `mpiexec -n W fsdpcheck sweep`: the conformance gate.
//
// Draws seeded random cases from the config space (sweep_draw.c) at every
// world size W' = 1..W (sub-communicators of the job), runs each with the
// implementation under test and checks every property of DESIGN §8 that
// applies (sweep_case.c: numbers through the one comparison engine, the
// schedule and memory through the one theory). The first failing case is
// shrunk (sweep_shrink.c) while it keeps failing, and a one-line command that
// replays it is printed. This file is the command: flags, the loop, the
// memory profile for the report's plot, the reports.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
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

// What the watchdog's hook needs when a case hangs (core/watchdog.h): the
// case in progress fails as a timeout and the reports are written with it.
static struct {
    fc_sweep_report *rep;
    int current;                 // index of the case running, -1 outside the loop
    const char *report, *junit, *impl;
    fc_fault inject;
    double timeout;
} g_sweep = {NULL, -1, NULL, NULL, NULL, FC_FAULT_NONE, 0};

static void on_timeout(const char *line, void *ctx) {
    (void)ctx;
    fc_sweep_report *rep = g_sweep.rep;
    if (!rep || g_sweep.current < 0) return;
    fc_case_result *r = &rep->cases[g_sweep.current];
    r->index = g_sweep.current;
    r->v.failed |= 1u;  // bit 0: the case did not finish
    snprintf(r->v.detail, sizeof r->v.detail, "timeout: %s", line);
    rep->n = g_sweep.current + 1;
    rep->n_failed++;
    printf("case %d timed out (W=%d): %s\n", g_sweep.current, r->W, r->spec);
    char extra[700];
    snprintf(extra, sizeof extra, "%s%s%s%s", strcmp(g_sweep.impl, "reference") ? " --impl " : "",
             strcmp(g_sweep.impl, "reference") ? g_sweep.impl : "", g_sweep.inject ? " --inject " : "",
             g_sweep.inject ? fc_fault_name(g_sweep.inject) : "");
    printf("reproduce: mpiexec -n %d fsdpcheck sweep --replay '%s' --timeout %g%s\n", r->W, r->spec, g_sweep.timeout,
           extra);
    // a hung case ends this job: shrinking it takes one job per variant
    printf("shrink it: fsdpcheck-shrink-timeout %d '%s' %g%s\n", r->W, r->spec, g_sweep.timeout, extra);
    fc_error e;
    if (g_sweep.report && fc_report_markdown(rep, g_sweep.report, &e)) fprintf(stderr, "fsdpcheck: --report: %s\n", e.msg);
    if (g_sweep.junit && fc_report_junit(rep, g_sweep.junit, &e)) fprintf(stderr, "fsdpcheck: --junit: %s\n", e.msg);
    fflush(stdout);
}

static _Noreturn void die_all(int rank, const char *msg) {
    fc_watchdog_stop();
    MPI_Finalize();
    if (rank == 0) fc_die(FC_EXIT_USAGE, "%s", msg);
    exit(FC_EXIT_USAGE);
}

int fc_cmd_sweep(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    fc_sweep_ctx x = {0};
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &x.rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &x.W));
    int cases = 300, keep_going = 0, quiet = 0, candidates = 0, threads = 0;
    double timeout = FC_DEFAULT_TIMEOUT;
    uint64_t seed = 1;
    const char *impl = "reference", *report = NULL, *junit = NULL, *replay = NULL;
    char msg[600];
    fc_error e;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--help")) {
            if (x.rank == 0) usage(stdout);
            MPI_Finalize();
            return FC_EXIT_PASS;
        } else if (!strcmp(a, "--keep-going")) {
            keep_going = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--candidates")) {
            candidates = 1;
        } else if (!v) {
            snprintf(msg, sizeof msg, "sweep: %s needs a value (or is unknown: see fsdpcheck sweep --help)", a);
            die_all(x.rank, msg);
        } else if (!strcmp(a, "--cases")) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1000000) {
                snprintf(msg, sizeof msg, "sweep --cases: '%s' is not an integer in 1..1000000", v);
                die_all(x.rank, msg);
            }
            cases = (int)n, i++;
        } else if (!strcmp(a, "--seed")) {
            unsigned long long n = strtoull(v, &end, 10);
            if (*end || !*v || *v == '-') {
                snprintf(msg, sizeof msg, "sweep --seed: '%s' is not a non-negative integer", v);
                die_all(x.rank, msg);
            }
            seed = n, i++;
        } else if (!strcmp(a, "--impl")) {
            impl = v, i++;
        } else if (!strcmp(a, "--inject")) {
            if (fc_fault_parse(v, &x.inject) || x.inject == FC_FAULT_NONE) {
                snprintf(msg, sizeof msg, "sweep --inject: unknown fault '%s'", v);
                die_all(x.rank, msg);
            }
            i++;
        } else if (!strcmp(a, "--report")) {
            report = v, i++;
        } else if (!strcmp(a, "--junit")) {
            junit = v, i++;
        } else if (!strcmp(a, "--replay")) {
            replay = v, i++;
        } else if (!strcmp(a, "--threads")) {
            if (fc_threads_parse(v, &threads, &e)) {
                snprintf(msg, sizeof msg, "sweep %s", e.msg);
                die_all(x.rank, msg);
            }
            i++;
        } else if (!strcmp(a, "--timeout")) {
            timeout = strtod(v, &end);
            if (*end || !*v || !(timeout >= 1 && timeout <= 604800)) {
                snprintf(msg, sizeof msg, "sweep --timeout: '%s' is not a number of seconds in 1..604800", v);
                die_all(x.rank, msg);
            }
            i++;
        } else {
            snprintf(msg, sizeof msg, "sweep: unknown flag %s (see fsdpcheck sweep --help)", a);
            die_all(x.rank, msg);
        }
    }
    if (candidates && !replay) die_all(x.rank, "sweep --candidates: needs --replay 'RUN FLAGS' (the case to simplify)");
    threads = fc_threads_setup(threads, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    if (fc_watchdog_start(MPI_COMM_WORLD, timeout, &e)) die_all(x.rank, e.msg);
    x.tested = fc_impl_resolve(impl, &e);
    if (!x.tested) die_all(x.rank, e.msg);
    x.ref = fc_reference_impl();
    x.tested_is_ref = x.tested == x.ref;
    x.expect = fc_fault_property(x.inject);
    if (x.inject != FC_FAULT_NONE && !x.tested_is_ref)
        die_all(x.rank, "sweep --inject: faults are injected into the reference only");
    fc_sweep_subs_make(&x);

    fc_sweep_report *rep = callocCheck(1, sizeof *rep);
    snprintf(rep->impl, sizeof rep->impl, "%s", impl);
    rep->inject = x.inject;
    rep->seed = seed;
    rep->world = x.W;
    double t0 = fc_sweep_now();

    if (replay) {  // exactly one case, at this job's W
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", replay);
        char *args[128];
        int n = 0;
        fc_case_ckpt ck = {0};
        for (char *tok = strtok(buf, " \t"); tok && n < 128; tok = strtok(NULL, " \t")) {
            if (strcmp(tok, "--ckpt") != 0) {
                args[n++] = tok;
                continue;
            }
            char *v = strtok(NULL, " \t"), kind[16] = "", strat[32] = "";
            if (!v || sscanf(v, "%15[a-z]:%d:%d:%31[a-z_0-9]", kind, &ck.at, &ck.W, strat) != 4 ||
                (strcmp(kind, "full") && strcmp(kind, "sharded")) || fc_strategy_parse(strat, &ck.strategy) ||
                ck.W < 1 || ck.W > x.W || ck.at < 1)
                die_all(x.rank, "sweep --replay: --ckpt takes full|sharded:AT:W:STRATEGY with W <= the job's size");
            ck.on = 1;
            ck.sharded = !strcmp(kind, "sharded");
        }
        fc_run_args ra;
        if (fc_cli_parse_run(n, args, &ra, &e) != 0) die_all(x.rank, e.msg);
        if (fc_run_config_validate_world(&ra.cfg, x.W, &e)) die_all(x.rank, e.msg);
        if (ck.on && (ck.at >= ra.cfg.steps || ra.cfg.global_batch % (ck.W * ra.cfg.grad_accum)))
            die_all(x.rank, "sweep --replay: --ckpt AT must be below --steps and W must divide the batch");
        if (candidates) {
            for (int k = 0; x.rank == 0 && k < FC_SWEEP_N_SIMPLIFY; k++) {
                fc_run_config c2 = ra.cfg;
                fc_case_ckpt ck2 = ck;
                int W2 = x.W;
                if (!fc_sweep_simplify(k, &c2, &W2, &ck2)) continue;
                char spec[sizeof rep->cases[0].spec];
                fc_sweep_case_spec(&c2, &ck2, spec, sizeof spec);
                printf("%d\t%s\n", W2, spec);
            }
            fc_watchdog_stop();
            fc_sweep_subs_free(&x);
            free(rep);
            MPI_Finalize();
            return FC_EXIT_PASS;
        }
        fc_case_result r;
        fc_sweep_run_case(&x, &ra.cfg, x.W, &ck, &r);
        fc_watchdog_stop();
        if (x.rank == 0) {
            for (int p = 1; p < FC_NPROP; p++)
                if (r.v.checked & (1u << p))
                    printf("P%-2d %-42s %s\n", p, fc_prop_name(p), r.v.failed & (1u << p) ? "FAIL" : "pass");
            if (r.v.failed) printf("%s\ncaught by P%d\n", r.v.detail, fc_props_lowest(r.v.failed));
        }
        fc_sweep_subs_free(&x);
        free(rep);
        MPI_Finalize();
        return r.v.failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
    }

    rep->cases = callocCheck((size_t)cases, sizeof(fc_case_result));
    g_sweep.rep = rep, g_sweep.report = report, g_sweep.junit = junit, g_sweep.impl = impl;
    g_sweep.inject = x.inject, g_sweep.timeout = timeout;
    fc_watchdog_on_timeout(on_timeout, NULL);
    uint64_t s = seed;
    int tty = isatty(STDERR_FILENO);
    int failed_at = -1;
    for (int i = 0; i < cases; i++) {
        fc_run_config c;
        fc_case_ckpt ck;
        int W;
        unsigned versions = x.tested->fsdp_versions & (x.inject ? fc_fault_versions(x.inject) : ~0u);
        fc_sweep_draw(&s, x.W, versions, x.tested->features, x.inject, &c, &W, &ck);
        fc_case_result *r = &rep->cases[i];
        r->W = W;
        fc_sweep_case_spec(&c, &ck, r->spec, sizeof r->spec);
        g_sweep.current = i;
        fc_sweep_run_case(&x, &c, W, &ck, r);
        r->index = i;
        rep->n = i + 1;
        if (r->v.failed) rep->n_failed++;
        if (!quiet && x.rank == 0 && (tty || (i + 1) % 50 == 0 || r->v.failed || i + 1 == cases)) {
            fprintf(stderr, "%s[%4d/%d] %5.1f s  passed %d  failed %d  (W=%d %s %s)%s", tty ? "\r" : "", i + 1, cases,
                    fc_sweep_now() - t0, rep->n - rep->n_failed, rep->n_failed, W, fc_strategy_name(c.strategy),
                    c.model.name, tty ? "   " : "\n");
            fflush(stderr);
        }
        // With a fault injected, the failure the gate is after is the one the
        // catalogue expects to catch it: cases that fail only other
        // properties are counted, and the sweep goes on to one that fails it.
        int decisive = x.expect ? (r->v.failed >> x.expect) & 1 : r->v.failed != 0;
        if (decisive && failed_at < 0) failed_at = i;
        if (decisive && !keep_going) break;
    }
    if (!quiet && x.rank == 0 && tty) fputc('\n', stderr);
    if (failed_at < 0 && x.expect && rep->n_failed) {
        // no case failed the expected property: shrink the first failure anyway
        for (int i = 0; i < rep->n && failed_at < 0; i++)
            if (rep->cases[i].v.failed) failed_at = i;
    }
    if (failed_at >= 0) {
        rep->have_shrunk = 1;
        rep->shrunk = rep->cases[failed_at];
        if (x.rank == 0) fprintf(stderr, "case %d failed (W=%d): %s\n  %s\n", failed_at, rep->shrunk.W,
                                 rep->shrunk.spec, rep->shrunk.v.detail);
        fc_sweep_shrink(&x, &rep->shrunk, quiet);
        // an injected fault is caught by the property the catalogue expects, if that failed
        rep->caught_by = x.expect && (rep->shrunk.v.failed >> x.expect) & 1 ? x.expect : fc_props_lowest(rep->shrunk.v.failed);
        int n = snprintf(rep->repro, sizeof rep->repro, "mpiexec -n %d fsdpcheck sweep --replay '%s'", rep->shrunk.W,
                         rep->shrunk.spec);
        if (strcmp(impl, "reference")) n += snprintf(rep->repro + n, sizeof rep->repro - (size_t)n, " --impl %s", impl);
        if (x.inject) snprintf(rep->repro + n, sizeof rep->repro - (size_t)n, " --inject %s", fc_fault_name(x.inject));
    }
    if (report) memory_profile(&x, rep);
    g_sweep.current = -1;  // a hang from here on is no case's
    fc_watchdog_stop();
    rep->seconds = fc_sweep_now() - t0;
    int rc = rep->n_failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
    char starved[200];
    if (fc_sweep_draw_starved(starved, sizeof starved)) {  // every rank drew the same
        rc = FC_EXIT_FAIL;
        if (x.rank == 0) printf("fsdpcheck sweep: FAIL: %s\n", starved);
    }
    if (x.rank == 0) {
        int fsdp2 = 0;
        for (int i = 0; i < rep->n; i++) fsdp2 += rep->cases[i].cfg.fsdp_version == 2;
        printf("fsdpcheck sweep: %d cases (%d FSDP2%s) over W=1..%d, seed %llu, impl %s%s%s: %d passed, %d failed "
               "(%.1f s, %d threads per rank)\n",
               rep->n, fsdp2, x.tested->fsdp_versions & FC_IMPL_FSDP(2) ? "" : ": the implementation has FSDP1 only", x.W, (unsigned long long)seed, impl, x.inject ? ", injected " : "",
               x.inject ? fc_fault_name(x.inject) : "", rep->n - rep->n_failed, rep->n_failed, rep->seconds, threads);
        if (rep->have_shrunk) {
            printf("minimal failing case (W=%d): %s\n  %s\n", rep->shrunk.W, rep->shrunk.spec, rep->shrunk.v.detail);
            printf("caught by P%d (%s)\n", rep->caught_by, fc_prop_name(rep->caught_by));
            printf("failed properties:");
            for (int p = 1; p < FC_NPROP; p++)
                if ((rep->shrunk.v.failed >> p) & 1) printf(" P%d", p);
            if (x.expect) printf("; the fault catalogue expects P%d for %s", x.expect, fc_fault_name(x.inject));
            printf("\n");
            printf("reproduce: %s\n", rep->repro);
        }
        if (report && fc_report_markdown(rep, report, &e)) fprintf(stderr, "fsdpcheck: --report: %s\n", e.msg), rc = FC_EXIT_USAGE;
        if (junit && fc_report_junit(rep, junit, &e)) fprintf(stderr, "fsdpcheck: --junit: %s\n", e.msg), rc = FC_EXIT_USAGE;
        fflush(stdout);
    }
    fc_mpi_bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(rep->cases);
    free(rep);
    fc_sweep_subs_free(&x);
    MPI_Finalize();
    return rc;
}
