// reference/fsdp.h — the reference FSDP engine over MPI (DESIGN §4, §5).
//
// Every strategy but `local` (reference/local.h) runs here: no_shard (DDP),
// full_shard (ZeRO-3), shard_grad_op (ZeRO-2), hybrid_shard and
// hybrid_shard_zero2, with prefetch, the all-gather limiter, gradient
// accumulation with and without no_sync, clip_grad_norm, mixed precision,
// cpu_offload, a recorded comm log and tagged memory accounting.
#ifndef FC_FSDP_H
#define FC_FSDP_H

#include <mpi.h>

#include "impl.h"

typedef struct fc_fsdp fc_fsdp;

fc_fsdp *fc_fsdp_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e);
int fc_fsdp_step(fc_fsdp *f, fc_step_info *out, fc_error *e);
int fc_fsdp_export(fc_fsdp *f, fc_export what, float *dst, int root, fc_error *e);
const fc_comm_log *fc_fsdp_log(const fc_fsdp *f);
void fc_fsdp_memory(const fc_fsdp *f, fc_mem_stats *out);
void fc_fsdp_destroy(fc_fsdp *f);

// What this rank stores of unit u (for checkpoints). Elements are unit
// offsets: a sharded strategy stores [own_off, own_off + own_valid) at
// param[0..own_valid); no_shard stores all numel at param[0..numel) and
// "owns" the chunk [own_off, own_off + own_valid) of the W-way layout.
typedef struct {
    size_t numel, shard, padded, own_off, own_valid;
    int sharded;
    int writer;          // 1 on the ranks that write this chunk in a sharded
                         // checkpoint (hybrid: replica 0 of each shard)
    float *param, *state[2];
} fc_fsdp_unit_view;

void fc_fsdp_unit(fc_fsdp *f, int u, fc_fsdp_unit_view *v);
const fc_model *fc_fsdp_model(const fc_fsdp *f);
MPI_Comm fc_fsdp_comm(const fc_fsdp *f);      // the engine's duplicate of the world
long fc_fsdp_steps(const fc_fsdp *f);         // optimizer steps taken
void fc_fsdp_set_steps(fc_fsdp *f, long steps);

// PyTorch FSDP1's gradient pre-divide factor (_get_gradient_predivide_factor):
// starting at 1, double f while W % f == 0 and W / f > f; post = W / pre,
// which may be fractional (W = 3: pre 2, post 1.5).
double fc_predivide_factor(int W);

#endif
