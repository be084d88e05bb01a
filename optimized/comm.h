// optimized/comm.h — the collective backends of the CUDA port over one group
// of ranks: NCCL, when every rank has its own GPU, and host-staged MPI when
// ranks share one (NCCL refuses that); comm_choice.h decides which.
//
//   NCCL   the collective is enqueued on the given (communication) stream,
//          device buffer to device buffer, and an event marks its end; the
//          consumer stream waits on that event. Sums are NCCL's, in the
//          buffer's precision.
//   MPI    the send buffer is copied to host memory (the stream synchronized
//          first), a non-blocking MPI collective starts, and the wait
//          completes it, then copies the result back on the communication
//          stream and makes the consumer wait. A reduce-scatter is an
//          all-to-all plus the reference's canonical sum (staged.h: rank
//          order, every partial rounded to the reduce dtype); an all-reduce is
//          that reduce-scatter plus an all-gather, as the reference engine's.
// Host staging buffers are entered in the tagged allocator's book (host
// comm_buffers).
#ifndef FC_CUDA_COMM_H
#define FC_CUDA_COMM_H

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stddef.h>

#include "alloc_book.h"
#include "comm_choice.h"
#include "dtype.h"

FC_BEGIN_DECLS

typedef struct fc_cucomm fc_cucomm;
typedef struct fc_comm_op fc_comm_op;

// Collective over c (the device must be set). The book outlives the comm.
fc_cucomm *fc_comm_create(fc_comm_kind kind, MPI_Comm c, fc_book *book);
void fc_comm_destroy(fc_cucomm *c);
int fc_comm_size(const fc_cucomm *c);

// count: elements per rank; recv [count * G] (all-gather), send [count * G]
// (reduce-scatter); s: the stream the collective runs on.
fc_comm_op *fc_comm_all_gather(fc_cucomm *c, const void *send, void *recv, size_t count, fc_prec p, cudaStream_t s);
fc_comm_op *fc_comm_reduce_scatter(fc_cucomm *c, const void *send, void *recv, size_t count, fc_prec p, cudaStream_t s);
fc_comm_op *fc_comm_all_reduce(fc_cucomm *c, void *buf, size_t count, fc_prec p, cudaStream_t s);
// Completes op (and frees it): `consumer` runs after the result.
void fc_comm_wait(fc_comm_op *op, cudaStream_t consumer);
// all [G * bytes] = every rank's `mine` [bytes], on the host (synchronous).
// dev: (1 + G) * bytes of device scratch (NCCL).
void fc_comm_gather_bytes(fc_cucomm *c, const void *mine, void *all, size_t bytes, void *dev, cudaStream_t s);

FC_END_DECLS

#endif
