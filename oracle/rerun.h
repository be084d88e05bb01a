// oracle/rerun.h — the reference re-running a trace's steps in lockstep, for
// `compare` and `sensitivity` (docs/contract.md §8: every step judged from the tested
// implementation's own state).
//
// A trace records, after each step, everything the next step starts from:
// the fp32 parameters and the optimizer state (docs/contract.md §6), with the step
// number as the data position and the optimizer's step count. So step s of the
// expected side can be recomputed from B's record of step s - 1, on the same
// batch, instead of read from A's own trajectory, which a legitimately
// drifted run (AdamW turns rounding-level gradient differences into lr-sized
// parameter differences) would carry away from B. The reference runs it in
// this one process: `local` for fp32 policies, `no_shard` at W = 1 for mixed
// precision (local has none), with A's model, optimizer, batch, accumulation,
// clipping and precision. The state goes into the local reference in place
// (impl.h fc_reference_local_load: what its load would read from a FULL
// checkpoint of it, which mpi.test_rerun checks bit for bit), and into
// no_shard as a FULL checkpoint through the contract's load (runner.h,
// fc_lockstep_handover).
#ifndef FC_RERUN_H
#define FC_RERUN_H

#include "impl.h"
#include "trace.h"
#include "tracefile.h"

typedef struct {
    const fc_impl_ops *ops;
    fc_impl *im;
    fc_run_config cfg;     // what the reference runs (A's config, one process)
    char dir[256];         // the handover directory
    int n_state;
    const char *state_names[2];
    size_t numel;
    float *own;            // [4][numel]: fc_rerun_step's sets where the reference cannot lend its own
    int open;              // counted among the open re-runs (MPI is finalised after the last)
    // Set by the caller (NULL: none): where the local reference copies a
    // handover's params and state in place, each piece goes to release once
    // copied, as fc_trace_step.release (a view's pages dropped as read).
    fc_release_fn release;
    const void *release_arg;
} fc_rerun;

// The reference for re-running steps of a trace with config `like`.
// Initialises MPI (a singleton) when the process has not. -1 with e set when
// the reference cannot run that config (then `compare --trajectory` is the way).
// `world`: the data-parallel ranks `like` ran on. A run that set FSDP2's
// gradient divide factor F has (W / F) times the mean gradient, so the one
// process runs with F / W (config.h: local's mean over F).
// `init`: a safetensors file of the model's weights the reference starts
// from before the first step loads its own start (a trace's init.safetensors;
// any weights of the model do). NULL: the seed's, computed (gpt2-124m's 124M
// normals are seconds of work that the first handover overwrites).
int fc_rerun_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e);
// Step `step` from params/state (the tested run's after step - 1, [numel]
// each): out gets the loss, the norm and the tensors in bufs (bufs[0]
// gradients, bufs[1] parameters, bufs[2 + i] state i), prev_params = params.
// bufs NULL: out's tensors are the re-run's own, valid until its next step or
// close: the local reference's sets in place (fc_reference_local_sets: at
// gpt2-124m 2 GB neither copied nor newly touched), or else exported into
// memory the re-run keeps.
int fc_rerun_step(fc_rerun *r, long step, const float *params, const float *const state[2], float *const bufs[4],
                  fc_trace_step *out, fc_error *e);
// The magnitude pass (compare.h, 16-bit comparisons): like's step `step` from
// params, run by fc_reference_magnitude_impl() as `local` in fp32 with like's
// model, batch, accumulation and optimizer. mag [numel] gets, per gradient
// element, the sum of the magnitudes of the terms that formed it (before
// clipping). state travels with params (a checkpoint carries both); it changes
// no magnitude.
int fc_magnitude_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e);
int fc_magnitude_step(fc_rerun *r, long step, const float *params, const float *const state[2], float *mag,
                      fc_error *e);
// Whether B's first step `step` is re-run too, from B's initial weights and
// zero optimizer state: only where it is step 0 (where every run starts from
// its init and a fresh optimizer) and A holds no tensors of it (a plan,
// `fsdpcheck plan`, which ran no step). Every later step is re-run in lockstep
// from B's record of the step before. A re-run of the first step starts from
// B's init, so compare first requires it to be A's, bit for bit.
int fc_rerun_first_step(const fc_trace *ta, const fc_trace *tb, long step);
// The pieces of a step (oracle/signature.c): like's model and data, as the
// local reference in fp32, at world size `world`. fc_piece_grad: into out
// [numel], the gradient of the mean loss over samples [first, first + n) of
// step `step`'s global batch at params [numel], and into *loss their mean loss.
int fc_piece_open(fc_rerun *r, const fc_run_config *like, int world, const char *init, fc_error *e);
int fc_piece_grad(fc_rerun *r, const float *params, long step, int first, int n, float *out, float *loss, fc_error *e);
// Closes any kind (safe on a zeroed or failed one).
void fc_rerun_close(fc_rerun *r);

#endif
