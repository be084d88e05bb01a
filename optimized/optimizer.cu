// optimized/optimizer.cu — one optimizer step over the flat fp32 shards of
// every unit, multi-tensor (up to 32 buffers per launch, one grid row each),
// with core/optim.h's element updates: the same AdamW and SGD arithmetic as
// the reference's (and torch.optim's), the scalar coefficients computed once
// on the host by core/optim.c. The clip coefficient scales the gradient on
// the way in; the stored gradient stays unclipped.
#include <string.h>

#include "common.cuh"
#include "kernels.h"
#include "optim.h"

#define OPT_SEGS 32

typedef struct {
    float *p[OPT_SEGS];
    const float *g[OPT_SEGS];
    float *s0[OPT_SEGS];
    float *s1[OPT_SEGS];
    size_t n[OPT_SEGS];
} opt_segs;

__global__ static void adamw_kernel(opt_segs t, fc_adamw_coeffs k, float coef, int clip) {
    int j = blockIdx.y;
    float *p = t.p[j], *m = t.s0[j], *v = t.s1[j];
    const float *g = t.g[j];
    GRID_STRIDE(i, t.n[j]) {
        float pv = p[i], mv = m[i], vv = v[i];
        fc_adamw_elem(&pv, clip ? g[i] * coef : g[i], &mv, &vv, &k);
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
    }
}

__global__ static void sgd_kernel(opt_segs t, fc_sgd_coeffs k, float coef, int clip) {
    int j = blockIdx.y;
    float *p = t.p[j], *b = t.s0[j];
    const float *g = t.g[j];
    GRID_STRIDE(i, t.n[j]) {
        float pv = p[i], bv = b ? b[i] : 0.0f;
        fc_sgd_elem(&pv, clip ? g[i] * coef : g[i], b ? &bv : NULL, &k);
        p[i] = pv;
        if (b) b[i] = bv;
    }
}

extern "C" void fck_optimizer(const fc_optim_config *c, long step, float coef, int clip, float *const *p,
                              float *const *g, float *const *s0, float *const *s1, const size_t *n, int nu,
                              cudaStream_t s) {
    fc_adamw_coeffs ka = fc_adamw_coeffs_at(c, step);
    fc_sgd_coeffs ks = fc_sgd_coeffs_at(c, step);
    for (int u0 = 0; u0 < nu;) {
        opt_segs t;
        memset(&t, 0, sizeof t);
        int cnt = 0;
        size_t most = 0;
        for (; u0 < nu && cnt < OPT_SEGS; u0++) {
            if (!n[u0]) continue;  // a rank whose chunk is all padding
            t.p[cnt] = p[u0], t.g[cnt] = g[u0], t.s0[cnt] = s0[u0], t.s1[cnt] = s1[u0], t.n[cnt] = n[u0];
            if (n[u0] > most) most = n[u0];
            cnt++;
        }
        if (!cnt) continue;
        dim3 grid(fc_blocks(most, 256) > 1024 ? 1024 : fc_blocks(most, 256), (unsigned)cnt);
        if (c->kind == FC_OPT_ADAMW)
            adamw_kernel<<<grid, 256, 0, s>>>(t, ka, coef, clip);
        else
            sgd_kernel<<<grid, 256, 0, s>>>(t, ks, coef, clip);
        cudaCheckLaunch();
    }
}
