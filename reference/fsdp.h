// reference/fsdp.h — the reference FSDP engine over MPI (docs/contract.md §4, §5).
//
// Every strategy but `local` (reference/local.h) runs here: no_shard (DDP),
// full_shard (ZeRO-3), shard_grad_op (ZeRO-2), hybrid_shard and
// hybrid_shard_zero2, with prefetch, the all-gather limiter, gradient
// accumulation with and without no_sync, clip_grad_norm, mixed precision,
// cpu_offload, a recorded comm log and tagged memory accounting.
#ifndef FC_FSDP_H
#define FC_FSDP_H

#include <mpi.h>

#include "impl.h"

typedef struct fc_fsdp fc_fsdp;

fc_fsdp *fc_fsdp_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e);
int fc_fsdp_step(fc_fsdp *f, fc_step_info *out, fc_error *e);
int fc_fsdp_export(fc_fsdp *f, fc_export what, float *dst, int root, fc_error *e);
const fc_comm_log *fc_fsdp_log(const fc_fsdp *f);
void fc_fsdp_memory(const fc_fsdp *f, fc_mem_stats *out);
void fc_fsdp_destroy(fc_fsdp *f);

// Checkpoints (docs/contract.md §6) through the core protocol (core/ckpt_collective.h),
// collective over the engine's communicator: a save of the state after the
// last step, and a load that replaces the state just created (parameters,
// optimizer state, step count), at any W and strategy.
int fc_fsdp_save(fc_fsdp *f, const char *dir, fc_state_dict kind, fc_error *e);
int fc_fsdp_load(fc_fsdp *f, const char *dir, fc_error *e);
long fc_fsdp_steps(const fc_fsdp *f);         // optimizer steps taken

#endif
