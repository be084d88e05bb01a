// reference/forward_internal.h — what forward.c shares with the files of its
// other models (forward_llama.c): parameter lookup by name inside a unit's
// buffer, and the entry points forward.c dispatches to. Private to reference/.
#ifndef FC_FORWARD_INTERNAL_H
#define FC_FORWARD_INTERNAL_H

#include "forward.h"

// Parameter / gradient pointer by name pattern (names are the contract, so
// the math looks parameters up by name rather than by position), inside the
// buffer of the parameter's unit. Expect `m`, `up` (and `ug`) in scope.
static inline const fc_param *fc_param_of_(const fc_model *m, int i) { return &m->params[i]; }
#define PARAM_(fmt, ...) fc_param_of_(m, fc_model_param_index(m, fmt, __VA_ARGS__))
#define P(fmt, ...) \
    ((real *)up[PARAM_(fmt, __VA_ARGS__)->unit] + PARAM_(fmt, __VA_ARGS__)->unit_offset)
#define G(fmt, ...) (ug[PARAM_(fmt, __VA_ARGS__)->unit] + PARAM_(fmt, __VA_ARGS__)->unit_offset)

// llama (forward_llama.c): one decoder layer's activations, a whole half, and
// the stages, with forward.c's layout rules (encoded first, then the blocks,
// then the head's; each block's output, res3, last).
size_t RN(fc_llama_block_numel)(const fc_model_config *c, int B, int T);
size_t RN(fc_llama_half_numel)(const fc_model_config *c, int B, int T);
void RN(fc_llama_stage_forward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                                RN(fc_acts) *a);
void RN(fc_llama_stage_backward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                                 RN(fc_acts) *a, real *const *ug, real loss_scale);

#endif
