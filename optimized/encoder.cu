// optimized/encoder.cu — the token embedding, with GPT-2's position table
// added (Llama has none: wpe NULL, RoPE places the tokens), forward and a
// deterministic backward (no atomics): the token gradient goes bucket by
// bucket (enc_buckets.h), each bucket's rows added in position order, then
// added to dwte once, as the reference does (reference/layers.c).
#include "common.cuh"
#include "kernels.h"

// out [B,T,C] = wte [ids[b,t]] + wpe [t]; wpe NULL: wte [ids[b,t]] alone (not
// + 0, which would turn a -0 into +0)
template <class T>
__global__ static void encoder_forward_kernel(T *out, const int32_t *ids, const T *wte, const T *wpe, int Tn, int C,
                                              size_t n) {
    GRID_STRIDE(i, n) {
        size_t bt = i / (size_t)C, c = i % (size_t)C, t = bt % (size_t)Tn;
        float e = to_f32(wte[(size_t)ids[bt] * C + c]);
        out[i] = from_f32<T>(wpe ? e + to_f32(wpe[t * C + c]) : e);
    }
}

// grid (n_tok, ceil(C / blockDim.x)): dwte [tok[j], c] += sum over the bucket's positions of dout [pos, c]
template <class T>
__global__ static void encoder_backward_wte_kernel(T *dwte, const T *dout, const int32_t *tok, const int32_t *off,
                                                   const int32_t *pos, int C) {
    int j = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int g = off[j]; g < off[j + 1]; g++) acc += to_f32(dout[(size_t)pos[g] * C + c]);
    T *dw = dwte + (size_t)tok[j] * C + c;
    *dw = from_f32<T>(to_f32(*dw) + acc);
}

// dwpe [t, c] += sum over b ascending of dout [b, t, c]
template <class T>
__global__ static void encoder_backward_wpe_kernel(T *dwpe, const T *dout, int B, int Tn, int C) {
    size_t n = (size_t)Tn * C;
    GRID_STRIDE(i, n) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++) acc += to_f32(dout[(size_t)b * n + i]);
        dwpe[i] = from_f32<T>(to_f32(dwpe[i]) + acc);
    }
}

extern "C" void fck_encoder_forward(void *out, const int32_t *ids, const void *wte, const void *wpe, int B, int T,
                                    int C, fc_prec p, cudaStream_t s) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    FC_DISPATCH(p, X, encoder_forward_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, ids, (const X *)wte, (const X *)wpe, T, C, n));
    cudaCheckLaunch();
}

extern "C" void fck_encoder_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tok, const int32_t *off,
                                     const int32_t *pos, int n_tok, int B, int T, int C, fc_prec p, cudaStream_t s) {
    if (dwte && n_tok > 0) {
        dim3 grid((unsigned)n_tok, (unsigned)((C + 127) / 128));
        FC_DISPATCH(p, X, encoder_backward_wte_kernel<X><<<grid, 128, 0, s>>>((X *)dwte, (const X *)dout, tok, off, pos, C));
        cudaCheckLaunch();
    }
    if (dwpe) {
        size_t n = (size_t)T * C;
        FC_DISPATCH(p, X, encoder_backward_wpe_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)dwpe, (const X *)dout, B, T, C));
        cudaCheckLaunch();
    }
}
