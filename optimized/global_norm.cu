// optimized/global_norm.cu — this rank's partial gradient norm for
// clip_grad_norm (core/clip.h): the sum of |g| or g^2, or the max |g|, over
// the elements it owns, in double. Deterministic: a fixed grid of
// FCK_NORM_BLOCKS blocks per buffer, each thread summing a fixed stride of
// elements in order, blocks reduced in a fixed tree, then one thread adding
// the block partials buffer by buffer, block by block. The combination
// across ranks (rank order) is core/clip.c's on the host.
#include <string.h>

#include "common.cuh"
#include "kernels.h"

typedef struct {
    const float *g[FCK_NORM_SEGS];
    size_t n[FCK_NORM_SEGS];
} norm_segs;

__device__ static double norm_term(float x, int type) {
    double a = fabs((double)x);
    return type == FC_NORM_2 ? a * a : a;
}

// scratch [cnt * FCK_NORM_BLOCKS]: block partials
__global__ static void norm_blocks_kernel(double *scratch, norm_segs t, int type) {
    __shared__ double part[256];
    int j = blockIdx.y;
    const float *g = t.g[j];
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.n[j]; i += (size_t)gridDim.x * blockDim.x) {
        double v = norm_term(g[i], type);
        acc = type == FC_NORM_INF ? (v > acc ? v : acc) : acc + v;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            double o = part[threadIdx.x + w];
            part[threadIdx.x] = type == FC_NORM_INF ? (o > part[threadIdx.x] ? o : part[threadIdx.x]) : part[threadIdx.x] + o;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) scratch[(size_t)j * gridDim.x + blockIdx.x] = part[0];
}

// *out (+)= the partials in order (first: start from 0)
__global__ static void norm_finish_kernel(double *out, const double *scratch, int count, int type, int first) {
    if (threadIdx.x || blockIdx.x) return;
    double acc = first ? 0.0 : *out;
    for (int i = 0; i < count; i++) acc = type == FC_NORM_INF ? (scratch[i] > acc ? scratch[i] : acc) : acc + scratch[i];
    *out = acc;
}

extern "C" void fck_norm_part(double *out, double *scratch, float *const *g, const size_t *n, int nu, fc_norm_type t,
                              cudaStream_t s) {
    int first = 1;
    for (int u0 = 0; u0 < nu || first;) {
        norm_segs segs;
        memset(&segs, 0, sizeof segs);
        int cnt = 0;
        for (; u0 < nu && cnt < FCK_NORM_SEGS; u0++) {
            if (!n[u0]) continue;
            segs.g[cnt] = g[u0], segs.n[cnt] = n[u0];
            cnt++;
        }
        if (cnt) {
            norm_blocks_kernel<<<dim3(FCK_NORM_BLOCKS, (unsigned)cnt), 256, 0, s>>>(scratch, segs, (int)t);
            cudaCheckLaunch();
        }
        norm_finish_kernel<<<1, 32, 0, s>>>(out, scratch, cnt * FCK_NORM_BLOCKS, (int)t, first);
        cudaCheckLaunch();
        first = 0;
    }
}
