// optimized/engine.h — the CUDA port's FSDP engine: the schedule of docs/contract.md §5
// (what is gathered, freed, reduced, when, and what is logged and counted),
// driving an executor (exec.h) that does the work on the device.
//
// It is the reference engine's schedule (reference/fsdp.c) event for event,
// through the shared rules of core/layout.h, so the same theory judges both
// comm logs; the work behind each event is the executor's: real 16-bit
// storage and compute, NCCL or host-staged MPI collectives on a stream of
// their own, a stream-ordered tagged allocator.
#ifndef FC_CUDA_ENGINE_H
#define FC_CUDA_ENGINE_H

#include <mpi.h>

#include "exec.h"
#include "impl.h"
#include "layout.h"

FC_BEGIN_DECLS

// The communicators of a run (MPI; an NCCL executor builds its own over them).
typedef struct {
    fc_groups g;       // this rank's groups (core/layout.h)
    MPI_Comm world;    // a duplicate of the caller's communicator
    MPI_Comm shard;    // the G ranks of the reduction layout
    MPI_Comm replica;  // the ranks holding the same chunk (hybrid replicas)
    MPI_Comm post_fwd; // FSDP2's integer reshard_after_forward: PF consecutive ranks (else MPI_COMM_NULL)
} fce_comms;

// Collective over comm.
void fce_comms_make(const fc_run_config *cfg, MPI_Comm comm, fce_comms *c);
void fce_comms_free(fce_comms *c);

typedef struct fce fce;

// Builds the engine over x (the caller keeps x and frees it after
// fce_destroy); takes the communicators on success. NULL with e set on bad
// input (--init file).
fce *fce_create(const fc_run_config *cfg, fce_comms *c, fcx *x, fc_error *e);
int fce_step(fce *f, fc_step_info *out, fc_error *e);
int fce_export(fce *f, fc_export what, float *dst, int root, fc_error *e);
int fce_save(fce *f, const char *dir, fc_state_dict kind, fc_error *e);
int fce_load(fce *f, const char *dir, fc_error *e);
long fce_steps(const fce *f);
const fc_comm_log *fce_log(const fce *f);
void fce_memory(const fce *f, fc_mem_stats *out);
void fce_destroy(fce *f);

FC_END_DECLS

#endif
