// core/schedule.h — what an implementation reports about how it trained:
// the comm log (every collective and compute event, in issue order) and the
// per-category memory figures. Both are plain data in the contract, so the
// oracle checks a port's schedule and memory against the same theory as the
// reference's (P10, P11).
#ifndef FC_SCHEDULE_H
#define FC_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "dtype.h"
#include "hd.h"

FC_BEGIN_DECLS

typedef enum {
    FC_OP_ALL_GATHER,       // issue of a non-blocking all-gather of a unit's parameters
    FC_OP_REDUCE_SCATTER,   // issue of a gradient reduce-scatter
    FC_OP_ALL_REDUCE,       // issue of an all-reduce (DDP gradients, HSDP replicas, norms)
    FC_OP_WAIT,             // completion of an earlier collective (`of` says which)
    FC_OP_FORWARD,          // forward compute of a stage
    FC_OP_BACKWARD,         // backward compute of a stage
    FC_OP_FREE,             // a unit's gathered parameters freed (reshard)
    FC_OP_H2D,              // cpu_offload: a shard copied host -> device
    FC_OP_D2H,              // cpu_offload: a shard copied device -> host
    FC_OP_OPTIM,            // optimizer step over this rank's shard of a unit
    FC_OP_COUNT
} fc_op;

// RECOMPUTE: activation checkpointing's forward of a unit during backward,
// with the all-gather and free that recompute itself issues.
typedef enum { FC_PHASE_FORWARD, FC_PHASE_BACKWARD, FC_PHASE_CLIP, FC_PHASE_OPTIM, FC_PHASE_RECOMPUTE } fc_phase;
#define FC_PHASE_COUNT 5
// POST_FORWARD: FSDP2's integer reshard_after_forward, the groups of R ranks
// whose backward all-gather rebuilds a unit from the slices kept after forward
typedef enum { FC_GROUP_NONE, FC_GROUP_WORLD, FC_GROUP_SHARD, FC_GROUP_REPLICATE, FC_GROUP_POST_FORWARD } fc_group;
#define FC_GROUP_COUNT 5

typedef struct {
    long step;          // 0-based global step
    int micro;          // micro-batch within the step
    int order;          // position in this rank's event sequence for the step
    fc_op op;
    fc_op of;           // for FC_OP_WAIT: the op being completed
    int unit;           // -1 when not about one unit (e.g. the norm all-reduce)
    int stage;          // for FORWARD/BACKWARD: the stage index, else -1
    fc_group group;
    size_t bytes;       // collective: the full (padded) buffer in its dtype; copies: bytes moved
    fc_prec dtype;      // dtype of the collective's data
    fc_phase phase;
    int prefetch;       // 1 when the all-gather was issued ahead of need
} fc_event;

typedef struct {
    fc_event *ev;
    size_t n, cap;
    long step;
    int micro;
    int order;
} fc_comm_log;

void fc_log_init(fc_comm_log *log);
void fc_log_free(fc_comm_log *log);
// Starts a new step (order restarts at 0).
void fc_log_begin_step(fc_comm_log *log, long step);
// Appends an event; fills step, micro and order.
void fc_log_add(fc_comm_log *log, fc_event ev);
// Appends an event as it is (a log read back from a file keeps its own fields).
void fc_log_push(fc_comm_log *log, const fc_event *ev);
// The same from its fields (unit, stage -1 where none; `of` is the op a wait completes).
void fc_log_event(fc_comm_log *log, fc_op op, fc_op of, int unit, int stage, fc_group group, size_t bytes,
                  fc_prec dtype, fc_phase phase, int prefetch);
const char *fc_op_name(fc_op op);
const char *fc_phase_name(fc_phase p);
const char *fc_group_name(fc_group g);
// One JSON object per line: {"rank":..,"step":..,"order":..,"op":"all_gather",...}
void fc_log_write_jsonl(const fc_comm_log *log, int rank, FILE *f);

// Memory categories of docs/contract.md §5 / issue: every engine allocation is tagged.
typedef enum {
    FC_MEM_PARAM_SHARD,
    FC_MEM_GRAD_SHARD,
    FC_MEM_OPTIM_STATE,
    FC_MEM_GATHERED_PARAMS,
    FC_MEM_GATHERED_GRADS,
    FC_MEM_ACTIVATIONS,
    FC_MEM_COMM_BUFFERS,
    FC_MEM_COUNT
} fc_mem_cat;

typedef enum { FC_LOC_DEVICE, FC_LOC_HOST, FC_LOC_COUNT } fc_mem_loc;

typedef struct {
    size_t cur[FC_LOC_COUNT][FC_MEM_COUNT];
    size_t peak[FC_LOC_COUNT][FC_MEM_COUNT];   // peak of each category on its own
    size_t cur_total[FC_LOC_COUNT];
    size_t peak_total[FC_LOC_COUNT];           // peak of the sum over categories
} fc_mem_stats;

const char *fc_mem_cat_name(fc_mem_cat c);
const char *fc_mem_loc_name(fc_mem_loc l);
// Accounting only (the caller allocates): bytes counted under (loc, cat).
void fc_mem_add(fc_mem_stats *m, fc_mem_loc loc, fc_mem_cat cat, size_t bytes);
void fc_mem_sub(fc_mem_stats *m, fc_mem_loc loc, fc_mem_cat cat, size_t bytes);

FC_END_DECLS

#endif
