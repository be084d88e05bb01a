// tests/unit/test_dtype.c — element types and bf16/fp16 round-to-nearest-even.
//
// The expected bit patterns below are crafted so that the right answer is exact
// and known by construction (ties, half-ulp +-1 bit, carries, thresholds), in the
// style of nccl-tests: a wrong rounding mode cannot hide behind a tolerance.
// They are what torch's `torch.tensor(x, dtype=torch.float32).to(torch.bfloat16)`
// / `.to(torch.float16)` produce, i.e. IEEE-754 roundTiesToEven. The sampled
// sweeps compare against an independent reference written here with double
// arithmetic (enumerate the neighbouring 16-bit values, pick the nearest, even
// on a tie), so they share no code or trick with core/dtype.c.
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"

static float f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

typedef struct {
    uint32_t in;   // f32 bit pattern
    uint16_t out;  // expected 16-bit pattern
    const char *why;
} case16;

static void check_cases(const case16 *c, size_t n, uint16_t (*conv)(float), const char *fmt) {
    for (size_t i = 0; i < n; i++) {
        uint16_t got = conv(f32(c[i].in));
        cr_expect_eq(got, c[i].out, "%s: f32 0x%08X -> 0x%04X, want 0x%04X (%s)", fmt,
                     (unsigned)c[i].in, (unsigned)got, (unsigned)c[i].out, c[i].why);
    }
}

// ----------------------------------------------------------------------------
// bf16: exact cases

Test(bf16, round_to_nearest_even) {
    static const case16 c[] = {
        {0x3F800000, 0x3F80, "1.0 exact"},
        {0x3F808000, 0x3F80, "tie, kept lsb even: stays"},
        {0x3F818000, 0x3F82, "tie, kept lsb odd: rounds up to even"},
        {0x3F807FFF, 0x3F80, "just below half: down"},
        {0x3F808001, 0x3F81, "just above half: up"},
        {0x3F817FFF, 0x3F81, "just below half, odd: down"},
        {0x3F818001, 0x3F82, "just above half, odd: up"},
        {0x3F80FFFF, 0x3F81, "almost a full ulp: up"},
        {0x3F800001, 0x3F80, "one f32 ulp above: down"},
        {0x3FFF8000, 0x4000, "tie carries into exponent"},
        {0x3FFF7FFF, 0x3FFF, "below tie, no carry"},
        {0xBF808000, 0xBF80, "negative tie, even stays"},
        {0xBF818000, 0xBF82, "negative tie, up in magnitude"},
        {0xC0490FDB, 0xC049, "-pi"},
        {0x40490FDB, 0x4049, "pi: 0x0FDB < half"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_bf16, "bf16");
}

Test(bf16, overflow_inf_zero) {
    static const case16 c[] = {
        {0x7F7F0000, 0x7F7F, "max finite bf16 exact"},
        {0x7F7F7FFF, 0x7F7F, "just below the overflow tie"},
        {0x7F7F8000, 0x7F80, "overflow tie: odd max rounds to even = Inf"},
        {0x7F7FFFFF, 0x7F80, "FLT_MAX -> Inf"},
        {0xFF7F8000, 0xFF80, "negative overflow -> -Inf"},
        {0xFF7F7FFF, 0xFF7F, "negative just below overflow"},
        {0x7F7E8000, 0x7F7E, "tie near the top, even: no overflow"},
        {0x7F800000, 0x7F80, "+Inf"},
        {0xFF800000, 0xFF80, "-Inf"},
        {0x00000000, 0x0000, "+0"},
        {0x80000000, 0x8000, "-0"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_bf16, "bf16");
}

// bf16 has the f32 exponent range, so f32 subnormals round like any other bit
// pattern: the low 16 bits are dropped with round-to-nearest-even.
Test(bf16, subnormals) {
    static const case16 c[] = {
        {0x00000001, 0x0000, "smallest f32 subnormal -> +0"},
        {0x80000001, 0x8000, "-smallest subnormal -> -0"},
        {0x00007FFF, 0x0000, "below half of the bf16 subnormal step"},
        {0x00008000, 0x0000, "tie to even 0"},
        {0x00008001, 0x0001, "above half: smallest bf16 subnormal"},
        {0x00010000, 0x0001, "smallest bf16 subnormal exact"},
        {0x00018000, 0x0002, "tie, odd: up to even"},
        {0x00028000, 0x0002, "tie, even: stays"},
        {0x007F0000, 0x007F, "largest bf16 subnormal exact"},
        {0x007F8000, 0x0080, "tie carries into the smallest normal"},
        {0x007FFFFF, 0x0080, "largest f32 subnormal -> smallest normal"},
        {0x807FFFFF, 0x8080, "negative, carries into normal"},
        {0x00800000, 0x0080, "smallest normal exact"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_bf16, "bf16");
}

static int is_bf16_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0; }
static int is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }

Test(bf16, nan) {
    cr_expect_eq(fc_f32_to_bf16(f32(0x7FC00000)), 0x7FC0, "canonical qNaN");
    cr_expect_eq(fc_f32_to_bf16(f32(0xFFC00000)), 0xFFC0, "negative qNaN keeps its sign");
    // Payloads that live only in the dropped bits, and payloads whose rounding
    // add would carry: none may come out as Inf, zero or the other sign.
    static const uint32_t nans[] = {0x7F800001, 0x7F808000, 0x7F80FFFF, 0x7FFFFFFF, 0x7FBFFFFF,
                                    0xFF800001, 0xFF808000, 0xFFFFFFFF, 0x7FC00001, 0xFFBFFFFF};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = fc_f32_to_bf16(f32(nans[i]));
        cr_expect(is_bf16_nan(h), "0x%08X -> 0x%04X is not a NaN", (unsigned)nans[i], (unsigned)h);
        cr_expect(h & 0x0040, "0x%08X -> 0x%04X is not quiet", (unsigned)nans[i], (unsigned)h);
        cr_expect_eq(h & 0x8000, (nans[i] >> 16) & 0x8000, "0x%08X -> 0x%04X lost its sign",
                     (unsigned)nans[i], (unsigned)h);
    }
    cr_expect(isnan(fc_bf16_to_f32(0x7FC0)));
    cr_expect(isnan(fc_bf16_to_f32(0xFF81)));
    cr_expect(isnan(fc_round(FC_PREC_BF16, f32(0x7F800001))));
}

// ----------------------------------------------------------------------------
// fp16: exact cases

Test(f16, round_to_nearest_even) {
    static const case16 c[] = {
        {0x3F800000, 0x3C00, "1.0"},
        {0xBFC00000, 0xBE00, "-1.5"},
        {0x3F801000, 0x3C00, "1 + 2^-11: tie, even stays"},
        {0x3F803000, 0x3C02, "1 + 3*2^-11: tie, odd rounds up"},
        {0x3F800FFF, 0x3C00, "just below half"},
        {0x3F801001, 0x3C01, "just above half"},
        {0x3F802FFF, 0x3C01, "just below half, odd"},
        {0x3F803001, 0x3C02, "just above half, odd"},
        {0xBF801000, 0xBC00, "negative tie, even stays"},
        {0xBF803000, 0xBC02, "negative tie, up in magnitude"},
        {0x3FFFF000, 0x4000, "2 - 2^-12: tie carries into exponent"},
        {0x3FFFEFFF, 0x3FFF, "below the tie: no carry"},
        {0x40490FDB, 0x4248, "pi"},
        {0x47000000, 0x7800, "32768"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_f16, "f16");
}

Test(f16, overflow_inf_zero) {
    static const case16 c[] = {
        {0x477FE000, 0x7BFF, "65504, max finite"},
        {0x477FEF00, 0x7BFF, "65519"},
        {0x477FEFFF, 0x7BFF, "65519.996, last f32 below the tie"},
        {0x477FF000, 0x7C00, "65520: tie, odd max rounds to even = Inf"},
        {0x477FF001, 0x7C00, "just above 65520"},
        {0x47800000, 0x7C00, "65536"},
        {0x501502F9, 0x7C00, "1e10"},
        {0x7F7FFFFF, 0x7C00, "FLT_MAX"},
        {0xC77FE000, 0xFBFF, "-65504"},
        {0xC77FEFFF, 0xFBFF, "-65519.996"},
        {0xC77FF000, 0xFC00, "-65520 -> -Inf"},
        {0x7F800000, 0x7C00, "+Inf"},
        {0xFF800000, 0xFC00, "-Inf"},
        {0x00000000, 0x0000, "+0"},
        {0x80000000, 0x8000, "-0"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_f16, "f16");
}

Test(f16, subnormals) {
    static const case16 c[] = {
        {0x33800000, 0x0001, "2^-24, smallest subnormal"},
        {0x33000000, 0x0000, "2^-25: tie, rounds to even 0"},
        {0xB3000000, 0x8000, "-2^-25: tie to -0"},
        {0x33000001, 0x0001, "just above 2^-25"},
        {0x32FFFFFF, 0x0000, "just below 2^-25"},
        {0x32800000, 0x0000, "2^-26"},
        {0x33C00000, 0x0002, "3*2^-25: tie, rounds up to even 2^-23"},
        {0x34200000, 0x0002, "5*2^-25: tie, even 2*2^-24 stays"},
        {0x34000000, 0x0002, "2^-23"},
        {0xB3800000, 0x8001, "-2^-24"},
        {0xB3C00000, 0x8002, "-3*2^-25"},
        {0x387FC000, 0x03FF, "largest subnormal 1023*2^-24"},
        {0x387FD000, 0x03FF, "1023.25*2^-24: down"},
        {0x387FE000, 0x0400, "1023.5*2^-24: tie, rounds to even = smallest normal"},
        {0x387FF000, 0x0400, "1023.75*2^-24: up across the boundary"},
        {0x387FFFFF, 0x0400, "last f32 below 2^-14"},
        {0x387FDFFF, 0x03FF, "just below the boundary tie"},
        {0x387FE001, 0x0400, "just above the boundary tie"},
        {0x387FA000, 0x03FE, "1022.5*2^-24: tie, even stays"},
        {0x38800000, 0x0400, "2^-14, smallest normal"},
        {0x38801000, 0x0400, "2^-14 + half ulp: tie, even stays"},
        {0xB87FE000, 0x8400, "negative boundary tie"},
        {0x00000001, 0x0000, "f32 subnormal -> +0"},
        {0x80000001, 0x8000, "negative f32 subnormal -> -0"},
        {0x007FFFFF, 0x0000, "largest f32 subnormal -> +0"},
        {0x00800000, 0x0000, "smallest f32 normal -> +0"},
        {0x80800000, 0x8000, "-smallest f32 normal -> -0"},
    };
    check_cases(c, sizeof c / sizeof c[0], fc_f32_to_f16, "f16");
}

Test(f16, literals) {
    // The same thresholds written as values, guarding the bit patterns above.
    cr_expect_eq(fc_f32_to_f16(1.0f), 0x3C00);
    cr_expect_eq(fc_f32_to_f16(65504.0f), 0x7BFF);
    cr_expect_eq(fc_f32_to_f16(65519.0f), 0x7BFF);
    cr_expect_eq(fc_f32_to_f16(65519.99f), 0x7BFF);
    cr_expect_eq(fc_f32_to_f16(65520.0f), 0x7C00);
    cr_expect_eq(fc_f32_to_f16(-65520.0f), 0xFC00);
    cr_expect_eq(fc_f32_to_f16(0x1p-24f), 0x0001);
    cr_expect_eq(fc_f32_to_f16(0x1p-25f), 0x0000);
    cr_expect_eq(fc_f32_to_f16(0x1.000002p-25f), 0x0001);
    cr_expect_eq(fc_f32_to_f16(0x1.8p-24f), 0x0002);  // 3*2^-25
    cr_expect_eq(fc_f32_to_f16(0x1.ff8p-15f), 0x03FF); // 1023*2^-24
    cr_expect_eq(fc_f32_to_f16(0x1p-14f), 0x0400);
    cr_expect_eq(fc_f16_to_f32(0x7BFF), 65504.0f);
    cr_expect_eq(fc_f16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(fc_f16_to_f32(0x03FF), 0x1.ff8p-15f);
    cr_expect_eq(fc_bf16_to_f32(0x3F82), 1.015625f);
    cr_expect_eq(fc_round(FC_PREC_FP16, 65519.0f), 65504.0f);
    cr_expect(isinf(fc_round(FC_PREC_FP16, 65520.0f)));
    cr_expect_eq(fc_round(FC_PREC_BF16, 1.00390625f), 1.0f); // 1 + 2^-8: tie to even
}

Test(f16, nan) {
    cr_expect_eq(fc_f32_to_f16(f32(0x7FC00000)), 0x7E00, "canonical qNaN");
    cr_expect_eq(fc_f32_to_f16(f32(0xFFC00000)), 0xFE00, "negative qNaN keeps its sign");
    static const uint32_t nans[] = {0x7F800001, 0x7F801000, 0x7F800FFF, 0x7FFFFFFF, 0x7FBFFFFF,
                                    0xFF800001, 0xFF801FFF, 0xFFFFFFFF, 0x7FC00001, 0xFFBFFFFF};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = fc_f32_to_f16(f32(nans[i]));
        cr_expect(is_f16_nan(h), "0x%08X -> 0x%04X is not a NaN", (unsigned)nans[i], (unsigned)h);
        cr_expect(h & 0x0200, "0x%08X -> 0x%04X is not quiet", (unsigned)nans[i], (unsigned)h);
        cr_expect_eq(h & 0x8000, (nans[i] >> 16) & 0x8000, "0x%08X -> 0x%04X lost its sign",
                     (unsigned)nans[i], (unsigned)h);
    }
    cr_expect(isnan(fc_f16_to_f32(0x7E00)));
    cr_expect(isnan(fc_f16_to_f32(0x7C01)));  // signaling f16 NaN widens to a NaN
    cr_expect(signbit(fc_f16_to_f32(0xFE00)));
    cr_expect(isnan(fc_round(FC_PREC_FP16, f32(0x7F800001))));
}

// ----------------------------------------------------------------------------
// Independent reference: the value of every non-negative 16-bit pattern up to
// and including the Inf pattern, computed from the field definitions with
// ldexp. The Inf pattern gets the value the next binade would start at (2^16,
// 2^128); its mantissa is even, which is what makes the overflow ties go to
// Inf under round-to-nearest-even.

#define F16_TOP 0x7C00u
#define BF16_TOP 0x7F80u

static double ref_f16_value(uint32_t p) {
    int e = (int)(p >> 10), m = (int)(p & 0x3FF);
    return e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);  // (1 + m/2^10) 2^(e-15)
}

static double ref_bf16_value(uint32_t p) {
    int e = (int)(p >> 7), m = (int)(p & 0x7F);
    return e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);  // (1 + m/2^7) 2^(e-127)
}

typedef struct {
    double v[0x7F81];
    uint32_t top;
} ref_table;

static void ref_init(ref_table *t, uint32_t top, double (*value)(uint32_t)) {
    t->top = top;
    for (uint32_t p = 0; p <= top; p++) t->v[p] = value(p);
}

// Nearest 16-bit pattern to finite-or-Inf x, ties to the even pattern.
static uint16_t ref_round(const ref_table *t, float x) {
    double a = fabs((double)x);  // exact
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint32_t p;
    if (a >= t->v[t->top]) {
        p = t->top;
    } else {
        uint32_t lo = 0, hi = t->top;  // invariant v[lo] <= a < v[hi]
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (t->v[mid] <= a) lo = mid;
            else hi = mid;
        }
        double dlo = a - t->v[lo], dhi = t->v[hi] - a;  // both exact in double
        if (dlo < dhi) p = lo;
        else if (dhi < dlo) p = hi;
        else p = (lo & 1) ? hi : lo;
    }
    return (uint16_t)(sign | p);
}

// Checks one f32 pattern against the reference; returns 1 on mismatch.
static int ref_check(const ref_table *t, uint16_t (*conv)(float), uint32_t in, int is_f16,
                     int *reported) {
    float x = f32(in);
    uint16_t got = conv(x);
    int bad;
    if (isnan(x)) {
        uint16_t quiet = is_f16 ? 0x0200 : 0x0040;
        int nan = is_f16 ? is_f16_nan(got) : is_bf16_nan(got);
        bad = !nan || !(got & quiet) || (got & 0x8000) != ((in >> 16) & 0x8000);
        if (bad && *reported < 10) {
            (*reported)++;
            cr_log_error("%s: NaN 0x%08X -> 0x%04X", is_f16 ? "f16" : "bf16", (unsigned)in,
                         (unsigned)got);
        }
        return bad;
    }
    uint16_t want = ref_round(t, x);
    bad = got != want;
    if (bad && *reported < 10) {
        (*reported)++;
        cr_log_error("%s: 0x%08X (%a) -> 0x%04X, reference 0x%04X", is_f16 ? "f16" : "bf16",
                     (unsigned)in, (double)x, (unsigned)got, (unsigned)want);
    }
    return bad;
}

// Patterns aimed at every possible rounding position: for each sign, exponent
// and bit k, mantissas whose low k+1 bits are just below, at and just above
// half of 2^(k+1), under several upper parts (even and odd at the kept lsb).
static size_t sweep_targeted(const ref_table *t, uint16_t (*conv)(float), int is_f16,
                             int *reported) {
    static const uint32_t uppers[] = {0x000000, 0x000001, 0x000002, 0x000003, 0x2AAAAA,
                                      0x555555, 0x7FFFFF, 0x7FFFFE, 0x3C5A96};
    size_t bad = 0;
    for (uint32_t se = 0; se < 512; se++) {
        for (uint32_t k = 0; k < 23; k++) {
            uint32_t half = 1u << k;
            uint32_t lows[] = {half - 1, half, half + 1, 0, (half << 1) - 1};
            for (size_t i = 0; i < sizeof uppers / sizeof uppers[0]; i++) {
                for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++) {
                    uint32_t m = ((uppers[i] << (k + 1)) | lows[j]) & 0x7FFFFFu;
                    bad += (size_t)ref_check(t, conv, (se << 23) | m, is_f16, reported);
                }
            }
        }
    }
    return bad;
}

// 2^24 patterns spread over the whole 32-bit space: i * odd constant is a
// bijection mod 2^32, so the samples are distinct and hit every exponent with
// varied low bits (a plain power-of-two stride would leave the low bits zero).
static size_t sweep_spread(const ref_table *t, uint16_t (*conv)(float), int is_f16,
                           int *reported) {
    size_t bad = 0;
    for (uint32_t i = 0; i < (1u << 24); i++)
        bad += (size_t)ref_check(t, conv, i * 0x9E3779B1u, is_f16, reported);
    return bad;
}

// Every f32 in the exponent window where f16 rounding changes shape (below
// 2^-25 up to the subnormal/normal boundary and the overflow threshold) is
// denser than the spread sweep, so walk a few binades at a small odd stride.
static size_t sweep_window(const ref_table *t, uint16_t (*conv)(float), int is_f16,
                           uint32_t e_lo, uint32_t e_hi, int *reported) {
    size_t bad = 0;
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = e_lo; e <= e_hi; e++)
            for (uint32_t m = 0; m < 0x800000u; m += 61)
                bad += (size_t)ref_check(t, conv, (s << 31) | (e << 23) | m, is_f16, reported);
    return bad;
}

static ref_table g_ref;  // ~260 KB: too big for the stack under ASan

Test(f16, reference_sweep, .timeout = 600) {
    ref_init(&g_ref, F16_TOP, ref_f16_value);
    int reported = 0;
    size_t bad = sweep_targeted(&g_ref, fc_f32_to_f16, 1, &reported);
    bad += sweep_spread(&g_ref, fc_f32_to_f16, 1, &reported);
    // 2^-26 .. 2^-13 covers zero/tie, all subnormal shifts and the boundary;
    // 2^15 covers the overflow threshold.
    bad += sweep_window(&g_ref, fc_f32_to_f16, 1, 101, 114, &reported);
    bad += sweep_window(&g_ref, fc_f32_to_f16, 1, 142, 143, &reported);
    cr_assert_eq(bad, 0, "%zu f32 patterns disagree with the f16 reference", bad);
}

Test(bf16, reference_sweep, .timeout = 600) {
    ref_init(&g_ref, BF16_TOP, ref_bf16_value);
    int reported = 0;
    size_t bad = sweep_targeted(&g_ref, fc_f32_to_bf16, 0, &reported);
    bad += sweep_spread(&g_ref, fc_f32_to_bf16, 0, &reported);
    // f32 subnormals, the first normal binade and the overflow binade.
    bad += sweep_window(&g_ref, fc_f32_to_bf16, 0, 0, 1, &reported);
    bad += sweep_window(&g_ref, fc_f32_to_bf16, 0, 254, 254, &reported);
    cr_assert_eq(bad, 0, "%zu f32 patterns disagree with the bf16 reference", bad);
}

Test(reference, self_check) {
    // The reference itself must agree with the hand-made cases, or the sweeps
    // prove nothing.
    ref_init(&g_ref, F16_TOP, ref_f16_value);
    cr_expect_eq(ref_round(&g_ref, 65519.0f), 0x7BFF);
    cr_expect_eq(ref_round(&g_ref, 65520.0f), 0x7C00);
    cr_expect_eq(ref_round(&g_ref, 0x1p-25f), 0x0000);
    cr_expect_eq(ref_round(&g_ref, 0x1.8p-24f), 0x0002);
    cr_expect_eq(ref_round(&g_ref, f32(0x387FE000)), 0x0400);
    cr_expect_eq(ref_round(&g_ref, -1.5f), 0xBE00);
    ref_init(&g_ref, BF16_TOP, ref_bf16_value);
    cr_expect_eq(ref_round(&g_ref, f32(0x3F808000)), 0x3F80);
    cr_expect_eq(ref_round(&g_ref, f32(0x3F818000)), 0x3F82);
    cr_expect_eq(ref_round(&g_ref, f32(0x7F7F8000)), 0x7F80);
    cr_expect_eq(ref_round(&g_ref, f32(0x00018000)), 0x0002);
    cr_expect_eq(ref_round(&g_ref, f32(0x807FFFFF)), 0x8080);
}

// ----------------------------------------------------------------------------
// 16 -> 32: exact for all 65536 patterns

Test(f16, to_f32_all_patterns) {
    size_t bad = 0;
    for (uint32_t p = 0; p < 0x10000u; p++) {
        uint16_t h = (uint16_t)p;
        float x = fc_f16_to_f32(h);
        uint32_t mag = p & 0x7FFF;
        if (mag > F16_TOP) {  // NaN
            if (!isnan(x) || !signbit(x) != !(p & 0x8000)) {
                bad++;
                cr_log_error("f16 NaN 0x%04X -> 0x%08X", (unsigned)p, (unsigned)bits(x));
            }
            uint16_t back = fc_f32_to_f16(x);
            if (!is_f16_nan(back)) bad++;
            continue;
        }
        // exact value from the field definition; Inf pattern means Inf here
        double want = mag == F16_TOP ? INFINITY : ref_f16_value(mag);
        if (p & 0x8000) want = -want;
        if ((double)x != want || !signbit(x) != !(p & 0x8000)) {
            bad++;
            cr_log_error("f16 0x%04X -> %a, want %a", (unsigned)p, (double)x, want);
        }
        uint16_t back = fc_f32_to_f16(x);
        if (back != h) {
            bad++;
            cr_log_error("f16 0x%04X round trip -> 0x%04X", (unsigned)p, (unsigned)back);
        }
    }
    cr_assert_eq(bad, 0, "%zu f16 patterns wrong", bad);
}

Test(bf16, to_f32_all_patterns) {
    size_t bad = 0;
    for (uint32_t p = 0; p < 0x10000u; p++) {
        uint16_t h = (uint16_t)p;
        float x = fc_bf16_to_f32(h);
        uint32_t mag = p & 0x7FFF;
        if (mag > BF16_TOP) {
            if (!isnan(x) || !signbit(x) != !(p & 0x8000)) {
                bad++;
                cr_log_error("bf16 NaN 0x%04X -> 0x%08X", (unsigned)p, (unsigned)bits(x));
            }
            uint16_t back = fc_f32_to_bf16(x);
            if (!is_bf16_nan(back)) bad++;
            continue;
        }
        double want = mag == BF16_TOP ? INFINITY : ref_bf16_value(mag);
        if (p & 0x8000) want = -want;
        if ((double)x != want || !signbit(x) != !(p & 0x8000)) {
            bad++;
            cr_log_error("bf16 0x%04X -> %a, want %a", (unsigned)p, (double)x, want);
        }
        uint16_t back = fc_f32_to_bf16(x);
        if (back != h) {
            bad++;
            cr_log_error("bf16 0x%04X round trip -> 0x%04X", (unsigned)p, (unsigned)back);
        }
    }
    cr_assert_eq(bad, 0, "%zu bf16 patterns wrong", bad);
}

// ----------------------------------------------------------------------------
// fc_round / fc_round_buffer

Test(round, fp32_identity) {
    static const uint32_t in[] = {0x3F800001, 0x00000001, 0x80000000, 0x7F800001,
                                  0xFFC12345, 0x7F7FFFFF, 0x477FF000};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        cr_expect_eq(bits(fc_round(FC_PREC_FP32, f32(in[i]))), in[i], "0x%08X changed",
                     (unsigned)in[i]);
}

Test(round, buffer) {
    static const uint32_t in[] = {0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000,
                                  0x477FF000, 0x33000001, 0x80000001, 0x7F7F8000};
    enum { N = sizeof in / sizeof in[0] };
    float x[N], y[N], z[N];
    for (int i = 0; i < N; i++) x[i] = y[i] = z[i] = f32(in[i]);

    fc_round_buffer(FC_PREC_BF16, x, N);
    fc_round_buffer(FC_PREC_FP16, y, N);
    fc_round_buffer(FC_PREC_FP32, z, N);
    for (int i = 0; i < N; i++) {
        cr_expect_eq(bits(x[i]), (uint32_t)fc_f32_to_bf16(f32(in[i])) << 16, "bf16 [%d]", i);
        cr_expect_eq(bits(x[i]), bits(fc_round(FC_PREC_BF16, f32(in[i]))), "bf16 [%d]", i);
        cr_expect_eq(bits(y[i]), bits(fc_f16_to_f32(fc_f32_to_f16(f32(in[i])))), "f16 [%d]", i);
        cr_expect_eq(bits(z[i]), in[i], "fp32 [%d]", i);
    }
    // spot values, exact by construction
    cr_expect_eq(x[0], 1.0f);
    cr_expect_eq(x[1], 1.015625f);
    cr_expect(isinf(x[7]) && x[7] > 0);
    cr_expect_eq(y[2], 1.0f);
    cr_expect_eq(y[3], 1.001953125f);
    cr_expect(isinf(y[4]) && y[4] > 0);
    cr_expect_eq(y[5], 0x1p-24f);
    cr_expect_eq(bits(y[6]), 0x80000000u);  // -0 keeps its sign

    // Rounding is idempotent: a second pass changes nothing.
    float x2[N], y2[N];
    memcpy(x2, x, sizeof x);
    memcpy(y2, y, sizeof y);
    fc_round_buffer(FC_PREC_BF16, x2, N);
    fc_round_buffer(FC_PREC_FP16, y2, N);
    cr_expect(memcmp(x, x2, sizeof x) == 0);
    cr_expect(memcmp(y, y2, sizeof y) == 0);

    fc_round_buffer(FC_PREC_BF16, NULL, 0);  // empty buffer touches nothing
}

// ----------------------------------------------------------------------------
// dtype and precision names

Test(dtype, names_sizes_parse) {
    static const struct {
        fc_dtype t;
        const char *name;
        size_t size;
    } want[] = {
        {FC_DT_F64, "F64", 8}, {FC_DT_F32, "F32", 4}, {FC_DT_F16, "F16", 2},
        {FC_DT_BF16, "BF16", 2}, {FC_DT_I64, "I64", 8}, {FC_DT_I32, "I32", 4},
        {FC_DT_I16, "I16", 2}, {FC_DT_I8, "I8", 1}, {FC_DT_U64, "U64", 8},
        {FC_DT_U32, "U32", 4}, {FC_DT_U16, "U16", 2}, {FC_DT_U8, "U8", 1},
        {FC_DT_BOOL, "BOOL", 1},
    };
    cr_assert_eq(sizeof want / sizeof want[0], (size_t)FC_DT_COUNT, "table out of date");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_expect_str_eq(fc_dtype_name(want[i].t), want[i].name);
        cr_expect_eq(fc_dtype_size(want[i].t), want[i].size, "%s", want[i].name);
        fc_dtype t = FC_DT_COUNT;
        cr_expect_eq(fc_dtype_parse(want[i].name, &t), 0, "%s", want[i].name);
        cr_expect_eq(t, want[i].t, "%s", want[i].name);
    }
    // every enum value round-trips through its name
    for (int i = 0; i < FC_DT_COUNT; i++) {
        fc_dtype t = FC_DT_COUNT;
        cr_expect_eq(fc_dtype_parse(fc_dtype_name((fc_dtype)i), &t), 0);
        cr_expect_eq((int)t, i);
    }
}

Test(dtype, refuses_unknown) {
    static const char *bad[] = {"f32", "Bf16", "bf16", "FP32", "float32", "F8_E4M3", "F32 ",
                                " F32", "F3", "BF16x", "", "BOOLEAN", "I128", "C64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_dtype t = FC_DT_U8;
        cr_expect_eq(fc_dtype_parse(bad[i], &t), -1, "\"%s\" accepted", bad[i]);
        cr_expect_eq(t, FC_DT_U8, "\"%s\" wrote the output on failure", bad[i]);
    }
    fc_dtype t = FC_DT_U8;
    cr_expect_eq(fc_dtype_parse(NULL, &t), -1);
    cr_expect_eq(t, FC_DT_U8);
    // out-of-range tags are not trusted as indices
    cr_expect_eq(fc_dtype_size(FC_DT_COUNT), 0);
    cr_expect_not_null(fc_dtype_name(FC_DT_COUNT));
    cr_expect_eq(fc_dtype_size((fc_dtype)-1), 0);
}

Test(prec, names_parse) {
    static const struct {
        fc_prec p;
        const char *name;
    } want[] = {{FC_PREC_FP32, "fp32"}, {FC_PREC_BF16, "bf16"}, {FC_PREC_FP16, "fp16"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_expect_str_eq(fc_prec_name(want[i].p), want[i].name);
        fc_prec p = (fc_prec)99;
        cr_expect_eq(fc_prec_parse(want[i].name, &p), 0, "%s", want[i].name);
        cr_expect_eq(p, want[i].p, "%s", want[i].name);
    }
    static const char *bad[] = {"FP32", "BF16", "bfloat16", "float16", "half", "f32",
                                "fp8",  "fp64", "",         "fp16 ",   "fp"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_prec p = FC_PREC_FP32;
        cr_expect_eq(fc_prec_parse(bad[i], &p), -1, "\"%s\" accepted", bad[i]);
        cr_expect_eq(p, FC_PREC_FP32);
    }
    cr_expect_eq(fc_prec_parse(NULL, NULL), -1);
    cr_expect_not_null(fc_prec_name((fc_prec)99));
}
