// optimized/model_cu.h — the mlp, gpt2 and llama models as stages on the
// device: stage s of core/model.h computed from unit stages[s].unit's
// parameters alone (so the engine can gather one unit at a time), in the
// reference's structure (reference/forward.c, reference/forward_llama.c) over
// the kernels of kernels.h. Frozen parameters (--freeze, LoRA's base) get no
// gradient computed: their slots in ug are never written.
#ifndef FC_CUDA_MODEL_CU_H
#define FC_CUDA_MODEL_CU_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "acts.h"
#include "kernels.h"
#include "model.h"

FC_BEGIN_DECLS

// One micro-batch on the device.
typedef struct {
    const int32_t *input;   // gpt2, llama [B,T]
    const int32_t *target;  // gpt2, llama [B,T]; mlp [B]
    const float *features;  // mlp [B, in] fp32
    const int32_t *tok, *off, *pos;  // gpt2, llama: the encoder's token buckets (enc_buckets.h)
    int n_tok;
} fc_cu_batch;

typedef struct fc_cu_model fc_cu_model;

// acts: device memory of 2 * layout->half bytes (activations, then their
// gradients), laid out by layout (acts.h) for micro-batches of B samples.
// llama: RoPE's tables are uploaded into acts on st, which create waits for.
fc_cu_model *fc_cu_model_create(const fc_model *m, const fc_cu_acts *layout, void *acts, fc_prec p, fck_mm *mm,
                                cudaStream_t st);
void fc_cu_model_destroy(fc_cu_model *cm);

// Stage s forward; the first stage clears the activation gradients, the last
// computes the row losses and, fused, the logits' gradient (loss_scale).
void fc_cu_stage_forward(fc_cu_model *cm, int s, void *const *up, const fc_cu_batch *b, float loss_scale,
                         cudaStream_t st);
// Stage s backward, accumulating into ug[unit] (param_dtype, FlatParameter
// order) the gradients of the unit's trainable parameters only. ug[unit] NULL
// (a unit with no trainable parameter: the engine keeps no gradient for it):
// the activation gradients alone, no parameter gradient written.
void fc_cu_stage_backward(fc_cu_model *cm, int s, void *const *up, void *const *ug, const fc_cu_batch *b,
                          cudaStream_t st);
// The device pointer of the row losses [NT] fp32 of the last forward.
const float *fc_cu_losses(const fc_cu_model *cm);

FC_END_DECLS

#endif
