// oracle/trace.h — the trace a run writes (DESIGN §6) and `compare` reads.
//
//   DIR/trace.json               format, version, implementation, world size, config
//   DIR/init.safetensors         the initial weights, model names
//   DIR/step-NNNNNN.safetensors  loss, batch.input, batch.target, grad.<name>,
//                                param.<name>, optim.<state>.<name>
#ifndef FC_TRACE_H
#define FC_TRACE_H

#include "check.h"
#include "config.h"
#include "data.h"
#include "model.h"

#define FC_TRACE_FORMAT "fsdpcheck-trace"
#define FC_TRACE_VERSION 1

// Everything one step contributes; all tensors are full, in model layout.
typedef struct {
    long step;                 // 0-based global step number
    float loss;                // global mean loss
    const fc_batch *batch;     // the global batch
    const float *grads;        // [numel] after reduction/divide/accumulation, before clipping
    const float *params;       // [numel] after the optimizer step
    int n_state;
    const char *state_names[2];
    const float *state[2];     // [numel] each
} fc_trace_step;

// Creates DIR and writes trace.json and init.safetensors.
int fc_trace_begin(const char *dir, const fc_run_config *cfg, const fc_model *m, int world,
                   const float *init_params, fc_error *e);
int fc_trace_write_step(const char *dir, const fc_model *m, const fc_trace_step *s, fc_error *e);

#endif
