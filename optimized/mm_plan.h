// optimized/mm_plan.h — row-major matmuls as cuBLASLt's column-major calls,
// pure host arithmetic (unit-tested on a CPU by running the planned
// column-major product on the host and comparing with the row-major one).
//
// Every tensor of the port is row-major. A row-major matrix X[r, c] is the
// column-major matrix X^T with leading dimension c, so the row-major product
//     C[M, N] = op(A)[M, K] op(B)[K, N]
// is the column-major product C^T[N, M] = op(B)^T[N, K] op(A)^T[K, M]: cuBLAS's
// first operand is the stored B, its second the stored A. A is stored [M, K]
// (ta = 0) or [K, M] (ta = 1, op(A) = A^T); B is stored [K, N] (tb = 0) or
// [N, K] (tb = 1).
#ifndef FC_CUDA_MM_PLAN_H
#define FC_CUDA_MM_PLAN_H

#include <stdint.h>

#include "hd.h"

FC_BEGIN_DECLS

typedef struct {
    uint64_t rows, cols;  // the stored matrix as cuBLASLt's layout sees it (column-major)
    int64_t ld;           // leading dimension
    int trans;            // the operation cuBLASLt applies to it (CUBLAS_OP_T when 1)
} fc_mm_operand;

typedef struct {
    uint64_t m, n, k;       // the column-major product: D[m, n] = op(a)[m, k] op(b)[k, n]
    fc_mm_operand a, b, c;  // a = the row-major B, b = the row-major A, c = C (and D)
} fc_mm_plan;

fc_mm_plan fc_mm_plan_rowmajor(int M, int N, int K, int ta, int tb);

// A pointer's alignment for cuBLASLt's preference attributes: the largest
// power of two dividing the address, capped at 256 (cuBLASLt's default).
uint32_t fc_mm_alignment(const void *p);

FC_END_DECLS

#endif
