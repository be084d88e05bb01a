// core/round.h — bf16/fp16 bit conversions and round-to-nearest-even, inline
// for every implementation: FC_HD makes them callable from CUDA device code
// too (nvcc compiles this header as CUDA C++, the C compilers as C11), so the
// reference's emulation and a port's real casts are one definition.
//
// The conversions work on bit patterns with integer arithmetic only, so the
// result does not depend on the FPU rounding mode, on flush-to-zero settings or
// on how the compiler contracts float expressions. Bits move between float and
// uint32_t with memcpy: the one type pun C11 and C++ both define.
#ifndef FC_ROUND_H
#define FC_ROUND_H

#include <stdint.h>
#include <string.h>

#include "hd.h"
#include "dtype.h"

FC_BEGIN_DECLS

static inline FC_HD uint32_t fc_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline FC_HD float fc_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline FC_HD uint16_t fc_f32_to_bf16(float x) {
    uint32_t u = fc_f32_bits(x);
    // NaN first: the rounding add below could carry a NaN whose payload lives
    // only in the low 16 bits (e.g. signaling 0x7F800001) into the Inf pattern,
    // or truncate it to Inf. Setting the quiet bit keeps it a NaN, with its sign.
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    // Round to nearest, ties to even, on the raw pattern. bf16 shares the f32
    // exponent, so the discarded 16 bits are the same fraction of an ulp for
    // normals and subnormals alike. Adding 0x7FFF rounds up anything above half;
    // adding the kept lsb as well makes an exact half round up only when the
    // kept part is odd. A carry out of the mantissa bumps the exponent, which is
    // exactly right, and from 0x7F7F8000 upwards it lands on Inf (0x7F80) as
    // IEEE overflow under round-to-nearest demands. Inf itself has a zero low
    // half and passes through unchanged. No overflow of u: the largest input
    // here is 0xFF800000.
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline FC_HD float fc_bf16_to_f32(uint16_t h) {
    // bf16 is the top half of an f32, so widening is a shift and always exact.
    return fc_f32_from_bits((uint32_t)h << 16);
}

// f32: 1 sign, 8 exponent (bias 127), 23 mantissa.
// f16: 1 sign, 5 exponent (bias 15), 10 mantissa; subnormal step 2^-24.
static inline FC_HD uint16_t fc_f32_to_f16(float x) {
    uint32_t u = fc_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;  // magnitude bits

    if (a > 0x7F800000u) {
        // NaN: keep the top payload bits that fit and force the quiet bit so a
        // payload living only in the dropped low bits cannot turn into Inf.
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
    }
    if (a >= 0x477FF000u) {
        // 65520 = 65504 + half an ulp (ulp 32 at the top binade) is the tie
        // between 65504 (odd mantissa 0x3FF) and 2^16; even wins, so 2^16, which
        // does not exist: Inf. Everything at or above it, Inf included, is Inf.
        return (uint16_t)(sign | 0x7C00u);
    }
    if (a >= 0x38800000u) {
        // Normal f16 range [2^-14, 65520): rebias the exponent (127 - 15 = 112)
        // then round away the low 13 mantissa bits with the same add-and-carry
        // trick as bf16. The threshold above guarantees the carry stops at
        // 0x7BFF at most.
        a -= 112u << 23;
        a += 0x0FFFu + ((a >> 13) & 1u);
        return (uint16_t)(sign | (a >> 13));
    }
    // Below 2^-14 the result is a multiple of 2^-24 (a subnormal or zero). With
    // biased exponent e and the implicit bit restored, the value is
    // m * 2^(e-150), i.e. m >> (126 - e) units of 2^-24. Any value below 2^-25
    // (e < 102, f32 subnormals included) is under half a unit: signed zero.
    // 2^-25 itself (e = 102, shift 24) is the exact tie and goes to 0 (even) in
    // the general path below.
    uint32_t e = a >> 23;
    if (e < 102u) return sign;
    uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
    uint32_t shift = 126u - e;  // 14..24
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    // q can reach 0x400 when rounding up from the largest subnormal; that is the
    // bit pattern of the smallest normal 2^-14, so no special case is needed.
    return (uint16_t)(sign | q);
}

static inline FC_HD float fc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x03FFu;
    uint32_t bits;
    if (e == 0x1Fu) {
        // Inf or NaN; the payload shifts into place, so the f16 quiet bit
        // (bit 9) becomes the f32 quiet bit (bit 22).
        bits = sign | 0x7F800000u | (m << 13);
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        bits = sign;  // signed zero
    } else {
        // f16 subnormal m * 2^-24 is an f32 normal: shift the leading one up to
        // the implicit position, lowering the exponent once per shift. Starting
        // at 113 (2^-14) makes m = 1 land on 113 - 10 = 103, i.e. 2^-24.
        uint32_t ef = 113u;
        while (!(m & 0x0400u)) {
            m <<= 1;
            ef--;
        }
        bits = sign | (ef << 23) | ((m & 0x03FFu) << 13);
    }
    return fc_f32_from_bits(bits);
}

static inline FC_HD float fc_round(fc_prec p, float x) {
    switch (p) {
    case FC_PREC_BF16: return fc_bf16_to_f32(fc_f32_to_bf16(x));
    case FC_PREC_FP16: return fc_f16_to_f32(fc_f32_to_f16(x));
    case FC_PREC_FP32:
    default: return x;  // fp32 is the storage type: nothing to round
    }
}

// Element i of a buffer stored in precision p, as fp32; and x rounded into it.
static inline FC_HD float fc_prec_load(fc_prec p, const void *b, size_t i) {
    if (p == FC_PREC_FP32) return ((const float *)b)[i];
    uint16_t h = ((const uint16_t *)b)[i];
    return p == FC_PREC_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
}
static inline FC_HD void fc_prec_store(fc_prec p, void *b, size_t i, float x) {
    if (p == FC_PREC_FP32)
        ((float *)b)[i] = x;
    else
        ((uint16_t *)b)[i] = p == FC_PREC_BF16 ? fc_f32_to_bf16(x) : fc_f32_to_f16(x);
}

FC_END_DECLS

#endif
