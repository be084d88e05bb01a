// optimized/global_norm.cu — this rank's partial gradient norm for
// clip_grad_norm (core/clip.h), exact: each block takes chunks of at most
// FC_NORM_BUCKET_TERMS elements, bins every element's integer term by its
// exponent with shared-memory integer atomics (whose sums cannot depend on
// their order), and one thread folds the bins into the block's 640-bit
// partial with core/clip.h's own FC_HD code. The host merges the blocks'
// partials and the ranks' (exactly too), so the total is the reference's,
// bit for bit, however the GPU schedules its threads.
#include <string.h>

#include "common.cuh"
#include "kernels.h"

typedef struct {
    const float *g[FCK_NORM_SEGS];
    size_t n[FCK_NORM_SEGS];
    int cnt;
} norm_segs;

// parts[blockIdx.x] += this block's chunks: chunk c of segment j is elements
// [c * TERMS, (c + 1) * TERMS), taken by block c % gridDim.x
__global__ static void norm_parts_kernel(fc_norm_part *parts, norm_segs t, int type) {
    __shared__ unsigned long long bucket[FC_NORM_BUCKETS];
    __shared__ unsigned int smax, sflags;
    const size_t TERMS = FC_NORM_BUCKET_TERMS;
    for (int j = 0; j < t.cnt; j++) {
        for (size_t c0 = (size_t)blockIdx.x * TERMS; c0 < t.n[j]; c0 += (size_t)gridDim.x * TERMS) {
            for (int i = threadIdx.x; i < FC_NORM_BUCKETS; i += blockDim.x) bucket[i] = 0;
            if (threadIdx.x == 0) smax = 0, sflags = 0;
            __syncthreads();
            size_t end = c0 + TERMS < t.n[j] ? c0 + TERMS : t.n[j];
            uint32_t flags = 0;
            for (size_t i = c0 + threadIdx.x; i < end; i += blockDim.x) {
                unsigned e;
                uint64_t term;
                uint32_t bits;
                if (!fc_norm_term(t.g[j][i], (fc_norm_type)type, &e, &term, &bits, &flags)) continue;
                if (type == FC_NORM_INF)
                    atomicMax(&smax, bits);
                else
                    atomicAdd(&bucket[e], (unsigned long long)term);
            }
            if (flags) atomicOr(&sflags, flags);
            __syncthreads();
            if (threadIdx.x == 0) {
                bucket[FC_NORM_BUCKETS - 1] = (unsigned long long)sflags << 32 | smax;
                fc_norm_part_add_buckets(&parts[blockIdx.x], (const uint64_t *)bucket, (fc_norm_type)type);
            }
            __syncthreads();
        }
    }
}

extern "C" void fck_norm_parts(fc_norm_part *parts, float *const *g, const size_t *n, int nu, fc_norm_type t,
                               cudaStream_t s) {
    for (int u0 = 0; u0 < nu;) {
        norm_segs segs;
        memset(&segs, 0, sizeof segs);
        for (; u0 < nu && segs.cnt < FCK_NORM_SEGS; u0++) {
            if (!n[u0]) continue;
            segs.g[segs.cnt] = g[u0], segs.n[segs.cnt] = n[u0];
            segs.cnt++;
        }
        if (!segs.cnt) continue;
        norm_parts_kernel<<<FCK_NORM_BLOCKS, 256, 0, s>>>(parts, segs, (int)t);
        cudaCheckLaunch();
    }
}
