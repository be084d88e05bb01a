// optimized/mm_plan.c — see mm_plan.h.
#include "mm_plan.h"

fc_mm_plan fc_mm_plan_rowmajor(int M, int N, int K, int ta, int tb) {
    fc_mm_plan p;
    p.m = (uint64_t)N;
    p.n = (uint64_t)M;
    p.k = (uint64_t)K;
    // cuBLAS's a = the stored B. Row-major [K, N] is column-major N x K with
    // ld N: already op(B)^T, no transpose. Row-major [N, K] is column-major
    // K x N with ld K: transpose it.
    p.a = tb ? (fc_mm_operand){(uint64_t)K, (uint64_t)N, K, 1} : (fc_mm_operand){(uint64_t)N, (uint64_t)K, N, 0};
    // cuBLAS's b = the stored A. Row-major [M, K] is column-major K x M with
    // ld K: already op(A)^T. Row-major [K, M] is column-major M x K with ld M.
    p.b = ta ? (fc_mm_operand){(uint64_t)M, (uint64_t)K, M, 1} : (fc_mm_operand){(uint64_t)K, (uint64_t)M, K, 0};
    // C^T: column-major N x M with ld N
    p.c = (fc_mm_operand){(uint64_t)N, (uint64_t)M, N, 0};
    return p;
}

uint32_t fc_mm_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}
