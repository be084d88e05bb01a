// core/init.c — see init.h.
#include "init.h"

#include "rng.h"

float fc_init_value(const fc_param *p, uint64_t seed, size_t index) {
    switch (p->init) {
    case FC_INIT_ZEROS: return 0.0f;
    case FC_INIT_ONES: return 1.0f;
    case FC_INIT_NORMAL: {
        fc_u32x4 r = fc_philox(seed, fc_hash_str(p->name), index);
        return p->init_scale * fc_normal_from(r);
    }
    case FC_INIT_UNIFORM: {
        fc_u32x4 r = fc_philox(seed, fc_hash_str(p->name), index);
        return p->init_scale * (2.0f * fc_u01(r.v[0]) - 1.0f);
    }
    }
    return 0.0f;
}

void fc_init_range(const fc_param *p, uint64_t seed, size_t first, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = fc_init_value(p, seed, first + i);
}

void fc_init_full(const fc_model *m, uint64_t seed, float *full) {
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        fc_init_range(p, seed, 0, p->numel, full + p->offset);
    }
}
