// core/optim.c — see optim.h.
#include "optim.h"

#include "simd.h"

fc_adamw_coeffs fc_adamw_coeffs_at(const fc_optim_config *c, long step) {
    fc_adamw_coeffs k;
    double bc1 = 1.0 - pow(c->beta1, (double)step);
    double bc2 = 1.0 - pow(c->beta2, (double)step);
    k.decay = (float)(1.0 - c->lr * c->weight_decay);
    k.w1 = (float)(1.0 - c->beta1);
    k.beta2 = (float)c->beta2;
    k.w2 = (float)(1.0 - c->beta2);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)c->eps;
    k.neg_step = (float)(-(c->lr / bc1));
    return k;
}

fc_sgd_coeffs fc_sgd_coeffs_at(const fc_optim_config *c, long step) {
    fc_sgd_coeffs k;
    k.wd = (float)c->weight_decay;
    k.momentum = (float)c->momentum;
    k.w = (float)(1.0 - c->dampening);
    k.neg_lr = (float)(-c->lr);
    k.nesterov = c->nesterov;
    k.first = step == 1;
    return k;
}

#ifdef FC_SIMD_X86
#include <immintrin.h>
// fc_adamw_elem on 16 elements at a time (AVX-512F), its operations in its order and
// each correctly rounded, so the bits are the scalar loop's. Returns how many it did
// (a multiple of 16); the caller does the rest.
__attribute__((target("avx512f"))) static size_t adamw_avx512(float *p, const float *g, float *m, float *v, size_t n,
                                                              const fc_adamw_coeffs *k) {
    const __m512 decay = _mm512_set1_ps(k->decay), w1 = _mm512_set1_ps(k->w1), rest = _mm512_set1_ps(1.0f - k->w1);
    const __m512 beta2 = _mm512_set1_ps(k->beta2), w2 = _mm512_set1_ps(k->w2), bc = _mm512_set1_ps(k->bc2_sqrt);
    const __m512 eps = _mm512_set1_ps(k->eps), step = _mm512_set1_ps(k->neg_step);
    const int near = k->w1 < 0.5f;  // fc_lerp's branch, the same for every element
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gi = _mm512_loadu_ps(g + i), mi = _mm512_loadu_ps(m + i), d = _mm512_sub_ps(gi, mi);
        const __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
        const __m512 mv = near ? _mm512_add_ps(mi, _mm512_mul_ps(w1, d)) : _mm512_sub_ps(gi, _mm512_mul_ps(d, rest));
        const __m512 vv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), beta2), _mm512_mul_ps(_mm512_mul_ps(w2, gi), gi));
        const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc), eps);
        _mm512_storeu_ps(p + i, _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(step, mv), denom)));
        _mm512_storeu_ps(m + i, mv);
        _mm512_storeu_ps(v + i, vv);
    }
    return i;
}
#endif

void fc_optim_update(const fc_optim_config *c, long step, float *p, const float *g, float *state0,
                     float *state1, size_t n) {
    // element-wise: threads (core/threads.h) split the elements and change no bit
    if (c->kind == FC_OPT_ADAMW) {
        fc_adamw_coeffs k = fc_adamw_coeffs_at(c, step);
        const int wide = fc_simd_level() == FC_SIMD_AVX512;
        const size_t chunk = 16384, nchunk = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n >= 65536)
        for (size_t q = 0; q < nchunk; q++) {
            const size_t i0 = q * chunk, len = n - i0 < chunk ? n - i0 : chunk;
            size_t i = 0;
#ifdef FC_SIMD_X86
            if (wide) i = adamw_avx512(p + i0, g + i0, state0 + i0, state1 + i0, len, &k);
#else
            (void)wide;
#endif
            for (; i < len; i++) fc_adamw_elem(&p[i0 + i], g[i0 + i], &state0[i0 + i], &state1[i0 + i], &k);
        }
    } else {
        fc_sgd_coeffs k = fc_sgd_coeffs_at(c, step);
        // without momentum there is no buffer (state0 == NULL) and none is touched
#pragma omp parallel for schedule(static) if (n >= 65536)
        for (size_t i = 0; i < n; i++) fc_sgd_elem(&p[i], g[i], state0 ? &state0[i] : NULL, &k);
    }
}

int fc_optim_state_names(const fc_optim_config *c, const char *names[2]) {
    if (c->kind == FC_OPT_ADAMW) {
        names[0] = "exp_avg";
        names[1] = "exp_avg_sq";
        return 2;
    }
    if (c->momentum == 0.0) return 0;  // torch keeps no buffer without momentum
    names[0] = "momentum_buffer";
    return 1;
}
