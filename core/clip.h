// core/clip.h — clip_grad_norm (DESIGN §4), written once.
//
// torch.nn.utils.clip_grad_norm_ over the global gradient: the total norm
// (type 1, 2 or inf) of every gradient element, then every gradient is scaled
// by max_norm / (total + 1e-6) when that is below 1. A sharded run computes
// the total from partial norms: each rank accumulates over the elements it
// owns (never padding), the partials are gathered and combined in rank order,
// so every strategy at one W adds the same numbers in the same order.
#ifndef FC_CLIP_H
#define FC_CLIP_H

#include <stddef.h>

#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

// Adds n gradient elements to a partial norm, in double: the sum of |g|
// (type 1), of g^2 (type 2), or the max |g| (inf). Resumable over pieces.
double fc_grad_norm_accumulate(double acc, const float *g, size_t n, fc_norm_type type);
// Combines G partial norms in rank order (a sum, or the max for inf) and
// finishes the total (the square root for type 2).
double fc_grad_norm_combine(const double *parts, int G, fc_norm_type type);
// The total norm of one whole gradient buffer.
double fc_grad_norm(const float *g, size_t n, fc_norm_type type);
// The clip coefficient max_norm / (total + 1e-6) in fp32, as torch computes
// it; the gradient is scaled only when it is below 1 (torch clamps it to 1).
float fc_clip_coef(float max_norm, double total);
int fc_clip_applies(float max_norm, float coef);

FC_END_DECLS

#endif
