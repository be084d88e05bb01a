// tests/mpi/mpitest.c — see mpitest.h.
#include "mpitest.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "threads.h"

int mt_errs = 0;

static const fc_impl_ops *g_impl;
static const char *g_impl_name = "reference";
static int g_verbose;

int mt_rank(void) {
    int r = 0, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

// A usage error: every rank leaves with 2, rank 0 prints the one line.
static _Noreturn void usage_fail(const char *msg) {
    int rank = mt_rank();
    MPI_Finalize();
    if (rank == 0) fc_die(FC_EXIT_USAGE, "%s", msg);
    exit(FC_EXIT_USAGE);
}

void mt_init(int *argc, char ***argv) {
    mpiCheck(MPI_Init(argc, argv));
    // the cores of the node shared among its ranks, as fsdpcheck run does: without
    // it OpenMP starts a thread per core in every rank, and on 2 cores at W=2 the
    // idle threads of one rank spin (libgomp's active wait) on the core the other
    // needs (docs/measurements/threads.md)
    fc_threads_setup(0, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    char msg[700];
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = (*argv)[i];
        if (!strcmp(a, "--impl")) {
            if (i + 1 >= *argc) usage_fail("--impl needs a value (reference or PATH.so)");
            g_impl_name = (*argv)[++i];
        } else if (!strncmp(a, "--impl=", 7)) {
            g_impl_name = a + 7;
        } else {
            snprintf(msg, sizeof msg, "%s: unknown argument %.200s (usage: %s [--impl reference|PATH.so])",
                     (*argv)[0], a, (*argv)[0]);
            usage_fail(msg);
        }
    }
    (*argv)[out] = NULL;
    *argc = out;
    fc_error e = {{0}};
    g_impl = fc_impl_resolve(g_impl_name, &e);
    if (!g_impl) usage_fail(e.msg);
    const char *v = getenv("MT_VERBOSE");
    g_verbose = v && *v && strcmp(v, "0");
    if (mt_rank() == 0 && !mt_tested_is_ref()) {
        printf("testing --impl %s (%s): bitwise claims are judged bitwise only where its table claims them "
               "(layout invariance, determinism), else by the default policy\n",
               g_impl_name, g_impl->name);
        fflush(stdout);
    }
}

int mt_finalize(void) {
    int total = 0;
    mpiCheck(MPI_Allreduce(&mt_errs, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (mt_rank() == 0) {
        if (total)
            printf(" Found %d errors\n", total);
        else
            printf(" No Errors\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}

const fc_impl_ops *mt_impl(void) { return g_impl ? g_impl : fc_reference_impl(); }
const char *mt_impl_name(void) { return g_impl_name; }
int mt_tested_is_ref(void) { return mt_impl() == fc_reference_impl(); }

void mt_skip(const char *fmt, ...) {
    if (mt_rank() != 0) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("SKIP: %s\n", msg);
    fflush(stdout);
}

fc_run_config mt_config(const char *model, fc_strategy s, int W, int steps) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_error e;
    if (fc_model_config_load(model, &c.model, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    c.strategy = s;
    c.steps = steps;
    c.global_batch = 4 * W;  // divisible by W and by K = 2 per rank
    c.seq_len = 8;
    c.seed = 20261121;
    return c;
}

static int run_with(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, mt_result *r) {
    fc_runner_run(ops, cfg, comm, r);  // fc_runner_run routes an injected fault through fc_impl_for
    MT_CHECK(r->ok, "run (%s %s, impl %s) failed: %s", fc_strategy_name(cfg->strategy), cfg->model.name, ops->name,
             r->error);
    return r->ok ? 0 : -1;
}

int mt_run(const fc_run_config *cfg, MPI_Comm comm, mt_result *r) { return run_with(mt_impl(), cfg, comm, r); }

int mt_run_ref(const fc_run_config *cfg, MPI_Comm comm, mt_result *r) {
    return run_with(fc_reference_impl(), cfg, comm, r);
}

void mt_result_free(mt_result *r) { fc_runner_free(r); }

// The steps both sides are judged over: n, or every step of both.
static int steps_of(const mt_judgement *j) {
    if (j->n) return j->n;
    const mt_result *t = j->tested.run, *e = j->expected.run;
    MT_CHECK(!t->ok || !e->ok || t->steps == e->steps, "%s: %d steps against %d", j->what, t->steps, e->steps);
    return t->steps < e->steps ? t->steps : e->steps;
}

static int compare(const mt_judgement *j, fc_props *v) {
    memset(v, 0, sizeof *v);
    const mt_result *tested = j->tested.run, *expected = j->expected.run;
    int n = steps_of(j);
    const fc_impl_ops *ops = mt_impl();
    int exact = (j->bitwise == MT_BITWISE_ANY && fc_impl_claims_repeatable(ops)) ||
                (j->bitwise == MT_BITWISE_REF && (mt_tested_is_ref() || fc_impl_claims_same_bits(ops)));
    // Against the local ground truth (the reference on this rank alone,
    // mt_run_ref), every step after the first is judged in lockstep: the
    // reference re-runs it from the tested run's own state after the step
    // before (docs/contract.md §8), so a difference never hides behind a trajectory
    // that has drifted. Bitwise claims, and tested runs against tested runs
    // (collective on every rank), are judged whole.
    fc_run_result lock;
    memset(&lock, 0, sizeof lock);
    int locked = !exact && n > 1 && j->expected.cfg->strategy == FC_STRATEGY_LOCAL && tested->ok && expected->ok &&
                 mt_rank() == 0;  // the tested run's tensors are on rank 0
    if (locked) {
        fc_run_config lc = *j->expected.cfg;
        lc.steps = n;
        fc_runner_lockstep(fc_reference_impl(), &lc, MPI_COMM_SELF, tested, j->tested.at,
                           expected->first_step + j->expected.at, &lock);
    }
    fc_judgement fj = {.p = j->p,
                       .against = j->what,
                       .tested = j->tested,
                       .expected = {j->expected.cfg, 0, expected, j->expected.at},
                       .n = n,
                       .bitwise = exact,
                       // an arithmetic that differs by layout shares no per-rank compute between two runs
                       .same_compute = j->same_compute && (mt_tested_is_ref() || fc_impl_claims_same_bits(ops)),
                       .lock = locked ? &lock : NULL};
    int ok = fc_props_compare(v, &fj);
    fc_runner_free(&lock);
    if (g_verbose)
        printf("  P%-2d %-60.60s %s%s: max err/scale %.3g, %.3g ULP at scale, %.3g of tolerance\n", (int)j->p, j->what,
               exact ? "bitwise" : "policy", locked ? " (lockstep)" : "", v->max_scaled[j->p], v->max_ulp[j->p],
               v->headroom[j->p]);
    return ok;
}

int mt_judge(const mt_judgement *j) {
    fc_props v;
    int ok = compare(j, &v);
    MT_CHECK(ok, "[%s] %s", j->tested.cfg->model.name, v.detail);
    return ok;
}

int mt_agrees(const mt_judgement *j, char *detail, size_t cap) {
    fc_props v;
    int ok = compare(j, &v);
    if (detail && cap) snprintf(detail, cap, "%s", v.detail);
    return ok;
}
