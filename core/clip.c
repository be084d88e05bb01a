// core/clip.c — see clip.h.
#include "clip.h"

#include <math.h>
#include <string.h>

#include "simd.h"

typedef uint64_t fc_norm_lanes[4][FC_NORM_BUCKETS - 1];

// Elements [i, n) into the lanes (type 1 or 2) one at a time, or (type inf) their max finite
// |g| bits, which it returns.
static uint32_t fill_scalar(fc_norm_lanes lane, const float *g, size_t i, size_t n, fc_norm_type type,
                            uint32_t *flags) {
    uint32_t max_bits = 0;
    for (; i < n; i++) {
        unsigned e;
        uint64_t term;
        uint32_t bits;
        if (!fc_norm_term(g[i], type, &e, &term, &bits, flags)) continue;
        if (type == FC_NORM_INF)
            max_bits = bits > max_bits ? bits : max_bits;
        else
            lane[i & 3][e] += term;
    }
    return max_bits;
}

#ifdef FC_SIMD_X86
#include <immintrin.h>
// fc_norm_term on 16 elements at a time (AVX-512F), the adds to the lanes one by one (the
// exponents of 16 elements may repeat). A block holding an inf or a NaN goes to
// fill_scalar, which flags it. Type 1 or 2 only.
__attribute__((target("avx512f"))) static void fill_avx512(fc_norm_lanes lane, const float *g, size_t n,
                                                               fc_norm_type type, uint32_t *flags) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), man = _mm512_set1_epi32(0x7fffff);
    const __m512i hidden = _mm512_set1_epi32(0x800000), one = _mm512_set1_epi32(1), inf = _mm512_set1_epi32(255);
    uint32_t e[16];
    uint64_t t[16];
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i b = _mm512_and_si512(_mm512_loadu_si512(g + i), abs_mask), E = _mm512_srli_epi32(b, 23);
        if (_mm512_cmpeq_epi32_mask(E, inf)) {  // not finite: the scalar path sets the flag
            fill_scalar(lane, g, i, i + 16, type, flags);
            continue;
        }
        const __m512i M = _mm512_and_si512(b, man);
        const __m512i m = _mm512_mask_or_epi32(M, _mm512_cmpneq_epi32_mask(E, _mm512_setzero_si512()), M, hidden);
        _mm512_storeu_si512(e, _mm512_max_epu32(E, one));  // a subnormal counts as e = 1
        const __m512i lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(m));
        const __m512i hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(m, 1));
        _mm512_storeu_si512(t, type == FC_NORM_2 ? _mm512_mul_epu32(lo, lo) : lo);
        _mm512_storeu_si512(t + 8, type == FC_NORM_2 ? _mm512_mul_epu32(hi, hi) : hi);
        for (int k = 0; k < 16; k += 4) {
            lane[0][e[k]] += t[k];
            lane[1][e[k + 1]] += t[k + 1];
            lane[2][e[k + 2]] += t[k + 2];
            lane[3][e[k + 3]] += t[k + 3];
        }
    }
    fill_scalar(lane, g, i, n, type, flags);
}
#endif

void fc_norm_buckets_fill(uint64_t *bucket, const float *g, size_t n, fc_norm_type type) {
    // Neighbouring elements mostly share an exponent, so one array would make each add wait
    // for the last to the same bucket: four lanes take the elements in turn and are summed
    // at the end. Each holds at most n terms' sum, so no sum wraps.
    fc_norm_lanes lane;
    uint32_t flags = 0, max_bits = 0;
    if (type != FC_NORM_INF) memset(lane, 0, sizeof lane);
#ifdef FC_SIMD_X86
    if (type != FC_NORM_INF && fc_simd_level() == FC_SIMD_AVX512)
        fill_avx512(lane, g, n, type, &flags);
    else
#endif
        max_bits = fill_scalar(lane, g, 0, n, type, &flags);
    for (int e = 0; e < FC_NORM_BUCKETS - 1; e++)
        bucket[e] = type == FC_NORM_INF ? 0 : lane[0][e] + lane[1][e] + lane[2][e] + lane[3][e];
    bucket[FC_NORM_BUCKETS - 1] = (uint64_t)flags << 32 | max_bits;
}

void fc_norm_part_add(fc_norm_part *p, const float *g, size_t n, fc_norm_type type) {
    uint64_t bucket[FC_NORM_BUCKETS];
    for (size_t i = 0; i < n; i += FC_NORM_BUCKET_TERMS) {
        size_t c = n - i < FC_NORM_BUCKET_TERMS ? n - i : FC_NORM_BUCKET_TERMS;
        fc_norm_buckets_fill(bucket, g + i, c, type);
        fc_norm_part_add_buckets(p, bucket, type);
    }
}

void fc_norm_part_merge(fc_norm_part *acc, const fc_norm_part *x) {
    uint64_t carry = 0;
    for (int k = 0; k < FC_NORM_LIMBS; k++) {
        uint64_t a = acc->limb[k], s = a + x->limb[k];
        uint64_t c1 = s < a;
        acc->limb[k] = s + carry;
        carry = c1 | (acc->limb[k] < s);
    }
    acc->max_bits = x->max_bits > acc->max_bits ? x->max_bits : acc->max_bits;
    acc->nonfinite |= x->nonfinite;
}

// The limbs' value rounded once to the nearest double (ties to even): the top
// 64 bits, with a sticky bit for any bit below them, converted by the FPU.
static double limbs_to_double(const uint64_t *limb) {
    int k = FC_NORM_LIMBS - 1;
    while (k > 0 && !limb[k]) k--;
    if (k == 0) return (double)limb[0];
    int lz = __builtin_clzll(limb[k]);  // limb[k] != 0 here
    uint64_t top = lz ? limb[k] << lz | limb[k - 1] >> (64 - lz) : limb[k];
    int sticky = (lz ? limb[k - 1] << lz : limb[k - 1]) != 0;
    for (int j = k - 2; j >= 0 && !sticky; j--) sticky = limb[j] != 0;
    // top's lowest bit lies 11 bits below a double's last: or-ing the sticky
    // bit into it cannot make a tie, nor hide one
    return ldexp((double)(top | (uint64_t)sticky), 64 * k - lz);
}

double fc_norm_part_total(const fc_norm_part *p, fc_norm_type type) {
    if (p->nonfinite & 2) return NAN;
    if (p->nonfinite & 1) return INFINITY;
    if (type == FC_NORM_INF) {
        union { uint32_t u; float f; } v = {p->max_bits};
        return v.f;
    }
    double sum = limbs_to_double(p->limb);
    return type == FC_NORM_2 ? sqrt(ldexp(sum, -298)) : ldexp(sum, -149);
}

double fc_grad_norm_combine(const fc_norm_part *parts, int G, fc_norm_type type) {
    fc_norm_part total;
    memset(&total, 0, sizeof total);
    for (int j = 0; j < G; j++) fc_norm_part_merge(&total, &parts[j]);
    return fc_norm_part_total(&total, type);
}

double fc_grad_norm(const float *g, size_t n, fc_norm_type type) {
    fc_norm_part p;
    memset(&p, 0, sizeof p);
    // Threads take chunks of buckets and their parts merge: the sums are exact integers, so
    // the split and the thread count change no bit.
    const size_t per = (size_t)FC_NORM_BUCKET_TERMS * 64, nchunk = (n + per - 1) / per;
#pragma omp parallel if (n >= 4 * per)
    {
        fc_norm_part mine;
        memset(&mine, 0, sizeof mine);
#pragma omp for schedule(static)
        for (size_t k = 0; k < nchunk; k++) {
            const size_t i = k * per;
            fc_norm_part_add(&mine, g + i, n - i < per ? n - i : per, type);
        }
#pragma omp critical(fc_grad_norm_merge)
        fc_norm_part_merge(&p, &mine);
    }
    return fc_norm_part_total(&p, type);
}

float fc_clip_coef(float max_norm, double total) { return (float)((double)max_norm / (total + 1e-6)); }

int fc_clip_applies(float max_norm, float coef) { return max_norm > 0 && coef < 1.0f; }
