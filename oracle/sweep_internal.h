// oracle/sweep_internal.h — what the sweep's files share (sweep.c the
// command, sweep_draw.c the cases, sweep_case.c one checked case,
// sweep_shrink.c the shrinker). Nothing outside the sweep uses it.
#ifndef FC_SWEEP_INTERNAL_H
#define FC_SWEEP_INTERNAL_H

#include <stdint.h>

#include "impl.h"
#include "sweep.h"

typedef struct {
    const fc_impl_ops *tested;   // the implementation under test
    const fc_impl_ops *ref;      // the clean reference (baselines)
    int tested_is_ref;           // its runs against the reference's are bitwise where the tree is one
    int same_bits;               // its own runs at one W and tree are bitwise (fc_impl_claims_same_bits)
    int repeatable;              // the same case twice is bitwise (fc_impl_claims_repeatable)
    fc_fault inject;             // injected into the tested implementation (the fault catalogue build)
    fc_prop expect;              // the property the catalogue expects to catch it (fc_fault_property), 0 if none
    int rank, W;
    // sub[w], w = 1..W: world ranks 0..w-1, MPI_COMM_NULL on the others. Made
    // once per job: MPI_Comm_split is the costliest collective there is under
    // MPICH when ranks outnumber cores.
    MPI_Comm *sub;
} fc_sweep_ctx;

// Makes and frees x->sub (collective over MPI_COMM_WORLD).
void fc_sweep_subs_make(fc_sweep_ctx *x);
void fc_sweep_subs_free(fc_sweep_ctx *x);

double fc_sweep_now(void);

// Cases (sweep_draw.c): what the draws of one sweep share. The draw redraws
// what the validator refuses, so a validator (or a rule it asks, core/layout.c)
// wrong about one strategy would quietly take that strategy out of the sweep:
// drawn and kept count the draws per strategy, and fc_sweep_draw_starved says so.
typedef struct {
    uint64_t seed;                 // the seeded stream's state
    int world;                     // cases are drawn at W' = 1..world
    unsigned fsdp_versions;        // the tested implementation's (core/impl.h), narrowed to an injected
                                   // fault's (fc_fault_versions): FSDP1 and FSDP2 are drawn only among them
    unsigned features;             // the tested implementation's: activation checkpointing, llama, freezing
    fc_fault inject;               // the fault the cases run with (FC_FAULT_NONE for none): a case it
                                   // does not apply to is redrawn, as the validator refuses it
    long drawn[FC_STRATEGY_COUNT]; // draws per strategy
    long kept[FC_STRATEGY_COUNT];  // of them, those the config validator let through
} fc_sweep_drawer;

// A seeded random case at a world size W' <= d->world; c->inject stays NONE.
void fc_sweep_draw(fc_sweep_drawer *d, fc_run_config *c, int *W, fc_case_ckpt *k);
// After the draws: 1, with msg saying which, when a strategy was drawn at least
// FC_SWEEP_STARVED_DRAWS times and the config validator refused every draw.
#define FC_SWEEP_STARVED_DRAWS 20
int fc_sweep_draw_starved(const fc_sweep_drawer *d, char *msg, size_t cap);
// The case as `run` flags (replayable with `sweep --replay`), what reports name it by.
void fc_sweep_case_spec(const fc_run_config *c, const fc_case_ckpt *k, char *out, size_t cap);
void fc_sweep_set_model(fc_run_config *c, const char *name);
// The global batch of a case: divisible by W' and K, m samples per micro-batch.
void fc_sweep_set_batch(fc_run_config *c, int W, int m);

// One case at W' ranks (sweep_case.c); every rank of the world calls it and
// gets the same verdict back (rank 0 decides).
void fc_sweep_run_case(const fc_sweep_ctx *x, const fc_run_config *cfg, int W, const fc_case_ckpt *k,
                       fc_case_result *res);

// Simpler variants of a failing case, kept while they still fail (sweep_shrink.c).
void fc_sweep_shrink(const fc_sweep_ctx *x, fc_case_result *worst, int quiet);
// Simplification k (0 <= k < FC_SWEEP_N_SIMPLIFY) of (c, W, ck) in place: 1
// if it applies and leaves a valid case. `sweep --replay CASE --candidates`
// prints them, for a shrinker outside the job (a case that hangs ends its job).
#define FC_SWEEP_N_SIMPLIFY 24
int fc_sweep_simplify(int k, fc_run_config *c, int *W, fc_case_ckpt *ck);

#endif
