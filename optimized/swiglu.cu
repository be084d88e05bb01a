// optimized/swiglu.cu — SwiGLU's gate (Hugging Face LlamaMLP:
// act_fn(gate_proj(x)) * up_proj(x), act_fn silu), forward and backward, the
// reference's expressions term for term (reference/layers.c fc_swiglu_*):
// silu(x) = x / (1 + exp(-x)), torch's CPU formula, not x * sigmoid(x), which
// rounds differently. fp32 whatever the storage type. expf is the device's
// (within 2 ulp of the true value, glibc's within 1), the one place this file
// may differ from the reference in the last bit.
#include "common.cuh"
#include "kernels.h"

// out [n] = silu(gate) * up, silu rounded to fp32 first
template <class T>
__global__ static void swiglu_forward_kernel(T *out, const T *gate, const T *up, size_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f32(gate[i]);
        out[i] = from_f32<T>(x / (1.0f + expf(-x)) * to_f32(up[i]));
    }
}

// dgate [n] += dout * up * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)) (torch's
// silu_backward, in that order); dup [n] += dout * silu(x). For x -> -inf,
// exp(-x) = inf gives s = 0 and silu = -0, never NaN. Either may be NULL.
template <class T>
__global__ static void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f32(gate[i]), dy = to_f32(dout[i]);
        float e1 = 1.0f + expf(-x);
        if (dgate) {
            float s = 1.0f / e1;
            dgate[i] = from_f32<T>(to_f32(dgate[i]) + dy * to_f32(up[i]) * s * (1.0f + x * (1.0f - s)));
        }
        if (dup) dup[i] = from_f32<T>(to_f32(dup[i]) + dy * (x / e1));
    }
}

extern "C" void fck_swiglu_forward(void *out, const void *gate, const void *up, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, swiglu_forward_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)gate, (const X *)up, n));
    cudaCheckLaunch();
}

extern "C" void fck_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                    size_t n, fc_prec p, cudaStream_t s) {
    if (!n || (!dgate && !dup)) return;
    FC_DISPATCH(p, X, swiglu_backward_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)dgate, (X *)dup, (const X *)dout, (const X *)gate, (const X *)up, n));
    cudaCheckLaunch();
}
