// oracle/sweep.h — `fsdpcheck sweep`: seeded random cases from the config
// space, each checked against the properties of docs/contract.md §8, shrunk to a
// minimal reproducer on failure, reported as Markdown (+SVG) and JUnit XML.
#ifndef FC_SWEEP_H
#define FC_SWEEP_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "config.h"
#include "props.h"
#include "schedule.h"

// A case's checkpoint round trip (P7): train `at` steps, save, load into a
// fresh instance at world size W with `strategy`, train the rest.
typedef struct {
    int on;
    int sharded;                  // SHARDED_STATE_DICT, else FULL
    int at;                       // steps before the save
    int W;                        // world size of the loading run
    fc_strategy strategy;         // strategy of the loading run
} fc_case_ckpt;

// One checked case.
typedef struct {
    int index;                    // position in the sweep (0-based)
    char spec[768];               // the case as `run` flags (replayable with `sweep --replay`)
    int W;                        // world size the case ran at
    fc_run_config cfg;            // the case's config
    fc_case_ckpt ckpt;            // its checkpoint round trip, if any
    fc_props v;                   // the verdicts: checked and failed properties, error magnitudes, detail
    double seconds;               // wall time of the case
    // measurements of the tested run (the largest over ranks)
    size_t mem_peak[FC_MEM_COUNT];      // per-rank peak bytes per category (device + host)
    size_t mem_total;                   // per-rank peak of the sum
    size_t comm_bytes[FC_OP_COUNT];     // bytes issued per step on rank 0, by collective op
} fc_case_result;

// Per-rank memory of one strategy at one world size, for the plot: the model
// states (param + grad + optimizer shards) plus the gathered-parameter peak.
typedef struct {
    fc_strategy strategy;
    int W;
    size_t param, grad, optim, gathered;  // per-rank peak bytes
} fc_mem_point;

typedef struct {
    char impl[256];
    char judged[200];             // how its own runs were judged: what its table claims (fc_sweep_judged_text)
    fc_fault inject;
    uint64_t seed;
    int world;                    // the communicator's size
    double seconds;               // total wall time
    int n;                        // cases checked
    fc_case_result *cases;
    int n_failed;
    // the first failure, shrunk: its spec and world size, the property that
    // caught it, and a one-line command that reproduces it
    int have_shrunk;
    fc_case_result shrunk;
    fc_prop caught_by;            // the property that caught it
    char repro[1024];
    // memory profile for the plot: model states per rank vs W
    char plot_model[64];          // the model of the profile
    size_t plot_numel;            // its parameter count (Psi)
    int n_points;
    fc_mem_point points[64];
} fc_sweep_report;

// Markdown report with the pass/fail matrix (property x strategy, and the
// failing cases), error magnitudes, comm volume and per-rank memory per
// strategy and W, and an inline SVG plot of per-rank memory against W with
// the ZeRO formulas (Rajbhandari et al.: DDP 16 Psi, ZeRO-2 4 Psi + 12 Psi/W,
// ZeRO-3 16 Psi/W bytes for fp32 AdamW). Also writes FILE.svg beside it.
int fc_report_markdown(const fc_sweep_report *r, const char *path, fc_error *e);
// JUnit XML: one testsuite, one testcase per case (name = spec), a <failure>
// naming the property for each failed case.
int fc_report_junit(const fc_sweep_report *r, const char *path, fc_error *e);

#endif
