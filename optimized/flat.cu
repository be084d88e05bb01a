// optimized/flat.cu — flat-buffer packs and casts between the fp32 master
// shards and the param_dtype / reduce_dtype buffers of the collectives, with
// core/round.h's round-to-nearest-even, exactly the reference's arithmetic
// (reference/fsdp.c: pack, the pre-divide, the post-divide).
#include "common.cuh"
#include "kernels.h"

// dst [n] (D) = src [n] fp32
template <class D>
__global__ static void cast_kernel(D *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = from_f32<D>(src[i]);
}

// dst [n] (R) = round_R(round_R(g) / pre), g [n] (P)
template <class R, class P>
__global__ static void predivide_kernel(R *dst, const P *g, size_t n, float pre) {
    GRID_STRIDE(i, n) dst[i] = from_f32<R>(round_to<R>(to_f32(g[i])) / pre);
}

// grad [n] fp32 += round_R(src / post), src [n] (R)
template <class R>
__global__ static void accumulate_kernel(float *grad, const R *src, size_t n, float post) {
    GRID_STRIDE(i, n) grad[i] = grad[i] + round_to<R>(to_f32(src[i]) / post);
}

extern "C" void fck_cast(void *dst, fc_prec p, const float *src, size_t n, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(p, D, cast_kernel<D><<<fc_blocks(n, 256), 256, 0, s>>>((D *)dst, src, n));
    cudaCheckLaunch();
}

extern "C" void fck_predivide(void *dst, fc_prec rd, const void *g, fc_prec pd, size_t n, float pre, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(rd, R,
                FC_DISPATCH(pd, P, predivide_kernel<R, P><<<fc_blocks(n, 256), 256, 0, s>>>((R *)dst, (const P *)g, n, pre)));
    cudaCheckLaunch();
}

extern "C" void fck_accumulate(float *grad, const void *src, fc_prec rd, size_t n, float post, cudaStream_t s) {
    if (!n) return;
    FC_DISPATCH(rd, R, accumulate_kernel<R><<<fc_blocks(n, 256), 256, 0, s>>>(grad, (const R *)src, n, post));
    cudaCheckLaunch();
}

// FSDP2's copy-out / copy-in (core/layout.h): map [3 * n] holds, per piece,
// (unit offset, wire offset, count); block b moves piece b.
template <class D>
__global__ static void permute_kernel(D *natural, D *wire, const size_t *map, int to_wire) {
    const size_t *pc = map + 3 * (size_t)blockIdx.x;
    D *nat = natural + pc[0], *wir = wire + pc[1];
    for (size_t i = threadIdx.x; i < pc[2]; i += blockDim.x) {
        if (to_wire)
            wir[i] = nat[i];
        else
            nat[i] = wir[i];
    }
}

extern "C" void fck_permute(void *natural, void *wire, const size_t *map, int n, size_t P, int to_wire, fc_prec p,
                            cudaStream_t s) {
    size_t es = fc_prec_size(p);
    if (to_wire) cudaCheck(cudaMemsetAsync(wire, 0, P * es, s));  // the padding is zeros
    if (!n) return;
    FC_DISPATCH(p, D, permute_kernel<D><<<n, 256, 0, s>>>((D *)natural, (D *)wire, map, to_wire));
    cudaCheckLaunch();
}
