// tests/ports/hwlike/hw_attention.c — the hardware-like port's causal
// attention, GPT-2's and Llama's grouped-query (layers.h documents both).
//
// HW_K_ATTENTION computes the forward as a flash kernel does: per query row,
// one pass over the keys a block at a time, with a running max m, a running
// sum l and an output accumulator o rescaled by exp(m_old - m_new) at each
// block, and out = o / l at the end. preatt holds the scores exactly as
// layers.c computes them, and att the probabilities a flash backward
// recomputes from the final m and l, so layers.c's backward (the port's, with
// every knob) runs on them. HW_K_COMPUTE16 rounds out, att and the input
// gradients to the compute precision. With neither knob on these are
// layers.c's functions.
#include <math.h>

#include "check.h"
#include "hwlike.h"
#include "layers.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// Less work than this (in multiply-adds) stays on one thread, as layers.c's FC_PAR_MIN.
#define HW_PAR_MIN 32768

// x [n] rounded to the compute precision under HW_K_COMPUTE16; NULL is no buffer.
static void hw_round_out(float *x, size_t n) {
    if (x && hw_on(HW_K_COMPUTE16)) hw_r16n(x, n);
}

// The shapes of one attention call, as layers.c's att_dims: head h of token
// (b, t) starts at base + (b*T + t) * stride + h*hs, and a score is
// (q . k * mul) / div (GPT-2: mul 1, div sqrt(hs); Llama: mul hs^-0.5, div 1).
typedef struct {
    int B, T, NH, NKV, hs;  // NKV divides NH
    size_t qs, kvs, os;     // row strides of q, of k and v, of out
    float mul, div;
} hw_att_dims;

// One query row t of one head, flash style.
// pre, a [T]: the row of preatt and att; o [hs]: the row's slice of out;
// qt [hs]: the query; kh, vh: key and value 0 of the head (row stride kvs);
// bk: the key block size.
static void flash_row(float *o, float *pre, float *a, const float *qt, const float *kh, const float *vh, int t,
                      int bk, const hw_att_dims *d) {
    const int T = d->T, hs = d->hs;
    const size_t kvs = d->kvs;
    // the scores, each dot summed over i ascending from 0 then scaled: layers.c's bits
    for (int k = 0; k <= t; k++) {
        const float *kk = kh + (size_t)k * kvs;
        float s = 0;
        for (int i = 0; i < hs; i++) s += qt[i] * kk[i];
        pre[k] = s * d->mul / d->div;
    }
    float m = -INFINITY, l = 0;
    for (int i = 0; i < hs; i++) o[i] = 0;
    for (int k0 = 0; k0 <= t; k0 += bk) {
        const int k1 = k0 + bk < t + 1 ? k0 + bk : t + 1;  // the block: keys [k0, k1)
        float mb = m;
        for (int k = k0; k < k1; k++) {
            if (pre[k] > mb) mb = pre[k];
        }
        const float alpha = expf(m - mb);  // 0 at the first block, where m = -inf
        float lb = 0;
        for (int i = 0; i < hs; i++) o[i] = o[i] * alpha;
        for (int k = k0; k < k1; k++) {
            const float p = expf(pre[k] - mb);
            const float *vk = vh + (size_t)k * kvs;
            lb += p;
            for (int i = 0; i < hs; i++) o[i] += p * vk[i];
        }
        l = l * alpha + lb;
        m = mb;
    }
    for (int i = 0; i < hs; i++) o[i] = o[i] / l;
    for (int k = 0; k <= t; k++) a[k] = expf(pre[k] - m) / l;
    for (int k = t + 1; k < T; k++) {
        pre[k] = 0;
        a[k] = 0;
    }
}

static void flash_forward(float *out, float *preatt, float *att, const float *q, const float *k, const float *v,
                          const hw_att_dims *d) {
    // out (row stride os), preatt [B,NH,T,T], att [B,NH,T,T], q (row stride qs), k, v (kvs)
    const int B = d->B, T = d->T, NH = d->NH, hs = d->hs, group = d->NH / d->NKV;
    // the key block, as a kernel's tile is chosen from the sequence and head sizes
    const int bk = 2 << (int)(hw_mix(hw_mix(hw.seed, (uint64_t)T), (uint64_t)hs) % 4);  // 2, 4, 8, 16
    // threads split the (b, h) pairs: each writes its own rows of preatt/att and its head's slice of out
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * T * NH * hs >= HW_PAR_MIN)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int kvh = h / group;
            const float *qh = q + (size_t)b * T * d->qs + (size_t)h * hs;     // q_t = qh + t*qs
            const float *kh = k + (size_t)b * T * d->kvs + (size_t)kvh * hs;  // k_t = kh + t*kvs
            const float *vh = v + (size_t)b * T * d->kvs + (size_t)kvh * hs;  // v_t = vh + t*kvs
            for (int t = 0; t < T; t++) {
                const size_t row = (((size_t)b * NH + h) * T + t) * T;
                float *o = out + ((size_t)b * T + t) * d->os + (size_t)h * hs;
                flash_row(o, preatt + row, att + row, qh + (size_t)t * d->qs, kh, vh, t, bk, d);
            }
        }
    }
}

void hw_attention_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T, int C, int NH) {
    // out [B,T,C], preatt [B,NH,T,T], att [B,NH,T,T], qkv [B,T,3C]
    if (!hw_on(HW_K_ATTENTION)) {
        fc_attention_forward(out, preatt, att, qkv, B, T, C, NH);
    } else {
        const int hs = C / NH;
        const size_t C3 = 3 * (size_t)C;
        const hw_att_dims d = {B, T, NH, NH, hs, C3, C3, (size_t)C, 1.0f, sqrtf((float)hs)};  // layers.c's scale
        flash_forward(out, preatt, att, qkv, qkv + C, qkv + 2 * (size_t)C, &d);
    }
    hw_round_out(out, (size_t)B * T * C);
    hw_round_out(att, (size_t)B * NH * T * T);
}

void hw_attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH) {
    // dqkv [B,T,3C] +=, dpreatt, datt [B,NH,T,T] scratch, dout [B,T,C], qkv [B,T,3C], att [B,NH,T,T]
    fc_attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH);
    hw_round_out(dqkv, (size_t)B * T * 3 * C);
}

void hw_gqa_attention_forward(float *out, float *preatt, float *att, const float *q, const float *k,
                              const float *v, int B, int T, int NH, int NKV, int hs) {
    // out [B,T,NH*hs], preatt [B,NH,T,T], att [B,NH,T,T], q [B,T,NH*hs], k, v [B,T,NKV*hs]
    if (!hw_on(HW_K_ATTENTION)) {
        fc_gqa_attention_forward(out, preatt, att, q, k, v, B, T, NH, NKV, hs);
    } else {
        if (NKV <= 0 || NH % NKV != 0) {  // callers validate the config; this is a bug here
            fc_die(FC_EXIT_INTERNAL, "internal error: %d kv heads do not divide %d heads", NKV, NH);
        }
        const float s = (float)(1.0 / sqrt((double)hs));  // layers.c's: head_dim ** -0.5 rounded once
        const hw_att_dims d = {B, T, NH, NKV, hs, (size_t)NH * hs, (size_t)NKV * hs, (size_t)NH * hs, s, 1.0f};
        flash_forward(out, preatt, att, q, k, v, &d);
    }
    hw_round_out(out, (size_t)B * T * NH * hs);
    hw_round_out(att, (size_t)B * NH * T * T);
}

void hw_gqa_attention_backward(float *dq, float *dk, float *dv, float *dpreatt, float *datt, const float *dout,
                               const float *q, const float *k, const float *v, const float *att, int B, int T,
                               int NH, int NKV, int hs) {
    // dq [B,T,NH*hs] +=, dk, dv [B,T,NKV*hs] +=, dpreatt, datt [B,NH,T,T] scratch, dout [B,T,NH*hs]
    fc_gqa_attention_backward(dq, dk, dv, dpreatt, datt, dout, q, k, v, att, B, T, NH, NKV, hs);
    hw_round_out(dq, (size_t)B * T * NH * hs);
    hw_round_out(dk, (size_t)B * T * NKV * hs);
    hw_round_out(dv, (size_t)B * T * NKV * hs);
}
