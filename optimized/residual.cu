// optimized/residual.cu — the residual add (and, in backward, the gradient
// fanning out into both branches): out = a + b, elementwise.
#include "common.cuh"
#include "kernels.h"

// out [n] = a + b; out may alias a or b (each element read before written)
template <class T>
__global__ static void residual_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

extern "C" void fck_residual(void *out, const void *a, const void *b, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, residual_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)a, (const X *)b, n));
    cudaCheckLaunch();
}
