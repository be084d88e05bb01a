// optimized/lora.cu — LoRA's scaling (PEFT's result + lora_B(lora_A(x)) *
// scaling), the two elementwise steps around cuBLASLt's matmuls, as the
// reference writes them (reference/forward_llama.c linear_forward/_backward):
// the adapter's product t = (x A^T) B^T is rounded to the storage type, then
// out += t * s (the product t * s rounded to fp32 first, then the add); in
// backward the scaled gradient ds = dout * s is formed once and fed to both
// adapter matmuls. A kernel of its own rather than cuBLASLt's alpha, whose
// point of rounding is the library's.
#include "common.cuh"
#include "kernels.h"

// out [n] += t [n] * scale
template <class T>
__global__ static void lora_add_kernel(T *out, const T *t, float scale, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(t[i]) * scale);
}

// out [n] = inp [n] * scale
template <class T>
__global__ static void scale_kernel(T *out, const T *inp, float scale, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(to_f32(inp[i]) * scale);
}

extern "C" void fck_lora_add(void *out, const void *t, float scale, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, lora_add_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)t, scale, n));
    cudaCheckLaunch();
}

extern "C" void fck_scale(void *out, const void *inp, float scale, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, scale_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)inp, scale, n));
    cudaCheckLaunch();
}
