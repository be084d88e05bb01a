// tests/mpi/mpitest.c — see mpitest.h.
#include "mpitest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "optim.h"

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
    memset(r, 0, sizeof *r);
    const fc_impl_ops *ops = fc_reference_impl();
    fc_error e;
    fc_impl *im = ops->create(cfg, comm, &e);
    if (!im) {
        MT_CHECK(0, "create failed: %s", e.msg);
        return -1;
    }
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    fc_model m;
    fc_model_build(&m, &cfg->model);
    r->numel = m.numel;
    r->steps = cfg->steps;
    const char *names[2];
    r->n_state = fc_optim_state_names(&cfg->optim, names);
    r->loss = callocCheck((size_t)cfg->steps, sizeof(float));
    r->norm = callocCheck((size_t)cfg->steps, sizeof(double));
    for (int t = 0; t < cfg->steps; t++) {
        fc_step_info info;
        if (ops->step(im, &info, &e)) {
            MT_CHECK(0, "step %d failed: %s", t, e.msg);
            break;
        }
        r->loss[t] = info.loss;
        r->norm[t] = info.grad_norm;
    }
    if (rank == 0) {
        r->params = callocCheck(m.numel, sizeof(float));
        r->grads = callocCheck(m.numel, sizeof(float));
        for (int i = 0; i < r->n_state; i++) r->state[i] = callocCheck(m.numel, sizeof(float));
    }
    if (ops->export_full(im, FC_EXPORT_PARAMS, r->params, 0, &e) ||
        ops->export_full(im, FC_EXPORT_GRADS, r->grads, 0, &e))
        MT_CHECK(0, "export failed: %s", e.msg);
    for (int i = 0; i < r->n_state; i++)
        if (ops->export_full(im, i ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, r->state[i], 0, &e))
            MT_CHECK(0, "export failed: %s", e.msg);
    const fc_comm_log *log = ops->comm_log(im);
    fc_log_init(&r->log);
    for (size_t i = 0; i < log->n; i++) {
        fc_log_add(&r->log, log->ev[i]);
        r->log.ev[i] = log->ev[i];  // keep the original step/micro/order
    }
    ops->memory(im, &r->mem);
    ops->destroy(im);
    fc_model_free(&m);
    return 0;
}

void mt_result_free(mt_result *r) {
    free(r->params);
    free(r->grads);
    free(r->state[0]);
    free(r->state[1]);
    free(r->loss);
    free(r->norm);
    fc_log_free(&r->log);
    memset(r, 0, sizeof *r);
}

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
