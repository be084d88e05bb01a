// reference/local.h — the `local` strategy: one process, the whole global
// batch, no communication. It is the ground truth every FSDP strategy is
// compared with (P1), so it is the simplest possible training loop.
#ifndef FC_LOCAL_H
#define FC_LOCAL_H

#include "checkpoint.h"
#include "config.h"
#include "data.h"
#include "forward.h"
#include "model.h"

typedef struct {
    fc_run_config cfg;
    fc_model model;
    float *params;       // [numel] full flat buffer (model layout)
    float *grads;        // [numel] gradients of the last step, before clipping
    float *state[2];     // [numel] optimizer state (exp_avg/exp_avg_sq or momentum_buffer)
    int n_state;
    const char *state_names[2];
    fc_batch batch;      // the global batch of the last step
    float *act_mem;      // activations of one micro-batch (NULL until a step makes them)
    RN(fc_acts) acts;
    long step;           // optimizer steps taken
    float loss;          // global mean loss of the last step
    double grad_norm;    // total gradient norm of the last step (clip_grad_norm's)
} fc_local;

// Builds the model and initial weights (counter-based, or cfg->init_path).
int RN(fc_local_create)(fc_local *L, const fc_run_config *cfg, fc_error *e);
// Trains one step: forward/backward over K micro-batches, clip, optimizer.
void RN(fc_local_step)(fc_local *L);
void RN(fc_local_free)(fc_local *L);
// Frees the activations until the next step makes them again: the oracle's re-run
// holds none while it compares the step's results (fc_reference_local_sets).
void RN(fc_local_drop_acts)(fc_local *L);

// Checkpoints (docs/contract.md §6), as the engine's (core/ckpt_collective.h): the
// manifest records world size 1 and strategy local.
int RN(fc_local_save)(fc_local *L, const char *dir, fc_state_dict kind, fc_error *e);
int RN(fc_local_load)(fc_local *L, const char *dir, fc_error *e);
// What fc_local_load does with a FULL checkpoint of params and state [numel]
// each (model layout) saved at `step`, without the file: the parameters, the
// optimizer state of every trainable parameter (a frozen one has none: it
// reads as 0, as from a checkpoint, whatever state holds) and the step count.
// release (NULL: none) is called with each piece of params and state once it
// is copied, so that a caller reading them from a mapped file can drop the
// piece's pages at once instead of holding the whole state while it is read.
void RN(fc_local_set)(fc_local *L, const float *params, const float *const state[2], long step,
                      fc_release_fn release, const void *arg);
// The gradient of the mean loss over samples [first, first + n) of step
// `step`'s data at L's parameters, in one micro-batch, into out [numel] (a
// frozen parameter's is 0): one rank's or one micro-batch's piece of a step,
// which the oracle's failure signatures (oracle/signature.c) assemble.
// Returns the mean loss over those samples.
float RN(fc_local_piece_grad)(fc_local *L, long step, int first, int n, float *out);

#endif
