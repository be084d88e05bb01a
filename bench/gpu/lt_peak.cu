// bench/gpu/lt_peak.cu — fc_lt_peak [N]: the bf16 matmul peak of this device,
// measured through cuBLASLt as the port calls it (bf16 A, B, D; fp32 compute
// and scale). The MFU of the bench stage is against this number, not against
// a datasheet: the lease's ceiling is what the card does today.
//
//   D[N,N] = A[N,N] @ B[N,N]   bf16, column-major, no transposes
//
// Random data (zeros run faster, KINDS.md: 894 vs 788 TFLOP/s), 3 warm-ups,
// then 10 timed products between two CUDA events; prints one line:
//   lt_peak: N=8192 bf16 cuBLASLt 781.4 TFLOP/s (10 products, 14.07 ms)
// Exit 77 (ctest's skip) with the probe's reason where there is no device.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_check.h"

// x[i] = a small hash of i in [-1, 1): random enough to defeat the zero shortcut
__global__ void fill(__nv_bfloat16 *x, size_t n, unsigned seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((float)(h & 0xffff) / 32768.0f - 1.0f);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8192;
    if (n < 256 || n > 32768 || n % 256) {
        fprintf(stderr, "fc_lt_peak: N must be a multiple of 256 in 256..32768, got %s\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    size_t elems = (size_t)n * n;
    __nv_bfloat16 *a, *b, *d;  // each [N, N]
    void *ws;                  // cuBLASLt workspace, 32 MiB (what the port gives it)
    size_t ws_bytes = 32u << 20;
    cudaCheck(cudaMalloc((void **)&a, elems * sizeof *a));
    cudaCheck(cudaMalloc((void **)&b, elems * sizeof *b));
    cudaCheck(cudaMalloc((void **)&d, elems * sizeof *d));
    cudaCheck(cudaMalloc(&ws, ws_bytes));
    unsigned blocks = (unsigned)((elems + 255) / 256);
    fill<<<blocks, 256>>>(a, elems, 1u);
    cudaCheckLaunch();
    fill<<<blocks, 256>>>(b, elems, 2u);
    cudaCheckLaunch();

    cublasLtHandle_t lt;
    cublasCheck(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                     sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &n_res));
    if (n_res == 0) {
        fprintf(stderr, "%s:%d: cuBLASLt error: no algorithm for a bf16 %dx%dx%d product\n", __FILE__, __LINE__, n, n, n);
        return 4;
    }
    float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    const int warm = 3, timed = 10;
    for (int i = 0; i < warm + timed; i++) {
        if (i == warm) cudaCheck(cudaEventRecord(t0, 0));
        cublasCheck(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &res.algo, ws, ws_bytes, 0));
    }
    cudaCheck(cudaEventRecord(t1, 0));
    cudaCheck(cudaEventSynchronize(t1));
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
    double flops = 2.0 * n * (double)n * n * timed;
    printf("lt_peak: N=%d bf16 cuBLASLt %.1f TFLOP/s (%d products, %.2f ms)\n", n, flops / (ms * 1e-3) / 1e12, timed, ms);

    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    cublasCheck(cublasLtDestroy(lt));
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    cudaCheck(cudaFree(a));
    cudaCheck(cudaFree(b));
    cudaCheck(cudaFree(d));
    cudaCheck(cudaFree(ws));
    return 0;
}
