// oracle/trace.h — the trace a run writes (docs/contract.md §6) and `compare` reads.
//
//   DIR/trace.json               format, version, implementation, world size, config
//   DIR/init.safetensors         the initial weights, model names
//   DIR/step-NNNNNN.safetensors  loss, [grad_norm], batch.input, batch.target,
//                                grad.<name>, param.<name>, optim.<state>.<name>
//   grad_norm (F64, a scalar): the total gradient norm clip_grad_norm_ returned;
//   required when the config clips (clip_grad_norm > 0), optional otherwise.
#ifndef FC_TRACE_H
#define FC_TRACE_H

#include "check.h"
#include "config.h"
#include "data.h"
#include "model.h"
#include "safetensors.h"

#define FC_TRACE_FORMAT "fsdpcheck-trace"
#define FC_TRACE_VERSION 1

// Everything one step contributes; all tensors are full, in model layout.
typedef struct {
    long step;                 // 0-based global step number
    float loss;                // global mean loss
    int has_norm;              // grad_norm is known (a trace stores it when has_norm)
    double grad_norm;          // clip_grad_norm's total norm of the step's gradient
    const fc_batch *batch;     // the global batch
    const float *grads;        // [numel] after reduction/divide/accumulation, before clipping
    const float *params;       // [numel] after the optimizer step
    const float *prev_params;  // [numel] before it (the previous step's, or the initial ones); NULL: unknown
    int n_state;
    const char *state_names[2];
    const float *state[2];     // [numel] each
    const float *grad_mag;     // [numel] or NULL: per gradient element, the sum of |terms| that formed it
                               // (the magnitude pass, rerun.h; in memory only, the expected side's)
    // NULL, or what the comparison calls on elements [p, p + n) of a set once it
    // has read them (compare_model.h fc_cmp_release): views of mapped traces drop
    // their pages, re-read from the file if they are read again.
    fc_release_fn release;
    const void *release_arg;
} fc_trace_step;

// A trace being written. trace.json is written last, by fc_trace_finish, so a
// directory without it is an incomplete trace, and a reader refuses it.
typedef struct {
    char dir[1024];
    const fc_model *m;
    long first_step, steps_written;
    long tensor_steps;  // steps written with their tensor sets before the first without (-1: all so far)
    int planned;        // no step was run (fc_trace_begin_plan): step files hold the batch alone
    fc_st_stream st;  // the step file being written
} fc_trace_writer;

// Creates DIR, removes the trace files of an earlier run there (trace.json,
// step-*.safetensors; nothing else), and writes init.safetensors.
int fc_trace_begin(fc_trace_writer *w, const char *dir, const fc_model *m,
                   const float *init_params, fc_error *e);
// The same for a plan (`fsdpcheck plan`): a run's start and data, with no
// step run. Its step files hold the batch alone (open ignores s's loss and
// norm; sets must be 0), and trace.json says "planned": true, "tensor_steps":
// 0, so that compare re-runs each of its steps from B's state (rerun.h).
int fc_trace_begin_plan(fc_trace_writer *w, const char *dir, const fc_model *m, const float *init_params,
                        fc_error *e);
// A step file, written one tensor set at a time, so its writer never holds
// more than one [numel] set: open takes s's step, loss, norm, batch and state
// names (its grads, params and state are not read); put then takes the sets in
// file order, the gradients, the parameters, each optimizer state; commit
// makes the file (a failure leaves no file; fc_trace_abort after it).
// sets 0: the step file holds loss, norm and batch only, and so does every
// later one (`run --trace-tensors first`; trace.json says "tensor_steps").
int fc_trace_write_open(fc_trace_writer *w, const fc_trace_step *s, int sets, fc_error *e);
int fc_trace_write_put(fc_trace_writer *w, const float *set, fc_error *e);
int fc_trace_write_commit(fc_trace_writer *w, fc_error *e);
// Writes trace.json: format, version, implementation, world size, config, layout.
int fc_trace_finish(fc_trace_writer *w, const fc_run_config *cfg, int world, fc_error *e);
// After a failure: removes every file this writer wrote.
void fc_trace_abort(fc_trace_writer *w);

#endif
