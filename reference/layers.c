// reference/layers.c — forward and backward of every layer (API and conventions in layers.h).
//
// Written once against `real` and compiled twice (float for training, double
// with -DFC_REAL_DOUBLE for the finite-difference tests), in the style of
// llm.c's train_gpt2.c, with two rules that the whole reference relies on:
//
//  1. Fixed summation order. Every output element is one sequential sum whose
//     order depends only on the shapes: a matmul element is
//         acc = (bias or 0); for r = 0..R-1: acc = fma(a[r], b[r], acc);
//     with r ascending, whatever blocking, vector path or thread computed it
//     (a fused multiply-add is correctly rounded, so fmaf and every vector FMA
//     give the same bits).
//     Blocking, vectorization and OpenMP threads only ever run *different*
//     elements side by side; they never split one element's sum. Every
//     `omp parallel for` below splits output elements (matmul column panels,
//     attention heads or kv-head groups, rows, channel chunks, token
//     positions) and nothing else. Nothing depends on the thread count
//     (core/threads.h) or on pointer alignment, so results are bitwise
//     reproducible. (Compile without -ffast-math; outside the matmul's explicit
//     fused multiply-adds, multiply and add are kept as two roundings, see the
//     pragma.)
//
//  2. Backward adds a fresh contribution. Each backward first sums its
//     contribution to a gradient element into a local accumulator starting at
//     0, then adds it to the gradient once: g = g + contribution. So the
//     contribution's bits never depend on what the gradient already held, and
//     calling a backward twice on a zeroed buffer gives exactly 2x.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "layers.h"
#include "simd.h"

// Keep a*b + c as two roundings. GCC in ISO C mode (-std=c11) already never
// contracts to FMA; clang contracts within an expression unless told not to.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// libm functions for the build's precision: float math must stay in float
// (PyTorch's fp32 kernels do), double math in double.
#ifdef FC_REAL_DOUBLE
#define RSQRT sqrt
#define REXP exp
#define RLOG log
#define RTANH tanh
#define RPOW pow
#define RCOS cos
#define RSIN sin
#else
#define RSQRT sqrtf
#define REXP expf
#define RLOG logf
#define RTANH tanhf
#define RPOW powf
#define RCOS cosf
#define RSIN sinf
#endif

// The magnitude pass (-DFC_MAGNITUDE, reference/magnitude.c): every parameter
// gradient is summed in absolute value, term by term (a weight's |x|^T |dy|, a
// bias's sum of |dy|, LayerNorm's sums of |norm * dy| and |dy|, RMSNorm's sum
// of |norm * dy|, an embedding row's sum of |dy|), while every input gradient
// stays the true one, so each layer sees the true dy. What a parameter
// gradient element comes out as is then the sum of the magnitudes of the
// terms that formed it: the quantity rounding errors are proportional to
// (Higham's gamma_n * sum |x_i|), which the oracle's 16-bit tolerance is built
// on (oracle/compare_model.c).
#ifdef FC_MAGNITUDE
#define MAG(x) fabsf(x)
#else
#define MAG(x) (x)
#endif

// Chunk width for per-column accumulators kept on the stack (bias and
// LayerNorm parameter gradients, attention rows, embedding rows): loops over a
// long row go chunk by chunk so no scratch allocation is needed.
#define FC_CHUNK 64

// Loops with less work than this (in multiply-adds or elements) stay on one
// thread: starting a parallel region costs microseconds, more than a tiny
// model's whole layer. The count changes which thread runs an element, never
// what it computes.
#define FC_PAR_MIN 32768

// ----------------------------------------------------------------------------
// matmul
//
// Every matmul forward and backward is one generic product
//     C[i, j] (= or +=) init[j] + sum_{r=0..R-1} A(i, r) * B(r, j)
// for i < M, j < N, with A and B given by strides, so the six products
//     out = inp w, dinp = dout w^T, dw = inp^T dout  (in both weight layouts)
// share a single kernel and a single summation order.
//
// The kernels compute a block of C in local accumulators (8 x 32 with AVX-512F,
// 8 x 8 with AVX2, 4 x 8 or 4 x 4 in double otherwise): for each r they broadcast
// A values and fuse-multiply-add them with one contiguous row of B, so the work
// is vector code across j while each element's sum still runs over r ascending.
// B is read from a packed R x 32 group of four R x 8 panels (see mm()).

#define MM_IB 4                            // rows of C per block of the generic kernel
#define MM_JB ((int)(32 / sizeof(real)))   // columns of a panel: 8 float, 4 double
#define MM_GP 4                            // panels packed side by side in one group
#define MM_GW (MM_GP * MM_JB)              // columns of a group: 32 float, 16 double
#define MM_KC 256                          // r per chunk of the AVX-512 kernels (mm_group_avx512)

#ifdef FC_REAL_DOUBLE
#define RFMA fma
#else
#define RFMA fmaf
#endif

// A full MM_IB x MM_JB block of C, the generic kernel (any CPU, and the double build).
// c: C(0, 0) of the block, row stride ldc.
// a: A(0, 0) of the block, element (i, r) at a[i * a_si + r * a_sk].
// b: the block's panel in a packed group, element (r, j) at b[r * ldb + j].
// init [MM_JB] or NULL: the starting value of each column's sum (the bias).
// accumulate: C += sum (backward) instead of C = sum (forward).
// fmaf is correctly rounded, so each step gives the bits the vector kernels' fused
// multiply-adds give.
static void mm_block_full(real *c, size_t ldc, const real *a, size_t a_si, size_t a_sk, const real *b,
                          size_t ldb, int R, const real *init, int accumulate) {
    real acc[MM_IB][MM_JB];
    for (int i = 0; i < MM_IB; i++) {
        for (int j = 0; j < MM_JB; j++) { acc[i][j] = init ? init[j] : (real)0; }
    }
    for (int r = 0; r < R; r++) {
        const real *brow = b + (size_t)r * ldb;  // B(r, 0..MM_JB-1)
        for (int i = 0; i < MM_IB; i++) {
            const real ai = a[(size_t)i * a_si + (size_t)r * a_sk];
            for (int j = 0; j < MM_JB; j++) { acc[i][j] = RFMA(ai, brow[j], acc[i][j]); }
        }
    }
    for (int i = 0; i < MM_IB; i++) {
        real *crow = c + (size_t)i * ldc;
        for (int j = 0; j < MM_JB; j++) {
            crow[j] = accumulate ? crow[j] + acc[i][j] : acc[i][j];
        }
    }
}

// The vector kernels are float only; the double build (FC_REAL_DOUBLE) runs the generic one.
#if defined(FC_SIMD_X86) && !defined(FC_REAL_DOUBLE)
#include <immintrin.h>
#define FC_MM_AVX2 1
#define MM_IB_AVX2 8  // rows of C per AVX2 block and per AVX-512 block
// An 8 x 8 block of C (float) on a CPU with AVX2 and FMA, chosen at run time (mm()):
// each row of the block is one 8-lane vector, 8 independent sums in flight, each lane
// one fused multiply-add per r ascending from init: the bits of mm_block_full.
__attribute__((target("avx2,fma"))) static void mm_block8_avx2(real *c, size_t ldc, const real *a, size_t a_si,
                                                               size_t a_sk, const real *b, size_t ldb, int R,
                                                               const real *init, int accumulate) {
    const __m256 s = init ? _mm256_loadu_ps(init) : _mm256_setzero_ps();
    __m256 acc0 = s, acc1 = s, acc2 = s, acc3 = s, acc4 = s, acc5 = s, acc6 = s, acc7 = s;  // acc<row>
    for (int r = 0; r < R; r++) {
        const __m256 bv = _mm256_loadu_ps(b + (size_t)r * ldb);  // B(r, 0..7)
        const real *ar = a + (size_t)r * a_sk;                    // A(0, r); A(i, r) = ar[i * a_si]
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar), bv, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + a_si), bv, acc1);
        acc2 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 2 * a_si), bv, acc2);
        acc3 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 3 * a_si), bv, acc3);
        acc4 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 4 * a_si), bv, acc4);
        acc5 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 5 * a_si), bv, acc5);
        acc6 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 6 * a_si), bv, acc6);
        acc7 = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 7 * a_si), bv, acc7);
    }
    const __m256 res[MM_IB_AVX2] = {acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7};
    for (int i = 0; i < MM_IB_AVX2; i++) {
        real *cp = c + (size_t)i * ldc;
        __m256 v = res[i];
        if (accumulate) { v = _mm256_add_ps(_mm256_loadu_ps(cp), v); }
        _mm256_storeu_ps(cp, v);
    }
}

// An 8 x 32 block of C from rows [0, R) of a packed group [., 32] on a CPU with AVX-512F:
// two 16-lane sums per row, 16 in flight, every broadcast of A serving 32 columns (10 loads
// per 16 fused multiply-adds, so the FMA units, not the loads, set the pace). The sums start
// from `start` (rows of lds, a part of the sum already run) or else from init or 0, and
// end in out (rows of ldo: = or +=). A part stored and loaded again as float is exact, so
// however mm() splits r, each lane is one fused multiply-add per r ascending: the same bits.
__attribute__((target("avx2,fma,avx512f"))) static void mm_block8x32_avx512(real *out, size_t ldo, const real *a,
                                                                            size_t a_si, size_t a_sk, const real *b,
                                                                            int R, const real *init, const real *start,
                                                                            size_t lds, int accumulate) {
    __m512 l[MM_IB_AVX2], h[MM_IB_AVX2];  // columns 0..15 and 16..31 of row i
    for (int i = 0; i < MM_IB_AVX2; i++) {
        if (start) {
            l[i] = _mm512_loadu_ps(start + (size_t)i * lds), h[i] = _mm512_loadu_ps(start + (size_t)i * lds + 16);
        } else {
            l[i] = init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
            h[i] = init ? _mm512_loadu_ps(init + 16) : _mm512_setzero_ps();
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 bl = _mm512_loadu_ps(b + (size_t)r * MM_GW);       // B(r, 0..15)
        const __m512 bh = _mm512_loadu_ps(b + (size_t)r * MM_GW + 16);  // B(r, 16..31)
        const real *ar = a + (size_t)r * a_sk;                            // A(i, r) = ar[i * a_si]
        for (int i = 0; i < MM_IB_AVX2; i++) {
            const __m512 x = _mm512_set1_ps(ar[(size_t)i * a_si]);
            l[i] = _mm512_fmadd_ps(x, bl, l[i]);
            h[i] = _mm512_fmadd_ps(x, bh, h[i]);
        }
    }
    for (int i = 0; i < MM_IB_AVX2; i++) {
        real *op = out + (size_t)i * ldo;
        __m512 u = l[i], v = h[i];
        if (accumulate) {
            u = _mm512_add_ps(_mm512_loadu_ps(op), u);
            v = _mm512_add_ps(_mm512_loadu_ps(op + 16), v);
        }
        _mm512_storeu_ps(op, u);
        _mm512_storeu_ps(op + 16, v);
    }
}

// Rows [0, M8) (a multiple of 8) of a whole group's 32 columns of C with mm_block8x32_avx512,
// r in chunks of MM_KC: each chunk of the packed group (MM_KC * 128 bytes) stays in L1 while
// every row block uses it, where a whole long group (the LM head's 50257 rows) would stream
// from memory once per row block. The sums between chunks wait in part [M8, 32].
__attribute__((target("avx2,fma,avx512f"))) static void mm_group_avx512(real *c, size_t ldc, const real *a,
                                                                        size_t a_si, size_t a_sk, const real *group,
                                                                        int M8, int R, const real *init,
                                                                        int accumulate, real *part) {
    for (int r0 = 0; r0 < R || r0 == 0; r0 += MM_KC) {
        const int kc = R - r0 < MM_KC ? R - r0 : MM_KC, first = r0 == 0, last = r0 + kc >= R;
        for (int i = 0; i < M8; i += MM_IB_AVX2) {
            real *pi = part ? part + (size_t)i * MM_GW : NULL;  // no parts where r is one chunk
            mm_block8x32_avx512(last ? c + (size_t)i * ldc : pi, last ? ldc : MM_GW, a + (size_t)i * a_si + (size_t)r0 * a_sk,
                                a_si, a_sk, group + (size_t)r0 * MM_GW, kc, init, first ? NULL : pi, MM_GW,
                                last && accumulate);
        }
        if (last) break;
    }
}

// B's columns [0, 32) from 32 rows of b (b[j * ldb + r], contiguous along r) into a packed
// group (element (r, j) at group[r * MM_GW + j]) for r in [0, R8), R8 a multiple of 8: 8 x 8
// tiles transposed in registers, where a scalar copy reads 32 rows an element at a time.
__attribute__((target("avx2,fma"))) static void mm_pack_t_avx2(real *group, const real *b, size_t ldb, int R8) {
    for (int r0 = 0; r0 < R8; r0 += 8) {
        for (int j0 = 0; j0 < MM_GW; j0 += 8) {
            __m256 x[8], t[8], u[8];  // x[k]: column j0 + k's r0..r0+7; then interleaved pairs, quads
            for (int k = 0; k < 8; k++) x[k] = _mm256_loadu_ps(b + (size_t)(j0 + k) * ldb + (size_t)r0);
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_ps(x[k], x[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(x[k], x[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {
                u[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            // u[k] (k < 4) holds r0 + k (low half) and r0 + k + 4 (high half) of columns
            // j0..j0+3; u[k + 4] the same of columns j0+4..j0+7
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(group + (size_t)(r0 + k) * MM_GW + j0, _mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
                _mm256_storeu_ps(group + (size_t)(r0 + k + 4) * MM_GW + j0,
                                 _mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
            }
        }
    }
}
#endif

// An edge block, rows [0, mb) and columns [0, jb), mb <= MM_IB, jb <= MM_JB:
// the same sums as mm_block_full, element by element in the same order.
static void mm_block_edge(real *c, size_t ldc, const real *a, size_t a_si, size_t a_sk, const real *b, size_t ldb,
                          int mb, int jb, int R, const real *init, int accumulate) {
    for (int i = 0; i < mb; i++) {
        for (int j = 0; j < jb; j++) {
            real s = init ? init[j] : (real)0;
            for (int r = 0; r < R; r++) { s = RFMA(a[(size_t)i * a_si + (size_t)r * a_sk], b[(size_t)r * ldb + j], s); }
            real *cij = c + (size_t)i * ldc + j;
            *cij = accumulate ? *cij + s : s;
        }
    }
}

// Rows [i0, M) of C's columns [j0, j0 + jb) from one panel of a packed group (row
// stride MM_GW): AVX2 8 x 8 blocks where the kernels allow, then mm_block_full, then
// the edges.
static void mm_panel(real *c, size_t ldc, const real *a, size_t a_si, size_t a_sk, const real *panel, int j0,
                     int jb, int i0, int M, int R, const real *init, int accumulate, int kernels) {
    const real *init_blk = init ? init + j0 : NULL;
#ifdef FC_MM_AVX2
    for (; kernels >= 1 && jb == MM_JB && M - i0 >= MM_IB_AVX2; i0 += MM_IB_AVX2) {
        mm_block8_avx2(c + (size_t)i0 * ldc + (size_t)j0, ldc, a + (size_t)i0 * a_si, a_si, a_sk, panel, MM_GW, R,
                       init_blk, accumulate);
    }
#else
    (void)kernels;
#endif
    for (; i0 < M; i0 += MM_IB) {
        const int mb = M - i0 < MM_IB ? M - i0 : MM_IB;
        real *cblk = c + (size_t)i0 * ldc + (size_t)j0;
        const real *ablk = a + (size_t)i0 * a_si;
        if (mb == MM_IB && jb == MM_JB) {
            mm_block_full(cblk, ldc, ablk, a_si, a_sk, panel, MM_GW, R, init_blk, accumulate);
        } else {
            mm_block_edge(cblk, ldc, ablk, a_si, a_sk, panel, MM_GW, mb, jb, R, init_blk, accumulate);
        }
    }
}

// B's rows [0, R), columns [0, gw) (b: B(0, j0), element (r, j) at b[r * b_sr + j * b_sj])
// into group [R, MM_GW]: a row copy where B is contiguous along j, tiles transposed in
// registers where it is contiguous along r (w^T in the LM head, dinp's w), else one by one.
static void mm_pack(real *group, const real *b, size_t b_sr, size_t b_sj, int R, int gw, int kernels) {
    int r = 0;
    if (b_sj == 1) {
        for (; r < R; r++) memcpy(group + (size_t)r * MM_GW, b + (size_t)r * b_sr, (size_t)gw * sizeof(real));
        return;
    }
#ifdef FC_MM_AVX2
    if (kernels >= 1 && b_sr == 1 && gw == MM_GW) {
        r = R / 8 * 8;
        mm_pack_t_avx2(group, b, b_sj, r);
    }
#else
    (void)kernels;
#endif
    for (; r < R; r++) {
        for (int j = 0; j < gw; j++) group[(size_t)r * MM_GW + j] = b[(size_t)r * b_sr + (size_t)j * b_sj];
    }
}

// C [M, N] (row stride ldc) (= or +=) init + A B, reduction length R.
// A(i, r) = a[i * a_si + r * a_sk]; B(r, j) = b[r * b_sr + j * b_sj].
static void mm(real *c, size_t ldc, const real *a, size_t a_si, size_t a_sk, const real *b,
               size_t b_sr, size_t b_sj, int M, int R, int N, const real *init, int accumulate) {
    // Each R x MM_GW column group of B is copied once into a contiguous buffer
    // (transposing it when B is not contiguous along j) and then reused for
    // every row block. Copying even a contiguous B matters: rows of w are
    // N * sizeof(real) apart, often a multiple of 4 KiB, and reading a few values
    // from each of R such rows thrashes a few L1 sets; the group is R * 128 bytes
    // in a row. The copy costs R * MM_GW loads against M * R * MM_GW multiply-adds.
    //
    // Threads split the column groups: every element of C is computed whole by
    // the one thread that owns its group, so the thread count changes no bit.
#ifdef FC_MM_AVX2
    const int kernels = fc_simd_level();  // 0 generic, 1 AVX2 8 x 8, 2 also AVX-512F 8 x 32
#else
    const int kernels = 0;
#endif
    const int ngroup = (N + MM_GW - 1) / MM_GW, M8 = M / 8 * 8;  // rows in whole AVX-512 blocks
#pragma omp parallel if ((double)M * R * N >= FC_PAR_MIN)
    {
        real *group = mallocCheck((size_t)R * MM_GW * sizeof(real) + 1);  // [R, MM_GW], this thread's
        // [M8, MM_GW]: mm_group_avx512's sums between chunks of r, where r has more than one
        real *part = kernels == 2 && R > MM_KC ? mallocCheck((size_t)M8 * MM_GW * sizeof(real) + 1) : NULL;
#pragma omp for schedule(static)
        for (int g = 0; g < ngroup; g++) {
            const int j0 = g * MM_GW, gw = N - j0 < MM_GW ? N - j0 : MM_GW;
            mm_pack(group, b + (size_t)j0 * b_sj, b_sr, b_sj, R, gw, kernels);
            int i_all = 0;  // rows [0, i_all) done for the whole group
#ifdef FC_MM_AVX2
            if (kernels == 2 && gw == MM_GW && M8 > 0) {
                mm_group_avx512(c + (size_t)j0, ldc, a, a_si, a_sk, group, M8, R, init ? init + j0 : NULL, accumulate,
                                part);
                i_all = M8;
            }
#endif
            for (int h = 0; h * MM_JB < gw; h++) {
                const int jb = gw - h * MM_JB < MM_JB ? gw - h * MM_JB : MM_JB;
                mm_panel(c, ldc, a, a_si, a_sk, group + (size_t)h * MM_JB, j0 + h * MM_JB, jb, i_all, M, R, init,
                         accumulate, kernels);
            }
        }
        free(group);
        free(part);
    }
}

void RN(fc_matmul_forward)(real *out, const real *inp, const real *w, const real *bias, int M,
                           int K, int N, fc_wlayout layout) {
    // out [M,N], inp [M,K], w [K,N] (KN) or [N,K] (NK), bias [N] or NULL.
    // out[m,n] = bias[n] + sum_{k ascending} inp[m,k] * w(k,n): bias first, as llm.c.
    const size_t Ks = (size_t)K, Ns = (size_t)N;
    if (layout == FC_W_KN) {
        mm(out, Ns, inp, Ks, 1, w, Ns, 1, M, K, N, bias, 0);    // B(k,n) = w[k*N + n]
    } else {
        mm(out, Ns, inp, Ks, 1, w, 1, Ks, M, K, N, bias, 0);    // B(k,n) = w[n*K + k]
    }
}

void RN(fc_matmul_backward)(real *dinp, real *dw, real *dbias, const real *dout, const real *inp,
                            const real *w, int M, int K, int N, fc_wlayout layout) {
    // dinp [M,K], dw like w, dbias [N], dout [M,N], inp [M,K], w [K,N] or [N,K].
    const size_t Ks = (size_t)K, Ns = (size_t)N;
    // dinp[m,k] += sum_{n ascending} dout[m,n] * w(k,n)
    if (dinp) {
        if (layout == FC_W_KN) {
            mm(dinp, Ks, dout, Ns, 1, w, 1, Ns, M, N, K, NULL, 1);  // B(n,k) = w[k*N + n]
        } else {
            mm(dinp, Ks, dout, Ns, 1, w, Ks, 1, M, N, K, NULL, 1);  // B(n,k) = w[n*K + k]
        }
    }
    // dw(k,n) += sum_{m ascending} inp[m,k] * dout[m,n]
    if (dw) {
#ifdef FC_MAGNITUDE
        // |inp|^T |dout|: the same product on absolute copies
        real *abs_inp = mallocCheck((size_t)M * Ks * sizeof(real));    // [M,K]
        real *abs_dout = mallocCheck((size_t)M * Ns * sizeof(real));   // [M,N]
        for (size_t i = 0; i < (size_t)M * Ks; i++) { abs_inp[i] = MAG(inp[i]); }
        for (size_t i = 0; i < (size_t)M * Ns; i++) { abs_dout[i] = MAG(dout[i]); }
        const real *x = abs_inp, *dy = abs_dout;
#else
        const real *x = inp, *dy = dout;
#endif
        if (layout == FC_W_KN) {
            // dw [K,N]: rows k, columns n; A(k,m) = inp[m*K + k], B(m,n) = dout[m*N + n]
            mm(dw, Ns, x, 1, Ks, dy, Ns, 1, K, M, N, NULL, 1);
        } else {
            // dw [N,K]: rows n, columns k; A(n,m) = dout[m*N + n], B(m,k) = inp[m*K + k]
            mm(dw, Ks, dy, 1, Ns, x, Ks, 1, N, M, K, NULL, 1);
        }
#ifdef FC_MAGNITUDE
        free(abs_inp);
        free(abs_dout);
#endif
    }
    // dbias[n] += sum_{m ascending} dout[m,n], a chunk of columns at a time so
    // the inner loop runs along a contiguous row of dout.
    if (dbias) {
#pragma omp parallel for schedule(static) if ((size_t)M * N >= FC_PAR_MIN)
        for (int n0 = 0; n0 < N; n0 += FC_CHUNK) {
            const int nb = N - n0 < FC_CHUNK ? N - n0 : FC_CHUNK;
            real acc[FC_CHUNK];
            for (int j = 0; j < nb; j++) { acc[j] = 0; }
            for (int m = 0; m < M; m++) {
                const real *row = dout + (size_t)m * Ns + (size_t)n0;
                for (int j = 0; j < nb; j++) { acc[j] += MAG(row[j]); }
            }
            for (int j = 0; j < nb; j++) { dbias[n0 + j] += acc[j]; }
        }
    }
}

// ----------------------------------------------------------------------------
// LayerNorm (PyTorch nn.LayerNorm): biased variance, rstd = 1 / sqrt(var + eps),
// out = (x - mean) * rstd * weight + bias.

void RN(fc_layernorm_forward)(real *out, real *mean, real *rstd, const real *inp,
                              const real *weight, const real *bias, int N, int C, real eps) {
    // out [N,C], mean [N], rstd [N], inp [N,C], weight [C], bias [C]
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;  // x [C]
        real *o = out + (size_t)n * C;        // o [C]
        real m = 0;
        for (int i = 0; i < C; i++) { m += x[i]; }
        m = m / (real)C;
        // two passes (mean, then squared deviations) rather than E[x^2] - m^2,
        // which cancels badly when |mean| >> std
        real v = 0;
        for (int i = 0; i < C; i++) {
            const real d = x[i] - m;
            v += d * d;
        }
        v = v / (real)C;  // biased: divide by C, not C - 1
        const real s = (real)1 / RSQRT(v + eps);
        for (int i = 0; i < C; i++) {
            o[i] = (x[i] - m) * s * weight[i] + bias[i];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

void RN(fc_layernorm_backward)(real *dinp, real *dweight, real *dbias, const real *dout,
                               const real *inp, const real *weight, const real *mean,
                               const real *rstd, int N, int C) {
    // dinp [N,C], dweight [C], dbias [C], dout [N,C], inp [N,C], weight [C], mean, rstd [N]
    // With norm = (x - mean) * rstd and dnorm = weight * dout (per row):
    //   dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    if (dinp) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
        for (int n = 0; n < N; n++) {
            const real *x = inp + (size_t)n * C;
            const real *dy = dout + (size_t)n * C;
            real *dx = dinp + (size_t)n * C;
            const real m = mean[n], s = rstd[n];
            real dnorm_mean = 0, dnorm_norm_mean = 0;
            for (int i = 0; i < C; i++) {
                const real norm = (x[i] - m) * s;
                const real dnorm = weight[i] * dy[i];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
            }
            dnorm_mean = dnorm_mean / (real)C;
            dnorm_norm_mean = dnorm_norm_mean / (real)C;
            for (int i = 0; i < C; i++) {
                const real norm = (x[i] - m) * s;
                const real dnorm = weight[i] * dy[i];
                dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    // dweight[c] += sum_n norm[n,c] * dout[n,c], dbias[c] += sum_n dout[n,c]:
    // sums over rows, a chunk of channels at a time (rule 2 at the top of this file).
    if (dweight || dbias) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
        for (int c0 = 0; c0 < C; c0 += FC_CHUNK) {
            const int cb = C - c0 < FC_CHUNK ? C - c0 : FC_CHUNK;
            real accw[FC_CHUNK], accb[FC_CHUNK];
            for (int j = 0; j < cb; j++) { accw[j] = 0; accb[j] = 0; }
            for (int n = 0; n < N; n++) {
                const real *x = inp + (size_t)n * C + c0;
                const real *dy = dout + (size_t)n * C + c0;
                const real m = mean[n], s = rstd[n];
                for (int j = 0; j < cb; j++) {
                    accw[j] += MAG((x[j] - m) * s * dy[j]);
                    accb[j] += MAG(dy[j]);
                }
            }
            for (int j = 0; j < cb; j++) {
                if (dweight) { dweight[c0 + j] += accw[j]; }
                if (dbias) { dbias[c0 + j] += accb[j]; }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// RMSNorm (Hugging Face LlamaRMSNorm): no mean, no bias,
// rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).

void RN(fc_rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *weight, int N, int C,
                            real eps) {
    // out [N,C], rstd [N], inp [N,C], weight [C]
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;  // x [C]
        real *o = out + (size_t)n * C;        // o [C]
        real ss = 0;
        for (int i = 0; i < C; i++) { ss += x[i] * x[i]; }  // torch's pow(2) is x * x
        const real v = ss / (real)C;
        // 1 / sqrt, two roundings, as torch.rsqrt's CPU kernel computes it
        const real s = (real)1 / RSQRT(v + eps);
        // x * rstd rounded first, then the weight: Hugging Face's order
        for (int i = 0; i < C; i++) { o[i] = weight[i] * (x[i] * s); }
        rstd[n] = s;
    }
}

void RN(fc_rmsnorm_backward)(real *dinp, real *dweight, const real *dout, const real *inp,
                             const real *weight, const real *rstd, int N, int C) {
    // dinp [N,C], dweight [C], dout [N,C], inp [N,C], weight [C], rstd [N]
    // With norm = x * rstd and dnorm = weight * dout (per row), and
    // d rstd / d x_i = -rstd^3 x_i / C:
    //   dinp = rstd * (dnorm - norm * mean(dnorm * norm))
    // (LayerNorm's formula without the mean terms).
    if (dinp) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
        for (int n = 0; n < N; n++) {
            const real *x = inp + (size_t)n * C;   // x [C]
            const real *dy = dout + (size_t)n * C; // dy [C]
            real *dx = dinp + (size_t)n * C;       // dx [C]
            const real s = rstd[n];
            real dnorm_norm_mean = 0;
            for (int i = 0; i < C; i++) {
                const real norm = x[i] * s;
                const real dnorm = weight[i] * dy[i];
                dnorm_norm_mean += dnorm * norm;
            }
            dnorm_norm_mean = dnorm_norm_mean / (real)C;
            for (int i = 0; i < C; i++) {
                const real norm = x[i] * s;
                const real dnorm = weight[i] * dy[i];
                dx[i] += (dnorm - norm * dnorm_norm_mean) * s;
            }
        }
    }
    // dweight[c] += sum_n norm[n,c] * dout[n,c]: a sum over rows, a chunk of
    // channels at a time (rule 2), in absolute value in the magnitude build.
    if (dweight) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= FC_PAR_MIN)
        for (int c0 = 0; c0 < C; c0 += FC_CHUNK) {
            const int cb = C - c0 < FC_CHUNK ? C - c0 : FC_CHUNK;
            real accw[FC_CHUNK];
            for (int j = 0; j < cb; j++) { accw[j] = 0; }
            for (int n = 0; n < N; n++) {
                const real *x = inp + (size_t)n * C + c0;   // x [cb]
                const real *dy = dout + (size_t)n * C + c0; // dy [cb]
                const real s = rstd[n];
                for (int j = 0; j < cb; j++) { accw[j] += MAG(x[j] * s * dy[j]); }
            }
            for (int j = 0; j < cb; j++) { dweight[c0 + j] += accw[j]; }
        }
    }
}

// ----------------------------------------------------------------------------
// gelu_new (Hugging Face NewGELUActivation, tanh form)

#define GELU_SCALE ((real)0.7978845608028654)  // sqrt(2 / pi)
#define GELU_COEF ((real)0.044715)

void RN(fc_gelu_forward)(real *out, const real *inp, size_t n) {
    // out [n], inp [n]
#pragma omp parallel for schedule(static) if (n >= FC_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const real x = inp[i];
        const real cube = GELU_COEF * (x * x * x);  // as HF: 0.044715 * pow(x, 3)
        out[i] = (real)0.5 * x * ((real)1 + RTANH(GELU_SCALE * (x + cube)));
    }
}

void RN(fc_gelu_backward)(real *dinp, const real *inp, const real *dout, size_t n) {
    // dinp [n], inp [n], dout [n]
    // d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, u = sqrt(2/pi)(x + 0.044715 x^3)
    if (!dinp) { return; }
#pragma omp parallel for schedule(static) if (n >= FC_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const real x = inp[i];
        const real cube = GELU_COEF * (x * x * x);  // as HF: 0.044715 * pow(x, 3)
        const real u = GELU_SCALE * (x + cube);
        const real th = RTANH(u);
        const real sech2 = (real)1 - th * th;
        const real du = GELU_SCALE * ((real)1 + (real)3 * GELU_COEF * x * x);
        const real local = (real)0.5 * ((real)1 + th) + (real)0.5 * x * sech2 * du;
        dinp[i] += local * dout[i];
    }
}

// ----------------------------------------------------------------------------
// SwiGLU's gate (Hugging Face LlamaMLP: act_fn(gate_proj(x)) * up_proj(x), act_fn silu).
// silu(x) = x / (1 + exp(-x)), the formula of torch's CPU silu kernel
// (aten/src/ATen/native/cpu/Activation.cpp), not x * sigmoid(x), which rounds differently.

void RN(fc_swiglu_forward)(real *out, const real *gate, const real *up, size_t n) {
    // out [n], gate [n], up [n]
#pragma omp parallel for schedule(static) if (n >= FC_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const real x = gate[i];
        out[i] = x / ((real)1 + REXP(-x)) * up[i];  // silu(gate) rounded, then * up
    }
}

void RN(fc_swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up,
                            size_t n) {
    // dgate [n], dup [n], dout [n], gate [n], up [n]
    // The product's backward gives dsilu = dout * up and dup = dout * silu(gate);
    // torch's silu_backward then takes dsilu * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)),
    // in that order. For x -> -inf, exp(-x) = inf gives s = 0 and silu = -0, never NaN.
    if (!dgate && !dup) { return; }
#pragma omp parallel for schedule(static) if (n >= FC_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const real x = gate[i];
        const real e1 = (real)1 + REXP(-x);
        if (dgate) {
            const real s = (real)1 / e1;
            dgate[i] += dout[i] * up[i] * s * ((real)1 + x * ((real)1 - s));
        }
        if (dup) { dup[i] += dout[i] * (x / e1); }
    }
}

// ----------------------------------------------------------------------------
// rotary position embedding (Hugging Face LlamaRotaryEmbedding + apply_rotary_pos_emb,
// the default rope type)

// The cos and sin of every (position t, frequency i) the rotations use, built
// as LlamaRotaryEmbedding builds them, in the build's precision (torch's fp32
// for the float build): inv_freq[i] = 1 / theta^((2i) / hd), the angle
// t * inv_freq[i] (one product, as its [hd/2,1] @ [1,T] matmul), then cos and
// sin of that. emb = cat(freqs, freqs) makes the two halves of a head share
// them. Returns one buffer: cos [T, hd/2] then sin [T, hd/2]; the caller frees it.
static real *rope_tables(int T, int hd, double theta) {
    if (hd <= 0 || hd % 2 != 0) {  // callers validate head_dim; this is a bug here
        fc_die(FC_EXIT_INTERNAL, "internal error: rope head dim %d is not a positive even number", hd);
    }
    const int half = hd / 2;
    real *tab = mallocCheck(((size_t)2 * T + 1) * half * sizeof(real));  // cos [T,half], sin [T,half], inv_freq [half]
    real *cosv = tab, *sinv = tab + (size_t)T * half, *inv_freq = tab + (size_t)2 * T * half;
    for (int i = 0; i < half; i++) {
        // torch: arange(0, hd, 2).float() / hd, then theta ** that, then 1.0 / that
        const real expo = (real)(2 * i) / (real)hd;
        inv_freq[i] = (real)1 / RPOW((real)theta, expo);
    }
#pragma omp parallel for schedule(static) if ((size_t)T * half >= FC_PAR_MIN)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            const real a = (real)t * inv_freq[i];
            cosv[(size_t)t * half + i] = RCOS(a);
            sinv[(size_t)t * half + i] = RSIN(a);
        }
    }
    return tab;
}

// The rotation of every head vector by +a (forward) or -a (backward: the
// transpose), written (sign = -1) or added (accumulate) into out:
//   forward:  out1 = x1 c - x2 s,  out2 = x2 c + x1 s   (q * cos + rotate_half(q) * sin:
//             with (-x2) * s = -(x2 * s) exactly, bit for bit what torch computes)
//   backward: dx1 += dy1 c + dy2 s, dx2 += dy2 c - dy1 s  (the rotation's transpose,
//             as autograd forms it from the two branches; x - y * (-s) = x + y * s exactly)
static void rope_rotate(real *out, const real *inp, int B, int T, int H, int hd, double theta, real sign,
                        int accumulate) {
    real *tab = rope_tables(T, hd, theta);  // cos [T,hd/2], sin [T,hd/2]
    const int half = hd / 2;
    const real *cosv = tab, *sinv = tab + (size_t)T * half;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * H * hd >= FC_PAR_MIN)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const real *c = cosv + (size_t)t * half, *s = sinv + (size_t)t * half;  // c, s [half]
            for (int h = 0; h < H; h++) {
                const size_t off = (((size_t)b * T + t) * H + h) * hd;
                const real *x = inp + off;  // x [hd]
                real *o = out + off;        // o [hd]
                for (int i = 0; i < half; i++) {
                    const real x1 = x[i], x2 = x[i + half], si = sign * s[i];
                    const real o1 = x1 * c[i] - x2 * si, o2 = x2 * c[i] + x1 * si;
                    if (accumulate) {
                        o[i] += o1;
                        o[i + half] += o2;
                    } else {
                        o[i] = o1;
                        o[i + half] = o2;
                    }
                }
            }
        }
    }
    free(tab);
}

void RN(fc_rope_forward)(real *out, const real *inp, int B, int T, int H, int hd, double theta) {
    // out [B,T,H,hd], inp [B,T,H,hd]; out may alias inp (each pair x[i], x[i + hd/2] is
    // read before either is written)
    rope_rotate(out, inp, B, T, H, hd, theta, 1, 0);
}

void RN(fc_rope_backward)(real *dinp, const real *dout, int B, int T, int H, int hd, double theta) {
    // dinp [B,T,H,hd] +=, dout [B,T,H,hd]; each element added to dinp once (rule 2)
    if (!dinp) { return; }
    rope_rotate(dinp, dout, B, T, H, hd, theta, -1, 1);
}

// ----------------------------------------------------------------------------
// causal self-attention: GPT-2's multi-head and Llama's grouped-query
//
// One core serves both. Per (b, query head h), reading kv head h / (NH / NKV)
// (repeat_kv's layout; NKV = NH for GPT-2):
//   preatt[t,t2] = (q_t . k_t2) scaled, for t2 <= t,
//   att = softmax over t2 <= t with the row max subtracted,
//   out_t = sum_t2 att[t,t2] v_t2.
// The masked entries (t2 > t) of preatt and att are 0, i.e. exp(-inf) = 0.
// The scaling follows each model's Hugging Face code, which rounds differently:
// GPT-2 divides by sqrt(hs) (torch.full([], sqrt(hs)) in fp32), Llama
// multiplies by its scaling = head_dim ** -0.5 (a Python float, rounded once
// to the build's precision).
//
// The core takes q, k, v (and out, and the gradients) as base pointers with a
// row stride per token, so GPT-2's packed qkv [B,T,3C] and Llama's separate
// q [B,T,NH*hs], k, v [B,T,NKV*hs] are the same loops: head h of token (b, t)
// starts at base + (b*T + t) * stride + h*hs.

typedef struct {
    int B, T, NH, NKV, hs;  // NKV divides NH
    size_t qs, kvs, os;     // row strides of q (and dq), of k and v (and dk, dv), of out (and dout)
    real mul, div;          // the score is (dot * mul) / div: GPT-2 mul = 1, Llama div = 1
} att_dims;

// A raw dot product (or its gradient) scaled. Multiplying or dividing by 1 is
// exact in IEEE arithmetic, so (dot * 1) / sqrt(hs) has the bits of GPT-2's
// dot / sqrt(hs) and (dot * s) / 1 those of Llama's dot * s: one branch-free
// formula serves both (a branch on the form here made GCC stop vectorizing the
// backward's loops: 2x slower).
static inline real att_scale(real dot, real mul, real div) {
    return dot * mul / div;
}

// 4 dot products of length n, x . y0..y3, each summed over i ascending; run
// together so the four dependency chains overlap (the per-element order is the
// same as a plain dot product).
static void dot4(real out[4], const real *x, const real *y0, const real *y1, const real *y2,
                 const real *y3, int n) {
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = 0; i < n; i++) {
        s0 += x[i] * y0[i];
        s1 += x[i] * y1[i];
        s2 += x[i] * y2[i];
        s3 += x[i] * y3[i];
    }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

static real dot1(const real *x, const real *y, int n) {
    real s = 0;
    for (int i = 0; i < n; i++) { s += x[i] * y[i]; }
    return s;
}

// row [t+1] = x . y_{t2} for t2 = 0..t, where y_{t2} = y + t2 * ystride.
static void dots_causal(real *row, const real *x, const real *y, size_t ystride, int t, int n) {
    int t2 = 0;
    for (; t2 + 3 <= t; t2 += 4) {
        dot4(row + t2, x, y + (size_t)t2 * ystride, y + (size_t)(t2 + 1) * ystride,
             y + (size_t)(t2 + 2) * ystride, y + (size_t)(t2 + 3) * ystride, n);
    }
    for (; t2 <= t; t2++) { row[t2] = dot1(x, y + (size_t)t2 * ystride, n); }
}

static void attention_forward_core(real *out, real *preatt, real *att, const real *q, const real *k,
                                   const real *v, const att_dims *d) {
    // out (row stride os), preatt [B,NH,T,T], att [B,NH,T,T], q (row stride qs), k, v (kvs)
    const int B = d->B, T = d->T, NH = d->NH, hs = d->hs, group = d->NH / d->NKV;
    const size_t qs = d->qs, kvs = d->kvs, os = d->os;
    const real mul = d->mul, div = d->div;  // locals: no reload after each store through a real *
    // threads split the (b, h) pairs: each writes its own rows of preatt/att and its head's slice of out
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * T * NH * hs >= FC_PAR_MIN)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int kvh = h / group;
            const real *qh = q + (size_t)b * T * qs + (size_t)h * hs;     // q_t = qh + t*qs
            const real *kh = k + (size_t)b * T * kvs + (size_t)kvh * hs;  // k_t = kh + t*kvs
            const real *vh = v + (size_t)b * T * kvs + (size_t)kvh * hs;  // v_t = vh + t*kvs
            for (int t = 0; t < T; t++) {
                real *pre = preatt + (((size_t)b * NH + h) * T + t) * T;   // pre [T]
                real *a = att + (((size_t)b * NH + h) * T + t) * T;        // a [T]
                real *o = out + ((size_t)b * T + t) * os + (size_t)h * hs; // o [hs]

                // scores and their max (the max keeps exp from overflowing)
                dots_causal(pre, qh + (size_t)t * qs, kh, kvs, t, hs);
                real maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    pre[t2] = att_scale(pre[t2], mul, div);
                    if (pre[t2] > maxval) { maxval = pre[t2]; }
                }
                real sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = REXP(pre[t2] - maxval);
                    sum += a[t2];
                }
                const real inv = (real)1 / sum;  // sum >= 1: the max term is exp(0)
                for (int t2 = 0; t2 <= t; t2++) { a[t2] *= inv; }
                for (int t2 = t + 1; t2 < T; t2++) { pre[t2] = 0; a[t2] = 0; }

                // o = sum_{t2 <= t} a[t2] v_t2, t2 ascending, vectorized along hs
                for (int i = 0; i < hs; i++) { o[i] = 0; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *vt = vh + (size_t)t2 * kvs;
                    const real w = a[t2];
                    for (int i = 0; i < hs; i++) { o[i] += w * vt[i]; }
                }
            }
        }
    }
}

static void attention_backward_core(real *dq, real *dk, real *dv, real *dpreatt, real *datt,
                                    const real *dout, const real *q, const real *k, const real *v,
                                    const real *att, const att_dims *d) {
    // dq, q (row stride qs); dk, dv, k, v (kvs); dout (os); dpreatt, datt, att [B,NH,T,T].
    // Any of dq, dk, dv may be NULL.
    const int B = d->B, T = d->T, NH = d->NH, NKV = d->NKV, hs = d->hs, group = d->NH / d->NKV;
    const size_t qs = d->qs, kvs = d->kvs, os = d->os;
    const real mul = d->mul, div = d->div;  // locals: no reload after each store through a real *
    // Threads split the (b, kv head) pairs; each writes the [T,T] blocks of the
    // kv head's group of query heads and their slices of dq, dk, dv. A kv
    // head's dk, dv element sums its query heads' contributions, each summed
    // from 0, in ascending head order, and that group sum is added to dk, dv
    // once (rule 2): as repeat_kv's backward sums over the group and then
    // accumulates. With NKV = NH (GPT-2) the group is one head and this is
    // exactly the per-head computation.
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * T * NH * hs >= FC_PAR_MIN)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            const size_t kvoff = (size_t)b * T * kvs + (size_t)kvh * hs;
            const real *kh = k + kvoff, *vh = v + kvoff;  // k_t = kh + t*kvs, v_t = vh + t*kvs
            const int h0 = kvh * group, h1 = h0 + group;  // the group: query heads [h0, h1)

            // datt[t,t2] = do_t . v_t2; then through the softmax:
            // dpreatt[t,t2] = att[t,t2] * (datt[t,t2] - sum_t3 att[t,t3] datt[t,t3])
            // (the O(T)-per-row form of the softmax Jacobian, not llm.c's O(T^2) per row)
            for (int h = h0; h < h1; h++) {
                const real *doh = dout + (size_t)b * T * os + (size_t)h * hs;  // do_t = doh + t*os
                const size_t bh = ((size_t)b * NH + h) * T * T;                // [T,T] block offset
                for (int t = 0; t < T; t++) {
                    const real *a = att + bh + (size_t)t * T;
                    real *da = datt + bh + (size_t)t * T;
                    real *dp = dpreatt + bh + (size_t)t * T;
                    dots_causal(da, doh + (size_t)t * os, vh, kvs, t, hs);
                    real s = 0;
                    for (int t2 = 0; t2 <= t; t2++) { s += a[t2] * da[t2]; }
                    for (int t2 = 0; t2 <= t; t2++) { dp[t2] = a[t2] * (da[t2] - s); }
                    for (int t2 = t + 1; t2 < T; t2++) { da[t2] = 0; dp[t2] = 0; }
                }
            }

            // Gradients of q, k, v, a chunk of the head dim at a time. With
            // g[t,t2] = dpreatt[t,t2] scaled (the gradient of the raw dot), per query head h:
            //   dq_t  += sum_{t2 <= t} g[t,t2] k_t2                      (t2 ascending)
            //   dk_t2 += sum_{h in group} (sum_{t >= t2} g_h[t,t2] q_h,t)  (h, then t ascending)
            //   dv_t2 += sum_{h in group} (sum_{t >= t2} att_h[t,t2] do_h,t)
            for (int i0 = 0; i0 < hs; i0 += FC_CHUNK) {
                const int ib = hs - i0 < FC_CHUNK ? hs - i0 : FC_CHUNK;
                real acc[FC_CHUNK], acc2[FC_CHUNK];     // one head's contribution
                real sumk[FC_CHUNK], sumv[FC_CHUNK];    // the group's sum of them
                for (int h = h0; h < h1 && dq; h++) {
                    const size_t bh = ((size_t)b * NH + h) * T * T;
                    real *dqh = dq + (size_t)b * T * qs + (size_t)h * hs;  // dq_t = dqh + t*qs
                    for (int t = 0; t < T; t++) {
                        const real *dp = dpreatt + bh + (size_t)t * T;
                        for (int i = 0; i < ib; i++) { acc[i] = 0; }
                        for (int t2 = 0; t2 <= t; t2++) {
                            const real g = att_scale(dp[t2], mul, div);
                            const real *kt = kh + (size_t)t2 * kvs + i0;
                            for (int i = 0; i < ib; i++) { acc[i] += g * kt[i]; }
                        }
                        real *dqt = dqh + (size_t)t * qs + i0;
                        for (int i = 0; i < ib; i++) { dqt[i] += acc[i]; }
                    }
                }
                for (int t2 = 0; t2 < T && (dk || dv); t2++) {
                    for (int h = h0; h < h1; h++) {
                        const size_t bh = ((size_t)b * NH + h) * T * T;
                        const real *qh = q + (size_t)b * T * qs + (size_t)h * hs;      // q_t = qh + t*qs
                        const real *doh = dout + (size_t)b * T * os + (size_t)h * hs;  // do_t = doh + t*os
                        for (int i = 0; i < ib; i++) { acc[i] = 0; acc2[i] = 0; }
                        for (int t = t2; t < T; t++) {
                            const real g = att_scale(dpreatt[bh + (size_t)t * T + t2], mul, div);
                            const real w = att[bh + (size_t)t * T + t2];
                            const real *qt = qh + (size_t)t * qs + i0;
                            const real *dy = doh + (size_t)t * os + i0;
                            for (int i = 0; i < ib; i++) {
                                acc[i] += g * qt[i];
                                acc2[i] += w * dy[i];
                            }
                        }
                        // the group's sum starts as the first head's contribution
                        // itself (not 0 + it), so a group of one is bit for bit
                        // the plain per-head backward, -0 included
                        if (h == h0) {
                            for (int i = 0; i < ib; i++) { sumk[i] = acc[i]; sumv[i] = acc2[i]; }
                        } else {
                            for (int i = 0; i < ib; i++) { sumk[i] += acc[i]; sumv[i] += acc2[i]; }
                        }
                    }
                    if (dk) {
                        real *dkt = dk + kvoff + (size_t)t2 * kvs + i0;
                        for (int i = 0; i < ib; i++) { dkt[i] += sumk[i]; }
                    }
                    if (dv) {
                        real *dvt = dv + kvoff + (size_t)t2 * kvs + i0;
                        for (int i = 0; i < ib; i++) { dvt[i] += sumv[i]; }
                    }
                }
            }
        }
    }
}

// GPT-2: q, k, v packed in qkv [B,T,3C] (row stride 3C), out [B,T,C], one kv head per head.
void RN(fc_attention_forward)(real *out, real *preatt, real *att, const real *qkv, int B, int T,
                              int C, int NH) {
    // out [B,T,C], preatt [B,NH,T,T], att [B,NH,T,T], qkv [B,T,3C]
    const int hs = C / NH;
    const size_t C3 = 3 * (size_t)C;
    // divide by sqrt(hs) in the build's precision, as torch.full([], sqrt(hs)) in HF GPT-2
    const att_dims d = {B, T, NH, NH, hs, C3, C3, (size_t)C, (real)1, RSQRT((real)hs)};
    attention_forward_core(out, preatt, att, qkv, qkv + C, qkv + 2 * (size_t)C, &d);
}

void RN(fc_attention_backward)(real *dqkv, real *dpreatt, real *datt, const real *dout,
                               const real *qkv, const real *att, int B, int T, int C, int NH) {
    // dqkv [B,T,3C], dpreatt [B,NH,T,T], datt [B,NH,T,T], dout [B,T,C], qkv [B,T,3C],
    // att [B,NH,T,T]
    const int hs = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const att_dims d = {B, T, NH, NH, hs, C3, C3, (size_t)C, (real)1, RSQRT((real)hs)};
    attention_backward_core(dqkv, dqkv ? dqkv + C : NULL, dqkv ? dqkv + 2 * (size_t)C : NULL, dpreatt,
                            datt, dout, qkv, qkv + C, qkv + 2 * (size_t)C, att, &d);
}

// Llama: separate q [B,T,NH*hs] and k, v [B,T,NKV*hs].
static att_dims gqa_dims(int B, int T, int NH, int NKV, int hs) {
    if (NKV <= 0 || NH % NKV != 0) {  // callers validate the config; this is a bug here
        fc_die(FC_EXIT_INTERNAL, "internal error: %d kv heads do not divide %d heads", NKV, NH);
    }
    // multiply by head_dim ** -0.5, a Python float in HF, rounded once to the build's precision
    const real s = (real)(1.0 / sqrt((double)hs));
    const att_dims d = {B, T, NH, NKV, hs, (size_t)NH * hs, (size_t)NKV * hs, (size_t)NH * hs, s, (real)1};
    return d;
}

void RN(fc_gqa_attention_forward)(real *out, real *preatt, real *att, const real *q, const real *k,
                                  const real *v, int B, int T, int NH, int NKV, int hs) {
    // out [B,T,NH*hs], preatt [B,NH,T,T], att [B,NH,T,T], q [B,T,NH*hs], k, v [B,T,NKV*hs]
    const att_dims d = gqa_dims(B, T, NH, NKV, hs);
    attention_forward_core(out, preatt, att, q, k, v, &d);
}

void RN(fc_gqa_attention_backward)(real *dq, real *dk, real *dv, real *dpreatt, real *datt,
                                   const real *dout, const real *q, const real *k, const real *v,
                                   const real *att, int B, int T, int NH, int NKV, int hs) {
    // dq [B,T,NH*hs], dk, dv [B,T,NKV*hs], dpreatt, datt [B,NH,T,T], dout [B,T,NH*hs],
    // q [B,T,NH*hs], k, v [B,T,NKV*hs], att [B,NH,T,T]
    const att_dims d = gqa_dims(B, T, NH, NKV, hs);
    attention_backward_core(dq, dk, dv, dpreatt, datt, dout, q, k, v, att, &d);
}

// ----------------------------------------------------------------------------
// token + position embedding

void RN(fc_encoder_forward)(real *out, const int32_t *ids, const real *wte, const real *wpe,
                            int B, int T, int C) {
    // out [B,T,C], ids [B,T], wte [V,C], wpe [P,C] with P >= T, or NULL (llama: no position embedding)
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * C >= FC_PAR_MIN)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *o = out + ((size_t)b * T + t) * C;
            const real *we = wte + (size_t)ids[(size_t)b * T + t] * C;
            if (!wpe) {
                memcpy(o, we, (size_t)C * sizeof(real));
                continue;
            }
            const real *pe = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) { o[i] = we[i] + pe[i]; }
        }
    }
}

// Sort key for grouping positions by token id: (id << 32) | position, so ties
// keep position order and each token's rows are summed in (b, t) order.
static int enc_cmp(const void *pa, const void *pb) {
    const uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

void RN(fc_encoder_backward)(real *dwte, real *dwpe, const real *dout, const int32_t *ids, int B,
                             int T, int C) {
    // dwte [V,C], dwpe [P,C], dout [B,T,C], ids [B,T]
    const size_t BT = (size_t)B * T;
    // dwte[v] += sum over positions with id v of dout[b,t], in (b, t) order.
    // A token can repeat, so positions are grouped by id first (a sort of
    // (id, position) keys) and each group is summed before the one add.
    if (dwte && BT > 0) {
        uint64_t *order = mallocCheck(BT * sizeof(uint64_t));  // order [B*T]: id << 32 | p
        for (size_t p = 0; p < BT; p++) { order[p] = (uint64_t)(uint32_t)ids[p] << 32 | p; }
        qsort(order, BT, sizeof(uint64_t), enc_cmp);
        for (size_t g0 = 0; g0 < BT;) {
            const uint64_t id = order[g0] >> 32;
            size_t g1 = g0 + 1;  // the group of token id is order[g0..g1)
            while (g1 < BT && order[g1] >> 32 == id) { g1++; }
            real *dw = dwte + (size_t)id * C;
            for (int c0 = 0; c0 < C; c0 += FC_CHUNK) {
                const int cb = C - c0 < FC_CHUNK ? C - c0 : FC_CHUNK;
                real acc[FC_CHUNK];
                for (int j = 0; j < cb; j++) { acc[j] = 0; }
                for (size_t g = g0; g < g1; g++) {
                    const size_t p = (size_t)(order[g] & 0xffffffffu);
                    const real *dy = dout + p * C + c0;
                    for (int j = 0; j < cb; j++) { acc[j] += MAG(dy[j]); }
                }
                for (int j = 0; j < cb; j++) { dw[c0 + j] += acc[j]; }
            }
            g0 = g1;
        }
        free(order);
    }
    // dwpe[t] += sum_{b ascending} dout[b,t]
    if (dwpe) {
#pragma omp parallel for schedule(static) if (BT * C >= FC_PAR_MIN)
        for (int t = 0; t < T; t++) {
            for (int c0 = 0; c0 < C; c0 += FC_CHUNK) {
                const int cb = C - c0 < FC_CHUNK ? C - c0 : FC_CHUNK;
                real acc[FC_CHUNK];
                for (int j = 0; j < cb; j++) { acc[j] = 0; }
                for (int b = 0; b < B; b++) {
                    const real *dy = dout + ((size_t)b * T + t) * C + c0;
                    for (int j = 0; j < cb; j++) { acc[j] += MAG(dy[j]); }
                }
                real *dw = dwpe + (size_t)t * C + c0;
                for (int j = 0; j < cb; j++) { dw[j] += acc[j]; }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// residual

void RN(fc_residual_forward)(real *out, const real *a, const real *b, size_t n) {
    // out [n], a [n], b [n]; out may alias a or b (each element is read before it is written)
#pragma omp parallel for schedule(static) if (n >= FC_PAR_MIN)
    for (size_t i = 0; i < n; i++) { out[i] = a[i] + b[i]; }
}

// ----------------------------------------------------------------------------
// softmax cross-entropy (PyTorch F.cross_entropy = nll(log_softmax))

real RN(fc_crossentropy_forward)(real *probs, const real *logits, const int32_t *targets, int N,
                                 int V) {
    // probs [N,V], logits [N,V], targets [N]
    // The row loss is computed as log_softmax, log(sum exp(x - max)) - (x[target] - max),
    // not as -log(probs[target]), so it stays finite when probs[target] underflows to 0.
    // The N row losses are summed in double, row order, so the total of a large batch
    // does not lose digits before the caller divides. Threads split the rows; each
    // row's loss is kept and the sum taken after, in row order, on one thread.
    double *rows = mallocCheck(((size_t)N + 1) * sizeof(double));  // rows [N]
#pragma omp parallel for schedule(static) if ((size_t)N * V >= FC_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const real *x = logits + (size_t)n * V;
        real *p = probs + (size_t)n * V;
        real maxval = -INFINITY;
        for (int i = 0; i < V; i++) {
            if (x[i] > maxval) { maxval = x[i]; }
        }
        real sum = 0;
        for (int i = 0; i < V; i++) {
            p[i] = REXP(x[i] - maxval);
            sum += p[i];
        }
        const real inv = (real)1 / sum;
        for (int i = 0; i < V; i++) { p[i] *= inv; }
        const real row = RLOG(sum) - (x[targets[n]] - maxval);
        rows[n] = (double)row;
    }
    double total = 0.0;
    for (int n = 0; n < N; n++) { total += rows[n]; }
    free(rows);
    return (real)total;
}

void RN(fc_crossentropy_backward)(real *dlogits, const real *probs, const int32_t *targets, int N,
                                  int V, real scale) {
    // dlogits [N,V], probs [N,V], targets [N]
    if (!dlogits) { return; }
#pragma omp parallel for schedule(static) if ((size_t)N * V >= FC_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const real *p = probs + (size_t)n * V;
        real *dl = dlogits + (size_t)n * V;
        const int32_t tgt = targets[n];
        for (int i = 0; i < V; i++) {
            const real indicator = i == tgt ? (real)1 : (real)0;
            dl[i] += scale * (p[i] - indicator);
        }
    }
}
