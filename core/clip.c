// core/clip.c — see clip.h.
#include "clip.h"

#include <math.h>
#include <string.h>

void fc_norm_buckets_fill(uint64_t *bucket, const float *g, size_t n, fc_norm_type type) {
    memset(bucket, 0, FC_NORM_BUCKETS * sizeof *bucket);
    uint32_t max_bits = 0, flags = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned e;
        uint64_t term;
        uint32_t bits;
        if (!fc_norm_term(g[i], type, &e, &term, &bits, &flags)) continue;
        if (type == FC_NORM_INF)
            max_bits = bits > max_bits ? bits : max_bits;
        else
            bucket[e] += term;
    }
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
