// oracle/props.h — the property engine's verdicts (DESIGN §8): which
// properties a case checked and failed, how close every check came to its
// tolerance, and the first failure in words. The sweep and the MPI property
// programs record into it; every numeric comparison goes through the one
// comparison engine (compare.h), every schedule and memory check through the
// one theory (theory.h).
#ifndef FC_PROPS_H
#define FC_PROPS_H

#include "compare.h"
#include "runner.h"

#define FC_NPROP 16  // properties P1..P15 at index 1..15 (index 0 unused)

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
} fc_props;

// Records a check of property p; a failure keeps the first detail.
void fc_props_record(fc_props *r, int p, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

// What both runs of a comparison are.
typedef struct {
    const fc_run_config *cfg;     // the tested run's config (its layout names element owners)
    int W;                        // its world size
    const fc_run_config *against; // the expected run's config (the precision takes the less precise)
    int same_compute;             // both share their per-rank arithmetic (fc_cmp_policy_same_compute)
    const fc_run_result *lock;    // NULL, or the expected side in lockstep with the tested run
                                  // (fc_runner_lockstep): its step k >= 1 replaces expected's e0 + k
    int against_W;                // the expected run's world size (0: W)
} fc_props_pair;

// Compares the tested run with the expected one under property p, step by
// step through the comparison engine: tested steps [t0, t0+n) against
// expected steps [e0, e0+n), bitwise or under the default policy of their
// precision. With pair->lock, every step after the first is judged against
// the expected implementation's step from the tested run's own state (DESIGN
// §8), never against a trajectory that has drifted. The first failing element becomes the detail ("P4 vs no
// prefetch: step 1, grad.layers.0.weight[3, 7]: ..., owned by rank 1 ...").
// Runs on the rank that holds the full tensors. Returns 1 if they agree.
int fc_props_compare(fc_props *r, int p, const fc_props_pair *pair, const fc_run_result *tested, int t0,
                     const fc_run_result *expected, int e0, int n, int bitwise, const char *against);

// The property a property-compare's kinds belong to is p itself: a norm
// mismatch found while comparing against no_shard is P9's or P2's, never P8's.

// The lowest property set in mask, 0 if none.
int fc_props_lowest(unsigned mask);

#endif
