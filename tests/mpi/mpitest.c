// tests/mpi/mpitest.c — see mpitest.h.
#include "mpitest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"

int mt_errs = 0;

int mt_rank(void) {
    int r = 0, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

void mt_init(int *argc, char ***argv) { mpiCheck(MPI_Init(argc, argv)); }

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

int mt_run(const fc_run_config *cfg, MPI_Comm comm, mt_result *r) {
    fc_runner_run(fc_reference_impl(), cfg, comm, r);
    MT_CHECK(r->ok, "run failed: %s", r->error);
    return r->ok ? 0 : -1;
}

void mt_result_free(mt_result *r) { fc_runner_free(r); }

size_t mt_compare(const char *what, const fc_model *m, const float *a, const float *b, int bitwise,
                  double rtol, double atol) {
    if (!a || !b) {
        MT_CHECK(0, "%s: missing result", what);
        return 1;
    }
    size_t bad = 0, first = 0;
    double max_abs = 0;
    for (size_t i = 0; i < m->numel; i++) {
        int same = bitwise ? memcmp(&a[i], &b[i], sizeof(float)) == 0
                           : fabs((double)a[i] - b[i]) <= atol + rtol * fabs((double)b[i]);
        double d = fabs((double)a[i] - b[i]);
        if (d > max_abs) max_abs = d;
        if (!same && bad++ == 0) first = i;
    }
    if (bad) {
        // name the parameter that holds the first divergent element
        const char *name = "?";
        size_t idx = first;
        for (int p = 0; p < m->n_params; p++)
            if (first >= m->params[p].offset && first < m->params[p].offset + m->params[p].numel) {
                name = m->params[p].name;
                idx = first - m->params[p].offset;
            }
        MT_CHECK(0, "%s: %zu of %zu elements differ (%s); first: %s[%zu] %.9g vs %.9g; max abs %.3g", what,
                 bad, m->numel, bitwise ? "bitwise" : "tolerance", name, idx, (double)a[first],
                 (double)b[first], max_abs);
    }
    return bad;
}
