// optimized/layernorm.cu — nn.LayerNorm (biased variance, two passes: the
// mean, then the squared deviations), forward and backward, statistics in
// fp32 whatever the storage type. One warp per row; the parameter gradients
// are column sums over the rows in a fixed order (no atomics).
#include "common.cuh"
#include "kernels.h"

#define LN_ROWS 4  // rows (warps) per block

// out [N,C], mean/rstd [N] fp32, inp [N,C], w/b [C]
template <class T>
__global__ static void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                                                int N, int C, float eps) {
    int row = blockIdx.x * LN_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;  // a whole warp leaves together
    const T *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += to_f32(x[i]);
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = to_f32(x[i]) - m;
        v += d * d;
    }
    v = warp_sum(v) / (float)C;  // biased: divide by C
    float r = 1.0f / sqrtf(v + eps);
    T *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) o[i] = from_f32<T>((to_f32(x[i]) - m) * r * to_f32(w[i]) + to_f32(b[i]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dinp [N,C] += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = w * dout
template <class T>
__global__ static void layernorm_backward_input_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                                       const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * LN_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bn = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float norm = (to_f32(x[i]) - m) * r, dnorm = to_f32(w[i]) * to_f32(dy[i]);
        a += dnorm;
        bn += dnorm * norm;
    }
    float dnorm_mean = warp_sum(a) / (float)C, dnorm_norm_mean = warp_sum(bn) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float norm = (to_f32(x[i]) - m) * r, dnorm = to_f32(w[i]) * to_f32(dy[i]);
        dx[i] = from_f32<T>(to_f32(dx[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r);
    }
}

// Column sums over the N rows, block (32 columns) x (8 row slices): thread
// (c, y) sums rows y, y+8, ... in order, then slice sums are added in slice
// order: dw [C] += sum norm * dout, db [C] += sum dout.
template <class T>
__global__ static void layernorm_backward_params_kernel(T *dw, T *db, const T *dout, const T *inp, const float *mean,
                                                        const float *rstd, int N, int C) {
    __shared__ float sw[8][32], sb[8][32];
    int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = y; n < N; n += 8) {
            float dy = to_f32(dout[(size_t)n * C + c]);
            aw += (to_f32(inp[(size_t)n * C + c]) - mean[n]) * rstd[n] * dy;
            ab += dy;
        }
    }
    sw[y][threadIdx.x] = aw;
    sb[y][threadIdx.x] = ab;
    __syncthreads();
    if (y != 0 || c >= C) return;
    for (int k = 1; k < 8; k++) {
        aw += sw[k][threadIdx.x];
        ab += sb[k][threadIdx.x];
    }
    if (dw) dw[c] = from_f32<T>(to_f32(dw[c]) + aw);
    if (db) db[c] = from_f32<T>(to_f32(db[c]) + ab);
}

extern "C" void fck_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                      const void *b, int N, int C, float eps, fc_prec p, cudaStream_t s) {
    if (N <= 0) return;
    unsigned blocks = (unsigned)((N + LN_ROWS - 1) / LN_ROWS);
    FC_DISPATCH(p, X, layernorm_forward_kernel<X><<<blocks, 32 * LN_ROWS, 0, s>>>((X *)out, mean, rstd, (const X *)inp, (const X *)w, (const X *)b, N, C, eps));
    cudaCheckLaunch();
}

extern "C" void fck_layernorm_backward(void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w,
                                       const float *mean, const float *rstd, int N, int C, fc_prec p, cudaStream_t s) {
    if (N <= 0) return;
    if (dinp) {
        unsigned blocks = (unsigned)((N + LN_ROWS - 1) / LN_ROWS);
        FC_DISPATCH(p, X, layernorm_backward_input_kernel<X><<<blocks, 32 * LN_ROWS, 0, s>>>((X *)dinp, (const X *)dout, (const X *)inp, (const X *)w, mean, rstd, N, C));
        cudaCheckLaunch();
    }
    if (dw || db) {
        dim3 block(32, 8);
        FC_DISPATCH(p, X, layernorm_backward_params_kernel<X><<<(unsigned)((C + 31) / 32), block, 0, s>>>((X *)dw, (X *)db, (const X *)dout, (const X *)inp, mean, rstd, N, C));
        cudaCheckLaunch();
    }
}
