// core/mpiwait.h — collectives that wait without holding a core.
//
// Why: MPICH's blocking calls busy-poll. On a node with more ranks than cores
// (the 2-core CI machine runs the sweep at W = 4) a rank that waits spins on
// the core the rank it waits for needs, and every message then costs a
// scheduler time slice (docs/measurements/mpiwait.md has the figures).
// These wrappers start the nonblocking form of the call and wait in
// fc_mpi_wait: a short spin (a wait on an idle node ends within it), then
// yielding, then short sleeps. Data movement only: none of them reduces
// floating-point data, so no result depends on MPI's algorithm choice;
// the reductions the reference needs are its own, in rank order.
#ifndef FC_MPIWAIT_H
#define FC_MPIWAIT_H

#include <mpi.h>

// Completes req like MPI_Wait, yielding the core while it is not done.
void fc_mpi_wait(MPI_Request *req);

void fc_mpi_barrier(MPI_Comm comm);
void fc_mpi_bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm);
// send[count] from every rank into recv[W * count], in rank order
void fc_mpi_allgather(const void *send, int count, MPI_Datatype t, void *recv, MPI_Comm comm);
// chunk j of send[W * count] to rank j; chunk i of recv[W * count] from rank i
void fc_mpi_alltoall(const void *send, int count, MPI_Datatype t, void *recv, MPI_Comm comm);
void fc_mpi_gather(const void *send, int count, MPI_Datatype t, void *recv, int root, MPI_Comm comm);
void fc_mpi_gatherv(const void *send, int count, MPI_Datatype t, void *recv, const int *counts, const int *displs,
                    int root, MPI_Comm comm);
// MPI_Comm_dup, through MPI_Comm_idup
void fc_mpi_comm_dup(MPI_Comm comm, MPI_Comm *out);
// MPI_Comm_split, entered only once every rank of comm has arrived (MPI has
// no nonblocking split; its spin is then short)
void fc_mpi_comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out);
// The communicators of a reduction layout over comm (the reference's and the
// CUDA port's engines): world, a dup of comm; shard, this rank's group of G
// consecutive ranks; replica, the ranks at this rank's position in every
// group (hybrid replicas). A group that is all of comm is an MPI_Comm_idup, a
// group of one rank a dup of MPI_COMM_SELF (no communication); only hybrid
// layouts split.
void fc_mpi_layout_comms(MPI_Comm comm, int G, MPI_Comm *world, MPI_Comm *shard, MPI_Comm *replica);
// exact integer reductions (MPI_SUM, MPI_MIN, MPI_MAX of MPI_INT)
void fc_mpi_allreduce_int(const int *send, int *recv, int count, MPI_Op op, MPI_Comm comm);
// sum of one double per rank, added in rank order (the same bits for any
// MPI algorithm and any placement of ranks)
double fc_mpi_sum_double(double x, MPI_Comm comm);

#endif
