// oracle/rerun.c — see rerun.h.
#include "rerun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "optim.h"
#include "runner.h"

// MPI started here (a process that had not), finalised when the last open re-run closes
static int mpi_started_here, n_open;

// The handover directories of the re-runs open now: a command that dies
// (fc_die: bad input found halfway, exit 2) removes them at exit, as close does.
#define MAX_OPEN_DIRS 8
static char open_dirs[MAX_OPEN_DIRS][256];

static void remove_open_dirs(void) {
    for (int i = 0; i < MAX_OPEN_DIRS; i++)
        if (open_dirs[i][0]) fc_remove_flat_dir(open_dirs[i]);
}

static void track_dir(const char *dir, int on) {
    static int registered;
    if (!registered) registered = atexit(remove_open_dirs) == 0;
    for (int i = 0; i < MAX_OPEN_DIRS; i++)
        if (on ? !open_dirs[i][0] : !strcmp(open_dirs[i], dir)) {
            if (on) snprintf(open_dirs[i], sizeof open_dirs[i], "%s", dir);
            else open_dirs[i][0] = '\0';
            return;
        }
}

// like, as one process of `ops` in `strategy`: the same model, batch,
// accumulation, clipping, optimizer and precision (unless fp32), no layout
static int open_as(fc_rerun *r, const fc_run_config *like, int world, const char *init, const fc_impl_ops *ops,
                   fc_strategy strategy, int fp32, fc_error *e) {
    memset(r, 0, sizeof *r);
    int up = 0;
    mpiCheck(MPI_Initialized(&up));
    if (!up) {
        mpiCheck(MPI_Init(NULL, NULL));
        mpi_started_here = 1;
    }
    n_open++;
    r->open = 1;
    fc_run_config c = fc_runner_local_of(*like, like->strategy == FC_STRATEGY_LOCAL ? 1 : world);
    c.strategy = strategy;
    if (fp32) c.param_dtype = c.reduce_dtype = FC_PREC_FP32;
    c.no_sync = strategy == FC_STRATEGY_LOCAL ? 0 : like->no_sync;  // one rank: no_sync changes no arithmetic
    // every step loads its start: the initial weights are never used, only cheaper read than computed
    // (a path too long for the config is not worth a failure: the seed's then)
    c.init_path[0] = '\0';
    if (init && strlen(init) < sizeof c.init_path) snprintf(c.init_path, sizeof c.init_path, "%s", init);
    c.steps = 1;
    if (fc_run_config_validate(&c, e) || fc_run_config_validate_world(&c, 1, e)) {
        fc_rerun_close(r);
        return -1;
    }
    r->cfg = c;
    r->ops = ops;
    r->im = r->ops->create(&r->cfg, MPI_COMM_SELF, e);
    if (!r->im) {
        fc_rerun_close(r);
        return -1;
    }
    fc_lockstep_dir(MPI_COMM_SELF, r->dir, sizeof r->dir);
    if (r->dir[0]) track_dir(r->dir, 1);
    if (!r->dir[0]) {
        fc_rerun_close(r);
        return fc_fail(e, "cannot create a directory for the lockstep state handover");
    }
    r->n_state = fc_optim_state_names(&c.optim, r->state_names);
    fc_model m;
    fc_model_build_run(&m, &c);
    r->numel = m.numel;
    fc_model_free(&m);
    return 0;
}

int fc_rerun_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e) {
    int mixed = like->param_dtype != FC_PREC_FP32 || like->reduce_dtype != FC_PREC_FP32;
    return open_as(r, like, world, init, fc_reference_impl(), mixed ? FC_STRATEGY_NO_SHARD : FC_STRATEGY_LOCAL, 0, e);
}

int fc_magnitude_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e) {
    return open_as(r, like, world, init, fc_reference_magnitude_impl(), FC_STRATEGY_LOCAL, 1, e);
}

// The tested run's state after step - 1 into the re-run: set in place where
// the re-run is the local reference (fc_reference_local_load: what its load
// reads from the handover's checkpoint, without writing and reading the
// checkpoint, 1.5 GB at gpt2-124m), through a FULL checkpoint otherwise.
static int handover(fc_rerun *r, long step, const float *params, const float *const state[2], fc_error *e) {
    if (fc_reference_local_load(r->ops, r->im, params, state, step, r->release, r->release_arg) == 0) return 0;
    return fc_lockstep_handover(r->ops, r->im, &r->cfg, params, state, step, r->dir, MPI_COMM_SELF, e);
}

int fc_magnitude_step(fc_rerun *r, long step, const float *params, const float *const state[2], float *mag,
                      fc_error *e) {
    if (handover(r, step, params, state, e)) return -1;
    fc_step_info info;
    if (r->ops->step(r->im, &info, e)) return -1;
    return r->ops->export_full(r->im, FC_EXPORT_GRADS, mag, 0, e);
}

// The step's sets into sets[4]: lent by the local reference, or exported into
// bufs (the caller's, or the re-run's own when bufs is NULL)
static int step_sets(fc_rerun *r, float *const bufs[4], const float *sets[4], fc_error *e) {
    if (!bufs && fc_reference_local_sets(r->ops, r->im, sets) == 0) return 0;
    float *own[4];
    if (!bufs) {
        if (!r->own) r->own = mallocCheck(4 * r->numel * sizeof(float));
        for (int i = 0; i < 4; i++) own[i] = r->own + i * r->numel;
        bufs = own;
    }
    for (int i = 0; i < 2 + r->n_state; i++) {
        if (r->ops->export_full(r->im, fc_step_set_exports[i], bufs[i], 0, e)) return -1;
        sets[i] = bufs[i];
    }
    return 0;
}

int fc_rerun_step(fc_rerun *r, long step, const float *params, const float *const state[2], float *const bufs[4],
                  fc_trace_step *out, fc_error *e) {
    if (handover(r, step, params, state, e)) return -1;
    fc_step_info info;
    if (r->ops->step(r->im, &info, e)) return -1;
    const float *sets[4] = {NULL, NULL, NULL, NULL};
    if (step_sets(r, bufs, sets, e)) return -1;
    memset(out, 0, sizeof *out);
    out->step = step;
    out->loss = info.loss;
    out->has_norm = 1;
    out->grad_norm = info.grad_norm;
    out->grads = sets[0];
    out->params = sets[1];
    out->prev_params = params;
    out->n_state = r->n_state;
    for (int i = 0; i < r->n_state; i++) {
        out->state_names[i] = r->state_names[i];
        out->state[i] = sets[2 + i];
    }
    return 0;
}

int fc_piece_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e) {
    fc_run_config c = *like;
    c.optim.kind = FC_OPT_SGD;  // the pieces are gradients: an optimizer without state needs none handed over
    c.optim.momentum = 0;
    c.optim.nesterov = 0;
    return open_as(r, &c, world, init, fc_reference_impl(), FC_STRATEGY_LOCAL, 1, e);
}

int fc_piece_grad(fc_rerun *r, const float *params, long step, int first, int n, float *out, float *loss, fc_error *e) {
    const float *const none[2] = {NULL, NULL};
    if (fc_reference_local_load(r->ops, r->im, params, none, step, NULL, NULL) ||
        fc_reference_piece_grad(r->ops, r->im, step, first, n, out, loss))
        return fc_fail(e, "the pieces of a step need the local reference");
    return 0;
}

void fc_rerun_close(fc_rerun *r) {
    if (r->im) r->ops->destroy(r->im);
    free(r->own);
    if (r->dir[0]) {
        fc_remove_flat_dir(r->dir);
        track_dir(r->dir, 0);
    }
    int was_open = r->open;
    memset(r, 0, sizeof *r);
    if (was_open && --n_open == 0 && mpi_started_here) {
        mpi_started_here = 0;
        mpiCheck(MPI_Finalize());
    }
}

int fc_rerun_first_step(const fc_trace *ta, const fc_trace *tb, long step) {
    return step == 0 && tb->first_step == 0 && ta->first_step == 0 && ta->tensor_steps == 0;
}
