// core/ckpt_collective.h — the collective save and load of a checkpoint
// (docs/contract.md §6), written once for every implementation.
//
// An implementation describes what one rank holds (host views of its shards,
// in the flat layout of core/layout.h) and calls these on every rank of its
// communicator; the files, their crash-safe order, the verification and the
// agreement between ranks are all here. A device implementation passes staged
// host copies and copies back after a load.
//
//   FULL save      the writers' chunks are gathered to rank 0, which writes
//                  config.json, model.safetensors, optimizer.safetensors,
//                  then the manifest.
//                  (A chunk of pieces sends one gather per piece slot.)
//   SHARDED save   rank 0 removes the old manifest and writes config.json;
//                  then every writer writes its own chunks (FSDP1's flat
//                  layout: shard-RRRRR.safetensors; FSDP2's rows: DCP's
//                  files, rank 0's with AdamW's steps); sizes and hashes go
//                  to rank 0, which writes the manifest last.
//   load           rank 0 verifies everything (SHA-256 included) and tells
//                  the others; every rank then opens the checkpoint itself
//                  (headers only), makes sure it is the same one, and reads
//                  just the elements it stores, so its memory stays O(shard).
//
// Every rank returns the same verdict; on failure every rank's error holds
// the message of the lowest failing rank.
#ifndef FC_CKPT_COLLECTIVE_H
#define FC_CKPT_COLLECTIVE_H

#include <mpi.h>

#include "checkpoint.h"
#include "layout.h"
#include "hd.h"

FC_BEGIN_DECLS

// What one rank holds of one unit (host memory).
typedef struct {
    size_t numel;         // N: the unit's real elements
    size_t own_off;       // this rank's chunk of the unit: [own_off, own_off + own_valid)
    size_t own_valid;
    size_t store;         // elements at param[] and state[i][]
    int full_copy;        // param[i] is element i of the unit (no_shard, local);
                          // else param[i] is element own_off + i (a shard)
    float *param;         // [store]
    float *state[2];      // [store] the optimizer's states in order, NULL past n_state
    // Or, for a chunk that is not one range (FSDP2's rows, core/layout.h):
    // its pieces at their storage offsets (NULL: the range above), and the
    // most pieces any rank's chunk of this unit has (the same on every rank).
    const fc_piece *pieces;
    int n_pieces, max_pieces;
} fc_ckpt_unit_view;

// What one rank holds of the whole run.
typedef struct {
    MPI_Comm comm;                   // every rank of the run
    const fc_run_config *cfg;        // the run's config (recorded on save, checked on load)
    const fc_model *m;
    fc_strategy strategy;            // the strategy the manifest records
    long step;                       // optimizer steps taken (save)
    int writer;                      // this rank's chunks are written by a SHARDED save and
                                     // gathered by a FULL one: the writers' chunks tile
                                     // every unit once (replica 0 of each shard group)
    const fc_ckpt_unit_view *units;  // [m->n_units]
    int skew_offsets;                // DCP: saved_offsets recorded this many rows early (the
                                     // fault catalogue's dcp_saved_offsets; 0 otherwise)
} fc_ckpt_rank_view;


// The checkpoint tensor that fills parameter p's tensor t (0 = param, 1.. =
// the states) on load; NULL means itself. A renaming load, and the fault
// catalogue's ckpt_swap, use it.
typedef void (*fc_ckpt_source_fn)(void *ctx, int p, int t, int *src_p, int *src_t);

// kind SHARDED or DCP must be the view's layout's (fc_ckpt_sharded_kind).
int fc_ckpt_save_collective(const fc_ckpt_rank_view *v, const char *dir, fc_state_dict kind, fc_error *e);
// Fills every view's param and states (padding beyond own_valid is zeroed)
// and returns the checkpoint's step in *step. A refused checkpoint changes
// nothing; a read that fails after verification (an I/O error) leaves the
// views undefined, and the caller must not continue training.
int fc_ckpt_load_collective(const fc_ckpt_rank_view *v, const char *dir, fc_ckpt_source_fn source, void *ctx,
                            long *step, fc_error *e);

FC_END_DECLS

#endif
