// oracle/props.h — the property engine's verdicts (docs/contract.md §8): which
// properties a case checked and failed, how close every check came to its
// tolerance, and the first failure in words. The sweep and the MPI property
// programs record into it; every numeric comparison goes through the one
// comparison engine (compare.h), every schedule and memory check through the
// one theory (theory.h).
#ifndef FC_PROPS_H
#define FC_PROPS_H

#include "compare.h"
#include "runner.h"
#include "signature.h"

// The properties of docs/contract.md §8, numbered as there: bit p of a verdict's masks
// is property p, and bit 0 marks a case that never finished (a timeout).
typedef enum {
    FC_P0_UNFINISHED = 0,       // not a property: the case hung and the watchdog ended it
    FC_P1_LOCAL = 1,            // == the `local` ground truth
    FC_P2_NO_SHARD = 2,         // no_shard == full_shard == shard_grad_op at the same W
    FC_P3_HYBRID = 3,           // hybrid_shard == full_shard at the same total W
    FC_P4_PREFETCH = 4,         // every prefetch setting == no prefetch
    FC_P5_WORLD_SIZE = 5,       // world-size invariance, uneven and empty shards included
    FC_P6_ACCUMULATION = 6,     // K accumulated micro-batches == one step on the joined batch
    FC_P7_CHECKPOINT = 7,       // train k, save, load at any W and strategy, train n == uninterrupted
    FC_P8_CLIP = 8,             // clip_grad_norm == the local model's
    FC_P9_MIXED_PRECISION = 9,  // mixed-precision FSDP == DDP under the same policy
    FC_P10_COMM_LOG = 10,       // every rank's comm log == the theory
    FC_P11_MEMORY = 11,         // every rank's peak memory == the sharded formula
    FC_P12_DETERMINISM = 12,    // the same run twice is bitwise identical
    FC_P13_FINITE_DIFF = 13,    // analytic gradients == finite differences
    FC_P14_CPU_OFFLOAD = 14,    // cpu_offload == no offload
    FC_P15_ACT_CKPT = 15,       // activation checkpointing == none, bitwise
    FC_NPROP = 16               // properties P1..P15 at index 1..15 (index 0 is no property)
} fc_prop;

// Short names of the properties, as reports print them ("== local ground truth", ...).
const char *fc_prop_name(int p);

typedef struct {
    unsigned checked;             // bit p set: property Pp was checked
    unsigned failed;              // bit p set: property Pp failed
    double max_abs[FC_NPROP];     // largest |a-b| per property
    double max_scaled[FC_NPROP];  // largest error relative to its tensor's scale
    double max_ulp[FC_NPROP];     // the same in ULPs at the tensor's scale
    double headroom[FC_NPROP];    // the largest judged error as a fraction of its tolerance (> 1: failed)
    char detail[768];             // the first failure: property, against what, step, tensor, element, values, rank
    char signature[FC_SIG_TEXT];  // what kind of wrong the first failure is (signature.h), "" where not judged
} fc_props;

// Records a check of property p; a failure keeps the first detail.
void fc_props_record(fc_props *r, fc_prop p, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

// One side of a comparison: a run, the config and world size it ran at, and
// the first of its steps compared.
typedef struct {
    const fc_run_config *cfg;     // the tested side's names element owners; the expected side's sets the precision
    int W;                        // its world size (the expected side's 0: the tested side's)
    const fc_run_result *run;
    int at;                       // its step compared first
} fc_side;

// A comparison of the tested run with the expected one under property p.
typedef struct {
    fc_prop p;
    const char *against;          // what the expected side is, as the detail names it ("no_shard")
    fc_side tested, expected;
    int n;                        // steps compared: tested [at, at+n) against expected [at, at+n)
    int bitwise;                  // bitwise, else the default policy of their precision
    int same_compute;             // both share their per-rank arithmetic (fc_cmp_policy_same_compute)
    const fc_run_result *lock;    // NULL, or the expected side in lockstep with the tested run
                                  // (fc_runner_lockstep): its step k >= 1 replaces expected's at + k
} fc_judgement;

// Judges j step by step through the comparison engine. With j->lock, every
// step after the first is judged against the expected implementation's step
// from the tested run's own state (docs/contract.md §8), never against a trajectory that
// has drifted. The first failing element becomes the detail ("P4 vs no
// prefetch: step 1, grad.layers.0.weight[3, 7]: ..., owned by rank 1 ...").
// Runs on the rank that holds the full tensors. Returns 1 if they agree.
int fc_props_compare(fc_props *r, const fc_judgement *j);

// The property a property-compare's kinds belong to is p itself: a norm
// mismatch found while comparing against no_shard is P9's or P2's, never P8's.

// The lowest property set in mask, 0 if none.
fc_prop fc_props_lowest(unsigned mask);

#endif
