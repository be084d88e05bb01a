// optimized/staged.c — see staged.h.
#include "staged.h"

#include <stdint.h>

static float load(fc_prec p, const void *b, size_t i) {
    if (p == FC_PREC_FP32) return ((const float *)b)[i];
    uint16_t h = ((const uint16_t *)b)[i];
    return p == FC_PREC_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
}

static void store(fc_prec p, void *b, size_t i, float x) {
    if (p == FC_PREC_FP32)
        ((float *)b)[i] = x;
    else
        ((uint16_t *)b)[i] = p == FC_PREC_BF16 ? fc_f32_to_bf16(x) : fc_f32_to_f16(x);
}

void fc_staged_sum(fc_prec p, const void *in, int G, size_t S, void *out) {
    for (size_t i = 0; i < S; i++) {
        float acc = load(p, in, i);
        for (int j = 1; j < G; j++) acc = fc_round(p, acc + load(p, in, (size_t)j * S + i));
        store(p, out, i, acc);
    }
}
