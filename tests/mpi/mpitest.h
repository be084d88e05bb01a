// tests/mpi/mpitest.h — the MPICH test-suite conventions for fsdpcheck's MPI
// programs: every rank counts its own failures, the counts are summed, rank 0
// prints " No Errors" or " Found N errors", and the exit code is non-zero if
// any rank failed. Plus a harness that runs an implementation through the
// contract and collects what the properties compare.
#ifndef FC_MPITEST_H
#define FC_MPITEST_H

#include <mpi.h>
#include <stdio.h>

#include "config.h"
#include "impl.h"
#include "model.h"
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

// MPI_Init with the world size checks done, and the matching finish: reduces
// the error counts, prints the verdict on rank 0, finalizes, returns the exit code.
void mt_init(int *argc, char ***argv);
int mt_finalize(void);

// What one run produced (oracle/runner.h): full tensors on rank 0 of the
// run's communicator.
typedef fc_run_result mt_result;

// Runs cfg on comm with the reference (collective over comm; ranks outside
// comm must not call). A failure to create or step counts as an error.
int mt_run(const fc_run_config *cfg, MPI_Comm comm, mt_result *r);
void mt_result_free(mt_result *r);

// A base config: model preset, strategy, small batch divisible by W*K.
fc_run_config mt_config(const char *model, fc_strategy s, int W, int steps);

// Compares a and b over n elements: bitwise, or |a-b| <= atol + rtol*|b|.
// Counts one error (with the first divergence: tensor name, element, both
// values) if any element differs. Returns the number of differing elements.
size_t mt_compare(const char *what, const fc_model *m, const float *a, const float *b, int bitwise,
                  double rtol, double atol);

#endif
