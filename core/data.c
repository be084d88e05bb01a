// core/data.c — see data.h.
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"

void fc_batch_alloc(fc_batch *b, const fc_model_config *cfg, int B, int T) {
    memset(b, 0, sizeof *b);
    b->kind = cfg->kind;
    b->B = B;
    if (cfg->kind == FC_MODEL_MLP) {
        b->in_dim = cfg->dims[0];
        b->features = mallocCheck((size_t)B * (size_t)b->in_dim * sizeof(float));
        b->target = mallocCheck((size_t)B * sizeof(int32_t));
    } else {
        b->T = T;
        b->input = mallocCheck((size_t)B * (size_t)T * sizeof(int32_t));
        b->target = mallocCheck((size_t)B * (size_t)T * sizeof(int32_t));
    }
}

void fc_batch_free(fc_batch *b) {
    free(b->features);
    free(b->input);
    free(b->target);
    memset(b, 0, sizeof *b);
}

// The random block for element j of sample s of step t.
static fc_u32x4 draw(uint64_t seed, int64_t step, int64_t sample, int64_t j) {
    uint64_t stream = fc_mix64(fc_hash_str("fsdpcheck.data") ^ (uint64_t)step);
    return fc_philox(seed, stream, ((uint64_t)sample << 32) | (uint64_t)(uint32_t)j);
}

void fc_data_fill(fc_batch *b, const fc_model_config *cfg, uint64_t seed, int64_t step,
                  int64_t first) {
    for (int i = 0; i < b->B; i++) {
        int64_t s = first + i;
        if (cfg->kind == FC_MODEL_MLP) {
            // Features ~ N(0, 1); the class is a fixed function of the sign
            // pattern of the first features plus noise, so there is something
            // to learn, and every sample is independent of every other.
            int C = cfg->dims[cfg->n_layers];
            float *x = b->features + (size_t)i * (size_t)b->in_dim;
            for (int j = 0; j < b->in_dim; j++) x[j] = fc_normal_from(draw(seed, step, s, j));
            fc_u32x4 r = draw(seed, step, s, -1);
            uint32_t cls = (x[0] > 0) + 2u * (b->in_dim > 1 && x[1] > 0);
            if (r.v[0] % 4 == 0) cls = r.v[1];  // 1 in 4 labels is noise
            b->target[i] = (int32_t)(cls % (uint32_t)C);
        } else {
            // T+1 tokens: a noisy affine chain tok[j+1] = 3 tok[j] + 1 (mod V)
            // that a model can learn; input = tokens[0:T], target = tokens[1:T+1].
            int T = b->T;
            uint32_t V = (uint32_t)cfg->vocab_size;
            int32_t *in = b->input + (size_t)i * (size_t)T;
            int32_t *tg = b->target + (size_t)i * (size_t)T;
            uint32_t tok = draw(seed, step, s, 0).v[0] % V;
            for (int j = 0; j <= T; j++) {
                if (j > 0) {
                    fc_u32x4 r = draw(seed, step, s, j);
                    tok = (r.v[0] % 4 == 0) ? r.v[1] % V : (uint32_t)((3ull * tok + 1) % V);
                }
                if (j < T) in[j] = (int32_t)tok;
                if (j > 0) tg[j - 1] = (int32_t)tok;
            }
        }
    }
}

fc_batch fc_batch_slice(const fc_batch *b, int first, int n) {
    fc_batch v = *b;
    v.B = n;
    if (b->kind == FC_MODEL_MLP) {
        v.features = b->features + (size_t)first * (size_t)b->in_dim;
        v.target = b->target + first;
    } else {
        v.input = b->input + (size_t)first * (size_t)b->T;
        v.target = b->target + (size_t)first * (size_t)b->T;
    }
    return v;
}
