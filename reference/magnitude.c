// reference/magnitude.c — the magnitude pass behind the implementation
// contract (core/impl.h): the one-process reference (`local`) compiled a third
// time with -DFC_MAGNITUDE, so the gradients it exports are, element by
// element, the sum of the absolute values of the terms that formed them
// (layers.c, MAG()): a weight's |x|^T |dy|, a bias's sum of |dy|, an
// embedding row's sum of |dy|, over every sample of the global batch.
//
// The oracle uses them as the scale of 16-bit rounding error per element
// (oracle/compare_model.c): a gradient rounded to 16 bits on a rank, summed over
// ranks and micro-batches in any order, or computed from 16-bit activations
// differs from the exact sum by a multiple of the unit roundoff times this
// magnitude, whatever the split, because every partial sum is bounded by it.
// Only `local` runs here (the magnitudes do not depend on the split); only
// the gradients mean anything (the optimizer step that follows is fed
// magnitudes, and its parameters and state are not exported).
#include <stdlib.h>
#include <string.h>

#include "impl.h"
#include "local.h"
#include "mpicheck.h"

struct fc_impl {
    fc_local local;
    fc_comm_log empty;  // communicates nothing
};

static fc_impl *mag_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    int W;
    mpiCheck(MPI_Comm_size(comm, &W));
    if (cfg->strategy != FC_STRATEGY_LOCAL || W != 1) {
        fc_fail(e, "the magnitude pass runs --strategy local as one process (not %s at W=%d)",
                fc_strategy_name(cfg->strategy), W);
        return NULL;
    }
    fc_impl *im = callocCheck(1, sizeof *im);
    fc_log_init(&im->empty);
    if (RN(fc_local_create)(&im->local, cfg, e)) {
        free(im);
        return NULL;
    }
    return im;
}

static int mag_step(fc_impl *im, fc_step_info *out, fc_error *e) {
    (void)e;
    RN(fc_local_step)(&im->local);
    out->loss = im->local.loss;
    out->grad_norm = im->local.grad_norm;  // the norm of the magnitudes: not a gradient norm
    return 0;
}

static int mag_export(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    if (what != FC_EXPORT_GRADS) return fc_fail(e, "the magnitude pass exports gradient magnitudes only");
    if (root != 0) return fc_fail(e, "export: root must be rank 0");
    memcpy(dst, im->local.grads, im->local.model.numel * sizeof(float));
    return 0;
}

static int mag_load(fc_impl *im, const char *dir, fc_error *e) { return RN(fc_local_load)(&im->local, dir, e); }

static long mag_steps_done(const fc_impl *im) { return im->local.step; }

static const fc_comm_log *mag_log(const fc_impl *im) { return &im->empty; }

static void mag_memory(const fc_impl *im, fc_mem_stats *out) {
    (void)im;
    memset(out, 0, sizeof *out);
}

static void mag_destroy(fc_impl *im) {
    if (!im) return;
    RN(fc_local_free)(&im->local);
    fc_log_free(&im->empty);
    free(im);
}

static const fc_impl_ops MAGNITUDE = {
    .abi_version = FC_IMPL_ABI_VERSION,
    .name = "reference-magnitude",
    .fsdp_versions = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2),
    .features = 0,  // `local` only, which checkpoints nothing
    .create = mag_create,
    .step = mag_step,
    .export_full = mag_export,
    .load = mag_load,
    .steps_done = mag_steps_done,
    .comm_log = mag_log,
    .memory = mag_memory,
    .destroy = mag_destroy,
};

const fc_impl_ops *fc_reference_magnitude_impl(void) { return &MAGNITUDE; }
