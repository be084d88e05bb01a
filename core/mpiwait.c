// core/mpiwait.c — see mpiwait.h.
#include "mpiwait.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "mpicheck.h"

// Yielding hands the core to a rank with work at once, a short nap keeps a
// needed rank from sleeping through its turn, and the spin keeps a wait between
// two ranks that each hold a core off the scheduler: the measured grid of
// SPIN, YIELD and NAP is docs/measurements/mpiwait.md.
enum { SPIN = 200, YIELD = 200 };
static const struct timespec NAP = {0, 20000};  // 20 us

void fc_mpi_wait(MPI_Request *req) {
    for (int i = 0;; i++) {
        int done = 0;
        mpiCheck(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (i < SPIN) continue;
        if (i < SPIN + YIELD)
            sched_yield();
        else
            nanosleep(&NAP, NULL);
    }
}

void fc_mpi_barrier(MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Ibarrier(comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Ibcast(buf, count, t, root, comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_allgather(const void *send, int count, MPI_Datatype t, void *recv, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Iallgather(send, count, t, recv, count, t, comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_alltoall(const void *send, int count, MPI_Datatype t, void *recv, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Ialltoall(send, count, t, recv, count, t, comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_gather(const void *send, int count, MPI_Datatype t, void *recv, int root, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Igather(send, count, t, recv, count, t, root, comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_gatherv(const void *send, int count, MPI_Datatype t, void *recv, const int *counts, const int *displs,
                    int root, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Igatherv(send, count, t, recv, counts, displs, t, root, comm, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_comm_dup(MPI_Comm comm, MPI_Comm *out) {
    MPI_Request r;
    mpiCheck(MPI_Comm_idup(comm, out, &r));
    fc_mpi_wait(&r);
}

void fc_mpi_comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out) {
    fc_mpi_barrier(comm);
    mpiCheck(MPI_Comm_split(comm, color, key, out));
}

// The ranks of comm with this rank's color, where the colors take n_colors
// values over equal blocks of consecutive ranks.
static void split_n(MPI_Comm comm, int color, int n_colors, MPI_Comm *out) {
    int rank, W;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    mpiCheck(MPI_Comm_size(comm, &W));
    if (n_colors == 1)
        fc_mpi_comm_dup(comm, out);
    else if (n_colors == W)
        mpiCheck(MPI_Comm_dup(MPI_COMM_SELF, out));
    else
        fc_mpi_comm_split(comm, color, rank, out);
}

void fc_mpi_layout_comms(MPI_Comm comm, int G, MPI_Comm *world, MPI_Comm *shard, MPI_Comm *replica) {
    int rank, W;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    mpiCheck(MPI_Comm_size(comm, &W));
    fc_mpi_comm_dup(comm, world);
    split_n(comm, rank / G, W / G, shard);
    split_n(comm, rank % G, G, replica);
}

void fc_mpi_allreduce_int(const int *send, int *recv, int count, MPI_Op op, MPI_Comm comm) {
    MPI_Request r;
    mpiCheck(MPI_Iallreduce(send, recv, count, MPI_INT, op, comm, &r));
    fc_mpi_wait(&r);
}

double fc_mpi_sum_double(double x, MPI_Comm comm) {
    int W;
    mpiCheck(MPI_Comm_size(comm, &W));
    double *all = mallocCheck((size_t)W * sizeof(double));  // [W] one value per rank
    fc_mpi_allgather(&x, 1, MPI_DOUBLE, all, comm);
    double s = 0;
    for (int i = 0; i < W; i++) s += all[i];
    free(all);
    return s;
}
