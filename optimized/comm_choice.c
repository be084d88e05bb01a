// optimized/comm_choice.c — see comm_choice.h.
#include "comm_choice.h"

#include <stdio.h>
#include <string.h>

int fc_device_for_rank(int local_rank, int device_count) {
    if (device_count <= 0 || local_rank < 0) return -1;
    return local_rank % device_count;
}

int fc_count_distinct_ids(const char *ids, int n) {
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        const char *a = ids + (size_t)i * FC_BUS_ID_LEN;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strncmp(a, ids + (size_t)j * FC_BUS_ID_LEN, FC_BUS_ID_LEN) == 0;
        distinct += !seen;
    }
    return distinct;
}

int fc_comm_choose(fc_comm forced, int shared, int node_ranks, int node_devices, fc_comm_kind *out, char *why,
                   size_t whysz, fc_error *e) {
    if (forced == FC_COMM_MPI) {
        *out = FC_COMM_MPI;
        snprintf(why, whysz, "forced by --comm mpi");
        return 0;
    }
    if (forced == FC_COMM_NCCL) {
        if (shared)
            return fc_fail(e,
                           "--comm nccl: ranks share a GPU (%d rank(s) on %d device(s) on this node) and NCCL refuses "
                           "two ranks on one device; use --comm mpi or one GPU per rank",
                           node_ranks, node_devices);
        *out = FC_COMM_NCCL;
        snprintf(why, whysz, "forced by --comm nccl");
        return 0;
    }
    if (shared) {
        *out = FC_COMM_MPI;
        snprintf(why, whysz, "ranks share a GPU (%d rank(s) on %d device(s) on this node): host-staged MPI", node_ranks,
                 node_devices);
    } else {
        *out = FC_COMM_NCCL;
        snprintf(why, whysz, "every rank has its own GPU (%d rank(s), %d device(s) on this node)", node_ranks,
                 node_devices);
    }
    return 0;
}
