// core/init.c — see init.h.
#include "init.h"

#include <string.h>

#include "rng.h"

// One element of p's init: a pure function of (seed, p's name hash, index).
static float init_value(const fc_param *p, uint64_t seed, uint64_t name_hash, size_t index) {
    switch (p->init) {
    case FC_INIT_ZEROS: return 0.0f;
    case FC_INIT_ONES: return 1.0f;
    case FC_INIT_NORMAL: {
        fc_u32x4 r = fc_philox(seed, name_hash, index);
        return p->init_scale * fc_normal_from(r);
    }
    case FC_INIT_UNIFORM: {
        fc_u32x4 r = fc_philox(seed, name_hash, index);
        return p->init_scale * (2.0f * fc_u01(r.v[0]) - 1.0f);
    }
    }
    return 0.0f;
}

float fc_init_value(const fc_param *p, uint64_t seed, size_t index) {
    return init_value(p, seed, fc_hash_str(p->name), index);
}

void fc_init_range(const fc_param *p, uint64_t seed, size_t first, size_t n, float *out) {
    // every element is its own pure function of its index: threads (core/threads.h)
    // split the range and change no bit; the name is hashed once, not per element
    const uint64_t h = fc_hash_str(p->name);
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) out[i] = init_value(p, seed, h, first + i);
}

void fc_init_full(const fc_model *m, uint64_t seed, float *full) {
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        fc_init_range(p, seed, 0, p->numel, full + p->offset);
    }
}

void fc_init_unit_range(const fc_model *m, int u, uint64_t seed, const float *from_file, size_t lo, size_t hi,
                        float *out) {
    const fc_unit *unit = &m->units[u];
    for (int k = 0; k < unit->n_params; k++) {
        const fc_param *p = &m->params[m->unit_params[unit->first_param + k]];
        size_t a = p->unit_offset, b = p->unit_offset + p->numel;  // p's range in the unit
        size_t s = a > lo ? a : lo, t = b < hi ? b : hi;
        if (s >= t) continue;
        if (from_file)
            memcpy(out + (s - lo), from_file + p->offset + (s - a), (t - s) * sizeof(float));
        else
            fc_init_range(p, seed, s - a, t - s, out + (s - lo));
    }
}
