// core/optim.h — AdamW and SGD-with-momentum exactly as torch.optim computes them.
//
// The per-element update is written once here, as inline functions that any
// implementation can use (FC_HD marks them callable from CUDA device code too),
// so the reference and a port share one definition of the arithmetic. The
// scalar coefficients are computed in double, as torch computes them from
// Python floats, then rounded to fp32 where torch hands them to an fp32 kernel.
//
// torch.optim.AdamW (single-tensor path), per step t >= 1:
//   p  = p * (1 - lr*wd)
//   m  = m.lerp(g, 1 - beta1)                   # m + w (g - m)
//   v  = v * beta2 + (1 - beta2) * g * g        # addcmul
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p  = p + (-lr / (1 - beta1^t)) * m / denom  # addcdiv
// torch.optim.SGD, per step:
//   g  = g + wd * p                             # if wd != 0
//   b  = g (first step) | b * momentum + (1 - dampening) * g
//   g  = g + momentum * b (nesterov) | b
//   p  = p + (-lr) * g
#ifndef FC_OPTIM_H
#define FC_OPTIM_H

#include <math.h>
#include <stddef.h>

#include "config.h"

#include "hd.h"

FC_BEGIN_DECLS

typedef struct {
    float decay;        // 1 - lr*wd
    float w1;           // 1 - beta1, the lerp weight
    float beta2, w2;    // beta2, 1 - beta2
    float bc2_sqrt;     // sqrt(1 - beta2^t)
    float eps;
    float neg_step;     // -lr / (1 - beta1^t)
} fc_adamw_coeffs;

typedef struct {
    float wd, momentum, w, neg_lr;  // w = 1 - dampening
    int nesterov, first;            // first: the momentum buffer starts as g
} fc_sgd_coeffs;

fc_adamw_coeffs fc_adamw_coeffs_at(const fc_optim_config *c, long step);
fc_sgd_coeffs fc_sgd_coeffs_at(const fc_optim_config *c, long step);

// torch.lerp's two-branch formula (CPU kernel), chosen for accuracy near w = 1.
static inline FC_HD float fc_lerp(float self, float end, float w) {
    return w < 0.5f ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

static inline FC_HD void fc_adamw_elem(float *p, float g, float *m, float *v,
                                       const fc_adamw_coeffs *k) {
    float pv = *p * k->decay;
    float mv = fc_lerp(*m, g, k->w1);
    float vv = *v * k->beta2 + k->w2 * g * g;
    float denom = sqrtf(vv) / k->bc2_sqrt + k->eps;
    *p = pv + k->neg_step * mv / denom;
    *m = mv;
    *v = vv;
}

static inline FC_HD void fc_sgd_elem(float *p, float g, float *buf, const fc_sgd_coeffs *k) {
    if (k->wd != 0.0f) g = g + k->wd * *p;
    if (k->momentum != 0.0f) {
        float b = k->first ? g : *buf * k->momentum + k->w * g;
        *buf = b;
        g = k->nesterov ? g + k->momentum * b : b;
    }
    *p = *p + k->neg_lr * g;
}

// Updates n elements in place. state0/state1: exp_avg/exp_avg_sq (AdamW) or
// momentum_buffer/unused (SGD). step counts from 1.
void fc_optim_update(const fc_optim_config *c, long step, float *p, const float *g, float *state0,
                     float *state1, size_t n);

// State tensors the optimizer keeps per parameter, as named in torch's
// state_dict ("exp_avg", "exp_avg_sq" / "momentum_buffer"); returns the count.
int fc_optim_state_names(const fc_optim_config *c, const char *names[2]);

FC_END_DECLS

#endif
