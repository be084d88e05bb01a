// tests/watchdog/hang_plugin.c — a port that hangs: the reference behind the
// contract, except that at its second step rank 0 blocks in a collective no
// other rank ever enters (a barrier on its own duplicate of the
// communicator), the way a port with mismatched collectives deadlocks. The
// watchdog test (watchdog.sh) must see every rank exit 3 with one line.
#include <stdlib.h>

#include "impl.h"

struct fc_impl {
    fc_impl *ref;       // the reference's own instance
    MPI_Comm comm;      // the plugin's duplicate, for the collective nobody joins
    int rank;
    long steps;
};

static const fc_impl_ops *ref(void) { return fc_reference_impl(); }

static fc_impl *hang_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    fc_impl *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->ref = ref()->create(cfg, comm, e);
    if (!h->ref) {
        free(h);
        return NULL;
    }
    MPI_Comm_dup(comm, &h->comm);
    MPI_Comm_rank(comm, &h->rank);
    return h;
}

static int hang_step(fc_impl *h, fc_step_info *out, fc_error *e) {
    if (h->steps++ == 1 && h->rank == 0) MPI_Barrier(h->comm);  // the others never come
    return ref()->step(h->ref, out, e);
}

static int hang_export(fc_impl *h, fc_export what, float *dst, int root, fc_error *e) {
    return ref()->export_full(h->ref, what, dst, root, e);
}
static long hang_steps_done(const fc_impl *h) { return ref()->steps_done(h->ref); }
static const fc_comm_log *hang_log(const fc_impl *h) { return ref()->comm_log(h->ref); }
static void hang_memory(const fc_impl *h, fc_mem_stats *out) { ref()->memory(h->ref, out); }
static void hang_destroy(fc_impl *h) {
    if (!h) return;
    ref()->destroy(h->ref);
    MPI_Comm_free(&h->comm);
    free(h);
}

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static fc_impl_ops ops;
    ops = *ref();
    ops.name = "hang-plugin";
    ops.create = hang_create;
    ops.step = hang_step;
    ops.export_full = hang_export;
    ops.save = NULL;
    ops.load = NULL;
    ops.steps_done = hang_steps_done;
    ops.comm_log = hang_log;
    ops.memory = hang_memory;
    ops.destroy = hang_destroy;
    return &ops;
}
