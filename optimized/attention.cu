// optimized/attention.cu — GPT-2's causal multi-head attention core, the
// reference's math (reference/layers.c) in fp32 arithmetic over the storage
// type: scores q.k / sqrt(hs) (a division, as Hugging Face does), the row max
// subtracted, softmax, stored in the storage type (as a 16-bit model's
// attention weights are) and read back rounded for the weighted sum of v.
// One warp per (b, h, t) row, its scores in shared memory; the backward's
// q/k/v gradients are one thread per output element summing in a fixed
// order. No atomics anywhere.
#include "common.cuh"
#include "kernels.h"

#define ATT_WARPS 4  // rows per block

static int att_warps(int T) { return T * ATT_WARPS * (int)sizeof(float) <= 48 * 1024 ? ATT_WARPS : 1; }

// out [B,T,C], att [B,NH,T,T], qkv [B,T,3C]; row = (b, h, t)
template <class X>
__global__ static void attention_forward_kernel(X *out, X *att, const X *qkv, int B, int T, int C, int NH, int warps) {
    extern __shared__ float smem[];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * warps + w;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    const X *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;  // q_t [hs]
    const X *kh = qkv + (size_t)b * T * C3 + C + (size_t)h * hs;    // k_t2 = kh + t2*3C
    const X *vh = kh + C;                                            // v_t2 = vh + t2*3C
    float *sc = smem + (size_t)w * T;                                // sc [T]
    float sqrt_hs = sqrtf((float)hs);
    float mx = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const X *k = kh + (size_t)t2 * C3;
        float d = 0.0f;
        for (int i = 0; i < hs; i++) d += to_f32(q[i]) * to_f32(k[i]);
        d = d / sqrt_hs;
        sc[t2] = d;
        mx = fmaxf(mx, d);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        float ex = expf(sc[t2] - mx);
        sc[t2] = ex;
        sum += ex;
    }
    float inv = 1.0f / warp_sum(sum);  // >= 1 term: exp(0)
    X *a = att + row * T;
    for (int t2 = lane; t2 < T; t2 += 32) {
        X v = from_f32<X>(t2 <= t ? sc[t2] * inv : 0.0f);
        a[t2] = v;
        if (t2 <= t) sc[t2] = to_f32(v);  // the weights as stored
    }
    __syncwarp();
    X *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += sc[t2] * to_f32(vh[(size_t)t2 * C3 + i]);
        o[i] = from_f32<X>(acc);
    }
}

// dpreatt [b,h,t,t2] = att * (datt - sum_t3 att * datt), datt[t2] = do_t . v_t2
template <class X>
__global__ static void attention_backward_rows_kernel(X *dpre, const X *dout, const X *qkv, const X *att, int B, int T,
                                                      int C, int NH, int warps) {
    extern __shared__ float smem[];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * warps + w;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    const X *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;        // do_t [hs]
    const X *vh = qkv + (size_t)b * T * C3 + 2 * (size_t)C + (size_t)h * hs;  // v_t2 = vh + t2*3C
    const X *a = att + row * T;
    float *da = smem + (size_t)w * T;
    float s = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const X *v = vh + (size_t)t2 * C3;
        float d = 0.0f;
        for (int i = 0; i < hs; i++) d += to_f32(dy[i]) * to_f32(v[i]);
        da[t2] = d;
        s += to_f32(a[t2]) * d;
    }
    s = warp_sum(s);
    X *dp = dpre + row * T;
    for (int t2 = lane; t2 < T; t2 += 32) dp[t2] = from_f32<X>(t2 <= t ? to_f32(a[t2]) * (da[t2] - s) : 0.0f);
}

// dq_t [i] += sum_{t2 <= t} (dpreatt[t,t2] / sqrt(hs)) k_t2[i], t2 ascending
template <class X>
__global__ static void attention_backward_q_kernel(X *dqkv, const X *dpre, const X *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t n = (size_t)B * NH * T * hs, C3 = 3 * (size_t)C;
    float sqrt_hs = sqrtf((float)hs);
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % hs);
        size_t row = idx / hs;  // (b, h, t)
        int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
        const X *dp = dpre + row * T;
        const X *kh = qkv + (size_t)b * T * C3 + C + (size_t)h * hs + i;
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += (to_f32(dp[t2]) / sqrt_hs) * to_f32(kh[(size_t)t2 * C3]);
        X *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs + i;
        *dq = from_f32<X>(to_f32(*dq) + acc);
    }
}

// dk_t2 [i] += sum_{t >= t2} (dpreatt[t,t2] / sqrt(hs)) q_t[i]; dv_t2 [i] += sum_{t >= t2} att[t,t2] do_t[i]
template <class X>
__global__ static void attention_backward_kv_kernel(X *dqkv, const X *dpre, const X *dout, const X *qkv, const X *att,
                                                    int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t n = (size_t)B * NH * T * hs, C3 = 3 * (size_t)C;
    float sqrt_hs = sqrtf((float)hs);
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % hs);
        size_t r2 = idx / hs;  // (b, h, t2)
        int t2 = (int)(r2 % T), h = (int)(r2 / T % NH), b = (int)(r2 / T / NH);
        size_t bh = ((size_t)b * NH + h) * T * T;
        const X *qh = qkv + (size_t)b * T * C3 + (size_t)h * hs + i;
        const X *dyh = dout + (size_t)b * T * C + (size_t)h * hs + i;
        float ak = 0.0f, av = 0.0f;
        for (int t = t2; t < T; t++) {
            size_t at = bh + (size_t)t * T + t2;
            ak += (to_f32(dpre[at]) / sqrt_hs) * to_f32(qh[(size_t)t * C3]);
            av += to_f32(att[at]) * to_f32(dyh[(size_t)t * C]);
        }
        X *dk = dqkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs + i;
        X *dv = dk + C;
        *dk = from_f32<X>(to_f32(*dk) + ak);
        *dv = from_f32<X>(to_f32(*dv) + av);
    }
}

extern "C" void fck_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, int NH, fc_prec p,
                                      cudaStream_t s) {
    size_t rows = (size_t)B * NH * T;
    if (!rows) return;
    int w = att_warps(T);
    unsigned blocks = (unsigned)((rows + w - 1) / w);
    size_t smem = (size_t)w * T * sizeof(float);
    FC_DISPATCH(p, X, attention_forward_kernel<X><<<blocks, 32 * w, smem, s>>>((X *)out, (X *)att, (const X *)qkv, B, T, C, NH, w));
    cudaCheckLaunch();
}

extern "C" void fck_attention_backward(void *dqkv, void *dpreatt, const void *dout, const void *qkv, const void *att,
                                       int B, int T, int C, int NH, fc_prec p, cudaStream_t s) {
    size_t rows = (size_t)B * NH * T, n = rows * (size_t)(C / NH);
    if (!rows) return;
    int w = att_warps(T);
    unsigned blocks = (unsigned)((rows + w - 1) / w);
    size_t smem = (size_t)w * T * sizeof(float);
    FC_DISPATCH(p, X, attention_backward_rows_kernel<X><<<blocks, 32 * w, smem, s>>>((X *)dpreatt, (const X *)dout, (const X *)qkv, (const X *)att, B, T, C, NH, w));
    cudaCheckLaunch();
    FC_DISPATCH(p, X, attention_backward_q_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)dqkv, (const X *)dpreatt, (const X *)qkv, B, T, C, NH));
    cudaCheckLaunch();
    FC_DISPATCH(p, X, attention_backward_kv_kernel<X><<<fc_blocks(n, 256), 256, 0, s>>>((X *)dqkv, (const X *)dpreatt, (const X *)dout, (const X *)qkv, (const X *)att, B, T, C, NH));
    cudaCheckLaunch();
}
