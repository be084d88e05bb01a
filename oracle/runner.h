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
} fc_run_result;

// Step t of a run as the comparison engine sees it (no batch, the norm known).
fc_trace_step fc_run_trace_step(const fc_run_result *r, int t);

// Runs cfg->steps steps of `ops` on comm (collective over comm).
void fc_runner_run(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, fc_run_result *r);
// The same, but the fresh instance first loads the checkpoint in load_dir,
// then runs cfg->steps more steps.
void fc_runner_resume(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const char *load_dir,
                      fc_run_result *r);
// Runs `steps` steps and saves a checkpoint of kind `kind` into dir.
// Returns 0, or -1 with e set (on every rank).
int fc_runner_save(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, int steps, const char *dir,
                   fc_state_dict kind, fc_error *e);
void fc_runner_free(fc_run_result *r);

// Waits for every rank of comm without spinning: ranks that have nothing to
// do (outside a sub-communicator, or while rank 0 computes alone) must not
// steal the cores from those that work, as MPICH's busy-polling would.
void fc_sleepy_barrier(MPI_Comm comm);

// The implementation named by --impl: "reference" (built in) or a path to a
// shared library exporting FC_IMPL_ENTRY with the same FC_IMPL_ABI_VERSION.
const fc_impl_ops *fc_impl_resolve(const char *impl, fc_error *e);
// The implementation that runs cfg: ops itself, or, when cfg injects a fault
// (--inject), the reference's fault catalogue build. NULL with e set when a
// fault is asked of another implementation (faults exist in the reference only).
const fc_impl_ops *fc_impl_for(const fc_impl_ops *ops, const fc_run_config *cfg, fc_error *e);

#endif
