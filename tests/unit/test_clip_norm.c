// tests/unit/test_clip_norm.c — the exact partial norm of core/clip.h.
//
// Inputs are crafted so that the exact total is a double we can write down
// (nccl-tests style): powers of two, integers, and sums whose every step is
// exact in double. Then order independence, the one final rounding (with its
// sticky bit), the bucket flush past FC_NORM_BUCKET_TERMS terms, subnormals,
// the largest fp32 and the non-finite flags.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"

static double norm_of(const float *g, size_t n, fc_norm_type t) { return fc_grad_norm(g, n, t); }

static uint64_t bits_of(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

Test(clip_norm, by_hand) {
    const float g[5] = {3.0f, -4.0f, 0.0f, 0.5f, -0.25f};
    cr_expect_eq(norm_of(g, 5, FC_NORM_1), 7.75);
    cr_expect_eq(norm_of(g, 5, FC_NORM_2), sqrt(25.3125));
    cr_expect_eq(norm_of(g, 5, FC_NORM_INF), 4.0);
    cr_expect_eq(norm_of(g, 2, FC_NORM_2), 5.0);
    cr_expect_eq(norm_of(g, 0, FC_NORM_2), 0.0);
    const float neg[2] = {-7.0f, 2.0f};
    cr_expect_eq(norm_of(neg, 2, FC_NORM_INF), 7.0, "inf norm takes |g|");
}

// The smallest subnormal and the largest finite fp32: both ends of the limbs.
Test(clip_norm, extremes) {
    float tiny = ldexpf(1.0f, -149), big = 0x1.fffffep127f;
    cr_expect_eq(norm_of(&tiny, 1, FC_NORM_1), ldexp(1, -149));
    cr_expect_eq(norm_of(&tiny, 1, FC_NORM_2), ldexp(1, -149));
    cr_expect_eq(norm_of(&big, 1, FC_NORM_1), (double)big);
    cr_expect_eq(norm_of(&big, 1, FC_NORM_2), (double)big, "sqrt(big^2) is big: big^2 is exact in the limbs");
    float sub[3] = {ldexpf(3.0f, -140), ldexpf(1.0f, -126), ldexpf(-5.0f, -149)};  // subnormal, normal, subnormal
    cr_expect_eq(norm_of(sub, 3, FC_NORM_1), ldexp(3, -140) + ldexp(1, -126) + ldexp(5, -149));
    float two[2] = {big, -big};  // 2 big^2 overflows fp32 but not the limbs
    cr_expect_eq(norm_of(two, 2, FC_NORM_2), sqrt(2.0 * (double)big * (double)big));
}

// One rounding at the end, to nearest, ties to even, with a sticky bit: 1 +
// 2^-53 is a tie and rounds down to 1; any bit below it breaks the tie.
Test(clip_norm, rounds_once_with_sticky_bit) {
    float tie[2] = {1.0f, ldexpf(1.0f, -53)};
    cr_expect_eq(norm_of(tie, 2, FC_NORM_1), 1.0);
    float above[3] = {1.0f, ldexpf(1.0f, -53), ldexpf(1.0f, -140)};
    cr_expect_eq(norm_of(above, 3, FC_NORM_1), 1.0 + ldexp(1, -52));
    float odd[3] = {1.0f, ldexpf(1.0f, -52), ldexpf(1.0f, -53)};  // a tie above an odd last bit: rounds up
    cr_expect_eq(norm_of(odd, 3, FC_NORM_1), 1.0 + ldexp(1, -51));
    // small terms after a large one are kept: in double, 1 + 2^-53 + 2^-53
    // added left to right is 1; exactly it is 1 + 2^-52
    float late[3] = {1.0f, ldexpf(1.0f, -53), ldexpf(1.0f, -53)};
    cr_expect_eq(norm_of(late, 3, FC_NORM_1), 1.0 + ldexp(1, -52));
}

// More terms than one bucket array takes: n (2^24 - 1)^2 with n = 3 * 2^16
// is 3 * 2^64 - 3 * 2^41 + 3 * 2^16, exact in double step by step.
Test(clip_norm, bucket_flush) {
    size_t n = 3 * 65536;
    float *g = malloc(n * sizeof *g);
    cr_assert(g);
    for (size_t i = 0; i < n; i++) g[i] = 16777215.0f;
    double want2 = ldexp(3, 64) - ldexp(3, 41) + ldexp(3, 16);
    cr_expect_eq(norm_of(g, n, FC_NORM_2), sqrt(want2));
    cr_expect_eq(norm_of(g, n, FC_NORM_1), (double)n * 16777215.0);
    free(g);
}

// Split into pieces and dealt to partials any way, the combined partials are
// the same bits, and the same as one pass.
Test(clip_norm, order_independent) {
    enum { N = 20000 };
    float *g = malloc(N * sizeof *g);
    cr_assert(g);
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        // exponents over a wide range, both signs, some subnormals
        g[i] = ldexpf((float)(s >> 8) / 16777216.0f, (int)(s % 200) - 170) * (s & 1 ? -1.0f : 1.0f);
    }
    for (int t = 0; t < 3; t++) {
        fc_norm_type type = (fc_norm_type)t;
        double whole = norm_of(g, N, type);
        int splits[] = {1, 2, 3, 7, 64};
        for (int k = 0; k < 5; k++) {
            int G = splits[k];
            fc_norm_part parts[64];
            memset(parts, 0, sizeof parts);
            // piece j (taken in reverse) goes to partial (j * 5) % G
            size_t piece = N / 97 + 1;
            for (size_t j = (N + piece - 1) / piece; j-- > 0;) {
                size_t a = j * piece, c = N - a < piece ? N - a : piece;
                fc_norm_part_add(&parts[(j * 5) % (size_t)G], g + a, c, type);
            }
            double got = fc_grad_norm_combine(parts, G, type);
            cr_expect_eq(bits_of(got), bits_of(whole), "type %d, %d partials: %a != %a", t, G, got, whole);
        }
    }
    free(g);
}

Test(clip_norm, non_finite) {
    float g[3] = {1.0f, INFINITY, 2.0f};
    for (int t = 0; t < 3; t++) cr_expect(isinf(norm_of(g, 3, (fc_norm_type)t)));
    g[1] = NAN;
    for (int t = 0; t < 3; t++) cr_expect(isnan(norm_of(g, 3, (fc_norm_type)t)));
    fc_norm_part a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    fc_norm_part_add(&a, g, 1, FC_NORM_2);
    fc_norm_part_add(&b, g + 1, 1, FC_NORM_2);
    fc_norm_part_merge(&a, &b);
    cr_expect(isnan(fc_norm_part_total(&a, FC_NORM_2)), "a NaN in one partial reaches the total");
}

// One bucket array's worth (FC_NORM_BUCKET_TERMS, not a multiple of 16: a scalar tail), filled
// by whatever kernel this CPU picks (core/simd.h), against the sums written out here element
// by element: exponents over the whole range, subnormals, zeros, and an inf and a NaN inside
// one 16-element block.
static void buckets_match_by_hand(void) {
    enum { N = FC_NORM_BUCKET_TERMS };
    static float g[N];
    uint32_t s = 777;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        g[i] = i % 97 == 0 ? 0.0f : ldexpf((float)(s >> 8) / 16777216.0f, (int)(s % 300) - 170) * (s & 1 ? -1.0f : 1.0f);
    }
    for (int t = 0; t < 3; t++) {
        for (int with_nonfinite = 0; with_nonfinite < 2; with_nonfinite++) {
            if (with_nonfinite) g[40000] = INFINITY, g[40003] = NAN;
            uint64_t want[FC_NORM_BUCKETS] = {0}, got[FC_NORM_BUCKETS];
            uint32_t max = 0, flags = 0;
            for (int i = 0; i < N; i++) {
                uint32_t b;
                memcpy(&b, &g[i], sizeof b);
                b &= 0x7fffffffu;
                uint32_t E = b >> 23, M = b & 0x7fffffu;
                if (E == 255) {
                    flags |= M ? 2u : 1u;
                    continue;
                }
                uint64_t m = E ? (M | 0x800000u) : M;
                if (t == FC_NORM_INF)
                    max = b > max ? b : max;
                else
                    want[E ? E : 1] += t == FC_NORM_2 ? m * m : m;
            }
            want[FC_NORM_BUCKETS - 1] = (uint64_t)flags << 32 | max;
            fc_norm_buckets_fill(got, g, N, (fc_norm_type)t);
            int bad = 0;
            for (int e = 0; e < FC_NORM_BUCKETS && bad < 5; e++) {
                if (got[e] != want[e]) {
                    bad++;
                    cr_expect_fail("type %d (nonfinite %d): bucket %d is %llu, by hand %llu", t, with_nonfinite, e,
                                   (unsigned long long)got[e], (unsigned long long)want[e]);
                }
            }
        }
        g[40000] = 1.0f, g[40003] = 1.0f;
    }
}

Test(clip_norm, buckets_by_hand_widest_kernel) { buckets_match_by_hand(); }

Test(clip_norm, buckets_by_hand_generic) {
    setenv("FSDPCHECK_MM_GENERIC", "1", 1);  // a fresh process: the first call reads it
    buckets_match_by_hand();
}
