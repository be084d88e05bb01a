// core/optim.c — see optim.h.
#include "optim.h"

fc_adamw_coeffs fc_adamw_coeffs_at(const fc_optim_config *c, long step) {
    fc_adamw_coeffs k;
    double bc1 = 1.0 - pow(c->beta1, (double)step);
    double bc2 = 1.0 - pow(c->beta2, (double)step);
    k.decay = (float)(1.0 - c->lr * c->weight_decay);
    k.w1 = (float)(1.0 - c->beta1);
    k.beta2 = (float)c->beta2;
    k.w2 = (float)(1.0 - c->beta2);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)c->eps;
    k.neg_step = (float)(-(c->lr / bc1));
    return k;
}

fc_sgd_coeffs fc_sgd_coeffs_at(const fc_optim_config *c, long step) {
    fc_sgd_coeffs k;
    k.wd = (float)c->weight_decay;
    k.momentum = (float)c->momentum;
    k.w = (float)(1.0 - c->dampening);
    k.neg_lr = (float)(-c->lr);
    k.nesterov = c->nesterov;
    k.first = step == 1;
    return k;
}

void fc_optim_update(const fc_optim_config *c, long step, float *p, const float *g, float *state0,
                     float *state1, size_t n) {
    // element-wise: threads (core/threads.h) split the elements and change no bit
    if (c->kind == FC_OPT_ADAMW) {
        fc_adamw_coeffs k = fc_adamw_coeffs_at(c, step);
#pragma omp parallel for schedule(static) if (n >= 65536)
        for (size_t i = 0; i < n; i++) fc_adamw_elem(&p[i], g[i], &state0[i], &state1[i], &k);
    } else {
        fc_sgd_coeffs k = fc_sgd_coeffs_at(c, step);
        // without momentum there is no buffer (state0 == NULL) and none is touched
#pragma omp parallel for schedule(static) if (n >= 65536)
        for (size_t i = 0; i < n; i++) fc_sgd_elem(&p[i], g[i], state0 ? &state0[i] : NULL, &k);
    }
}

int fc_optim_state_names(const fc_optim_config *c, const char *names[2]) {
    if (c->kind == FC_OPT_ADAMW) {
        names[0] = "exp_avg";
        names[1] = "exp_avg_sq";
        return 2;
    }
    if (c->momentum == 0.0) return 0;  // torch keeps no buffer without momentum
    names[0] = "momentum_buffer";
    return 1;
}
