// optimized/tests/exec_host.h — a host executor for the CUDA port's engine
// (optimized/exec.h without a device), for CPU tests of the engine.
//
// Every "device" buffer is host memory entered in the same tagged book
// (alloc_book.h) the CUDA executor uses; every operation first checks that
// its buffers are live allocations large enough for what it touches (a stale,
// freed or short buffer is counted as a violation); the work itself is the
// reference's arithmetic: the reference model (reference/forward.c, fp32
// compute on param_dtype-rounded parameters, as the reference emulates mixed
// precision), core/round.h casts, MPI collectives with the canonical
// rank-ordered sums (staged.h), core/clip.c and core/optim.c. A collective's
// result reaches its destination only at fcx_wait, so an engine that used a
// buffer before waiting would compute with stale data.
//
// So the engine driving this executor must reproduce the reference engine:
// its comm log event for event, its memory figures, and (fp32, and mlp in
// 16-bit) its numbers bit for bit.
#ifndef FC_CUDA_EXEC_HOST_H
#define FC_CUDA_EXEC_HOST_H

#include "engine.h"
#include "exec.h"

fcx *fcx_host_create(const fc_run_config *cfg, const fce_comms *c);
void fcx_host_destroy(fcx *x);
// Violations seen so far (bad buffers), and the first one's message.
int fcx_host_violations(const fcx *x, const char **first);
// Allocations still live (after fce_destroy: leaks).
size_t fcx_host_live(const fcx *x);

#endif
