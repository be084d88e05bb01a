// oracle/plan.c — `fsdpcheck plan --world W [run flags] --trace DIR`: the
// trace of a run that is yet to be judged, with no step run.
//
// It holds what every implementation's run of that config starts from and
// reads: init.safetensors (the seeded weights, core/init.h, or --init's; every
// world size, strategy and implementation starts from these bits), and each
// step's global batch (a pure function of seed and step, core/data.h). Its
// trace.json says "planned": true. `compare PLAN B` judges every step of B in
// lockstep (docs/contract.md §8), re-run by the reference from B's own state, the first
// from B's initial weights, which must be the plan's bit for bit, and zero
// optimizer state (rerun.h). So a check that gives an implementation its
// start and data from a trace need not run the W-rank reference beside it:
// `fsdpcheck-torch check` plans.
//
// One process, no MPI: W is what the run to be judged will use, for the
// config's checks (a global batch that W divides, a shard group of W).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "data.h"
#include "flags.h"
#include "init.h"
#include "threads.h"
#include "trace.h"
#include "weights.h"

static _Noreturn void usage_fail(const char *msg) {
    fc_die(FC_EXIT_USAGE, "plan: %s", msg);
}

// A plan's write failed: every file it wrote is removed, and the run ends with e.
static _Noreturn void trace_failed(fc_trace_writer *tw, const fc_error *e) {
    fc_trace_abort(tw);
    fc_die(FC_EXIT_USAGE, "plan: --trace: %s", e->msg);
}

static void usage(void) {
    printf("usage: fsdpcheck plan --world W [run flags: --model, --strategy, --seed, --steps, --global-batch, "
           "--seq-len, --init, --optimizer, ...] --trace DIR [--threads N] [--quiet]\n"
           "The trace of a run of those flags at W ranks with no step run: the initial weights and every step's\n"
           "batch, trace.json \"planned\": true. `fsdpcheck compare DIR B` judges each of B's steps in lockstep,\n"
           "re-run by the reference from B's state (its first from B's initial weights, which must be these).\n");
}

// run's flags that only a run that trains honours: the first in argv, or NULL.
static const char *running_flag(char **argv, int argc) {
    static const char *const no[] = {"--load", "--save", "--save-at", "--state-dict", "--comm-log",
                                     "--trace-tensors", "--timeout", "--impl"};
    for (int i = 0; i < argc; i++)
        for (size_t k = 0; k < sizeof no / sizeof *no; k++) {
            size_t n = strlen(no[k]);
            if (!strncmp(argv[i], no[k], n) && (argv[i][n] == '\0' || argv[i][n] == '=')) return no[k];
        }
    return NULL;
}

// plan's own flag, --world W, and run's flags, refused where a plan cannot
// honour them; 1 when --help was asked for (and printed).
static int parse_args(int argc, char **argv, fc_run_args *a, int *W) {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        usage();
        return 1;
    }
    static const fc_flag flags[] = {{"--world", FC_FLAG_VALUE}};
    char **rest = mallocCheck((size_t)(argc + 1) * sizeof *rest);
    int nrest = 0;
    *W = 0;
    fc_flags it = fc_flags_begin(argc, argv, flags, FC_FLAGS_COUNT(flags), NULL, FC_FLAGS_PASS);
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        if (id == FC_FLAGS_ARG) {
            rest[nrest++] = (char *)it.arg;
        } else if (!it.value || fc_cli_parse_world(it.value, W)) {
            free(rest);
            usage_fail("--world W: an integer in 1..1024 (the ranks of the run to be judged)");
        }
    }
    fc_error e;
    int rc = fc_cli_parse_run(nrest, rest, a, &e);
    const char *no = rc ? NULL : running_flag(rest, nrest);
    free(rest);
    if (rc == 1) {
        usage();
        return 1;
    }
    if (rc) fc_die(FC_EXIT_USAGE, "plan: %s", e.msg);
    // (--impl too: a plan is every implementation's start and data)
    if (no) fc_die(FC_EXIT_USAGE, "plan: %s: a plan runs no step, so nothing it does is that flag's", no);
    if (!*W) usage_fail("--world W is required (the ranks of the run to be judged)");
    if (!a->trace_dir[0]) usage_fail("--trace DIR is required (where the plan is written)");
    if (fc_run_config_validate_world(&a->cfg, *W, &e)) fc_die(FC_EXIT_USAGE, "plan: %s", e.msg);
    return 0;
}

// The initial weights and every step's batch, written as the plan's trace.
static void write_plan(const fc_run_args *a, const fc_model *m, int W) {
    fc_error e;
    float *init = mallocCheck(m->numel * sizeof(float));  // [numel] the initial weights, model layout
    if (a->cfg.init_path[0]) {
        if (fc_weights_load(m, a->cfg.init_path, init, &e)) fc_die(FC_EXIT_USAGE, "plan: --init %s", e.msg);
    } else {
        fc_init_full(m, a->cfg.seed, init);
    }
    fc_trace_writer tw;
    if (fc_trace_begin_plan(&tw, a->trace_dir, m, init, &e))  // leaves no file
        fc_die(FC_EXIT_USAGE, "plan: --trace: %s", e.msg);
    free(init);
    fc_batch batch = {0};
    fc_batch_alloc(&batch, &a->cfg.model, a->cfg.global_batch, a->cfg.seq_len);
    for (int t = 0; t < a->cfg.steps; t++) {
        // the batch as run regenerates it for its trace (oracle/run.c); a step
        // file of a plan holds nothing else (no tensor set, so no state names)
        fc_data_fill(&batch, &a->cfg.model, a->cfg.seed, t, 0);
        fc_trace_step s = {.step = t, .batch = &batch};
        if (fc_trace_write_open(&tw, &s, 0, &e) || fc_trace_write_commit(&tw, &e)) trace_failed(&tw, &e);
    }
    if (fc_trace_finish(&tw, &a->cfg, W, &e)) trace_failed(&tw, &e);
    fc_batch_free(&batch);
}

int fc_cmd_plan(int argc, char **argv) {
    fc_run_args a;
    int W;
    if (parse_args(argc, argv, &a, &W)) return FC_EXIT_PASS;
    const int threads = fc_threads_setup(a.threads, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fc_model m;  // the shared registry: names, shapes and layout of the trace
    fc_model_build_run(&m, &a.cfg);
    write_plan(&a, &m, W);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!a.quiet) {
        struct rusage ru;
        long kib = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
        printf("fsdpcheck plan: model %s (%zu parameters, %d units), W=%d, B=%d, steps %d, seed %llu: the initial "
               "weights and %d batches written to %s (%.1f ms, %d threads)\npeak RSS (MiB): %.1f\n",
               m.cfg.name, m.numel, m.n_units, W, a.cfg.global_batch, a.cfg.steps,
               (unsigned long long)a.cfg.seed, a.cfg.steps, a.trace_dir,
               (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6, threads, kib / 1024.0);
    }
    fc_model_free(&m);
    return FC_EXIT_PASS;
}
