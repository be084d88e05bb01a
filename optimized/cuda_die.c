// optimized/cuda_die.c — fc_cuda_die, the end of every failed cudaCheck,
// cublasCheck and ncclCheck (cuda_check.h): file:line and the library's own
// message on stderr, then the whole MPI job ends with FC_EXIT_INTERNAL. Its
// own file so that the port's small tools (bench/gpu/lt_peak.cu) report
// failures the same way.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "cuda_check.h"

FC_NORETURN void fc_cuda_die(const char *file, int line, const char *lib, const char *msg) {
    fprintf(stderr, "%s:%d: %s error: %s\n", file, line, lib, msg);
    fflush(stderr);
    int init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Abort(MPI_COMM_WORLD, FC_EXIT_INTERNAL);
    exit(FC_EXIT_INTERNAL);
}
