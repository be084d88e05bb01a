// core/data.h — training data as a pure function of (seed, step, sample).
//
// The global batch of step t is samples 0..B-1 of step t; a data-parallel rank
// takes a contiguous range of them. Since every sample is generated on its
// own, a rank's slice is bitwise the same as that range of the global batch.
#ifndef FC_DATA_H
#define FC_DATA_H

#include <stdint.h>

#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

typedef struct {
    fc_model_kind kind;
    int B;              // samples in this batch
    int T;              // gpt2: tokens per sample (input length); mlp: 0
    int in_dim;         // mlp: features per sample
    float *features;    // mlp  [B, in_dim]
    int32_t *input;     // gpt2 [B, T]   tokens[0:T] of each sample
    int32_t *target;    // gpt2 [B, T]   tokens[1:T+1]; mlp [B] class ids
} fc_batch;

// Allocates a batch of B samples (T = seq_len for gpt2).
void fc_batch_alloc(fc_batch *b, const fc_model_config *cfg, int B, int T);
void fc_batch_free(fc_batch *b);
// Fills b with samples [first, first + b->B) of step `step`.
void fc_data_fill(fc_batch *b, const fc_model_config *cfg, uint64_t seed, int64_t step,
                  int64_t first);
// A view of samples [first, first+n) of b (no copy; for micro-batches).
fc_batch fc_batch_slice(const fc_batch *b, int first, int n);

FC_END_DECLS

#endif
