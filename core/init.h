// core/init.h — initial weights as a pure function of (seed, name, index).
//
// Element i of parameter p is drawn from Philox(key = seed, counter =
// (hash(p.name), i)), so any rank can initialise exactly its shard and every
// world size, strategy and implementation starts from the same bits.
#ifndef FC_INIT_H
#define FC_INIT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "hd.h"

FC_BEGIN_DECLS

float fc_init_value(const fc_param *p, uint64_t seed, size_t index);
// out[0..n) = elements [first, first+n) of p.
void fc_init_range(const fc_param *p, uint64_t seed, size_t first, size_t n, float *out);
// The initial values of unit u's elements [lo, hi) (its own order) into
// out[hi - lo]: counter-based from seed, or from a whole model's weights
// (from_file, [m->numel] in model layout). So each rank makes only its shard.
void fc_init_unit_range(const fc_model *m, int u, uint64_t seed, const float *from_file, size_t lo, size_t hi,
                        float *out);
// The whole model into its full flat buffer (m->numel floats).
void fc_init_full(const fc_model *m, uint64_t seed, float *full);

FC_END_DECLS

#endif
