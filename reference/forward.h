// reference/forward.h — the reference model: forward and backward, stage by stage.
//
// A model is a list of stages (core/model.h); stage s needs only the
// parameters of unit stages[s].unit, which is what lets the FSDP engine gather
// one unit at a time. Stage functions therefore take per-unit base pointers:
// up[u] is unit u's flat parameter buffer (FlatParameter order, at least
// units[u].numel elements) and ug[u] its gradient buffer; a stage touches only
// up[unit] and ug[unit]. The whole-model helpers take full flat buffers
// (m->numel elements, model layout). Compiled as float and as double (RN()).
#ifndef FC_FORWARD_H
#define FC_FORWARD_H

#include <stddef.h>

#include "data.h"
#include "model.h"
#include "real.h"

// Activations of one micro-batch and, mirrored, their gradients.
typedef struct {
    int B, T;        // samples; tokens per sample (gpt2), 1 for mlp
    int NT;          // rows through the network: B*T
    size_t numel;    // elements in mem
    real *mem;       // one block: activations, then activation gradients
    real *acts, *grads;  // the two halves of mem, same layout
    real loss_sum;   // sum of the per-row losses of the last forward
} RN(fc_acts);

// Elements of activation memory one micro-batch of B samples needs (both halves).
size_t RN(fc_acts_numel)(const fc_model *m, int B, int T);
// Lays out acts over mem (RN(fc_acts_numel) elements, owned by the caller).
void RN(fc_acts_init)(RN(fc_acts) *a, const fc_model *m, int B, int T, real *mem);

// The part of the activation half that stage s writes in forward, as element
// offsets: [lo, hi), its output (the next stage's input) being the tail
// [out, hi). Activation checkpointing drops [lo, out) of a unit's stages
// after forward and recomputes it in backward; the gradient half mirrors it.
#ifndef FC_STAGE_REGION_DEFINED  // (this header is read once per precision)
#define FC_STAGE_REGION_DEFINED
typedef struct {
    size_t lo, out, hi;
} fc_stage_region;
#endif
fc_stage_region RN(fc_stage_acts_region)(const fc_model *m, int s, int B, int T);

// Stage s forward. The last stage also computes a->loss_sum.
void RN(fc_stage_forward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                          RN(fc_acts) *a);
// Stage s backward, accumulating into grads (full flat buffer). Must run in
// reverse stage order after a full forward. loss_scale is d(loss)/d(row
// loss), e.g. 1 / (rows in the mean) / (micro-batches accumulated).
void RN(fc_stage_backward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                           RN(fc_acts) *a, real *const *ug, real loss_scale);

// Convenience for one process: all stages. Returns the mean loss over rows.
real RN(fc_model_forward)(const fc_model *m, const real *params, const fc_batch *batch,
                          RN(fc_acts) *a);
void RN(fc_model_backward)(const fc_model *m, const real *params, const fc_batch *batch,
                           RN(fc_acts) *a, real *grads, real loss_scale);

#endif
