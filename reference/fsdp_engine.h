// reference/fsdp_engine.h — the state of the reference FSDP engine (fsdp.c),
// in one place: what a rank holds of each unit, its groups and communicators,
// the reduction in flight, its comm log and memory accounting. fsdp.c is the
// engine; the fault catalogue build (reference/faults/) reads this state too.
#ifndef FC_FSDP_ENGINE_H
#define FC_FSDP_ENGINE_H

#include <mpi.h>

#include "data.h"
#include "forward.h"
#include "fsdp.h"
#include "layout.h"

typedef struct {
    // the unit's layout on this rank (core/layout.h: FSDP1 flat, FSDP2 per-parameter)
    size_t numel;        // N: real elements
    size_t shard;        // S: elements per rank in the reduction (and shard) layout
    size_t padded;       // P = S * G
    size_t own_off;      // flat: first element of this rank's chunk, idx * S
    size_t own_valid;    // elements of this rank's chunk that are not padding
    size_t store;        // elements this rank stores: S (sharded) or N (no_shard)
    fc_piece *pieces;    // [G * max_pieces] where each chunk's real elements sit in the unit
    int *n_pieces;       // [G] (sharded; an empty flat chunk is one empty piece)
    fc_piece *own;       // this rank's: pieces + idx * max_pieces
    int n_own;
    size_t gathered_numel;  // elements of `gathered`: P (flat: the wire order is the unit's) or N
    float *param;        // [store] fp32 master parameters (shard, or all of them)
    float *grad;         // [store] fp32 reduced gradient, accumulated over micro-batches
    float *state[2];     // [store] optimizer state
    float *gathered;     // [P] (or [N] for no_shard) compute parameters; NULL when freed
    int gathered_owned;  // gathered is an allocation (not an alias of param)
    int ag_pending;      // an all-gather into gathered is in flight
    int ag_prefetched;   // ... and it was issued ahead of need
    int ag_from_slice;   // ... and it rebuilds the unit from the post-forward slices (ag_send is one)
    void *pf_slice;      // [P / PF] param_dtype: FSDP2's integer reshard_after_forward, this rank's
                         // slice of the wire order kept from forward to backward; NULL when none
    MPI_Request ag_req;
    void *ag_send, *ag_recv;  // packed param_dtype buffers of the all-gather
    float *full_grad;    // [gathered_numel] unsharded gradient, alive from first backward stage to reduce
    int reshard_after_forward;
    int ckpt;            // activation checkpointing recomputes its forward in backward
    int trains;          // a parameter of the unit trains: else it has no gradient and reduces nothing
} unit_state;

struct fc_fsdp {
    fc_run_config cfg;
    fc_model m;
    fc_groups g;         // W, rank, shard group F, replicas R, ... (core/layout.h)
    const fc_layout_ops *lay;  // FSDP1's flat chunks or FSDP2's per-parameter rows
    MPI_Comm world;      // duplicate of the caller's communicator
    MPI_Comm shard;      // the G ranks of the reduction layout (the shard group, or all for no_shard)
    MPI_Comm replica;    // the ranks holding the same chunk (hybrid replicas)
    MPI_Comm post_fwd;   // FSDP2's integer reshard_after_forward: the PF ranks sharing slices (else NULL)
    float pre, post;     // gradient divide factors
    unit_state *u;       // [n_units]
    fc_unit_stages *st;  // [n_units] the stages that use each unit
    int *prefetch_list;  // [n_units] scratch: the units one prefetch call issues
    int alive;           // units whose gathered parameters exist (sharded strategies)
    // the reduction in flight (at most one, like FSDP's post-backward stream)
    int rs_unit;
    MPI_Request rs_req;
    void *rs_send, *rs_recv;
    // data and activations of this rank
    fc_batch batch;      // [B/W] samples of the current step
    int micro;           // samples per micro-batch
    float *act_mem;
    fc_acts acts;
    fc_stage_region *act_region;  // [n_stages] what each stage writes of the activation half
    size_t *act_held;    // [n_stages] elements of it counted as held (from lo, out or hi to hi)
    const float **up;    // [n_units] stage parameter table
    float **ug;          // [n_units] stage gradient table
    int n_state;
    const char *state_names[2];
    long step;
    fc_comm_log log;
    fc_mem_stats mem;
    void *seam_state;    // owned by the build's seams (reference/*/seams.h); NULL in the plain build
};

#endif
