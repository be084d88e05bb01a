// optimized/staged.h — the arithmetic of the host-staged MPI backend, pure
// host code (unit-tested on a CPU).
//
// When ranks share a GPU, a gradient reduce-scatter is an MPI all-to-all of
// the chunks on the host followed by the reference's canonical sum: chunks
// added in rank order 0..G-1, every partial sum rounded to the reduce dtype
// (core/round.h), so the staged backend reduces exactly as the reference
// engine does (reference/fsdp.c).
#ifndef FC_CUDA_STAGED_H
#define FC_CUDA_STAGED_H

#include <stddef.h>

#include "dtype.h"

FC_BEGIN_DECLS

// out[i] = in[0*S + i] + in[1*S + i] + ... + in[(G-1)*S + i], left to right,
// each partial rounded to p; in [G*S] and out [S] hold p's storage format
// (float for fp32, 16-bit patterns for bf16/fp16). out may not alias in.
void fc_staged_sum(fc_prec p, const void *in, int G, size_t S, void *out);

FC_END_DECLS

#endif
