// optimized/tests/probe.c — fc_cuda_probe: exits 0 and prints the devices
// when a CUDA device can be used, else prints why (cudaGetDeviceCount failing
// counts as no device) and exits 77, ctest's SKIP_RETURN_CODE for the gpu
// tests.
#include <cuda_runtime_api.h>
#include <stdio.h>

int main(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n", cudaGetErrorString(err));
        return 77;
    }
    if (n == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: 0 devices)\n");
        return 77;
    }
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
            printf("device %d: %s, sm_%d%d, %.1f GiB\n", d, p.name, p.major, p.minor, p.totalGlobalMem / 1073741824.0);
    }
    return 0;
}
