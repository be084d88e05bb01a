// tests/unit/layers_test_util.h — what the layer tests (test_layers.c,
// test_layers_llama.c) share: a seeded generator, array helpers, bit
// comparisons and the finite-difference check. Included once per test file,
// after <criterion/criterion.h>; everything here is static.
#ifndef FC_LAYERS_TEST_UTIL_H
#define FC_LAYERS_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// splitmix64: a small deterministic generator for test inputs.
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s; }
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// uniform in [lo, hi)
static double rng_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53;
}

static double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    cr_assert_not_null(p);
    return p;
}
static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(p);
    return p;
}
static double *drand_array(size_t n, double lo, double hi) {
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++) { p[i] = rng_uniform(lo, hi); }
    return p;
}
static double *dcopy(const double *x, size_t n) {
    double *p = dalloc(n);
    memcpy(p, x, n * sizeof(double));
    return p;
}
// float copy of a double array (exact values are then the float-rounded ones)
static float *to_float(const double *x, size_t n) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) { p[i] = (float)x[i]; }
    return p;
}
static double dot_sum(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) { s += a[i] * b[i]; }
    return s;
}
static int same_bits_d(const double *a, const double *b, size_t n) {
    return memcmp(a, b, n * sizeof(double)) == 0;
}
static int same_bits_f(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

// The finite-difference check. loss(ctx) runs the forward with the current
// parameter values and returns the scalar loss. For each element of param the
// central difference (L(x + h) - L(x - h)) / 2h is compared with analytic[i].
// It also insists that the gradient is not all ~0, so a broken backward and a
// loss that ignores the parameter cannot agree by both being zero.
#define FD_H 1e-6
#define FD_ATOL 1e-6
#define FD_RTOL 1e-5
typedef double (*loss_fn)(void *ctx);
static void check_fd(const char *what, double *param, size_t n, const double *analytic,
                     loss_fn loss, void *ctx) {
    double maxabs = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = param[i];
        param[i] = x + FD_H;
        const double lp = loss(ctx);
        param[i] = x - FD_H;
        const double lm = loss(ctx);
        param[i] = x;
        const double num = (lp - lm) / (2 * FD_H);
        const double a = analytic[i];
        cr_assert(fabs(a - num) <= FD_ATOL + FD_RTOL * fabs(num),
                  "%s[%zu]: analytic %.12g, finite difference %.12g (diff %.3g)", what, i, a, num,
                  fabs(a - num));
        if (fabs(num) > maxabs) { maxabs = fabs(num); }
    }
    cr_assert(n == 0 || maxabs > 1e-3, "%s: gradient is ~0 everywhere (max %g)", what, maxabs);
}

#endif
