// tests/ports/hwlike/hw_matmul.c — the hardware-like port's matmuls: the
// products of reference/layers.c computed the way a GPU's GEMM library does.
//
// What each knob stands for here:
//  - HW_K_MATMUL: cuBLASLt picks a kernel per call from the problem's shape
//    and its operands' alignment, so a plan (split-K factor, accumulation
//    lanes) is a pure function of the seed, the shape, which product it is
//    and hw_align_class(w). Split-K sums contiguous slices of the reduction
//    dimension separately and adds the partials in slice order (for dw the
//    reduction is over M, the long dimension cuBLASLt splits for a weight
//    gradient). Inside a slice, element r goes to lane r % L, as a tile's
//    vector accumulators do, and the L lanes are combined as a pairwise tree.
//    The bias is added in the fp32 epilogue after the whole sum.
//  - HW_K_FMA: the multiply-adds' fusion is the other one from the reference's:
//    layers.c fuses every step (one rounding, as FFMA / HMMA), so with the knob
//    each step is a multiply, then an add (two roundings), as a kernel built
//    without contraction (nvcc --fmad=false) computes it.
//  - HW_K_COMPUTE16: a bf16/fp16 GEMM rounds its fp32 accumulator once on
//    output; a gradient GEMM writing a 16-bit gradient buffer rounds its
//    result and then the sum dst + result.
//  - HW_K_ATOMICS: the bias gradient is summed over rows in a run-to-run
//    order, as atomicAdd-based bias-gradient kernels sum it.
// Each knob alone changes only its own thing: without HW_K_MATMUL the sum is
// the reference's (bias first, r ascending, fused), and without MATMUL and FMA
// the products are layers.c's own.
//
// Threads split rows of the output only; every element is computed whole by
// one thread, so the thread count changes no bit.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hwlike.h"
#include "layers.h"

// Multiply and add stay two roundings where a plan asks for no fmaf.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define HW_IB 4      // output rows per block: each row of B is reused for them
#define HW_JB 64     // output columns per block
#define HW_LMAX 16   // the most accumulation lanes a plan picks
#define HW_PAR_MIN 32768.0  // multiply-adds below which a product stays on one thread

// Which product a plan is for: cuBLASLt sees three different problems.
enum { HW_P_FORWARD, HW_P_DINP, HW_P_DW };

typedef struct {
    int splits;      // split-K slices, 1..4
    int lanes;       // accumulation lanes per slice: 1, 4, 8 or 16
    int fma;         // fmaf(a, b, acc) (the reference's) instead of acc + a * b
    int bias_first;  // the sum starts at the bias (the reference's order), else bias in the epilogue
} hw_plan;

// One product C[i, j] = sum_{r < R} A(i, r) * B(r, j) for i < I, j < J.
typedef struct {
    float *c;
    size_t ldc;
    const float *a;      // A(i, r) = a[i * a_si + r * a_sr]
    size_t a_si, a_sr;
    const float *b;      // B [R,J], contiguous along j
    const float *bias;   // [J] or NULL; forward only
    int I, R, J;
    int accumulate;      // backward: C = r16(C + r16(sum)); forward: C = r16(sum + bias)
} hw_gemm;

// 16-bit rounding that actually changes something: the knob on and a 16-bit compute precision.
static int r16_active(void) { return hw_on(HW_K_COMPUTE16) && hw.compute != FC_PREC_FP32; }

static hw_plan plan_for(int product, int M, int K, int N, fc_wlayout layout, const void *w) {
    static const int lanes[4] = {1, 4, 8, 16};
    hw_plan p = {1, 1, !hw_on(HW_K_FMA), 1};
    if (!hw_on(HW_K_MATMUL)) return p;
    uint64_t h = hw_mix(hw.seed, 0x6d61746d756c0000ULL + (uint64_t)product);  // "matmul"
    h = hw_mix(h, ((uint64_t)(uint32_t)M << 32) | (uint32_t)K);
    h = hw_mix(h, ((uint64_t)(uint32_t)N << 1) | (uint64_t)(layout == FC_W_NK));
    h = hw_mix(h, hw_align_class(w));
    p.splits = 1 + (int)(h % 4);
    p.lanes = lanes[(h >> 8) % 4];
    p.bias_first = 0;
    return p;
}

// The inner step of every product: ac_i[j] = ac_i[j] + x[i] * b[j] for rows
// i < ib (row i at ac + i * ld) and j < n, one rounding for the product and
// one for the add, or one for both (fma). Every version below gives the same
// bits: they differ only in how many lanes one instruction handles.
typedef void (*hw_update)(float *ac, size_t ld, const float *b, const float *x, int ib, int n);

static void update_plain(float *ac, size_t ld, const float *b, const float *x, int ib, int n) {
    for (int i = 0; i < ib; i++) {
        float *a = ac + (size_t)i * ld;
        for (int j = 0; j < n; j++) a[j] = a[j] + x[i] * b[j];
    }
}

static void update_fma(float *ac, size_t ld, const float *b, const float *x, int ib, int n) {
    for (int i = 0; i < ib; i++) {
        float *a = ac + (size_t)i * ld;
        for (int j = 0; j < n; j++) a[j] = fmaf(x[i], b[j], a[j]);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HW_AVX2 1
// 8 lanes a step: without a vector fmaf in plain C, the fused path would
// otherwise be a libm call per element. _mm256_mul_ps then _mm256_add_ps is
// two IEEE roundings per lane, _mm256_fmadd_ps one, as fmaf.
__attribute__((target("avx2"))) static void update_avx2(float *ac, size_t ld, const float *b, const float *x,
                                                        int ib, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 bv = _mm256_loadu_ps(b + j);
        for (int i = 0; i < ib; i++) {
            float *a = ac + (size_t)i * ld + j;
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_mul_ps(_mm256_set1_ps(x[i]), bv)));
        }
    }
    if (j < n) update_plain(ac + j, ld, b + j, x, ib, n - j);
}

__attribute__((target("avx2,fma"))) static void update_fma_avx2(float *ac, size_t ld, const float *b,
                                                                const float *x, int ib, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 bv = _mm256_loadu_ps(b + j);
        for (int i = 0; i < ib; i++) {
            float *a = ac + (size_t)i * ld + j;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(x[i]), bv, _mm256_loadu_ps(a)));
        }
    }
    if (j < n) update_fma(ac + j, ld, b + j, x, ib, n - j);
}
#endif

// 1: the AVX2 versions may run; decided once, before any parallel region (gemm() asks first).
static int hw_simd = -1;

static hw_update pick_update(int fma) {
#ifdef HW_AVX2
    if (hw_simd < 0) hw_simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (hw_simd) return fma ? update_fma_avx2 : update_avx2;
#endif
    return fma ? update_fma : update_plain;
}

// tot [HW_IB,HW_JB]: the sums of rows i0..i0+ib and columns j0..j0+jb of g
// (bias included when the plan starts from it), slice by slice.
static void block_sums(float *tot, const hw_gemm *g, hw_plan p, hw_update upd, int i0, int ib, int j0,
                       int jb) {
    float acc[HW_IB * HW_LMAX * HW_JB];  // [lane][ib][j]: lane l's rows at acc + l * HW_IB * HW_JB
    const size_t lane = (size_t)HW_IB * HW_JB;
    const int S = p.splits < g->R ? p.splits : (g->R > 0 ? g->R : 1);
    for (int s = 0; s < S; s++) {
        const int r0 = (int)((long long)g->R * s / S), r1 = (int)((long long)g->R * (s + 1) / S);
        memset(acc, 0, (size_t)p.lanes * lane * sizeof(float));
        if (p.bias_first && g->bias) {
            for (int ii = 0; ii < ib; ii++) memcpy(acc + (size_t)ii * HW_JB, g->bias + j0, (size_t)jb * sizeof(float));
        }
        for (int r = r0; r < r1; r++) {
            float x[HW_IB];  // A(i0.., r)
            for (int ii = 0; ii < ib; ii++) x[ii] = g->a[(size_t)(i0 + ii) * g->a_si + (size_t)r * g->a_sr];
            upd(acc + (size_t)((r - r0) % p.lanes) * lane, HW_JB, g->b + (size_t)r * (size_t)g->J + (size_t)j0, x,
                ib, jb);
        }
        // lanes combined pairwise: lane l += lane l + w, w halving (a warp-shuffle tree)
        for (int w = p.lanes / 2; w >= 1; w /= 2) {
            for (int l = 0; l < w; l++) {
                float *lo = acc + (size_t)l * lane;
                const float *hi = acc + (size_t)(l + w) * lane;
                for (size_t e = 0; e < (size_t)ib * HW_JB; e++) lo[e] = lo[e] + hi[e];
            }
        }
        for (size_t e = 0; e < (size_t)ib * HW_JB; e++) tot[e] = s == 0 ? acc[e] : tot[e] + acc[e];
    }
}

static void gemm(const hw_gemm *g, hw_plan p) {
    const int nblk = (g->I + HW_IB - 1) / HW_IB;
    const hw_update upd = pick_update(p.fma);
#pragma omp parallel for schedule(static) if ((double)g->I * g->R * g->J >= HW_PAR_MIN)
    for (int q = 0; q < nblk; q++) {
        const int i0 = q * HW_IB, ib = g->I - i0 < HW_IB ? g->I - i0 : HW_IB;
        float tot[HW_IB * HW_JB];
        for (int j0 = 0; j0 < g->J; j0 += HW_JB) {
            const int jb = g->J - j0 < HW_JB ? g->J - j0 : HW_JB;
            block_sums(tot, g, p, upd, i0, ib, j0, jb);
            for (int ii = 0; ii < ib; ii++) {
                float *c = g->c + (size_t)(i0 + ii) * g->ldc + (size_t)j0;
                const float *t = tot + (size_t)ii * HW_JB;
                for (int j = 0; j < jb; j++) {
                    if (g->accumulate) {
                        c[j] = hw_r16(c[j] + hw_r16(t[j]));
                    } else {
                        const float v = (g->bias && !p.bias_first) ? t[j] + g->bias[j0 + j] : t[j];
                        c[j] = hw_r16(v);
                    }
                }
            }
        }
    }
}

// dst [rows,cols] = src^T, src [cols,rows]: makes B contiguous along the output's columns.
static float *transposed(const float *src, int rows, int cols) {
    float *dst = mallocCheck((size_t)rows * (size_t)cols * sizeof(float) + 1);
    const size_t R = (size_t)rows, C = (size_t)cols;
    for (size_t c = 0; c < C; c++) {
        for (size_t r = 0; r < R; r++) dst[r * C + c] = src[c * R + r];
    }
    return dst;
}

void hw_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int M, int K,
                       int N, fc_wlayout layout) {
    // out [M,N], inp [M,K], w [K,N] (KN) or [N,K] (NK), bias [N] or NULL.
    if (!hw_on(HW_K_MATMUL) && !hw_on(HW_K_FMA)) {
        fc_matmul_forward(out, inp, w, bias, M, K, N, layout);
        if (r16_active()) hw_r16n(out, (size_t)M * (size_t)N);
        return;
    }
    const hw_plan p = plan_for(HW_P_FORWARD, M, K, N, layout, w);
    float *wt = layout == FC_W_NK ? transposed(w, K, N) : NULL;  // [K,N]
    const hw_gemm g = {out, (size_t)N, inp, (size_t)K, 1, wt ? wt : w, bias, M, K, N, 0};
    gemm(&g, p);
    free(wt);
}

// dst [n] = r16(dst + r16(contribution)) with the contribution from layers.c:
// its products, and only 16-bit compute's rounding on top.
static void ref_backward_part(float *dinp, float *dw, const float *dout, const float *inp,
                              const float *w, int M, int K, int N, fc_wlayout layout) {
    float *dst = dinp ? dinp : dw;
    const size_t n = dinp ? (size_t)M * (size_t)K : (size_t)K * (size_t)N;
    if (!r16_active()) {
        fc_matmul_backward(dinp, dw, NULL, dout, inp, w, M, K, N, layout);
        return;
    }
    float *part = callocCheck(n + 1, sizeof(float));
    fc_matmul_backward(dinp ? part : NULL, dw ? part : NULL, NULL, dout, inp, w, M, K, N, layout);
    for (size_t i = 0; i < n; i++) dst[i] = hw_r16(dst[i] + hw_r16(part[i]));
    free(part);
}

// dbias [N] += sum_m dout[m,:]: m ascending as layers.c, or in an atomics order.
static void bias_backward(float *dbias, const float *dout, int M, int N) {
    size_t *perm = NULL;
    if (hw_on(HW_K_ATOMICS)) {
        perm = mallocCheck((size_t)M * sizeof(size_t) + 1);
        const uint64_t shape = ((uint64_t)(uint32_t)M << 32) | (uint32_t)N;
        hw_atomic_order(perm, (size_t)M, hw_mix(0x6462696173ULL, shape));  // "dbias"
    }
    float acc[HW_JB];
    for (int n0 = 0; n0 < N; n0 += HW_JB) {
        const int nb = N - n0 < HW_JB ? N - n0 : HW_JB;
        for (int j = 0; j < nb; j++) acc[j] = 0;
        for (int t = 0; t < M; t++) {
            const size_t m = perm ? perm[t] : (size_t)t;
            const float *row = dout + m * (size_t)N + (size_t)n0;
            for (int j = 0; j < nb; j++) acc[j] = acc[j] + row[j];
        }
        for (int j = 0; j < nb; j++) dbias[n0 + j] = hw_r16(dbias[n0 + j] + hw_r16(acc[j]));
    }
    free(perm);
}

void hw_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, int M, int K, int N, fc_wlayout layout) {
    // dinp [M,K], dw like w, dbias [N], dout [M,N], inp [M,K], w [K,N] or [N,K]; all +=.
    const int own = hw_on(HW_K_MATMUL) || hw_on(HW_K_FMA);
    if (!own && !hw_on(HW_K_ATOMICS) && !r16_active()) {
        fc_matmul_backward(dinp, dw, dbias, dout, inp, w, M, K, N, layout);
        return;
    }
    const size_t Ks = (size_t)K, Ns = (size_t)N;
    if (dinp && !own) ref_backward_part(dinp, NULL, dout, inp, w, M, K, N, layout);
    if (dinp && own) {
        // dinp[m,k] += sum_n dout[m,n] w(k,n): B(n,k) = w(k,n), contiguous along k for NK
        float *wt = layout == FC_W_KN ? transposed(w, N, K) : NULL;  // [N,K]
        const hw_gemm g = {dinp, Ks, dout, Ns, 1, wt ? wt : w, NULL, M, N, K, 1};
        gemm(&g, plan_for(HW_P_DINP, M, K, N, layout, w));
        free(wt);
    }
    if (dw && !own) ref_backward_part(NULL, dw, dout, inp, w, M, K, N, layout);
    if (dw && own) {
        // dw(k,n) += sum_m inp[m,k] dout[m,n], the reduction over M
        const hw_plan p = plan_for(HW_P_DW, M, K, N, layout, w);
        if (layout == FC_W_KN) {
            const hw_gemm g = {dw, Ns, inp, 1, Ks, dout, NULL, K, M, N, 1};  // A(k,m) = inp[m,k]
            gemm(&g, p);
        } else {
            const hw_gemm g = {dw, Ks, dout, 1, Ns, inp, NULL, N, M, K, 1};  // A(n,m) = dout[m,n]
            gemm(&g, p);
        }
    }
    if (dbias) bias_backward(dbias, dout, M, N);
}
