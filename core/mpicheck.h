// core/mpicheck.h — mpiCheck, as in llm.c: every MPI call is checked and a
// failure is reported with file:line and MPI's own error string.
#ifndef FC_MPICHECK_H
#define FC_MPICHECK_H

#include <mpi.h>
#include <stdio.h>

#include "check.h"
#include "dtype.h"
#include "mpiwait.h"

static inline void fc_mpi_check(int rc, const char *file, int line) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "%s:%d: MPI error: %s\n", file, line, msg);
    MPI_Abort(MPI_COMM_WORLD, FC_EXIT_INTERNAL);
}
#define mpiCheck(call) fc_mpi_check((call), __FILE__, __LINE__)

// The MPI type that carries a buffer stored in precision p (16-bit ones as raw bits).
static inline MPI_Datatype fc_prec_mpi_type(fc_prec p) { return p == FC_PREC_FP32 ? MPI_FLOAT : MPI_UINT16_T; }

// The ranks of comm on this node (that share its memory): the default thread
// count divides the cores by it (core/threads.h). Collective on comm; before
// MPI_Init (compare, sensitivity) this process alone, 1.
static inline int fc_mpi_ranks_on_node(MPI_Comm comm) {
    int up, n = 1;
    mpiCheck(MPI_Initialized(&up));
    if (!up) return 1;
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_size(node, &n));
    mpiCheck(MPI_Comm_free(&node));
    return n;
}

// Every rank of comm learns whether all ranks succeeded (ok != 0); if not,
// every rank's e gets the message of the lowest failing rank, so all of them
// report one reason. Returns 0 when all succeeded, else -1. Collective.
static inline int fc_mpi_agree(MPI_Comm comm, int ok, fc_error *e) {
    int W, rank, lowest;
    mpiCheck(MPI_Comm_size(comm, &W));
    mpiCheck(MPI_Comm_rank(comm, &rank));
    int mine = ok ? W : rank;
    fc_mpi_allreduce_int(&mine, &lowest, 1, MPI_MIN, comm);
    if (lowest == W) return 0;
    fc_mpi_bcast(e->msg, (int)sizeof e->msg, MPI_CHAR, lowest, comm);
    return -1;
}

#endif
