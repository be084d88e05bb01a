// tests/mpi/mpitest.h — the MPICH test-suite conventions for fsdpcheck's MPI
// programs: every rank counts its own failures, the counts are summed, rank 0
// prints " No Errors" or " Found N errors", and the exit code is non-zero if
// any rank failed. A part of a test that cannot run says so in one
// "SKIP: reason" line: no test silently does nothing.
//
// Every program takes `--impl reference|PATH.so` (default reference): mt_run
// runs the implementation under test, mt_run_ref the reference (the local
// ground truth and other baselines). Both go through fc_impl_for, so a config
// with `inject` set runs the reference's fault-catalogue build.
//
// Every numerical judgement goes through the one comparison engine
// (oracle/props.h fc_props_compare, oracle/compare.h): mt_judge turns a failed
// property into an MT_CHECK failure that prints the first divergence (step,
// tensor, element, both values with their bits, error relative to the
// tensor's scale, owning rank). A bitwise claim holds only for the reference
// (its canonical reductions); another implementation is judged by the default
// policy of the comparison's precision instead.
#ifndef FC_MPITEST_H
#define FC_MPITEST_H

#include <mpi.h>
#include <stdio.h>

#include "config.h"
#include "impl.h"
#include "model.h"
#include "props.h"
#include "runner.h"

extern int mt_errs;
int mt_rank(void);

#define MT_CHECK(cond, ...)                                                     \
    do {                                                                        \
        if (!(cond)) {                                                          \
            mt_errs++;                                                          \
            if (mt_errs <= 30) {                                                \
                fprintf(stderr, "[rank %d] %s:%d: ", mt_rank(), __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                                   \
                fputc('\n', stderr);                                            \
            }                                                                   \
        }                                                                       \
    } while (0)

// MPI_Init, then the program's flags: `--impl reference|PATH.so`. A bad flag
// or an implementation that cannot be loaded: one "fsdpcheck: " line on
// stderr, exit 2. The matching finish reduces the error counts, prints the
// verdict on rank 0, finalizes and returns the exit code.
void mt_init(int *argc, char ***argv);
int mt_finalize(void);

// The implementation under test, its name as given to --impl, and whether it
// is the reference (bitwise claims apply).
const fc_impl_ops *mt_impl(void);
const char *mt_impl_name(void);
int mt_tested_is_ref(void);

// Prints "SKIP: <reason>" on rank 0 of MPI_COMM_WORLD.
void mt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// What one run produced (oracle/runner.h): every step's full tensors on rank 0
// of the run's communicator.
typedef fc_run_result mt_result;

// Runs cfg on comm (collective over comm; ranks outside comm must not call).
// mt_run: the implementation under test; mt_run_ref: the reference. A failure
// to create or step counts as an error. Returns 0 or -1.
int mt_run(const fc_run_config *cfg, MPI_Comm comm, mt_result *r);
int mt_run_ref(const fc_run_config *cfg, MPI_Comm comm, mt_result *r);
void mt_result_free(mt_result *r);

// A base config: model preset, strategy, small batch divisible by W*K.
fc_run_config mt_config(const char *model, fc_strategy s, int W, int steps);

// How a judgement treats bits: the default policy of the precision; bitwise
// for the reference, or for an implementation whose table claims layout
// invariance and determinism (core/impl.h; another gets the policy); bitwise
// for an implementation that claims determinism (P12).
enum { MT_POLICY = 0, MT_BITWISE_REF = 1, MT_BITWISE_ANY = 2 };

// One side of a judgement: a run, its config and world size, and the first of
// its steps judged (oracle/props.h).
typedef fc_side mt_side;

// Property p through the engine: the tested run against the expected run, n
// steps from each side's `at` (n 0: every step of both, which must have as
// many). bitwise: MT_POLICY, MT_BITWISE_REF or MT_BITWISE_ANY. same_compute:
// both runs share their per-rank arithmetic (fc_cmp_policy_same_compute).
typedef struct {
    fc_prop p;
    const char *what;  // what the tested run is compared against, for the detail
    mt_side tested, expected;
    int n;
    int bitwise;
    int same_compute;
} mt_judgement;

// Judges j: on failure, one MT_CHECK error naming j->what with the props
// detail. Call on the rank holding both runs' full tensors (rank 0 of their
// communicators). Returns 1 if they agree.
int mt_judge(const mt_judgement *j);
// The same comparison without counting anything: 1 if they agree; the detail
// (or "") in detail. For tests that must see a comparison fail.
int mt_agrees(const mt_judgement *j, char *detail, size_t cap);

#endif
