// reference/impl_reference.c — the reference behind the implementation
// contract (core/impl.h): `local` runs the one-process trainer, every other
// strategy the MPI FSDP engine.
#include "seams.h"  // first: the fault build renames this file's exported symbols

#include <stdlib.h>
#include <string.h>

#include "fsdp.h"
#include "local.h"
#include "mpicheck.h"

struct fc_impl {
    fc_fsdp *fsdp;       // every strategy but local
    fc_local local;      // strategy local
    int is_local;
    fc_comm_log empty;   // local communicates nothing
};

static fc_impl *ref_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    fc_impl *im = callocCheck(1, sizeof *im);
    fc_log_init(&im->empty);
    if (cfg->strategy == FC_STRATEGY_LOCAL) {
        int W;
        mpiCheck(MPI_Comm_size(comm, &W));
        if (W != 1) {
            free(im);
            fc_fail(e, "--strategy local runs as one process, not %d", W);
            return NULL;
        }
        im->is_local = 1;
        if (fc_local_create(&im->local, cfg, e)) {
            free(im);
            return NULL;
        }
        return im;
    }
    im->fsdp = fc_fsdp_create(cfg, comm, e);
    if (!im->fsdp) {
        free(im);
        return NULL;
    }
    return im;
}

static int ref_step(fc_impl *im, fc_step_info *out, fc_error *e) {
    if (!im->is_local) return fc_fsdp_step(im->fsdp, out, e);
    fc_local_step(&im->local);
    out->loss = im->local.loss;
    out->grad_norm = im->local.grad_norm;
    return 0;
}

static int ref_export(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    if (!im->is_local) return fc_fsdp_export(im->fsdp, what, dst, root, e);
    const fc_local *L = &im->local;
    const float *src = what == FC_EXPORT_PARAMS ? L->params
                       : what == FC_EXPORT_GRADS ? L->grads
                       : L->state[what == FC_EXPORT_STATE0 ? 0 : 1];
    if ((what == FC_EXPORT_STATE0 && L->n_state < 1) || (what == FC_EXPORT_STATE1 && L->n_state < 2))
        return fc_fail(e, "export: the optimizer keeps no such state");
    if (root != 0) return fc_fail(e, "export: root must be rank 0");
    memcpy(dst, src, L->model.numel * sizeof(float));
    return 0;
}

static int ref_save(fc_impl *im, const char *dir, fc_state_dict kind, fc_error *e) {
    if (im->is_local) return fc_local_save(&im->local, dir, kind, e);
    return fc_fsdp_save(im->fsdp, dir, kind, e);
}

static int ref_load(fc_impl *im, const char *dir, fc_error *e) {
    if (im->is_local) return fc_local_load(&im->local, dir, e);
    return fc_fsdp_load(im->fsdp, dir, e);
}

static long ref_steps_done(const fc_impl *im) {
    return im->is_local ? im->local.step : fc_fsdp_steps(im->fsdp);
}

static const fc_comm_log *ref_log(const fc_impl *im) {
    return im->is_local ? &im->empty : fc_fsdp_log(im->fsdp);
}

static void ref_memory(const fc_impl *im, fc_mem_stats *out) {
    if (im->is_local)
        memset(out, 0, sizeof *out);  // the ground truth keeps no FSDP accounting
    else
        fc_fsdp_memory(im->fsdp, out);
}

static void ref_destroy(fc_impl *im) {
    if (!im) return;
    if (im->is_local)
        fc_local_free(&im->local);
    else
        fc_fsdp_destroy(im->fsdp);
    fc_log_free(&im->empty);
    free(im);
}

static const fc_impl_ops REFERENCE = {
    .abi_version = FC_IMPL_ABI_VERSION,
    .name = "reference",
    .fsdp_versions = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2),
    // its canonical reductions make every layout's sums one tree (reference/fsdp.c)
    .features = FC_IMPL_ACT_CKPT | FC_IMPL_LLAMA | FC_IMPL_FREEZE | FC_IMPL_LAYOUT_INVARIANT | FC_IMPL_DETERMINISTIC |
                seam_features,
    .create = ref_create,
    .step = ref_step,
    .export_full = ref_export,
    .save = ref_save,
    .load = ref_load,
    .steps_done = ref_steps_done,
    .comm_log = ref_log,
    .memory = ref_memory,
    .destroy = ref_destroy,
};

const fc_impl_ops *fc_reference_impl(void) { return &REFERENCE; }

int fc_reference_local_sets(const fc_impl_ops *ops, fc_impl *im, const float *sets[4]) {
    if (ops != &REFERENCE || !im || !im->is_local) return -1;
    fc_local *L = &im->local;
    fc_local_drop_acts(L);  // the oracle reads the sets now, and steps (making them again) later
    sets[0] = L->grads;  // ref_export's FC_EXPORT_GRADS: before clipping
    sets[1] = L->params;
    sets[2] = L->n_state > 0 ? L->state[0] : NULL;
    sets[3] = L->n_state > 1 ? L->state[1] : NULL;
    return 0;
}

int fc_reference_local_load(const fc_impl_ops *ops, fc_impl *im, const float *params, const float *const state[2],
                            long step, fc_release_fn release, const void *arg) {
    if (ops != &REFERENCE || !im || !im->is_local) return -1;
    fc_local_set(&im->local, params, state, step, release, arg);
    return 0;
}

int fc_reference_piece_grad(const fc_impl_ops *ops, fc_impl *im, long step, int first, int n, float *out, float *loss) {
    if (ops != &REFERENCE || !im || !im->is_local) return -1;
    *loss = fc_local_piece_grad(&im->local, step, first, n, out);
    return 0;
}
