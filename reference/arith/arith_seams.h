// reference/arith/arith_seams.h — the arithmetic seams of the reference engine: how
// a reduction sums the ranks' chunks, how it divides, where its buffers start.
// Here, in every build of the reference (plain and fault catalogue), each is
// the reference's own: the rank-ordered sum, a true division, calloc. The
// hardware-like port (tests/ports/hwlike/) compiles reference/fsdp.c again
// with its own arith_seams.h found first on the include path.
#ifndef FC_ARITH_SEAMS_H
#define FC_ARITH_SEAMS_H

// Zeroed engine memory of n bytes.
#define arith_calloc(n) callocCheck((n), 1)
// x / d, for the gradient's pre- and post-divide.
#define arith_div(f, x, d) ((void)(f), (x) / (d))
// The loss scale of the backward (1: none), and grad[0..n) *= s, each a
// power of two, so that the gradients a step keeps are the same numbers.
#define arith_loss_scale(f) ((void)(f), 1.0f)
#define arith_scale_grads(f, grad, n, s) ((void)(f), (void)(grad), (void)(n), (void)(s))
// acc[0..S) = the sum of this rank's block of the G exchanged chunks in recv
// (chunk j from rank j of comm, rd's storage), each partial rounded by rnd;
// allreduce: the reduction is an all-reduce's (else a reduce-scatter's).
#define arith_sum_chunks(f, acc, recv, S, G, rd, comm, allreduce, rnd) \
    ((void)(comm), (void)(allreduce), sum_rank_order((f), (acc), (recv), (S), (G), (rd), (rnd)))

#endif
