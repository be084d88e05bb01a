// tests/abi/null_function.c — the right entry point and ABI version, but a
// NULL in the table where a required function belongs (step): fsdpcheck must
// refuse it (exit 2, one line naming the function) before calling anything.
#include <stddef.h>

#include <fsdpcheck/impl.h>

static fc_impl *create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    (void)cfg, (void)comm, (void)e;
    return NULL;
}
static int export_full(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    (void)im, (void)what, (void)dst, (void)root, (void)e;
    return -1;
}
static const fc_comm_log *comm_log(const fc_impl *im) {
    (void)im;
    return NULL;
}
static void memory(const fc_impl *im, fc_mem_stats *out) { (void)im, (void)out; }
static void destroy(fc_impl *im) { (void)im; }

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static const fc_impl_ops ops = {
        .abi_version = FC_IMPL_ABI_VERSION,
        .name = "abi-null-function",
        .fsdp_versions = FC_IMPL_FSDP(1),
        .create = create,
        .step = NULL,  // the missing function
        .export_full = export_full,
        .comm_log = comm_log,
        .memory = memory,
        .destroy = destroy,
    };
    return &ops;
}
