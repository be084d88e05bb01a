// optimized/cuda_check.h — cudaCheck, cublasCheck, ncclCheck, in the style
// of llm.c: every CUDA, cuBLAS and NCCL call is checked, and a failure is an
// internal error reported with file:line and the library's own message, then
// the whole MPI job ends (exit code FC_EXIT_INTERNAL). Bad input never gets
// here: create() refuses it first with one line (cuda_config.h).
#ifndef FC_CUDA_CHECK_H
#define FC_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "hd.h"

FC_BEGIN_DECLS

FC_NORETURN void fc_cuda_die(const char *file, int line, const char *lib, const char *msg);

static inline void fc_cuda_check(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess) fc_cuda_die(file, line, "CUDA", cudaGetErrorString(err));
}
static inline void fc_cublas_check(cublasStatus_t st, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) fc_cuda_die(file, line, "cuBLAS", cublasLtGetStatusString(st));
}
static inline void fc_nccl_check(ncclResult_t r, const char *file, int line) {
    if (r != ncclSuccess) fc_cuda_die(file, line, "NCCL", ncclGetErrorString(r));
}

#define cudaCheck(call) fc_cuda_check((call), __FILE__, __LINE__)
#define cublasCheck(call) fc_cublas_check((call), __FILE__, __LINE__)
#define ncclCheck(call) fc_nccl_check((call), __FILE__, __LINE__)
// after every kernel launch: launch errors are reported where they happen
#define cudaCheckLaunch() fc_cuda_check(cudaGetLastError(), __FILE__, __LINE__)

FC_END_DECLS

#endif
