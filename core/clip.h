// core/clip.h — clip_grad_norm (docs/contract.md §4), written once.
//
// torch.nn.utils.clip_grad_norm_ over the global gradient: the total norm
// (type 1, 2 or inf) of every gradient element, then every gradient is scaled
// by max_norm / (total + 1e-6) when that is below 1. A sharded run computes
// the total from partial norms: each rank accumulates over the elements it
// owns (never padding), the partials are gathered and combined.
//
// Why exact: which elements a rank owns depends on the layout (FSDP1's flat
// chunks, FSDP2's per-parameter rows) and on W, and a floating-point sum
// depends on its order. So a partial is kept exactly, as a 640-bit integer in
// units of the smallest term (|g| of type 1 in units of 2^-149, g^2 of type 2
// in units of 2^-298: every fp32 |g| and g^2 is an integer there), and the
// total is rounded once, at the end. Every layout, strategy, W and thread
// split then gives the same bits, and so does a GPU summing in any order.
#ifndef FC_CLIP_H
#define FC_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

enum {
    FC_NORM_LIMBS = 10,           // 640 bits: 2^40 terms of at most 2^48 * 2^506 fit in 2^594
    FC_NORM_BUCKETS = 256,        // one per fp32 exponent field; [255] holds the flags and the max
    FC_NORM_BUCKET_TERMS = 65535  // terms one bucket array may take: 65535 * (2^24 - 1)^2 < 2^64
};

// One rank's partial norm, exact. Plain data: it travels as bytes.
typedef struct {
    uint64_t limb[FC_NORM_LIMBS];  // the exact sum, little-endian 64-bit limbs
    uint32_t max_bits;             // type inf: the largest finite |g|, as fp32 bits
    uint32_t nonfinite;            // bit 0: an inf was seen, bit 1: a NaN
} fc_norm_part;

// One element's place in a bucket array: its fp32 exponent field e, and the
// term it adds to bucket[e], m (type 1) or m^2 (type 2), m its 24-bit
// mantissa with the hidden bit; a subnormal counts as e = 1 without it (its
// value m * 2^-149 is then read as for e = 1). Returns 0 for an inf or a NaN
// (e = 255), whose flag it sets in *flags, and for the max's bits in *abs_bits.
static inline FC_HD int fc_norm_term(float x, fc_norm_type type, unsigned *e, uint64_t *term, uint32_t *abs_bits,
                                     uint32_t *flags) {
    union { float f; uint32_t u; } v;
    v.f = x;
    uint32_t b = v.u & 0x7fffffffu, E = b >> 23, M = b & 0x7fffffu;
    if (E == 255) {
        *flags |= M ? 2u : 1u;
        return 0;
    }
    uint64_t m = E ? (M | 0x800000u) : M;
    *e = E ? E : 1;
    *term = type == FC_NORM_2 ? m * m : m;
    *abs_bits = b;
    return 1;
}

// limb[] += v * 2^s, exactly; s <= 506, so v * 2^s fits in the limbs.
static inline FC_HD void fc_norm_add_shifted(uint64_t *limb, uint64_t v, unsigned s) {
    unsigned k = s / 64, r = s % 64;
    uint64_t lo = v << r, hi = r ? v >> (64 - r) : 0;  // hi < 2^63: adding a carry cannot wrap
    uint64_t old = limb[k];
    limb[k] = old + lo;
    uint64_t carry = limb[k] < old;
    for (unsigned j = k + 1; j < FC_NORM_LIMBS && (hi || carry); j++) {
        old = limb[j];
        limb[j] = old + hi + carry;
        carry = limb[j] < old;
        hi = 0;
    }
}

// Adds one bucket array (fc_norm_buckets_fill below) to a partial: the term
// of exponent field e is worth 2^(e-1) units of 2^-149 (type 1), or 2^(2e-2)
// units of 2^-298 (type 2).
static inline FC_HD void fc_norm_part_add_buckets(fc_norm_part *p, const uint64_t *bucket, fc_norm_type type) {
    uint64_t top = bucket[FC_NORM_BUCKETS - 1];
    uint32_t max_bits = (uint32_t)top;
    p->nonfinite |= (uint32_t)(top >> 32);
    p->max_bits = max_bits > p->max_bits ? max_bits : p->max_bits;
    if (type == FC_NORM_INF) return;
    for (unsigned e = 1; e < FC_NORM_BUCKETS - 1; e++)
        if (bucket[e]) fc_norm_add_shifted(p->limb, bucket[e], type == FC_NORM_2 ? 2 * e - 2 : e - 1);
}

// Adds n gradient elements to a partial (zero-initialise it first).
void fc_norm_part_add(fc_norm_part *p, const float *g, size_t n, fc_norm_type type);
// Fills bucket[FC_NORM_BUCKETS] from at most FC_NORM_BUCKET_TERMS elements:
// bucket[e] (e < 255) is the sum, over the elements whose fp32 exponent field
// is e, of their mantissa m with its hidden bit (type 1) or of m^2 (type 2);
// bucket[255] is (nonfinite flags << 32) | the max finite |g| bits. A kernel
// may fill one in any order with integer atomics: the sums cannot depend on it.
void fc_norm_buckets_fill(uint64_t *bucket, const float *g, size_t n, fc_norm_type type);
// acc += x, exactly.
void fc_norm_part_merge(fc_norm_part *acc, const fc_norm_part *x);
// The total of a partial: the exact sum rounded once to double (its square
// root for type 2), or the max; inf if an inf was seen, NaN if a NaN was.
double fc_norm_part_total(const fc_norm_part *p, fc_norm_type type);
// Combines G partials (exactly, so their order cannot matter) into the total.
double fc_grad_norm_combine(const fc_norm_part *parts, int G, fc_norm_type type);
// The total norm of one whole gradient buffer.
double fc_grad_norm(const float *g, size_t n, fc_norm_type type);
// The clip coefficient max_norm / (total + 1e-6) in fp32, as torch computes
// it; the gradient is scaled only when it is below 1 (torch clamps it to 1).
float fc_clip_coef(float max_norm, double total);
int fc_clip_applies(float max_norm, float coef);

FC_END_DECLS

#endif
