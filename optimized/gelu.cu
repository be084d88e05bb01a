// optimized/gelu.cu — gelu_new (Hugging Face NewGELUActivation, tanh form),
// the reference's expression term for term (reference/layers.c), in fp32
// whatever the storage type. A kernel of its own rather than cuBLASLt's GELU
// epilogue, whose tanh approximation is not tanhf's.
#include "common.cuh"
#include "kernels.h"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_COEF 0.044715f

template <class T>
__global__ static void gelu_forward_kernel(T *out, const T *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f32(inp[i]);
        float cube = GELU_COEF * (x * x * x);
        out[i] = from_f32<T>(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube))));
    }
}

// dinp [n] += gelu'(inp) * dout
template <class T>
__global__ static void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f32(inp[i]);
        float cube = GELU_COEF * (x * x * x);
        float u = GELU_SCALE * (x + cube);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_COEF * x * x);
        float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
        dinp[i] = from_f32<T>(to_f32(dinp[i]) + local * to_f32(dout[i]));
    }
}

extern "C" void fck_gelu_forward(void *out, const void *inp, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, gelu_forward_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)inp, n));
    cudaCheckLaunch();
}

extern "C" void fck_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, fc_prec p, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, X, gelu_backward_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)dinp, (const X *)inp, (const X *)dout, n));
    cudaCheckLaunch();
}
