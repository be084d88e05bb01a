// oracle/runner.h — runs an implementation through the contract and keeps
// what the properties compare. Shared by `sweep`, `check` and the MPI tests.
#ifndef FC_RUNNER_H
#define FC_RUNNER_H

#include <mpi.h>

#include "impl.h"
#include "trace.h"

// One step of a run: the step info, and on rank 0 of the run's communicator
// the full tensors after it (NULL elsewhere).
typedef struct {
    float loss;                        // global mean loss
    double norm;                       // total gradient norm
    float *grads, *params, *state[2];  // [numel] each
    const float *start;                // lockstep: the parameters the step started from (another run's; not owned)
} fc_run_step;

// What one run produced.
typedef struct {
    int ok;                            // 1 when create and every step succeeded
    char error[600];                   // else why not
    size_t numel;
    int steps, n_state;
    long first_step;                   // the global number of step[0] (a resumed run's continues)
    const char *state_names[2];
    float *init;                       // [numel] the parameters before step[0] (rank 0)
    fc_run_step *step;                 // [steps]
    fc_comm_log log;                   // this rank's comm log
    fc_mem_stats mem;                  // this rank's memory figures
    int act32;                         // the built-in reference ran: activations in fp32 (fc_cmp_ctx)
} fc_run_result;

// The `local` ground truth of a run of c at W data-parallel ranks: the same
// model, batch, accumulation, clipping, optimizer, precision and seed in one
// process, with no layout, schedule, offload, checkpointing or fault, and
// FSDP2's gradient divide factor F as F / W (config.h: the run's gradient is
// W / F times the mean, local's the mean / (F / W)).
fc_run_config fc_runner_local_of(fc_run_config c, int W);

// Whether ops is the built-in reference (or its fault catalogue), which
// computes activations in fp32 under 16-bit parameters (fc_cmp_ctx.b_act32).
int fc_runner_act32(const fc_impl_ops *ops);

// Step t of a run as the comparison engine sees it (no batch, the norm known).
fc_trace_step fc_run_trace_step(const fc_run_result *r, int t);

// Runs cfg->steps steps of `ops` on comm (collective over comm).
void fc_runner_run(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, fc_run_result *r);
// The same, saving a checkpoint of `kind` into dir after step at - 1 and
// going on: a round trip's uninterrupted run that is also the one that saved
// (for an implementation that does not repeat its bits, P7). A failed save
// leaves r->ok 0 with r->error set.
void fc_runner_run_saving(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, int at, const char *dir,
                          fc_state_dict kind, fc_run_result *r);
// The same, but the fresh instance first loads the checkpoint in load_dir,
// then runs cfg->steps more steps.
void fc_runner_resume(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const char *load_dir,
                      fc_run_result *r);
// The expected side of a comparison in lockstep with a tested run (docs/contract.md §8,
// "every step is judged in lockstep"): for k = 1 .. cfg->steps - 1, step k
// starts from `from`'s state after its step from0 + k - 1, its parameters and
// optimizer state, with the global step number first + k (the oracle's count,
// not the tested run's: a step count the tested run lost is its own error).
// The state travels as a FULL checkpoint that the oracle writes from the
// tested run's exported tensors (core/checkpoint.h) and the implementation
// loads (fc_impl_ops.load), so any implementation that loads checkpoints can be
// the expected side, through the contract alone. Step 0 is not run here
// (r->step[0] stays empty): it starts where both runs start, and the caller
// judges it against the expected run's own step. `from` holds its tensors on
// rank 0 of comm (world rank 0 in every caller); collective over comm.
void fc_runner_lockstep(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const fc_run_result *from,
                        int from0, long first, fc_run_result *r);
// The handover itself, for callers that step two implementations side by
// side (check): fc_lockstep_dir makes a directory for it (rank 0; every rank
// of comm learns the name, "" on failure; the caller removes it with
// fc_remove_flat_dir), and fc_lockstep_handover writes params and state
// (rank 0's, in model layout) there as a FULL checkpoint with step number
// `step` and has im load it. Collective over comm; -1 with e set on every rank.
void fc_lockstep_dir(MPI_Comm comm, char *dir, size_t cap);
// What export_full is asked for to get each tensor set of a step, in a trace
// step's order (trace.h): gradients, parameters, optimizer states 0 and 1.
extern const fc_export fc_step_set_exports[4];
int fc_lockstep_handover(const fc_impl_ops *ops, fc_impl *im, const fc_run_config *cfg, const float *params,
                         const float *const state[2], long step, const char *dir, MPI_Comm comm, fc_error *e);
// Runs `steps` steps and saves a checkpoint of kind `kind` into dir.
// Returns 0, or -1 with e set (on every rank).
int fc_runner_save(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, int steps, const char *dir,
                   fc_state_dict kind, fc_error *e);
void fc_runner_free(fc_run_result *r);
// Removes a directory of plain files the oracle made (a checkpoint), and its files.
void fc_remove_flat_dir(const char *dir);

// The implementation named by --impl: "reference" (built in) or a path to a
// shared library exporting FC_IMPL_ENTRY with the same FC_IMPL_ABI_VERSION.
const fc_impl_ops *fc_impl_resolve(const char *impl, fc_error *e);
// The implementation that runs cfg: ops itself, or, when cfg injects a fault
// (--inject), the reference's fault catalogue build, or ops itself when its
// table says it has the catalogue built in (FC_IMPL_FAULTS). NULL with e set
// when a fault is asked of an implementation without it.
const fc_impl_ops *fc_impl_for(const fc_impl_ops *ops, const fc_run_config *cfg, fc_error *e);
// What a table claims about its arithmetic (core/impl.h), the only ground for
// judging two of its runs bitwise (docs/contract.md §8): the same bits under
// every layout at one W and reduction tree (layout-invariant and
// deterministic), and the same bits when a run is repeated (deterministic).
int fc_impl_claims_same_bits(const fc_impl_ops *ops);
int fc_impl_claims_repeatable(const fc_impl_ops *ops);

// Ends an MPI command (run, check, sweep) on every rank with the usage exit
// code: the watchdog stopped and MPI finalized first, so no rank hangs or
// aborts; rank 0 alone prints the message, as fc_die does.
FC_NORETURN void fc_die_all(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
