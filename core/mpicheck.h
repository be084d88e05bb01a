// core/mpicheck.h — mpiCheck, as in llm.c: every MPI call is checked and a
// failure is reported with file:line and MPI's own error string.
#ifndef FC_MPICHECK_H
#define FC_MPICHECK_H

#include <mpi.h>
#include <stdio.h>

#include "check.h"

static inline void fc_mpi_check(int rc, const char *file, int line) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "%s:%d: MPI error: %s\n", file, line, msg);
    MPI_Abort(MPI_COMM_WORLD, FC_EXIT_INTERNAL);
}
#define mpiCheck(call) fc_mpi_check((call), __FILE__, __LINE__)

#endif
