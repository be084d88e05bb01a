// oracle/theory.h — the property engine of P10 (comm log) and P11 (memory):
// what a correct FSDP implementation's schedule and memory figures must be,
// derived from the config, the model registry (core/model.h) and the layout
// and schedule rules (core/layout.h) alone. Nothing here knows how any
// implementation works inside, so the sweep, `check` and the MPI programs
// judge the reference and a hardware port by the same theory (docs/contract.md §5, §8).
//
// Both checks look at one rank: its comm log (core/schedule.h) holds every
// collective it issued, every wait, every compute and free, in issue order,
// and its memory figures the per-category peaks. A finding is one violation,
// one line saying what the theory expected and what the rank did.
#ifndef FC_THEORY_H
#define FC_THEORY_H

#include "config.h"
#include "findings.h"  // fc_findings, fc_sched_api
#include "schedule.h"

// P10: this rank's comm log (all steps of a run of cfg at world size W, this
// rank = rank) against the theory: per step and micro-batch the counts, bytes
// and dtypes of every collective (all_gather, reduce_scatter, every
// all_reduce: DDP's, the hybrid replicas', the norm's), waits matching
// issues, compute only on completed gathers, frees, the issue order the
// prefetch policy (forward_prefetch, backward_prefetch pre/post/none)
// implies, and the limiter's bound. The log's steps are cfg->steps
// consecutive ones (a resumed run starts past 0). Returns the number of
// violations added.
int fc_theory_check_schedule(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, fc_findings *out);

// fc_theory_check_schedule for a log of api (findings.h).
int fc_theory_check_schedule_as(const fc_run_config *cfg, int W, int rank, fc_sched_api api, const fc_comm_log *log,
                                fc_findings *out);

// P11: this rank's memory figures: param_shards, grad_shards and optim_state
// exactly the sharded formula (params + grads + optimizer state / shard
// group, in the right location: host under cpu_offload); gathered_params'
// peak equal to the peak of gathered units the comm log itself shows, within
// what the prefetch policy allows; gathered_grads no more than the schedule
// needs (> 0 when sharded); activations and comm_buffers reported (nonzero)
// but never compared with any implementation's own layout. Returns the
// number of violations added.
int fc_theory_check_memory(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, const fc_mem_stats *mem,
                           fc_findings *out);

#endif
