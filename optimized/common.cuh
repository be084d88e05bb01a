// optimized/common.cuh — what every kernel file shares: the storage types of
// the three precisions, their conversions (core/round.h: round to nearest
// even, the reference's own definition), the precision dispatch, warp and
// block reductions with a fixed order, and launch arithmetic.
//
// Determinism: no kernel uses atomics. Every reduction has a fixed shape that
// depends only on the sizes: a thread sums its elements in index order, a
// warp combines its lanes with a butterfly (every lane ends with the same
// bits: each step adds two values whose sum is commutative), a block combines
// its warps in warp order. So the same run twice gives the same bits.
#ifndef FC_CUDA_COMMON_CUH
#define FC_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_check.h"
#include "dtype.h"  // fc_prec, and core/round.h's FC_HD conversions

// 16-bit storage types: the bit pattern, nothing else, so every conversion
// goes through core/round.h.
struct fc_bf16 {
    uint16_t bits;
};
struct fc_f16 {
    uint16_t bits;
};

__host__ __device__ inline float to_f32(float x) { return x; }
__host__ __device__ inline float to_f32(fc_bf16 x) { return fc_bf16_to_f32(x.bits); }
__host__ __device__ inline float to_f32(fc_f16 x) { return fc_f16_to_f32(x.bits); }

template <class T>
__host__ __device__ inline T from_f32(float x);
template <>
__host__ __device__ inline float from_f32<float>(float x) {
    return x;
}
template <>
__host__ __device__ inline fc_bf16 from_f32<fc_bf16>(float x) {
    return fc_bf16{fc_f32_to_bf16(x)};
}
template <>
__host__ __device__ inline fc_f16 from_f32<fc_f16>(float x) {
    return fc_f16{fc_f32_to_f16(x)};
}
// x rounded to T's precision, as a float
template <class T>
__host__ __device__ inline float round_to(float x) {
    return to_f32(from_f32<T>(x));
}

// Runs the statement(s) after T with T the storage type of precision p.
#define FC_DISPATCH(p, T, ...)                           \
    switch (p) {                                         \
    case FC_PREC_BF16: {                                 \
        typedef fc_bf16 T;                               \
        __VA_ARGS__;                                     \
    } break;                                             \
    case FC_PREC_FP16: {                                 \
        typedef fc_f16 T;                                \
        __VA_ARGS__;                                     \
    } break;                                             \
    default: {                                           \
        typedef float T;                                 \
        __VA_ARGS__;                                     \
    } break;                                             \
    }

static inline unsigned fc_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8u) b = 65535u * 8u;  // grid-stride loops cover the rest
    return b ? (unsigned)b : 1u;
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum / max of v (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `scratch` is 32 floats of shared memory.
__device__ inline float block_sum(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(t);
}
__device__ inline float block_max(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

#endif
