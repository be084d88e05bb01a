// optimized/rope.cu — rotary position embedding as Hugging Face applies it
// (LlamaRotaryEmbedding + apply_rotary_pos_emb: rotate_half, the two halves
// of a head, not interleaved pairs), forward and backward, the reference's
// expressions (reference/layers.c rope_rotate). The cos and sin tables are
// not computed here: the device's cosf/sinf/powf are not glibc's, so the
// tables are built on the host by the reference's own arithmetic
// (model_cu.c) and read from device memory, so every angle's cos and sin
// have the reference's bits. With --fmad=false the rotation's two products
// and their sum round as the reference's do.
#include "common.cuh"
#include "kernels.h"

// x [B,T,H,hd], cos/sin [T,hd/2] fp32; one thread per pair (x[i], x[i + hd/2])
// of one head vector:
//   forward:  o1 = x1 c - x2 s,  o2 = x2 c + x1 s        (written)
//   backward: o1 = x1 c + x2 s,  o2 = x2 c - x1 s        (added: the transpose)
template <class T>
__global__ static void rope_kernel(T *out, const T *inp, const float *cosv, const float *sinv, int Tn, int H, int hd,
                                   size_t n, int backward) {
    int half = hd / 2;
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % half);
        size_t head = idx / half;                 // (b, t, h)
        int t = (int)(head / H % (size_t)Tn);
        const T *x = inp + head * hd;             // x [hd]
        T *o = out + head * hd;                   // o [hd]
        float c = cosv[(size_t)t * half + i], s = sinv[(size_t)t * half + i];
        float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
        if (!backward) {
            // read both before writing either: out may alias inp
            float o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s;
            o[i] = from_f32<T>(o1);
            o[i + half] = from_f32<T>(o2);
        } else {
            // the reference's sign = -1: x1 c - x2 (-s) and x2 c + x1 (-s), the same bits
            float o1 = x1 * c + x2 * s, o2 = x2 * c - x1 * s;
            o[i] = from_f32<T>(to_f32(o[i]) + o1);
            o[i + half] = from_f32<T>(to_f32(o[i + half]) + o2);
        }
    }
}

static void rope_launch(void *out, const void *inp, const float *cosv, const float *sinv, int B, int T, int H, int hd,
                        int backward, fc_prec p, cudaStream_t s) {
    size_t n = (size_t)B * T * H * (size_t)(hd / 2);
    if (!n) return;
    FC_DISPATCH(p, X, rope_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)out, (const X *)inp, cosv, sinv, T, H, hd, n, backward));
    cudaCheckLaunch();
}

extern "C" void fck_rope_forward(void *out, const void *inp, const float *cosv, const float *sinv, int B, int T, int H,
                                 int hd, fc_prec p, cudaStream_t s) {
    rope_launch(out, inp, cosv, sinv, B, T, H, hd, 0, p, s);
}

extern "C" void fck_rope_backward(void *dinp, const void *dout, const float *cosv, const float *sinv, int B, int T,
                                  int H, int hd, fc_prec p, cudaStream_t s) {
    if (!dinp) return;
    rope_launch(dinp, dout, cosv, sinv, B, T, H, hd, 1, p, s);
}
