// optimized/cuda_config.h — what the CUDA port refuses, and the device memory
// a run needs: pure host code (unit-tested on a CPU). create() calls these
// before it touches a device, so bad input is one clear line (exit 2 from the
// CLI), never a crash.
#ifndef FC_CUDA_CONFIG_H
#define FC_CUDA_CONFIG_H

#include <stddef.h>

#include "check.h"
#include "config.h"

FC_BEGIN_DECLS

// The longest sequence the attention kernels take (one row of scores per
// warp lives in shared memory).
#define FC_CUDA_MAX_SEQ 8192
// The cuBLASLt workspace (fixed, so the algorithm choice is too).
#define FC_CUDA_WORKSPACE (32u << 20)

// The config against itself and the world (core's checks), plus the port's
// own limits. 0 or -1 with e set.
int fc_cuda_config_check(const fc_run_config *cfg, int W, fc_error *e);

// Device bytes a run of cfg needs on `rank` of W, an upper bound: fp32
// shards, gradients and optimizer state (none under cpu_offload), every unit
// gathered at once in param_dtype, the two largest unsharded gradients, the
// reduction buffers, activations and their gradients, the workspace. Frozen
// parameters count honestly: optimizer state only for trainable elements,
// and a unit with no trainable parameter has no gradient shard, gathered
// gradient or reduction buffer.
size_t fc_cuda_device_bytes(const fc_run_config *cfg, int W, int rank);

// Refuses when `need` exceeds `free_bytes` on device `dev` (called `name`).
int fc_cuda_memory_fits(size_t need, size_t free_bytes, int dev, const char *name, fc_error *e);

FC_END_DECLS

#endif
