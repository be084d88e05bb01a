// optimized/rmsnorm.cu — Llama's RMSNorm (Hugging Face LlamaRMSNorm), forward
// and backward, the reference's expressions term for term (reference/layers.c
// fc_rmsnorm_*): the mean square of x, rstd = 1 / sqrt(ms + eps) as two
// roundings (a division of a correctly rounded sqrtf, as torch.rsqrt's CPU
// kernel), then out = w * (x * rstd), x * rstd rounded first (Hugging Face's
// order). Statistics in fp32 whatever the storage type. One warp per row, as
// layernorm.cu; the weight gradient is a column sum over the rows in a fixed
// order (no atomics). Only the row sums' order differs from the reference's
// (lanes, then a butterfly, where the reference adds in index order).
#include "common.cuh"
#include "kernels.h"

#define RMS_ROWS 4  // rows (warps) per block

// N rows of C channels: out [N,C], rstd [N] fp32, inp [N,C], w [C]
template <class T>
__global__ static void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    int row = blockIdx.x * RMS_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;  // a whole warp leaves together
    const T *x = inp + (size_t)row * C;  // x [C]
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float xi = to_f32(x[i]);
        ss += xi * xi;  // torch's pow(2) is x * x
    }
    float v = warp_sum(ss) / (float)C;
    float r = 1.0f / sqrtf(v + eps);
    T *o = out + (size_t)row * C;  // o [C]
    for (int i = lane; i < C; i += 32) o[i] = from_f32<T>(to_f32(w[i]) * (to_f32(x[i]) * r));
    if (lane == 0) rstd[row] = r;
}

// dinp [N,C] += rstd * (dnorm - norm * mean(dnorm * norm)), norm = x * rstd,
// dnorm = w * dout: LayerNorm's formula without the mean terms
template <class T>
__global__ static void rmsnorm_backward_input_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                                     const float *rstd, int N, int C) {
    int row = blockIdx.x * RMS_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;  // x, dy [C]
    T *dx = dinp + (size_t)row * C;                                     // dx [C]
    float r = rstd[row], a = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float norm = to_f32(x[i]) * r, dnorm = to_f32(w[i]) * to_f32(dy[i]);
        a += dnorm * norm;
    }
    float dnorm_norm_mean = warp_sum(a) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float norm = to_f32(x[i]) * r, dnorm = to_f32(w[i]) * to_f32(dy[i]);
        dx[i] = from_f32<T>(to_f32(dx[i]) + (dnorm - norm * dnorm_norm_mean) * r);
    }
}

// dw [C] += sum over the N rows of x * rstd * dout: block (32 columns) x (8
// row slices), thread (c, y) sums rows y, y+8, ... in order, then the slice
// sums are added in slice order (layernorm.cu's shape)
template <class T>
__global__ static void rmsnorm_backward_weight_kernel(T *dw, const T *dout, const T *inp, const float *rstd, int N,
                                                      int C) {
    __shared__ float sw[8][32];
    int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float aw = 0.0f;
    if (c < C)
        for (int n = y; n < N; n += 8) aw += to_f32(inp[(size_t)n * C + c]) * rstd[n] * to_f32(dout[(size_t)n * C + c]);
    sw[y][threadIdx.x] = aw;
    __syncthreads();
    if (y != 0 || c >= C) return;
    for (int k = 1; k < 8; k++) aw += sw[k][threadIdx.x];
    dw[c] = from_f32<T>(to_f32(dw[c]) + aw);
}

extern "C" void fck_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps,
                                    fc_prec p, cudaStream_t s) {
    if (N <= 0) return;
    unsigned blocks = (unsigned)((N + RMS_ROWS - 1) / RMS_ROWS);
    FC_DISPATCH(p, X, rmsnorm_forward_kernel<X><<<blocks, 32 * RMS_ROWS, 0, s>>>((X *)out, rstd, (const X *)inp, (const X *)w, N, C, eps));
    cudaCheckLaunch();
}

extern "C" void fck_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                                     const float *rstd, int N, int C, fc_prec p, cudaStream_t s) {
    if (N <= 0) return;
    if (dinp) {
        unsigned blocks = (unsigned)((N + RMS_ROWS - 1) / RMS_ROWS);
        FC_DISPATCH(p, X, rmsnorm_backward_input_kernel<X><<<blocks, 32 * RMS_ROWS, 0, s>>>((X *)dinp, (const X *)dout, (const X *)inp, (const X *)w, rstd, N, C));
        cudaCheckLaunch();
    }
    if (dw) {  // NULL for a frozen weight: no gradient computed at all
        dim3 block(32, 8);
        FC_DISPATCH(p, X, rmsnorm_backward_weight_kernel<X><<<(unsigned)((C + 31) / 32), block, 0, s>>>((X *)dw, (const X *)dout, (const X *)inp, rstd, N, C));
        cudaCheckLaunch();
    }
}
