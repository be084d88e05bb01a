// tests/ports/hwlike/arith_seams.h — the arithmetic seams of reference/fsdp.c
// (reference/arith/arith_seams.h) in the hardware-like port: found before the
// reference's on this port's include path. Each falls back to the
// reference's own where its knob is off.
#ifndef FC_ARITH_SEAMS_H
#define FC_ARITH_SEAMS_H

#include <mpi.h>
#include <stddef.h>

#include "dtype.h"

struct fc_fsdp;
typedef float (*hw_round_fn)(const struct fc_fsdp *, fc_prec, float);

// 256-byte aligned zeroed memory (what a device allocator hands out), so an
// operand's alignment class is its offset in its buffer (hw_align_class).
void *hw_calloc(size_t n);
// x / d, or x * (1 / d) with HW_K_AVG.
float hw_div(float x, float d);
// acc[0..S) summed in ring or tree order (HW_K_RING, HW_K_TREE); 0 when no
// knob applies and the reference's rank order is the one to use.
int hw_sum_chunks(const struct fc_fsdp *f, float *acc, const void *recv, size_t S, int G, fc_prec rd,
                  MPI_Comm comm, int allreduce, hw_round_fn rnd);

// The backward's loss scale: a power of two under fp16 compute (hw_loss_scale), else 1.
float hw_loss_scale(void);
// grad[0..n) *= s (s a power of two: exact but for underflow and overflow).
void hw_scale(float *grad, size_t n, float s);

#define arith_calloc(n) hw_calloc(n)
#define arith_loss_scale(f) ((void)(f), hw_loss_scale())
#define arith_scale_grads(f, grad, n, s) ((void)(f), hw_scale((grad), (n), (s)))
#define arith_div(f, x, d) ((void)(f), hw_div((x), (d)))
#define arith_sum_chunks(f, acc, recv, S, G, rd, comm, allreduce, rnd)              \
    (void)(hw_sum_chunks((f), (acc), (recv), (S), (G), (rd), (comm), (allreduce), (rnd)) || \
           (sum_rank_order((f), (acc), (recv), (S), (G), (rd), (rnd)), 0))

#endif
