// optimized/staged.c — see staged.h.
#include "staged.h"

#include <stdint.h>

void fc_staged_sum(fc_prec p, const void *in, int G, size_t S, void *out) {
    for (size_t i = 0; i < S; i++) {
        float acc = fc_prec_load(p, in, i);
        for (int j = 1; j < G; j++) acc = fc_round(p, acc + fc_prec_load(p, in, (size_t)j * S + i));
        fc_prec_store(p, out, i, acc);
    }
}
