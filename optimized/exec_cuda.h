// optimized/exec_cuda.h — the CUDA executor (exec.h on a GPU): two streams
// (compute, communication), a stream-ordered device memory pool of its own
// whose every allocation is tagged (alloc_book.h), cuBLASLt, the kernels, and
// the collective backends (comm.h) over the engine's groups.
#ifndef FC_CUDA_EXEC_CUDA_H
#define FC_CUDA_EXEC_CUDA_H

#include "comm_choice.h"
#include "engine.h"
#include "exec.h"

FC_BEGIN_DECLS

// Collective over c->world (NCCL communicators are built over c->shard and,
// for hybrid strategies with replicas, c->replica). The device is `dev`
// (already checked); `shared`: another rank uses it too (the device memory
// cross-check is then left out).
fcx *fcx_cuda_create(const fc_run_config *cfg, const fce_comms *c, int dev, fc_comm_kind kind, int shared);
void fcx_cuda_destroy(fcx *x);

FC_END_DECLS

#endif
