// optimized/comm.c — see comm.h.
#include "comm.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "layout.h"
#include "mpicheck.h"
#include "staged.h"

struct fc_cucomm {
    fc_comm_kind kind;
    MPI_Comm mpi;      // the group (a duplicate)
    int G, rank;
    ncclComm_t nccl;   // FC_COMM_NCCL
    fc_book *book;
};

typedef enum { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE } op_kind;

struct fc_comm_op {
    fc_cucomm *c;
    op_kind kind;
    cudaEvent_t done;   // the result is on the device after this (on `s`)
    cudaStream_t s;
    // MPI staging
    MPI_Request req;
    int pending;        // req is in flight
    void *hsend, *hrecv;
    void *dst;          // device destination of the result
    size_t count;
    fc_prec p;
};

static ncclDataType_t nccl_type(fc_prec p) {
    return p == FC_PREC_BF16 ? ncclBfloat16 : p == FC_PREC_FP16 ? ncclFloat16 : ncclFloat32;
}

// host staging, counted as host comm_buffers
static void *stage(fc_cucomm *c, size_t bytes) {
    void *h = mallocCheck(bytes ? bytes : 1);
    fc_error e;
    if (fc_book_add(c->book, h, bytes, FC_LOC_HOST, FC_MEM_COMM_BUFFERS, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    return h;
}
static void unstage(fc_cucomm *c, void *h) {
    if (!h) return;
    fc_error e;
    if (fc_book_remove(c->book, h, NULL, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    free(h);
}

fc_cucomm *fc_comm_create(fc_comm_kind kind, MPI_Comm mc, fc_book *book) {
    fc_cucomm *c = callocCheck(1, sizeof *c);
    c->kind = kind;
    c->book = book;
    mpiCheck(MPI_Comm_dup(mc, &c->mpi));
    mpiCheck(MPI_Comm_size(c->mpi, &c->G));
    mpiCheck(MPI_Comm_rank(c->mpi, &c->rank));
    if (kind == FC_COMM_NCCL) {
        ncclUniqueId id;
        // NVLink SHARP's in-switch sums are not deterministic between calls (NVIDIA/nccl#1497), and the port
        // claims FC_IMPL_DETERMINISTIC; NCCL reads its environment when it initialises, so before any comm.
        if (setenv("NCCL_NVLS_ENABLE", "0", 1)) fc_die(FC_EXIT_INTERNAL, "setenv NCCL_NVLS_ENABLE: out of memory");
        if (c->rank == 0) ncclCheck(ncclGetUniqueId(&id));
        mpiCheck(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
        ncclCheck(ncclCommInitRank(&c->nccl, c->G, id, c->rank));
    }
    return c;
}

void fc_comm_destroy(fc_cucomm *c) {
    if (!c) return;
    if (c->kind == FC_COMM_NCCL) ncclCheck(ncclCommDestroy(c->nccl));
    mpiCheck(MPI_Comm_free(&c->mpi));
    free(c);
}

int fc_comm_size(const fc_cucomm *c) { return c->G; }

static fc_comm_op *op_new(fc_cucomm *c, op_kind k, void *dst, size_t count, fc_prec p, cudaStream_t s) {
    fc_comm_op *op = callocCheck(1, sizeof *op);
    op->c = c;
    op->kind = k;
    op->dst = dst;
    op->count = count;
    op->p = p;
    op->s = s;
    cudaCheck(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
    return op;
}

// the device buffer src [n elements] into a new host staging buffer of cap elements (zero beyond n)
static void *download(fc_cucomm *c, const void *src, size_t n, size_t cap, fc_prec p, cudaStream_t s) {
    size_t es = fc_prec_size(p);
    void *h = stage(c, cap * es);
    if (cap > n) memset((char *)h + n * es, 0, (cap - n) * es);
    cudaCheck(cudaMemcpyAsync(h, src, n * es, cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    return h;
}

fc_comm_op *fc_comm_all_gather(fc_cucomm *c, const void *send, void *recv, size_t count, fc_prec p, cudaStream_t s) {
    fc_comm_op *op = op_new(c, OP_ALL_GATHER, recv, count, p, s);
    if (c->kind == FC_COMM_NCCL) {
        ncclCheck(ncclAllGather(send, recv, count, nccl_type(p), c->nccl, s));
        cudaCheck(cudaEventRecord(op->done, s));
        return op;
    }
    op->hsend = download(c, send, count, count, p, s);
    op->hrecv = stage(c, count * (size_t)c->G * fc_prec_size(p));
    mpiCheck(MPI_Iallgather(op->hsend, (int)count, fc_prec_mpi_type(p), op->hrecv, (int)count, fc_prec_mpi_type(p), c->mpi, &op->req));
    op->pending = 1;
    return op;
}

fc_comm_op *fc_comm_reduce_scatter(fc_cucomm *c, const void *send, void *recv, size_t count, fc_prec p, cudaStream_t s) {
    fc_comm_op *op = op_new(c, OP_REDUCE_SCATTER, recv, count, p, s);
    if (c->kind == FC_COMM_NCCL) {
        ncclCheck(ncclReduceScatter(send, recv, count, nccl_type(p), ncclSum, c->nccl, s));
        cudaCheck(cudaEventRecord(op->done, s));
        return op;
    }
    size_t all = count * (size_t)c->G;
    op->hsend = download(c, send, all, all, p, s);
    op->hrecv = stage(c, all * fc_prec_size(p));
    mpiCheck(MPI_Ialltoall(op->hsend, (int)count, fc_prec_mpi_type(p), op->hrecv, (int)count, fc_prec_mpi_type(p), c->mpi, &op->req));
    op->pending = 1;
    return op;
}

fc_comm_op *fc_comm_all_reduce(fc_cucomm *c, void *buf, size_t count, fc_prec p, cudaStream_t s) {
    fc_comm_op *op = op_new(c, OP_ALL_REDUCE, buf, count, p, s);
    if (c->kind == FC_COMM_NCCL) {
        ncclCheck(ncclAllReduce(buf, buf, count, nccl_type(p), ncclSum, c->nccl, s));
        cudaCheck(cudaEventRecord(op->done, s));
        return op;
    }
    // the canonical all-reduce: pad to S*G, all-to-all, rank-ordered sum, all-gather
    size_t es = fc_prec_size(p), S = fc_chunk_size(count, c->G), P = S * (size_t)c->G;
    void *h = download(c, buf, count, P, p, s);
    void *r = stage(c, P * es), *acc = stage(c, S * es);
    mpiCheck(MPI_Alltoall(h, (int)S, fc_prec_mpi_type(p), r, (int)S, fc_prec_mpi_type(p), c->mpi));
    fc_staged_sum(p, r, c->G, S, acc);
    mpiCheck(MPI_Allgather(acc, (int)S, fc_prec_mpi_type(p), h, (int)S, fc_prec_mpi_type(p), c->mpi));
    cudaCheck(cudaMemcpyAsync(buf, h, count * es, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaEventRecord(op->done, s));
    cudaCheck(cudaStreamSynchronize(s));  // the staging buffers may go
    unstage(c, h);
    unstage(c, r);
    unstage(c, acc);
    return op;
}

void fc_comm_wait(fc_comm_op *op, cudaStream_t consumer) {
    fc_cucomm *c = op->c;
    if (op->pending) {
        size_t es = fc_prec_size(op->p);
        mpiCheck(MPI_Wait(&op->req, MPI_STATUS_IGNORE));
        const void *result = op->hrecv;
        void *sum = NULL;
        if (op->kind == OP_REDUCE_SCATTER) {
            sum = stage(c, op->count * es);
            fc_staged_sum(op->p, op->hrecv, c->G, op->count, sum);
            result = sum;
        }
        size_t n = op->kind == OP_ALL_GATHER ? op->count * (size_t)c->G : op->count;
        cudaCheck(cudaMemcpyAsync(op->dst, result, n * es, cudaMemcpyHostToDevice, op->s));
        cudaCheck(cudaEventRecord(op->done, op->s));
        cudaCheck(cudaStreamSynchronize(op->s));  // the staging buffers may go
        unstage(c, sum);
    }
    cudaCheck(cudaStreamWaitEvent(consumer, op->done, 0));
    unstage(c, op->hsend);
    unstage(c, op->hrecv);
    cudaCheck(cudaEventDestroy(op->done));
    free(op);
}

void fc_comm_gather_bytes(fc_cucomm *c, const void *mine, void *all, size_t bytes, void *dev, cudaStream_t s) {
    if (c->kind == FC_COMM_MPI) {
        mpiCheck(MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->mpi));
        return;
    }
    char *d = dev;  // [bytes] this rank's, then [G * bytes] everyone's
    cudaCheck(cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, s));
    ncclCheck(ncclAllGather(d, d + bytes, bytes, ncclUint8, c->nccl, s));
    cudaCheck(cudaMemcpyAsync(all, d + bytes, (size_t)c->G * bytes, cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
}
