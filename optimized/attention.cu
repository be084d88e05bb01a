// optimized/attention.cu — the causal attention core of both language models,
// the reference's math (reference/layers.c attention_*_core) in fp32
// arithmetic over the storage type: GPT-2's multi-head attention over its
// packed qkv, and Llama's grouped-query attention over separate q, k, v
// (query head h reads kv head h / (NH/NKV), repeat_kv's layout). One set of
// kernels serves both, as one core does in the reference: q, k, v and out are
// base pointers with a row stride per token, and the score is (q.k * mul) /
// div, GPT-2's q.k / sqrt(hs) (mul = 1) or Llama's q.k * head_dim**-0.5 (div
// = 1): multiplying or dividing by 1 is exact, so each model gets its own
// Hugging Face rounding. The row max is subtracted, softmax, the weights
// stored in the storage type (as a 16-bit model's are) and read back rounded
// for the weighted sum of v. One warp per (b, h, t) row, its scores in shared
// memory; the backward's q/k/v gradients are one thread per output element
// summing in a fixed order. No atomics anywhere.
#include <math.h>

#include "common.cuh"
#include "kernels.h"

#define ATT_WARPS 4  // rows per block

static int att_warps(int T) { return T * ATT_WARPS * (int)sizeof(float) <= 48 * 1024 ? ATT_WARPS : 1; }

// B samples, T tokens, NH query heads of hs, NKV kv heads (dividing NH).
// Head h of token (b, t) starts at base + (b*T + t) * stride + h*hs.
typedef struct {
    int B, T, NH, NKV, hs;
    size_t qs, kvs, os;  // row strides of q (and dq), of k and v (and dk, dv), of out (and dout)
    float mul, div;      // the score is (dot * mul) / div
} att_dims;

__device__ static inline float att_scale(float dot, const att_dims &d) { return dot * d.mul / d.div; }

// out (os) [B,T,NH*hs], att [B,NH,T,T], q (qs), k, v (kvs); row = (b, h, t)
template <class X>
__global__ static void attention_forward_kernel(X *out, X *att, const X *q, const X *k, const X *v, att_dims d,
                                                int warps) {
    extern __shared__ float smem[];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, T = d.T, hs = d.hs;
    size_t row = (size_t)blockIdx.x * warps + w;
    if (row >= (size_t)d.B * d.NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % d.NH), b = (int)(row / T / d.NH), kvh = h / (d.NH / d.NKV);
    const X *qt = q + ((size_t)b * T + t) * d.qs + (size_t)h * hs;  // q_t [hs]
    const X *kh = k + (size_t)b * T * d.kvs + (size_t)kvh * hs;     // k_t2 = kh + t2*kvs
    const X *vh = v + (size_t)b * T * d.kvs + (size_t)kvh * hs;     // v_t2 = vh + t2*kvs
    float *sc = smem + (size_t)w * T;                                // sc [T]
    float mx = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const X *kt = kh + (size_t)t2 * d.kvs;
        float dot = 0.0f;
        for (int i = 0; i < hs; i++) dot += to_f32(qt[i]) * to_f32(kt[i]);
        dot = att_scale(dot, d);
        sc[t2] = dot;
        mx = fmaxf(mx, dot);
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
        X val = from_f32<X>(t2 <= t ? sc[t2] * inv : 0.0f);
        a[t2] = val;
        if (t2 <= t) sc[t2] = to_f32(val);  // the weights as stored
    }
    __syncwarp();
    X *o = out + ((size_t)b * T + t) * d.os + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += sc[t2] * to_f32(vh[(size_t)t2 * d.kvs + i]);
        o[i] = from_f32<X>(acc);
    }
}

// dpreatt [b,h,t,t2] = att * (datt - sum_t3 att * datt), datt[t2] = do_t . v_t2
template <class X>
__global__ static void attention_backward_rows_kernel(X *dpre, const X *dout, const X *v, const X *att, att_dims d,
                                                      int warps) {
    extern __shared__ float smem[];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, T = d.T, hs = d.hs;
    size_t row = (size_t)blockIdx.x * warps + w;
    if (row >= (size_t)d.B * d.NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % d.NH), b = (int)(row / T / d.NH), kvh = h / (d.NH / d.NKV);
    const X *dy = dout + ((size_t)b * T + t) * d.os + (size_t)h * hs;  // do_t [hs]
    const X *vh = v + (size_t)b * T * d.kvs + (size_t)kvh * hs;        // v_t2 = vh + t2*kvs
    const X *a = att + row * T;
    float *da = smem + (size_t)w * T;
    float s = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const X *vt = vh + (size_t)t2 * d.kvs;
        float dot = 0.0f;
        for (int i = 0; i < hs; i++) dot += to_f32(dy[i]) * to_f32(vt[i]);
        da[t2] = dot;
        s += to_f32(a[t2]) * dot;
    }
    s = warp_sum(s);
    X *dp = dpre + row * T;
    for (int t2 = lane; t2 < T; t2 += 32) dp[t2] = from_f32<X>(t2 <= t ? to_f32(a[t2]) * (da[t2] - s) : 0.0f);
}

// dq_t [i] += sum_{t2 <= t} (dpreatt[t,t2] scaled) k_t2[i], t2 ascending
template <class X>
__global__ static void attention_backward_q_kernel(X *dq, const X *dpre, const X *k, att_dims d) {
    int T = d.T, hs = d.hs;
    size_t n = (size_t)d.B * d.NH * T * hs;
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % hs);
        size_t row = idx / hs;  // (b, h, t)
        int t = (int)(row % T), h = (int)(row / T % d.NH), b = (int)(row / T / d.NH), kvh = h / (d.NH / d.NKV);
        const X *dp = dpre + row * T;
        const X *kh = k + (size_t)b * T * d.kvs + (size_t)kvh * hs + i;
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += att_scale(to_f32(dp[t2]), d) * to_f32(kh[(size_t)t2 * d.kvs]);
        X *o = dq + ((size_t)b * T + t) * d.qs + (size_t)h * hs + i;
        *o = from_f32<X>(to_f32(*o) + acc);
    }
}

// Per kv head kvh and its group of query heads [h0, h0 + NH/NKV):
//   dk_t2 [i] += sum_{h in group} (sum_{t >= t2} (dpreatt_h[t,t2] scaled) q_h,t[i])
//   dv_t2 [i] += sum_{h in group} (sum_{t >= t2} att_h[t,t2] do_h,t[i])
// each head's sum from 0, the group's starting at its first head's (so a group
// of one is exactly the per-head backward), added to dk, dv once, as the
// reference (repeat_kv's backward: summed over the group, then accumulated).
template <class X>
__global__ static void attention_backward_kv_kernel(X *dk, X *dv, const X *dpre, const X *dout, const X *q,
                                                    const X *att, att_dims d) {
    int T = d.T, hs = d.hs, group = d.NH / d.NKV;
    size_t n = (size_t)d.B * d.NKV * T * hs;
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % hs);
        size_t r2 = idx / hs;  // (b, kvh, t2)
        int t2 = (int)(r2 % T), kvh = (int)(r2 / T % d.NKV), b = (int)(r2 / T / d.NKV);
        float sk = 0.0f, sv = 0.0f;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            size_t bh = ((size_t)b * d.NH + h) * T * T;
            const X *qh = q + (size_t)b * T * d.qs + (size_t)h * hs + i;
            const X *dyh = dout + (size_t)b * T * d.os + (size_t)h * hs + i;
            float ak = 0.0f, av = 0.0f;
            for (int t = t2; t < T; t++) {
                size_t at = bh + (size_t)t * T + t2;
                ak += att_scale(to_f32(dpre[at]), d) * to_f32(qh[(size_t)t * d.qs]);
                av += to_f32(att[at]) * to_f32(dyh[(size_t)t * d.os]);
            }
            sk = h == kvh * group ? ak : sk + ak;
            sv = h == kvh * group ? av : sv + av;
        }
        size_t at = ((size_t)b * T + t2) * d.kvs + (size_t)kvh * hs + i;
        if (dk) dk[at] = from_f32<X>(to_f32(dk[at]) + sk);
        if (dv) dv[at] = from_f32<X>(to_f32(dv[at]) + sv);
    }
}

static void att_forward(void *out, void *att, const void *q, const void *k, const void *v, att_dims d, fc_prec p,
                        cudaStream_t s) {
    size_t rows = (size_t)d.B * d.NH * d.T;
    if (!rows) return;
    int w = att_warps(d.T);
    unsigned blocks = (unsigned)((rows + w - 1) / w);
    size_t smem = (size_t)w * d.T * sizeof(float);
    FC_DISPATCH(p, X, attention_forward_kernel<X><<<blocks, 32 * w, smem, s>>>((X *)out, (X *)att, (const X *)q, (const X *)k, (const X *)v, d, w));
    cudaCheckLaunch();
}

static void att_backward(void *dq, void *dk, void *dv, void *dpreatt, const void *dout, const void *q, const void *k,
                         const void *v, const void *att, att_dims d, fc_prec p, cudaStream_t s) {
    size_t rows = (size_t)d.B * d.NH * d.T, nq = rows * (size_t)d.hs, nkv = (size_t)d.B * d.NKV * d.T * d.hs;
    if (!rows) return;
    int w = att_warps(d.T);
    unsigned blocks = (unsigned)((rows + w - 1) / w);
    size_t smem = (size_t)w * d.T * sizeof(float);
    FC_DISPATCH(p, X, attention_backward_rows_kernel<X><<<blocks, 32 * w, smem, s>>>((X *)dpreatt, (const X *)dout, (const X *)v, (const X *)att, d, w));
    cudaCheckLaunch();
    if (dq) {
        FC_DISPATCH(p, X, attention_backward_q_kernel<X><<<fc_blocks(nq, 256), 256, 0, s>>>((X *)dq, (const X *)dpreatt, (const X *)k, d));
        cudaCheckLaunch();
    }
    if (dk || dv) {
        FC_DISPATCH(p, X, attention_backward_kv_kernel<X><<<fc_blocks(nkv, 256), 256, 0, s>>>((X *)dk, (X *)dv, (const X *)dpreatt, (const X *)dout, (const X *)q, (const X *)att, d));
        cudaCheckLaunch();
    }
}

// GPT-2: q, k, v packed in qkv [B,T,3C], one kv head per head, the score divided by sqrt(hs)
static att_dims gpt2_dims(int B, int T, int C, int NH) {
    size_t C3 = 3 * (size_t)C;
    att_dims d = {B, T, NH, NH, C / NH, C3, C3, (size_t)C, 1.0f, sqrtf((float)(C / NH))};
    return d;
}

// Llama: the score multiplied by head_dim ** -0.5, a Python float in Hugging
// Face, rounded once to fp32 (computed in double, as the reference does)
static att_dims gqa_dims(int B, int T, int NH, int NKV, int hs) {
    att_dims d = {B, T, NH, NKV, hs, (size_t)NH * hs, (size_t)NKV * hs, (size_t)NH * hs,
                  (float)(1.0 / sqrt((double)hs)), 1.0f};
    return d;
}

extern "C" void fck_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, int NH, fc_prec p,
                                      cudaStream_t s) {
    size_t esz = fc_prec_size(p);
    const char *q = (const char *)qkv;
    att_forward(out, att, q, q + C * esz, q + 2 * C * esz, gpt2_dims(B, T, C, NH), p, s);
}

extern "C" void fck_attention_backward(void *dqkv, void *dpreatt, const void *dout, const void *qkv, const void *att,
                                       int B, int T, int C, int NH, fc_prec p, cudaStream_t s) {
    size_t esz = fc_prec_size(p);
    const char *q = (const char *)qkv;
    char *dq = (char *)dqkv;
    att_backward(dq, dq + C * esz, dq + 2 * C * esz, dpreatt, dout, q, q + C * esz, q + 2 * C * esz, att,
                 gpt2_dims(B, T, C, NH), p, s);
}

extern "C" void fck_gqa_attention_forward(void *out, void *att, const void *q, const void *k, const void *v, int B,
                                          int T, int NH, int NKV, int hs, fc_prec p, cudaStream_t s) {
    att_forward(out, att, q, k, v, gqa_dims(B, T, NH, NKV, hs), p, s);
}

extern "C" void fck_gqa_attention_backward(void *dq, void *dk, void *dv, void *dpreatt, const void *dout,
                                           const void *q, const void *k, const void *v, const void *att, int B,
                                           int T, int NH, int NKV, int hs, fc_prec p, cudaStream_t s) {
    att_backward(dq, dk, dv, dpreatt, dout, q, k, v, att, gqa_dims(B, T, NH, NKV, hs), p, s);
}
