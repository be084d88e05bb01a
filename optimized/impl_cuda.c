// optimized/impl_cuda.c — the CUDA port behind the implementation contract
// (core/impl.h): libfsdpcheck_cuda.so exports fsdpcheck_impl_v1() and
// nothing else.
//
// create() refuses, with one line in e and NULL on every rank, everything it
// cannot run, before any device work: no CUDA device or driver
// (cudaGetDeviceCount failing counts as none), a configuration the port does
// not take (cuda_config.h), NCCL forced onto ranks that share a GPU, too
// little device memory. Then it picks the collective backend
// (comm_choice.h), says which on rank 0 (stderr, once per process), and
// builds the executor and the engine.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_choice.h"
#include "cuda_check.h"
#include "cuda_config.h"
#include "engine.h"
#include "exec_cuda.h"
#include "impl.h"
#include "mpicheck.h"

struct fc_impl {
    fce *f;
    fcx *x;
};

typedef struct {
    int dev, count, shared, node_ranks, on_device;
    fc_comm_kind kind;
    char why[256];
} placement;

// Finds this rank's device and the backend; collective over comm whatever
// happens locally (so a rank without a device cannot leave the others
// waiting). Returns 0, or -1 with e set.
static int place(const fc_run_config *cfg, MPI_Comm comm, placement *pl, fc_error *e) {
    int rc = 0;
    memset(pl, 0, sizeof *pl);
    cudaError_t err = cudaGetDeviceCount(&pl->count);
    if (err != cudaSuccess) {
        pl->count = 0;  // no driver, or no device: both are "no CUDA device"
        rc = fc_fail(e, "--impl cuda: no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(err));
        (void)cudaGetLastError();
    } else if (pl->count == 0) {
        rc = fc_fail(e, "--impl cuda: no CUDA device (cudaGetDeviceCount: 0 devices)");
    }
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int node_rank;
    mpiCheck(MPI_Comm_rank(node, &node_rank));
    mpiCheck(MPI_Comm_size(node, &pl->node_ranks));
    pl->dev = fc_device_for_rank(node_rank, pl->count);
    char bus[FC_BUS_ID_LEN];
    snprintf(bus, sizeof bus, "none:%d", rank);  // no device: never equal to another rank's
    if (rc == 0) {
        err = cudaSetDevice(pl->dev);
        if (err == cudaSuccess) err = cudaDeviceGetPCIBusId(bus, FC_BUS_ID_LEN, pl->dev);
        if (err != cudaSuccess)
            rc = fc_fail(e, "--impl cuda: device %d cannot be used: %s", pl->dev, cudaGetErrorString(err));
    }
    // ranks per device on this node: NCCL takes only one
    char *all = mallocCheck((size_t)pl->node_ranks * FC_BUS_ID_LEN);
    mpiCheck(MPI_Allgather(bus, FC_BUS_ID_LEN, MPI_CHAR, all, FC_BUS_ID_LEN, MPI_CHAR, node));
    int distinct = fc_count_distinct_ids(all, pl->node_ranks), shared = distinct < pl->node_ranks;
    for (int r = 0; r < pl->node_ranks; r++) pl->on_device += strncmp(all + (size_t)r * FC_BUS_ID_LEN, bus, FC_BUS_ID_LEN) == 0;
    free(all);
    mpiCheck(MPI_Comm_free(&node));
    mpiCheck(MPI_Allreduce(&shared, &pl->shared, 1, MPI_INT, MPI_MAX, comm));
    if (rc == 0 && fc_comm_choose(cfg->comm, pl->shared, pl->node_ranks, pl->count, &pl->kind, pl->why,
                                  sizeof pl->why, e))
        rc = -1;
    if (rc == 0 && cfg->cpu_offload) {
        int ua = 0;
        cudaCheck(cudaDeviceGetAttribute(&ua, cudaDevAttrUnifiedAddressing, pl->dev));
        if (!ua) rc = fc_fail(e, "--cpu-offload: device %d has no unified addressing (the kernels read pinned host shards)", pl->dev);
    }
    return rc;
}

static fc_impl *cuda_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    int W, rank;
    mpiCheck(MPI_Comm_size(comm, &W));
    mpiCheck(MPI_Comm_rank(comm, &rank));
    placement pl;
    int ok = place(cfg, comm, &pl, e) == 0;
    if (ok && fc_cuda_config_check(cfg, W, e)) ok = 0;
    if (ok) {
        size_t free_b = 0, total = 0;
        struct cudaDeviceProp prop;
        cudaCheck(cudaMemGetInfo(&free_b, &total));
        cudaCheck(cudaGetDeviceProperties(&prop, pl.dev));
        // ranks sharing the device share its free memory
        size_t need = fc_cuda_device_bytes(cfg, W, rank) * (size_t)(pl.on_device > 0 ? pl.on_device : 1);
        if (fc_cuda_memory_fits(need, free_b, pl.dev, prop.name, e)) ok = 0;
    }
    if (fc_mpi_agree(comm, ok, e)) return NULL;
    static int said;
    if (rank == 0 && !said) {
        fprintf(stderr, "fsdpcheck: cuda: %d rank(s), collectives over %s: %s\n", W, fc_comm_name(pl.kind), pl.why);
        said = 1;
    }
    fc_impl *im = callocCheck(1, sizeof *im);
    fce_comms c;
    fce_comms_make(cfg, comm, &c);
    im->x = fcx_cuda_create(cfg, &c, pl.dev, pl.kind, pl.shared);
    im->f = fce_create(cfg, &c, im->x, e);
    if (!im->f) {  // an --init file every rank refuses alike
        fcx_cuda_destroy(im->x);
        fce_comms_free(&c);
        free(im);
        return NULL;
    }
    return im;
}

static int cuda_step(fc_impl *im, fc_step_info *out, fc_error *e) { return fce_step(im->f, out, e); }

static int cuda_export(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    return fce_export(im->f, what, dst, root, e);
}

static int cuda_save(fc_impl *im, const char *dir, fc_state_dict kind, fc_error *e) {
    return fce_save(im->f, dir, kind, e);
}

static int cuda_load(fc_impl *im, const char *dir, fc_error *e) { return fce_load(im->f, dir, e); }
static long cuda_steps_done(const fc_impl *im) { return fce_steps(im->f); }
static const fc_comm_log *cuda_log(const fc_impl *im) { return fce_log(im->f); }
static void cuda_memory(const fc_impl *im, fc_mem_stats *out) { fce_memory(im->f, out); }

static void cuda_destroy(fc_impl *im) {
    if (!im) return;
    fce_destroy(im->f);
    fcx_cuda_destroy(im->x);
    free(im);
}

static const fc_impl_ops CUDA_OPS = {
    .abi_version = FC_IMPL_ABI_VERSION,
    .name = "cuda",
    .fsdp_versions = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2),
    // Activation checkpointing: not yet, and no fault catalogue (cuda_config.c refuses both).
    // Deterministic: no kernel adds floats atomically (common.cuh), cuBLASLt runs one cached algorithm per
    // product in our own workspace (cuBLAS guide, "Results reproducibility": the same bits every run on one
    // GPU model), NCCL without NVLS (comm.c), the staged MPI sums in rank order (staged.h).
    // Not layout-invariant: no_shard all-reduces where full_shard reduce-scatters, and NCCL sums the two in
    // orders of its own. Only the CUDA executor is behind this table (create refuses where there is no
    // device); the host executor (optimized/tests/exec_host.h) drives the engine without it, in tests.
    .features = FC_IMPL_LLAMA | FC_IMPL_FREEZE | FC_IMPL_DETERMINISTIC,
    .create = cuda_create,
    .step = cuda_step,
    .export_full = cuda_export,
    .save = cuda_save,
    .load = cuda_load,
    .steps_done = cuda_steps_done,
    .comm_log = cuda_log,
    .memory = cuda_memory,
    .destroy = cuda_destroy,
};

// The one exported symbol of libfsdpcheck_cuda.so (everything else is hidden).
__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void);
const fc_impl_ops *fsdpcheck_impl_v1(void) { return &CUDA_OPS; }
