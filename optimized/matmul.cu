// optimized/matmul.cu — every matmul of the models through cuBLASLt: fp32
// accumulation (CUBLAS_COMPUTE_32F: never TF32, which only the _FAST_TF32
// compute types use), a fixed workspace, split-K partials reduced in fp32 only
// (no in-place or output-type reduction: those add partials in the 16-bit
// output type), the bias added by the BIAS epilogue where its pointer is
// aligned, and one algorithm per shape and operand alignment (cached), so a
// run is reproducible.
// Row-major operands map to cuBLASLt's column-major ones through mm_plan.h.
// Where cuBLASLt offers no algorithm (odd alignments), a plain kernel with a
// fixed summation order does the product. The bias gradient is a column
// sum of our own (fixed order, no atomics).
#include <string.h>

#include "common.cuh"
#include "kernels.h"
#include "mm_plan.h"

#define MM_CACHE 128

typedef struct {
    int M, N, K, ta, tb, bias, acc;
    fc_prec p;
    uint32_t al[4];
    int found;  // cuBLASLt had an algorithm
    cublasLtMatmulAlgo_t algo;
} mm_entry;

struct fck_mm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    mm_entry cache[MM_CACHE];
    int n_cache;
};

extern "C" fck_mm *fck_mm_create(void *workspace, size_t ws_bytes) {
    fck_mm *mm = (fck_mm *)callocCheck(1, sizeof *mm);
    cublasCheck(cublasLtCreate(&mm->lt));
    mm->ws = workspace;
    mm->ws_bytes = ws_bytes;
    return mm;
}

extern "C" void fck_mm_destroy(fck_mm *mm) {
    if (!mm) return;
    cublasCheck(cublasLtDestroy(mm->lt));
    free(mm);
}

static cudaDataType_t cuda_type(fc_prec p) {
    return p == FC_PREC_BF16 ? CUDA_R_16BF : p == FC_PREC_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

// C [M,N] = (acc ? C : 0) + (bias[n] or 0) + sum_k op(A)[m,k] op(B)[k,n], k ascending
template <class T>
__global__ static void matmul_plain_kernel(T *C, const T *A, const T *B, const T *bias, int M, int N, int K, int ta,
                                           int tb, int acc) {
    size_t total = (size_t)M * N;
    GRID_STRIDE(i, total) {
        size_t m = i / (size_t)N, n = i % (size_t)N;
        float s = bias ? to_f32(bias[n]) : 0.0f;
        for (int k = 0; k < K; k++) {
            float a = to_f32(ta ? A[(size_t)k * M + m] : A[m * K + k]);
            float b = to_f32(tb ? B[n * K + k] : B[(size_t)k * N + n]);
            s += a * b;
        }
        C[i] = from_f32<T>(acc ? to_f32(C[i]) + s : s);
    }
}

// C [M,N] += bias [N], row by row
template <class T>
__global__ static void add_bias_kernel(T *C, const T *bias, int M, int N) {
    size_t total = (size_t)M * N;
    GRID_STRIDE(i, total) C[i] = from_f32<T>(to_f32(C[i]) + to_f32(bias[i % (size_t)N]));
}

// dbias [N] += sum over the M rows of dout [M,N]: 32 columns x 8 row slices per
// block, each slice summed in row order, slices added in order.
template <class T>
__global__ static void bias_backward_kernel(T *dbias, const T *dout, int M, int N) {
    __shared__ float part[8][32];
    int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float a = 0.0f;
    if (c < N)
        for (int m = y; m < M; m += 8) a += to_f32(dout[(size_t)m * N + c]);
    part[y][threadIdx.x] = a;
    __syncthreads();
    if (y != 0 || c >= N) return;
    for (int k = 1; k < 8; k++) a += part[k][threadIdx.x];
    dbias[c] = from_f32<T>(to_f32(dbias[c]) + a);
}

static mm_entry *cache_find(fck_mm *mm, const mm_entry *key) {
    for (int i = 0; i < mm->n_cache; i++) {
        mm_entry *e = &mm->cache[i];
        if (e->M == key->M && e->N == key->N && e->K == key->K && e->ta == key->ta && e->tb == key->tb &&
            e->bias == key->bias && e->acc == key->acc && e->p == key->p && !memcmp(e->al, key->al, sizeof e->al))
            return e;
    }
    return NULL;
}

static void plain(void *C, const void *A, const void *B, const void *bias, int M, int N, int K, int ta, int tb, int acc,
                  fc_prec p, cudaStream_t s) {
    size_t total = (size_t)M * N;
    FC_DISPATCH(p, X, matmul_plain_kernel<X><<<fc_blocks(total, 256), 256, 0, s>>>((X *)C, (const X *)A, (const X *)B, (const X *)bias, M, N, K, ta, tb, acc));
    cudaCheckLaunch();
}

extern "C" void fck_matmul(fck_mm *mm, void *C, const void *A, const void *B, const void *bias, int M, int N, int K,
                           int ta, int tb, int accumulate, fc_prec p, cudaStream_t s) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // an empty product: only the bias (or nothing)
        if (!accumulate) cudaCheck(cudaMemsetAsync(C, 0, (size_t)M * N * fc_prec_size(p), s));
        if (bias) FC_DISPATCH(p, X, add_bias_kernel<X><<<fc_blocks((size_t)M * N, 256), 256, 0, s>>>((X *)C, (const X *)bias, M, N));
        cudaCheckLaunch();
        return;
    }
    fc_mm_plan pl = fc_mm_plan_rowmajor(M, N, K, ta, tb);
    // the bias by the epilogue only where cuBLASLt can read it vector-wise
    int epi_bias = bias && fc_mm_alignment(bias) >= 16;
    mm_entry key;
    memset(&key, 0, sizeof key);
    key.M = M, key.N = N, key.K = K, key.ta = ta, key.tb = tb, key.bias = epi_bias, key.acc = accumulate, key.p = p;
    // Each operand's own alignment: cuBLASLt assumes 256 bytes unless told less (cublasLt.h,
    // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), and the one value every operand shares is the element size
    // (parameters are packed at any offset of their unit), which would rule out every vectorised kernel.
    // Where a buffer sits cannot change a class: each is an allocation of its own, 256-byte aligned (CUDA C++
    // Programming Guide, "Device Memory Accesses"), so a class (capped at 256) is that of the operand's offset
    // in its unit or in the activation layout, the same under every strategy, prefetch and offload.
    key.al[0] = fc_mm_alignment(B);  // cuBLAS's A is our B
    key.al[1] = fc_mm_alignment(A);
    key.al[2] = fc_mm_alignment(C);
    key.al[3] = epi_bias ? fc_mm_alignment(bias) : 0;

    cudaDataType_t dt = cuda_type(p);
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = pl.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, opb = pl.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (epi_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, dt, pl.a.rows, pl.a.cols, pl.a.ld));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, dt, pl.b.rows, pl.b.cols, pl.b.ld));
    cublasCheck(cublasLtMatrixLayoutCreate(&lc, dt, pl.c.rows, pl.c.cols, pl.c.ld));

    mm_entry *e = cache_find(mm, &key);
    mm_entry fresh = key;
    if (!e) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = mm->ws_bytes;
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // or none: partials summed in fp32
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.al[0], sizeof(uint32_t)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.al[1], sizeof(uint32_t)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.al[2], sizeof(uint32_t)));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.al[2], sizeof(uint32_t)));
        cublasLtMatmulHeuristicResult_t res;
        int n_res = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(mm->lt, desc, la, lb, lc, lc, pref, 1, &res, &n_res);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        fresh.found = st == CUBLAS_STATUS_SUCCESS && n_res > 0;
        if (fresh.found) fresh.algo = res.algo;
        e = &fresh;
        if (mm->n_cache < MM_CACHE) {
            mm->cache[mm->n_cache] = fresh;
            e = &mm->cache[mm->n_cache++];
        }
    }
    if (e->found) {
        float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
        cublasCheck(cublasLtMatmul(mm->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &e->algo, mm->ws,
                                   mm->ws_bytes, s));
        if (bias && !epi_bias)
            FC_DISPATCH(p, X, add_bias_kernel<X><<<fc_blocks((size_t)M * N, 256), 256, 0, s>>>((X *)C, (const X *)bias, M, N));
        cudaCheckLaunch();
    } else {
        plain(C, A, B, bias, M, N, K, ta, tb, accumulate, p, s);
    }
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(lc));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

extern "C" void fck_bias_backward(void *dbias, const void *dout, int M, int N, fc_prec p, cudaStream_t s) {
    if (!dbias || N <= 0) return;
    dim3 block(32, 8);
    FC_DISPATCH(p, X, bias_backward_kernel<X><<<(unsigned)((N + 31) / 32), block, 0, s>>>((X *)dbias, (const X *)dout, M, N));
    cudaCheckLaunch();
}
