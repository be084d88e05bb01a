// optimized/enc_buckets.h — the token buckets of the embedding backward,
// built on the host (pure C, unit-tested on a CPU).
//
// dwte[v] gets the sum of the output gradient rows at every position whose
// token is v. Summing them with atomics would make the result depend on
// timing; instead the host, which generated the tokens, sorts the positions
// by (token, position), and the kernel gives each distinct token one thread
// per channel that adds its rows in position order, then adds the sum to
// dwte[v] once: the reference's order exactly (reference/layers.c).
#ifndef FC_CUDA_ENC_BUCKETS_H
#define FC_CUDA_ENC_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"

FC_BEGIN_DECLS

// ids [n] in [0, V). Fills tok [n_tok] (distinct tokens, ascending),
// off [n_tok + 1] (bucket j is pos[off[j] .. off[j+1])), pos [n] (positions,
// ascending within a bucket); count [V] is scratch. Returns n_tok.
int fc_enc_buckets(const int32_t *ids, int n, int V, int32_t *count, int32_t *tok, int32_t *off, int32_t *pos);

FC_END_DECLS

#endif
