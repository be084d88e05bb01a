// core/weights.h — loading full model weights from a safetensors file (--init).
#ifndef FC_WEIGHTS_H
#define FC_WEIGHTS_H

#include "check.h"
#include "model.h"
#include "hd.h"

FC_BEGIN_DECLS

// Reads every parameter of m from path into the full flat buffer `full`.
// Accepts fsdpcheck/Hugging Face names ("transformer.h.0..."), the Hub's
// prefix-less GPT-2 names ("h.0...", "wte.weight"), F32/BF16/F16 data, and
// skips what is not a parameter of a tied GPT-2 (lm_head.weight, the
// attn.bias / attn.masked_bias mask buffers). Anything else is refused: an
// unknown tensor, a missing or duplicated parameter, a shape mismatch.
int fc_weights_load(const fc_model *m, const char *path, float *full, fc_error *e);

FC_END_DECLS

#endif
