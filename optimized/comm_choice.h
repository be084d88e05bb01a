// optimized/comm_choice.h — which collective backend the CUDA port uses, as a
// pure host function (no CUDA, no MPI), so the rule is unit-tested on a CPU.
//
// NCCL needs every rank on its own GPU: it refuses two ranks of one
// communicator on one device. When ranks share a device (W ranks on fewer
// GPUs, as on a one-GPU workstation or in CI), the port stages every
// collective through host memory and runs it with MPI instead. The choice is
// automatic (count the distinct devices per node: MPI_Comm_split_type plus
// each rank's PCI bus id) and can be forced with the run's --comm nccl|mpi
// (fc_run_config.comm, core/config.h).
#ifndef FC_CUDA_COMM_CHOICE_H
#define FC_CUDA_COMM_CHOICE_H

#include <stddef.h>

#include "check.h"
#include "config.h"

FC_BEGIN_DECLS

// The backend chosen: FC_COMM_NCCL or FC_COMM_MPI (core/config.h's fc_comm;
// FC_COMM_AUTO is a request, never a choice).
typedef fc_comm fc_comm_kind;

#define FC_BUS_ID_LEN 32  // cudaDeviceGetPCIBusId's "dddd:bb:dd.f", with room

// The device a rank uses: its rank among the ranks of its node, modulo the
// node's device count (so ranks share devices round robin when there are
// more ranks than devices). -1 when there is no device.
int fc_device_for_rank(int local_rank, int device_count);

// The number of distinct strings among n bus ids ids[0..n) (each a
// NUL-terminated string of at most FC_BUS_ID_LEN bytes, back to back).
int fc_count_distinct_ids(const char *ids, int n);

// The backend: `forced` is the run's --comm (FC_COMM_AUTO = choose),
// `shared` whether any node runs two ranks on one device (the world's
// maximum), `node_ranks` / `node_devices` this node's figures for the
// message. On success fills *out and a one-line reason (why, whysz bytes);
// refuses an unknown value, and NCCL forced onto shared devices.
int fc_comm_choose(fc_comm forced, int shared, int node_ranks, int node_devices, fc_comm_kind *out, char *why,
                   size_t whysz, fc_error *e);

FC_END_DECLS

#endif
