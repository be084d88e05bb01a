// optimized/classifier.cu — fused softmax + cross-entropy + its gradient,
// one block per row (llm.c's fused classifier idea): the row loss as
// log_softmax, log(sum exp(x - max)) - (x[target] - max), which stays finite
// when the target's probability underflows, and the logits' gradient
// scale * (softmax - onehot) added into dlogits in the same pass, in fp32
// whatever the storage type. The row losses stay fp32 per row; the host adds
// them in double in row order (the reference's sum).
#include "common.cuh"
#include "kernels.h"

template <class X>
__global__ static void classifier_kernel(float *losses, X *dlogits, const X *logits, const int32_t *targets, int V,
                                         float scale) {
    __shared__ float scratch[32];
    size_t row = blockIdx.x;
    const X *x = logits + row * V;
    X *dx = dlogits + row * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, to_f32(x[i]));
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(to_f32(x[i]) - mx);
    sum = block_sum(sum, scratch);
    int tgt = targets[row];
    if (threadIdx.x == 0) losses[row] = logf(sum) - (to_f32(x[tgt]) - mx);
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float pr = expf(to_f32(x[i]) - mx) * inv;
        float ind = i == tgt ? 1.0f : 0.0f;
        dx[i] = from_f32<X>(to_f32(dx[i]) + scale * (pr - ind));
    }
}

extern "C" void fck_classifier(float *losses, void *dlogits, const void *logits, const int32_t *targets, int N, int V,
                               float scale, fc_prec p, cudaStream_t s) {
    if (N <= 0) return;
    int threads = V >= 1024 ? 1024 : (V + 31) / 32 * 32;
    FC_DISPATCH(p, X, classifier_kernel<X><<<(unsigned)N, threads, 0, s>>>(losses, (X *)dlogits, (const X *)logits, targets, V, scale));
    cudaCheckLaunch();
}
