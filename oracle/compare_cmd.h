// oracle/compare_cmd.h — what `compare` and `sensitivity` share: the two
// traces a comparison reads, A (expected) and B (under test), and how A's
// side of a step is judged (recorded, or re-run by the reference in lockstep).
#ifndef FC_COMPARE_CMD_H
#define FC_COMPARE_CMD_H

#include "compare.h"
#include "rerun.h"
#include "tracefile.h"

typedef struct {
    const char *dir_a, *dir_b;  // as given on the command line
    fc_trace a, b;
    char b_init[1100];  // what a re-run starts from before its first step loads B's state: read, not computed
} fc_trace_pair;

// Opens both traces and reads B's init file's name; bad input ends the command (exit 2).
void fc_pair_open(fc_trace_pair *p, const char *dir_a, const char *dir_b);
void fc_pair_close(fc_trace_pair *p);
// The first step both traces hold.
long fc_pair_first_step(const fc_trace_pair *p);

// The reference re-running A's config (one process) from B's recorded state,
// and its magnitude pass (rerun.h); 0 or -1 with e.
int fc_pair_rerun_open(fc_rerun *rr, const fc_trace_pair *p, fc_error *e);
int fc_pair_magnitude_open(fc_rerun *mag, const fc_trace_pair *p, fc_error *e);

// How the engine judges B under B's layout against A's step: the recorded one
// (rr NULL) or rr's re-run, which is one process dividing as its config says.
fc_cmp_ctx fc_pair_ctx(const fc_trace_pair *p, const fc_cmp_policy *pol, const fc_rerun *rr);

// compare's Markdown report (--report FILE.md), written whole or not at all.
void fc_compare_write_report(const char *path, const fc_trace_pair *p, const fc_cmp_policy *pol,
                             const fc_cmp_result *res, int n_res, const fc_cmp_divergence *first);

#endif
