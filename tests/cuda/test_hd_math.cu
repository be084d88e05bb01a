// tests/cuda/test_hd_math.cu — the arithmetic a CUDA port shares with the
// reference (core/round.h: bf16/fp16 round-to-nearest-even; core/optim.h: the
// AdamW and SGD element updates) compiled by nvcc, compared bit for bit with
// the C compiler's build of the same inline functions (hd_math_ref.c):
//
//   test_hd_math          nvcc's host build (runs anywhere)
//   test_hd_math --device the kernels on the GPU; exit 77 (ctest's skip)
//                         with the reason when there is no usable device
//
// Inputs: every 16-bit pattern (both directions), and a fixed set of floats
// chosen at the rounding boundaries (ties, carries into the exponent,
// overflow to Inf, subnormals, NaN payloads) plus 2^20 pseudo-random bit
// patterns; optimizer updates over 4096 seeded (p, g, m, v) tuples and three
// step counts. Expected results are the C build's: they must agree exactly.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hd_math_ref.h"

#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
static void cuda_check(cudaError_t err, const char *file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "%s:%d: CUDA error: %s\n", file, line, cudaGetErrorString(err));
    exit(1);
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// splitmix64: the same inputs on every run
static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static std::vector<float> test_floats(void) {
    std::vector<float> v;
    const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, 0x3F808000u,
                              0x3F818000u, 0x3F80FFFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u,
                              0x7F800001u, 0xFFC00001u, 0x477FF000u, 0x477FEFFFu, 0x38800000u, 0x33000000u,
                              0x33000001u, 0x387FE000u, 0x387FF000u, 0x3F800FFFu, 0x3F801000u, 0x3F803000u};
    for (uint32_t e : edges) v.push_back(from_bits(e));
    uint64_t s = 20261123;
    for (int i = 0; i < (1 << 20); i++) v.push_back(from_bits((uint32_t)next(&s)));
    return v;
}

typedef struct {
    float p, g, m, v;
} opt_case;

static std::vector<opt_case> opt_cases(void) {
    std::vector<opt_case> c;
    uint64_t s = 7;
    for (int i = 0; i < 4096; i++) {
        auto u = [&](float scale) { return scale * ((float)(next(&s) >> 40) / (float)(1u << 24) - 0.5f); };
        c.push_back({u(2.0f), u(i % 7 == 0 ? 1e-6f : 0.1f), u(0.01f), (float)(next(&s) >> 40) / (float)(1u << 24) * 1e-4f});
    }
    return c;
}

// One function, compiled for host and device: what the port would call.
struct results {
    uint16_t bf16, f16;
    float rb, rf;
};
__host__ __device__ static results convert(float x) {
    results r;
    r.bf16 = fc_f32_to_bf16(x);
    r.f16 = fc_f32_to_f16(x);
    r.rb = fc_round(FC_PREC_BF16, x);
    r.rf = fc_round(FC_PREC_FP16, x);
    return r;
}

__global__ static void convert_kernel(const float *x, results *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = convert(x[i]);
}

__global__ static void widen_kernel(float *bf, float *f16) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 65536) {
        bf[i] = fc_bf16_to_f32((uint16_t)i);
        f16[i] = fc_f16_to_f32((uint16_t)i);
    }
}

__global__ static void optim_kernel(opt_case *c, int n, fc_adamw_coeffs a, fc_sgd_coeffs s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    opt_case x = c[i];
    if (i % 2 == 0) {
        fc_adamw_elem(&x.p, x.g, &x.m, &x.v, &a);
    } else {
        fc_sgd_elem(&x.p, x.g, &x.m, &s);
    }
    c[i] = x;
}

static int errs = 0;
static void expect_bits(const char *what, uint64_t i, uint32_t got, uint32_t want) {
    if (got == want) return;
    if (errs++ < 10) fprintf(stderr, "%s [%llu]: 0x%08x, the C build gives 0x%08x\n", what, (unsigned long long)i, got, want);
}

static void check_results(const char *side, const std::vector<float> &x, const results *r) {
    for (size_t i = 0; i < x.size(); i++) {
        expect_bits(side, i, r[i].bf16, ref_f32_to_bf16(x[i]));
        expect_bits(side, i, r[i].f16, ref_f32_to_f16(x[i]));
        expect_bits(side, i, bits(r[i].rb), bits(ref_round(FC_PREC_BF16, x[i])));
        expect_bits(side, i, bits(r[i].rf), bits(ref_round(FC_PREC_FP16, x[i])));
    }
}

static void check_optim(const char *side, const std::vector<opt_case> &in, const std::vector<opt_case> &got,
                        const fc_adamw_coeffs *a, const fc_sgd_coeffs *s) {
    for (size_t i = 0; i < in.size(); i++) {
        opt_case w = in[i];
        if (i % 2 == 0)
            ref_adamw(&w.p, w.g, &w.m, &w.v, a);
        else
            ref_sgd(&w.p, w.g, &w.m, s);
        expect_bits(side, i, bits(got[i].p), bits(w.p));
        expect_bits(side, i, bits(got[i].m), bits(w.m));
        expect_bits(side, i, bits(got[i].v), bits(w.v));
    }
}

int main(int argc, char **argv) {
    int device = argc > 1 && !strcmp(argv[1], "--device");
    std::vector<float> x = test_floats();
    std::vector<opt_case> oc = opt_cases();
    fc_optim_config adam = {FC_OPT_ADAMW, 1e-3, 0.01, 0.9, 0.999, 1e-8, 0, 0, 0};
    fc_optim_config sgd = {FC_OPT_SGD, 0.05, 0.01, 0.9, 0.999, 1e-8, 0.9, 0.1, 0};
    long steps[] = {1, 2, 1000};
    if (!device) {
        std::vector<results> r(x.size());
        for (size_t i = 0; i < x.size(); i++) r[i] = convert(x[i]);
        check_results("nvcc host", x, r.data());
        for (uint32_t h = 0; h < 65536; h++) {
            expect_bits("nvcc host bf16->f32", h, bits(fc_bf16_to_f32((uint16_t)h)), bits(ref_bf16_to_f32((uint16_t)h)));
            expect_bits("nvcc host f16->f32", h, bits(fc_f16_to_f32((uint16_t)h)), bits(ref_f16_to_f32((uint16_t)h)));
        }
        for (long t : steps) {
            fc_adamw_coeffs a = fc_adamw_coeffs_at(&adam, t);
            fc_sgd_coeffs s = fc_sgd_coeffs_at(&sgd, t);
            std::vector<opt_case> got = oc;
            for (size_t i = 0; i < got.size(); i++) {
                if (i % 2 == 0)
                    fc_adamw_elem(&got[i].p, got[i].g, &got[i].m, &got[i].v, &a);
                else
                    fc_sgd_elem(&got[i].p, got[i].g, &got[i].m, &s);
            }
            check_optim("nvcc host optim", oc, got, &a, &s);
        }
        printf("nvcc host build: %zu floats, 65536 patterns each way, %zu x 3 optimizer updates: %d mismatches\n",
               x.size(), oc.size(), errs);
        return errs ? 1 : 0;
    }
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n", cudaGetErrorString(err), n);
        return 77;
    }
    float *dx;
    results *dr;
    cudaCheck(cudaMalloc(&dx, x.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&dr, x.size() * sizeof(results)));
    cudaCheck(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    convert_kernel<<<(unsigned)((x.size() + 255) / 256), 256>>>(dx, dr, (int)x.size());
    cudaCheck(cudaGetLastError());
    std::vector<results> r(x.size());
    cudaCheck(cudaMemcpy(r.data(), dr, x.size() * sizeof(results), cudaMemcpyDeviceToHost));
    check_results("device", x, r.data());
    float *dbf, *df16;
    cudaCheck(cudaMalloc(&dbf, 65536 * sizeof(float)));
    cudaCheck(cudaMalloc(&df16, 65536 * sizeof(float)));
    widen_kernel<<<256, 256>>>(dbf, df16);
    cudaCheck(cudaGetLastError());
    std::vector<float> wb(65536), wf(65536);
    cudaCheck(cudaMemcpy(wb.data(), dbf, 65536 * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(wf.data(), df16, 65536 * sizeof(float), cudaMemcpyDeviceToHost));
    for (uint32_t h = 0; h < 65536; h++) {
        expect_bits("device bf16->f32", h, bits(wb[h]), bits(ref_bf16_to_f32((uint16_t)h)));
        expect_bits("device f16->f32", h, bits(wf[h]), bits(ref_f16_to_f32((uint16_t)h)));
    }
    opt_case *dc;
    cudaCheck(cudaMalloc(&dc, oc.size() * sizeof(opt_case)));
    for (long t : steps) {
        fc_adamw_coeffs a = fc_adamw_coeffs_at(&adam, t);
        fc_sgd_coeffs s = fc_sgd_coeffs_at(&sgd, t);
        cudaCheck(cudaMemcpy(dc, oc.data(), oc.size() * sizeof(opt_case), cudaMemcpyHostToDevice));
        optim_kernel<<<(unsigned)((oc.size() + 255) / 256), 256>>>(dc, (int)oc.size(), a, s);
        cudaCheck(cudaGetLastError());
        std::vector<opt_case> got(oc.size());
        cudaCheck(cudaMemcpy(got.data(), dc, oc.size() * sizeof(opt_case), cudaMemcpyDeviceToHost));
        check_optim("device optim", oc, got, &a, &s);
    }
    cudaCheck(cudaFree(dx));
    cudaCheck(cudaFree(dr));
    cudaCheck(cudaFree(dbf));
    cudaCheck(cudaFree(df16));
    cudaCheck(cudaFree(dc));
    printf("device build: %zu floats, 65536 patterns each way, %zu x 3 optimizer updates: %d mismatches\n", x.size(),
           oc.size(), errs);
    return errs ? 1 : 0;
}
