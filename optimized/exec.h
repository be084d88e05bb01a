// optimized/exec.h — the executor: everything the FSDP engine (engine.c) asks
// a device to do, and nothing about when. The engine decides the schedule
// (what is gathered, freed, reduced and when, what is logged, which buffer of
// which size is allocated under which memory category); the executor runs it.
//
// Two executors implement this header: exec_cuda.c (streams, the tagged
// stream-ordered allocator, the kernels, cuBLASLt, NCCL or host-staged MPI)
// for the port, and tests/exec_fake.c (host memory, no device) with which the
// engine's schedule, memory accounting and checkpoint plumbing are tested on
// a CPU against the reference engine.
//
// Streams: COMPUTE runs the model, the gradient pre/post divides and the
// optimizer; COMM runs the all-gather packs and every collective. Work on one
// stream runs in issue order; fcx_order makes a stream wait for what was
// issued on the other so far. A buffer may be freed on a stream once every
// use on the other stream is ordered before that point (stream-ordered free).
#ifndef FC_CUDA_EXEC_H
#define FC_CUDA_EXEC_H

#include <stddef.h>

#include "clip.h"
#include "config.h"
#include "data.h"
#include "hd.h"
#include "schedule.h"

FC_BEGIN_DECLS

typedef struct fcx fcx;

typedef enum { FCX_COMPUTE, FCX_COMM, FCX_NSTREAMS } fcx_stream;
// The ranks a collective runs over: the reduction layout's G ranks (the shard
// group; the whole world for no_shard), the R replicas of one chunk, or
// FSDP2's integer reshard_after_forward group of PF consecutive ranks.
typedef enum { FCX_GROUP_SHARD, FCX_GROUP_REPLICA, FCX_GROUP_POST_FORWARD } fcx_group;

// A collective in flight, completed by fcx_wait.
typedef struct {
    void *impl;  // the executor's own state; NULL when nothing is in flight
} fcx_req;

// ---- memory: tagged (core/schedule.h), counted `bytes` ------------------
// FC_LOC_DEVICE: device memory, allocated in stream order on s.
// FC_LOC_HOST: pinned, mapped host memory (cpu_offload), which kernels read
// and write directly (unified addressing); s is ignored.
void *fcx_alloc(fcx *x, fc_mem_loc loc, fc_mem_cat cat, size_t bytes, fcx_stream s);
void fcx_free(fcx *x, void *p, fcx_stream s);
void fcx_memory(const fcx *x, fc_mem_stats *out);
// Checks the tagged figures against the allocator's own (alloc_book.h); the
// engine calls it after every step. 0, or -1 with e set.
int fcx_crosscheck(fcx *x, fc_error *e);

// Synchronous copies between the host and an allocation (init, export,
// checkpoint staging; they are not part of the measured schedule).
void fcx_upload(fcx *x, void *dst, const void *host_src, size_t bytes);
void fcx_download(fcx *x, void *host_dst, const void *src, size_t bytes);
// Waits until the device is idle.
void fcx_sync(fcx *x);
// `waiter` runs what is issued on it next only after everything issued on
// `signaler` so far.
void fcx_order(fcx *x, fcx_stream waiter, fcx_stream signaler);

// ---- elementwise ----------------------------------------------------------
void fcx_zero(fcx *x, void *p, size_t bytes, fcx_stream s);
// dst [bytes] = src [bytes], both device memory.
void fcx_copy(fcx *x, void *dst, const void *src, size_t bytes, fcx_stream s);
// Unit u's copies between its natural order [N] and the run's wire order [P]
// (core/layout.h fc_layout_to_natural / fc_layout_to_wire), in precision p:
// to_wire writes every real element to its chunk's place and zeros the
// padding; else the natural buffer gets every chunk's pieces. FSDP2's
// copy-out after an all-gather and copy-in before a reduce-scatter.
void fcx_permute(fcx *x, int u, void *natural, void *wire, int to_wire, fc_prec p, fcx_stream s);
// dst [n] in p = src [n] fp32 rounded to p (src: device or pinned host).
void fcx_cast(fcx *x, void *dst, fc_prec p, const float *src, size_t n, fcx_stream s);
// dst [n] in rd = round_rd(round_rd(g) / pre), g [n] in pd: the pre-divide.
void fcx_predivide(fcx *x, void *dst, fc_prec rd, const void *g, fc_prec pd, size_t n, float pre, fcx_stream s);
// grad [n] fp32 += round_rd(src / post), src [n] in rd: the post-divide and
// accumulation (grad: device or pinned host).
void fcx_accumulate(fcx *x, float *grad, const void *src, fc_prec rd, size_t n, float post, fcx_stream s);

// ---- collectives (on COMM, after what COMM was given so far) -------------
// count: elements per rank (all-gather: send [count], recv [count*G];
// reduce-scatter: send [count*G], recv [count]); all-reduce: buf [count].
// Sums are in p.
void fcx_all_gather(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r);
void fcx_reduce_scatter(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r);
void fcx_all_reduce(fcx *x, fcx_group g, void *buf, size_t count, fc_prec p, fcx_req *r);
// Completes r: COMPUTE is ordered after the collective's result.
void fcx_wait(fcx *x, fcx_req *r);
// all[j] = rank j's `mine`, over the shard group (the norm's partials).
void fcx_gather_norm_parts(fcx *x, const fc_norm_part *mine, fc_norm_part *all);

// ---- the model ------------------------------------------------------------
// This rank's samples of the step (host), copied to the device.
void fcx_set_batch(fcx *x, const fc_batch *b);
// Stage s of micro-batch k, forward; up[u] is unit u's compute parameters
// (param_dtype, FlatParameter order). The last stage computes the loss and,
// fused, the logits' gradient (loss_scale: d loss / d row loss).
void fcx_forward(fcx *x, int s, int k, void *const *up, float loss_scale);
// Stage s backward, accumulating into ug[u] (param_dtype). ug[u] is NULL
// when no parameter of unit u trains (--freeze, LoRA's base): the stage
// computes its input gradients only. In a unit that trains, a frozen
// parameter's slot may be left as it was (the engine drops it).
void fcx_backward(fcx *x, int s, int k, void *const *up, void *const *ug);
// After fcx_sync: micro-batch k's summed row losses, in the reference's
// arithmetic (per-row fp32 losses added in double in row order, then fp32).
float fcx_loss_sum(fcx *x, int k);

// ---- clip_grad_norm and the optimizer over the units' own elements --------
// g[u] [n[u]] (device, or pinned host when `host`): *out = this rank's exact
// partial norm (core/clip.h).
void fcx_norm_part(fcx *x, float *const *g, const size_t *n, int nu, fc_norm_type t, int host, fc_norm_part *out);
// One optimizer step (core/optim.h) over every unit's elements, the clip
// coefficient applied to the gradient on the way in when `clip`; on the
// device, or on the host (cpu_offload, as PyTorch does) when `host`.
// s0/s1 may hold NULLs (SGD without momentum keeps no state).
void fcx_optim(fcx *x, const fc_optim_config *c, long step, float coef, int clip, float *const *p, float *const *g,
               float *const *s0, float *const *s1, const size_t *n, int nu, int host);

FC_END_DECLS

#endif
