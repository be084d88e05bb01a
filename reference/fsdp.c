// reference/fsdp.c — the reference FSDP engine over MPI. See fsdp.h.
//
// Read it top to bottom as one training step:
//   1. every rank takes its slice of the global batch, in K micro-batches;
//   2. forward, stage by stage: a unit's parameters are all-gathered before
//      its first stage runs (earlier with forward_prefetch) and freed after
//      its last forward stage when the strategy reshards after forward;
//   3. backward, stages in reverse: the unit is gathered again if it was
//      freed, its unsharded gradient accumulates, and after its last backward
//      stage the unit is freed and its gradient reduced (reduce-scatter, or
//      all-reduce for no_shard, plus a replica all-reduce for hybrid);
//   4. clip_grad_norm over the sharded gradient, then each rank runs the
//      optimizer over its own shard only.
//
// Layout (DESIGN §5): unit u's FlatParameter has N elements, zero-padded to
// P = S * G where G is the shard-group size (the world for no_shard's
// reductions); rank r of the group owns [r*S, (r+1)*S). Padding is never read
// into a gradient, a norm or the optimizer.
//
// Numerics: every gradient reduction is the canonical rank-ordered sum
// (chunks exchanged with an all-to-all, then summed in rank order 0..G-1), and
// no_shard's all-reduce is that same reduce-scatter followed by an all-gather,
// so no_shard, full_shard and shard_grad_op are bitwise identical at one W.
// Mixed precision is emulated by round-to-nearest-even at the points PyTorch
// casts: parameters when gathered (param_dtype), gradients after each unit's
// backward (param_dtype), and every step of the reduction (reduce_dtype);
// 16-bit collectives really send 16-bit data.
#include "fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "forward.h"
#include "init.h"
#include "local.h"
#include "mpicheck.h"
#include "optim.h"
#include "weights.h"

typedef struct {
    size_t numel;        // N: real elements
    size_t shard;        // S: elements per rank in the reduction (and shard) layout
    size_t padded;       // P = S * G
    size_t own_off;      // first element of this rank's chunk, r * S
    size_t own_valid;    // elements of this rank's chunk that are not padding
    size_t store;        // elements this rank stores: S (sharded) or N (no_shard)
    float *param;        // [store] fp32 master parameters (shard, or all of them)
    float *grad;         // [store] fp32 reduced gradient, accumulated over micro-batches
    float *state[2];     // [store] optimizer state
    float *gathered;     // [P] (or [N] for no_shard) compute parameters; NULL when freed
    int gathered_owned;  // gathered is an allocation (not an alias of param)
    int ag_pending;      // an all-gather into gathered is in flight
    int ag_prefetched;   // ... and it was issued ahead of need
    float *stale;        // [P] fault stale_gather: the previous gather's contents
    MPI_Request ag_req;
    void *ag_send, *ag_recv;  // packed param_dtype buffers of the all-gather
    float *full_grad;    // [P] unsharded gradient, alive from first backward stage to reduce
    int first_fwd, last_fwd;  // first and last forward stage using this unit
    int first_bwd, last_bwd;  // first and last backward stage (stage indices; bwd runs high to low)
    int reshard_after_forward;
} unit_state;

struct fc_fsdp {
    fc_run_config cfg;
    fc_model m;
    MPI_Comm world;      // duplicate of the caller's communicator
    MPI_Comm shard;      // the F ranks that shard a unit between them
    MPI_Comm replica;    // the R = W/F ranks holding the same shard (hybrid)
    int W, rank, F, R, shard_rank;
    int sharded, hybrid;
    float pre, post;     // gradient divide factors
    unit_state *u;
    int alive;           // units whose gathered parameters exist (sharded strategies)
    // the reduction in flight (at most one, like FSDP's post-backward stream)
    int rs_unit;
    MPI_Request rs_req;
    void *rs_send, *rs_recv;
    // data and activations of this rank
    fc_batch batch;      // [B/W] samples of the current step
    int micro;           // samples per micro-batch
    float *act_mem;
    fc_acts acts;
    const float **up;    // [n_units] stage parameter table
    float **ug;          // [n_units] stage gradient table
    int n_state;
    const char *state_names[2];
    long step;
    fc_comm_log log;
    fc_mem_stats mem;
};

static int truncating(const fc_fsdp *f) { return f->cfg.inject == FC_FAULT_BF16_TRUNCATE; }

double fc_predivide_factor(int W) {
    int f = 1;
    while (W % f == 0 && W / f > f) f *= 2;
    return f;
}

// ---------------------------------------------------------------------------
// tagged memory: every engine allocation is counted under a category

static fc_mem_loc shard_loc(const fc_fsdp *f) {
    return f->cfg.cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE;
}

// Allocates `bytes` (zeroed) and counts `counted` bytes under (loc, cat).
// The two differ only where fp32 storage emulates a 16-bit tensor.
static void *mem_alloc(fc_fsdp *f, fc_mem_loc loc, fc_mem_cat cat, size_t bytes, size_t counted) {
    fc_mem_add(&f->mem, loc, cat, counted);
    return callocCheck(bytes ? bytes : 1, 1);
}

static void mem_free(fc_fsdp *f, void *p, fc_mem_loc loc, fc_mem_cat cat, size_t counted) {
    fc_mem_sub(&f->mem, loc, cat, counted);
    free(p);
}

// ---------------------------------------------------------------------------
// emulated precisions on the wire

static size_t prec_bytes(fc_prec p) { return p == FC_PREC_FP32 ? 4 : 2; }

// Rounding and packing of this engine: fault bf16_truncate (when injected)
// rounds bf16 toward zero instead of to nearest-even.
static uint16_t to_bf16(int truncate, float x) {
    if (truncate) {  // drop the low bits: round toward zero
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        return (uint16_t)(u >> 16);
    }
    return fc_f32_to_bf16(x);
}

static int truncating(const fc_fsdp *f);

static float round_p(const fc_fsdp *f, fc_prec p, float x) {
    if (p == FC_PREC_BF16) return fc_bf16_to_f32(to_bf16(truncating(f), x));
    return fc_round(p, x);
}
static MPI_Datatype prec_type(fc_prec p) { return p == FC_PREC_FP32 ? MPI_FLOAT : MPI_UINT16_T; }

// dst[i] = src[i] rounded to p, in p's storage format
static void pack(const fc_fsdp *f, fc_prec p, const float *src, void *dst, size_t n) {
    if (p == FC_PREC_FP32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = p == FC_PREC_BF16 ? to_bf16(truncating(f), src[i]) : fc_f32_to_f16(src[i]);
}

static float unpack1(fc_prec p, const void *src, size_t i) {
    if (p == FC_PREC_FP32) return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return p == FC_PREC_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
}

// ---------------------------------------------------------------------------
// the comm log

static void log_ev(fc_fsdp *f, fc_op op, fc_op of, int unit, int stage, fc_group g, size_t bytes,
                   fc_prec dt, fc_phase ph, int prefetch) {
    fc_event e = {0};
    e.op = op;
    e.of = of;
    e.unit = unit;
    e.stage = stage;
    e.group = g;
    e.bytes = bytes;
    e.dtype = dt;
    e.phase = ph;
    e.prefetch = prefetch;
    fc_log_add(&f->log, e);
}

// ---------------------------------------------------------------------------
// all-gather, free, prefetch

static void issue_all_gather(fc_fsdp *f, int u, fc_phase ph, int prefetch) {
    unit_state *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    size_t pb = prec_bytes(pd);
    if (f->cfg.cpu_offload)  // the fp32 shard comes to the device first
        log_ev(f, FC_OP_H2D, FC_OP_H2D, u, -1, FC_GROUP_NONE, U->shard * sizeof(float), FC_PREC_FP32, ph, 0);
    U->gathered = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->padded * sizeof(float), U->padded * pb);
    U->gathered_owned = 1;
    U->ag_send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->shard * pb, U->shard * pb);
    pack(f, pd, U->param, U->ag_send, U->shard);
    // fp32 gathers straight into the compute buffer; 16-bit into a packed one
    U->ag_recv = pd == FC_PREC_FP32 ? (void *)U->gathered : mallocCheck(U->padded * pb);
    mpiCheck(MPI_Iallgather(U->ag_send, (int)U->shard, prec_type(pd), U->ag_recv, (int)U->shard,
                            prec_type(pd), f->shard, &U->ag_req));
    U->ag_pending = 1;
    U->ag_prefetched = prefetch;
    f->alive++;
    log_ev(f, FC_OP_ALL_GATHER, FC_OP_ALL_GATHER, u, -1, FC_GROUP_SHARD, U->padded * pb, pd, ph, prefetch);
}

// Faults that corrupt a completed all-gather.
static void inject_after_gather(fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    fc_fault fault = f->cfg.inject;
    if (fault == FC_FAULT_SHARD_OFFSET && u == f->m.n_units - 1 && f->F > 1) {
        // the last unit's chunk j is taken from rank j+1's position
        float *copy = mallocCheck(U->padded * sizeof(float));
        memcpy(copy, U->gathered, U->padded * sizeof(float));
        for (int j = 0; j < f->F; j++)
            memcpy(U->gathered + (size_t)j * U->shard, copy + (size_t)((j + 1) % f->F) * U->shard,
                   U->shard * sizeof(float));
        free(copy);
    }
    if (fault == FC_FAULT_STALE_GATHER && U->ag_prefetched) {
        // a prefetched unit is computed on the previous gather's contents
        if (!U->stale) {
            U->stale = mallocCheck(U->padded * sizeof(float));
            memcpy(U->stale, U->gathered, U->padded * sizeof(float));
        } else {
            float *fresh = U->gathered;
            U->gathered = U->stale;
            U->stale = fresh;
        }
    }
}

static void wait_all_gather(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    mpiCheck(MPI_Wait(&U->ag_req, MPI_STATUS_IGNORE));
    if (pd != FC_PREC_FP32) {
        for (size_t i = 0; i < U->padded; i++) U->gathered[i] = unpack1(pd, U->ag_recv, i);
        free(U->ag_recv);
    }
    U->ag_recv = NULL;
    inject_after_gather(f, u);
    mem_free(f, U->ag_send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->shard * prec_bytes(pd));
    U->ag_send = NULL;
    U->ag_pending = 0;
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_GATHER, u, -1, FC_GROUP_SHARD, 0, pd, ph, 0);
}

// Makes unit u's compute parameters available, waiting for them if needed.
static void ensure_gathered(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    if (!f->sharded) {
        if (U->gathered) return;
        if (f->cfg.param_dtype == FC_PREC_FP32) {
            U->gathered = U->param;  // DDP computes on its own full copy
            U->gathered_owned = 0;
        } else {  // a low-precision compute copy, like DDP under mixed precision
            size_t pb = prec_bytes(f->cfg.param_dtype);
            U->gathered = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->numel * sizeof(float), U->numel * pb);
            U->gathered_owned = 1;
            for (size_t i = 0; i < U->numel; i++) U->gathered[i] = round_p(f, f->cfg.param_dtype, U->param[i]);
        }
        return;
    }
    if (!U->gathered) issue_all_gather(f, u, ph, 0);
    if (U->ag_pending) wait_all_gather(f, u, ph);
}

static void free_gathered(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    if (!U->gathered) return;
    if (U->gathered_owned) {
        size_t n = f->sharded ? U->padded : U->numel;
        mem_free(f, U->gathered, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, n * prec_bytes(f->cfg.param_dtype));
    }
    if (f->sharded) {
        f->alive--;
        log_ev(f, FC_OP_FREE, FC_OP_FREE, u, -1, FC_GROUP_NONE, 0, f->cfg.param_dtype, ph, 0);
    }
    U->gathered = NULL;
    U->gathered_owned = 0;
}

// Issues unit v's all-gather ahead of need. With limit_all_gathers at most two
// units' gathered parameters may exist (in flight or not yet freed): a
// prefetch that would make a third is not issued, and the unit is gathered
// when it is reached instead.
static void prefetch(fc_fsdp *f, int v, fc_phase ph) {
    if (v < 0 || !f->sharded || f->u[v].gathered) return;
    if (f->cfg.limit_all_gathers && f->alive >= 2) return;
    issue_all_gather(f, v, ph, 1);
}

// The next unit whose first use in forward comes after stage s, -1 if none.
static int next_forward_unit(const fc_fsdp *f, int s) {
    for (int t = s + 1; t < f->m.n_stages; t++) {
        int v = f->m.stages[t].unit;
        if (f->u[v].first_fwd == t) return v;
    }
    return -1;
}

// The next unit whose first use in backward comes after stage s, -1 if none.
static int next_backward_unit(const fc_fsdp *f, int s) {
    for (int t = s - 1; t >= 0; t--) {
        int v = f->m.stages[t].unit;
        if (f->u[v].first_bwd == t) return v;
    }
    return -1;
}

// ---------------------------------------------------------------------------
// gradient reduction

// Canonical all-reduce of x[n] over comm, blocking: the rank-ordered
// reduce-scatter of the module comment, then an all-gather.
static void all_reduce_canonical(fc_fsdp *f, MPI_Comm comm, float *x, size_t n, fc_prec rd) {
    int G;
    mpiCheck(MPI_Comm_size(comm, &G));
    size_t S = (n + (size_t)G - 1) / (size_t)G, P = S * (size_t)G, rb = prec_bytes(rd);
    float *padded = callocCheck(P, sizeof(float));
    memcpy(padded, x, n * sizeof(float));
    void *send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    void *recv = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    pack(f, rd, padded, send, P);
    mpiCheck(MPI_Alltoall(send, (int)S, prec_type(rd), recv, (int)S, prec_type(rd), comm));
    float *acc = callocCheck(S, sizeof(float));
    for (size_t i = 0; i < S; i++) acc[i] = unpack1(rd, recv, i);
    for (int j = 1; j < G; j++)
        for (size_t i = 0; i < S; i++) acc[i] = round_p(f, rd, acc[i] + unpack1(rd, recv, (size_t)j * S + i));
    pack(f, rd, acc, send, S);
    mpiCheck(MPI_Allgather(send, (int)S, prec_type(rd), recv, (int)S, prec_type(rd), comm));
    for (size_t i = 0; i < n; i++) x[i] = unpack1(rd, recv, i);
    free(acc);
    free(padded);
    mem_free(f, send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    mem_free(f, recv, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
}

// The precision gradients are reduced in.
static fc_prec reduce_prec(const fc_fsdp *f) {
    if (f->cfg.inject == FC_FAULT_REDUCE_DTYPE_IGNORED) return f->cfg.param_dtype;
    return f->cfg.reduce_dtype;
}

// Finishes the reduction in flight: rank-ordered sum of the exchanged chunks,
// the replica all-reduce (hybrid), the all-gather half of DDP's all-reduce,
// the post-divide, and accumulation into the fp32 gradient.
static void complete_reduce(fc_fsdp *f) {
    int u = f->rs_unit;
    if (u < 0) return;
    unit_state *U = &f->u[u];
    fc_prec rd = reduce_prec(f);
    size_t rb = prec_bytes(rd), S = U->shard, P = U->padded;
    int G = f->sharded ? f->F : f->W;
    mpiCheck(MPI_Wait(&f->rs_req, MPI_STATUS_IGNORE));
    float *acc = callocCheck(S, sizeof(float));  // this rank's chunk, summed in rank order
    for (size_t i = 0; i < S; i++) acc[i] = unpack1(rd, f->rs_recv, i);
    for (int j = 1; j < G; j++)
        for (size_t i = 0; i < S; i++) acc[i] = round_p(f, rd, acc[i] + unpack1(rd, f->rs_recv, (size_t)j * S + i));
    if (f->sharded) {
        log_ev(f, FC_OP_WAIT, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, 0, rd, FC_PHASE_BACKWARD, 0);
        if (f->hybrid && f->R > 1 && f->cfg.inject != FC_FAULT_HSDP_NO_REPLICATE) {
            log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, S * rb, rd, FC_PHASE_BACKWARD, 0);
            all_reduce_canonical(f, f->replica, acc, S, rd);
            log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, 0, rd, FC_PHASE_BACKWARD, 0);
        }
        size_t n = f->cfg.inject == FC_FAULT_PADDING_LEAK ? S : U->own_valid;
        for (size_t i = 0; i < n; i++) U->grad[i] += round_p(f, rd, acc[i] / f->post);
        if (f->cfg.inject == FC_FAULT_AVG_TAIL)  // the last elements keep the undivided sum
            for (size_t i = n > 3 ? n - 3 : 0; i < n; i++) U->grad[i] += acc[i] - round_p(f, rd, acc[i] / f->post);
    } else {
        // DDP: all-gather the summed chunks back into the whole gradient
        pack(f, rd, acc, f->rs_send, S);
        mpiCheck(MPI_Allgather(f->rs_send, (int)S, prec_type(rd), f->rs_recv, (int)S, prec_type(rd), f->world));
        log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, 0, rd, FC_PHASE_BACKWARD, 0);
        for (size_t i = 0; i < U->numel; i++) U->grad[i] += round_p(f, rd, unpack1(rd, f->rs_recv, i) / f->post);
        if (f->cfg.inject == FC_FAULT_AVG_TAIL)
            for (size_t i = U->numel > 3 ? U->numel - 3 : 0; i < U->numel; i++) {
                float x = unpack1(rd, f->rs_recv, i);
                U->grad[i] += x - round_p(f, rd, x / f->post);
            }
    }
    if (f->cfg.cpu_offload)  // the reduced fp32 gradient shard goes to the host
        log_ev(f, FC_OP_D2H, FC_OP_D2H, u, -1, FC_GROUP_NONE, U->own_valid * sizeof(float), FC_PREC_FP32,
               FC_PHASE_BACKWARD, 0);
    free(acc);
    mem_free(f, f->rs_send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    mem_free(f, f->rs_recv, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    f->rs_send = f->rs_recv = NULL;
    f->rs_unit = -1;
    (void)G;
}

// Starts reducing unit u's unsharded gradient: pre-divide in reduce_dtype,
// exchange chunks. The unsharded gradient is freed once packed.
static void issue_reduce(fc_fsdp *f, int u) {
    complete_reduce(f);  // one reduction in flight at a time
    unit_state *U = &f->u[u];
    fc_prec rd = reduce_prec(f);
    size_t rb = prec_bytes(rd), S = U->shard, P = U->padded;
    if (f->cfg.inject == FC_FAULT_PADDING_LEAK)  // padding is not zero on the way in
        for (size_t i = U->numel; i < P; i++) U->full_grad[i] = 0.01f;
    f->rs_send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    f->rs_recv = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    float *scaled = mallocCheck(P * sizeof(float));
    for (size_t i = 0; i < P; i++) scaled[i] = round_p(f, rd, round_p(f, rd, U->full_grad[i]) / f->pre);
    pack(f, rd, scaled, f->rs_send, P);
    free(scaled);
    mem_free(f, U->full_grad, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, P * prec_bytes(f->cfg.param_dtype));
    U->full_grad = NULL;
    MPI_Comm comm = f->sharded ? f->shard : f->world;
    mpiCheck(MPI_Ialltoall(f->rs_send, (int)S, prec_type(rd), f->rs_recv, (int)S, prec_type(rd), comm, &f->rs_req));
    f->rs_unit = u;
    if (f->sharded)
        log_ev(f, FC_OP_REDUCE_SCATTER, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, P * rb, rd, FC_PHASE_BACKWARD, 0);
    else
        log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, P * rb, rd, FC_PHASE_BACKWARD, 0);
}

// ---------------------------------------------------------------------------
// one micro-batch

static void forward(fc_fsdp *f, const fc_batch *mb) {
    const fc_model *m = &f->m;
    for (int s = 0; s < m->n_stages; s++) {
        int u = m->stages[s].unit;
        unit_state *U = &f->u[u];
        if (s == U->first_fwd) ensure_gathered(f, u, FC_PHASE_FORWARD);
        // FSDP's forward prefetch: the next unit's all-gather goes out before this compute
        if (f->cfg.forward_prefetch) prefetch(f, next_forward_unit(f, s), FC_PHASE_FORWARD);
        log_ev(f, FC_OP_FORWARD, FC_OP_FORWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_FORWARD, 0);
        f->up[u] = U->gathered;
        fc_stage_forward(m, s, f->up, mb, &f->acts);
        f->up[u] = NULL;
        if (s == U->last_fwd && U->reshard_after_forward) free_gathered(f, u, FC_PHASE_FORWARD);
    }
}

// Fault skip_root_reduce: the unit's gradient is divided as if reduced but
// never communicated, so each rank keeps its local gradient.
static void keep_local_gradient(fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    size_t lo = f->sharded ? U->own_off : 0, n = f->sharded ? U->own_valid : U->numel;
    for (size_t i = 0; i < n; i++) U->grad[i] += U->full_grad[lo + i] / f->pre / f->post;
    mem_free(f, U->full_grad, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, U->padded * prec_bytes(f->cfg.param_dtype));
    U->full_grad = NULL;
}

static void backward(fc_fsdp *f, const fc_batch *mb, int sync) {
    const fc_model *m = &f->m;
    float scale = 1.0f / (float)f->acts.NT / (float)f->cfg.grad_accum;
    size_t pb = prec_bytes(f->cfg.param_dtype);
    for (int s = m->n_stages - 1; s >= 0; s--) {
        int u = m->stages[s].unit;
        unit_state *U = &f->u[u];
        if (s == U->first_bwd) {
            ensure_gathered(f, u, FC_PHASE_BACKWARD);
            if (U->full_grad && f->cfg.inject == FC_FAULT_NO_SYNC_OVERWRITE)
                memset(U->full_grad, 0, U->padded * sizeof(float));  // drops earlier micro-batches
            if (!U->full_grad)  // survives across micro-batches under no_sync
                U->full_grad = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, U->padded * sizeof(float),
                                         U->padded * pb);
            // BACKWARD_PRE: the next unit's all-gather goes out before this gradient compute
            if (f->cfg.backward_prefetch == FC_PREFETCH_PRE)
                prefetch(f, next_backward_unit(f, s), FC_PHASE_BACKWARD);
        }
        log_ev(f, FC_OP_BACKWARD, FC_OP_BACKWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_BACKWARD, 0);
        f->up[u] = U->gathered;
        f->ug[u] = U->full_grad;
        // fault tied_untied: the embedding's gradient path into the tied wte is lost
        size_t wte_n = m->cfg.kind == FC_MODEL_GPT2 ? m->params[0].numel : 0;
        float *wte_saved = NULL;
        if (f->cfg.inject == FC_FAULT_TIED_UNTIED && m->stages[s].kind == FC_STAGE_EMBED) {
            wte_saved = mallocCheck(wte_n * sizeof(float));
            memcpy(wte_saved, U->full_grad, wte_n * sizeof(float));
        }
        fc_stage_backward(m, s, f->up, mb, &f->acts, f->ug, scale);
        if (wte_saved) {
            memcpy(U->full_grad, wte_saved, wte_n * sizeof(float));
            free(wte_saved);
        }
        f->up[u] = NULL;
        f->ug[u] = NULL;
        if (s == U->last_bwd) {
            // gradients are produced in param_dtype
            if (f->cfg.param_dtype != FC_PREC_FP32)
                for (size_t i = 0; i < U->numel; i++) U->full_grad[i] = round_p(f, f->cfg.param_dtype, U->full_grad[i]);
            // BACKWARD_POST: after this gradient compute, before its reduction
            if (f->cfg.backward_prefetch == FC_PREFETCH_POST)
                prefetch(f, next_backward_unit(f, s), FC_PHASE_BACKWARD);
            free_gathered(f, u, FC_PHASE_BACKWARD);
            if (sync && f->cfg.inject == FC_FAULT_SKIP_ROOT_REDUCE && u == m->root_unit)
                keep_local_gradient(f, u);  // never reduced: each rank keeps its own
            else if (sync)
                issue_reduce(f, u);
        }
    }
    complete_reduce(f);
}

// ---------------------------------------------------------------------------
// clip_grad_norm and the optimizer

// Total gradient norm. Each rank sums its own chunk of every unit (for
// no_shard the chunk it would own if sharded over W, so all strategies at one
// W add the same numbers in the same order), the partials are all-gathered and
// added in rank order.
static double grad_norm(fc_fsdp *f) {
    fc_norm_type t = f->cfg.norm_type;
    double part = 0;
    for (int u = 0; u < f->m.n_units; u++) {
        const unit_state *U = &f->u[u];
        const float *g = f->sharded ? U->grad : U->grad + U->own_off;
        size_t n = U->own_valid;
        if (f->cfg.inject == FC_FAULT_PADDING_LEAK && f->sharded) n = U->shard;  // padding counted
        if (f->cfg.inject == FC_FAULT_CLIP_DOUBLE_COUNT && !f->sharded) g = U->grad, n = U->numel;
        part = fc_grad_norm_accumulate(part, g, n, t);
    }
    MPI_Comm comm = f->sharded ? f->shard : f->world;
    int G = f->sharded ? f->F : f->W;
    if (f->cfg.inject == FC_FAULT_CLIP_DOUBLE_COUNT) comm = f->world, G = f->W;  // replicas counted again
    double *parts = mallocCheck((size_t)G * sizeof(double));
    log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, -1, -1, f->sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD,
           sizeof(double), FC_PREC_FP32, FC_PHASE_CLIP, 0);
    mpiCheck(MPI_Allgather(&part, 1, MPI_DOUBLE, parts, 1, MPI_DOUBLE, comm));
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, -1, -1, f->sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD, 0,
           FC_PREC_FP32, FC_PHASE_CLIP, 0);
    double total = 0;
    if (f->cfg.inject == FC_FAULT_CLIP_LOCAL_NORM) G = 1, parts[0] = part;  // this rank's shard only
    for (int j = 0; j < G; j++) {
        if (t == FC_NORM_INF)
            total = parts[j] > total ? parts[j] : total;
        else
            total += parts[j];
    }
    free(parts);
    return t == FC_NORM_2 ? sqrt(total) : total;
}

// The optimizer over this rank's own elements, with the clip coefficient
// applied on the way in (the stored gradient stays unclipped for export).
static void optimizer_step(fc_fsdp *f, float coef) {
    enum { CHUNK = 1024 };
    float g[CHUNK];
    for (int u = 0; u < f->m.n_units; u++) {
        unit_state *U = &f->u[u];
        size_t n = f->sharded ? U->own_valid : U->numel;
        log_ev(f, FC_OP_OPTIM, FC_OP_OPTIM, u, -1, FC_GROUP_NONE, n * sizeof(float), FC_PREC_FP32, FC_PHASE_OPTIM, 0);
        for (size_t i = 0; i < n; i += CHUNK) {
            size_t c = n - i < CHUNK ? n - i : CHUNK;
            for (size_t k = 0; k < c; k++) g[k] = coef < 1.0f ? U->grad[i + k] * coef : U->grad[i + k];
            fc_optim_update(&f->cfg.optim, f->step, U->param + i, g, U->state[0] ? U->state[0] + i : NULL,
                            U->state[1] ? U->state[1] + i : NULL, c);
        }
    }
}

int fc_fsdp_step(fc_fsdp *f, fc_step_info *out, fc_error *e) {
    (void)e;
    const fc_run_config *c = &f->cfg;
    fc_log_begin_step(&f->log, f->step);
    for (int u = 0; u < f->m.n_units; u++) memset(f->u[u].grad, 0, f->u[u].store * sizeof(float));
    // this rank's samples of the global batch: [r B/W, (r+1) B/W)
    int local = c->global_batch / f->W;
    int data_rank = c->inject == FC_FAULT_DATA_OVERLAP && f->rank > 0 ? f->rank - 1 : f->rank;
    fc_data_fill(&f->batch, &c->model, c->seed, f->step, (int64_t)data_rank * local);
    double loss = 0;
    for (int k = 0; k < c->grad_accum; k++) {
        f->log.micro = k;
        fc_batch mb = fc_batch_slice(&f->batch, k * f->micro, f->micro);
        forward(f, &mb);
        loss += f->acts.loss_sum / (float)f->acts.NT;
        // with no_sync, only the last micro-batch communicates gradients
        backward(f, &mb, !c->no_sync || k == c->grad_accum - 1);
    }
    double norm = grad_norm(f);
    float coef = 1.0f;
    if (c->clip_grad_norm > 0) coef = (float)((double)c->clip_grad_norm / (norm + 1e-6));
    f->step++;
    optimizer_step(f, coef);
    // the reported loss is a metric, not part of FSDP: kept out of the comm log
    double local_loss = loss / c->grad_accum, global_loss = 0;
    mpiCheck(MPI_Allreduce(&local_loss, &global_loss, 1, MPI_DOUBLE, MPI_SUM, f->world));
    out->loss = (float)(global_loss / f->W);
    out->grad_norm = norm;
    return 0;
}

// ---------------------------------------------------------------------------
// create / export / destroy

// Initial weights of this rank's stored elements of unit u: counter-based
// init is a pure function of (seed, name, index), so each rank makes only its
// own shard; from a file, the rank reads the whole model and keeps its range.
static void init_unit(fc_fsdp *f, int u, const float *from_file) {
    const fc_model *m = &f->m;
    unit_state *U = &f->u[u];
    size_t lo = f->sharded ? U->own_off : 0, hi = lo + (f->sharded ? U->own_valid : U->numel);
    const fc_unit *unit = &m->units[u];
    for (int k = 0; k < unit->n_params; k++) {
        const fc_param *p = &m->params[m->unit_params[unit->first_param + k]];
        size_t a = p->unit_offset, b = p->unit_offset + p->numel;  // p's range in the unit
        size_t s = a > lo ? a : lo, t = b < hi ? b : hi;
        if (s >= t) continue;
        if (from_file)
            memcpy(U->param + (s - lo), from_file + p->offset + (s - a), (t - s) * sizeof(float));
        else
            fc_init_range(p, f->cfg.seed, s - a, t - s, U->param + (s - lo));
    }
}

fc_fsdp *fc_fsdp_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    int W, rank;
    mpiCheck(MPI_Comm_size(comm, &W));
    mpiCheck(MPI_Comm_rank(comm, &rank));
    if (cfg->strategy == FC_STRATEGY_LOCAL) {
        fc_fail(e, "the FSDP engine does not run --strategy local");
        return NULL;
    }
    if (fc_run_config_validate(cfg, e) || fc_run_config_validate_world(cfg, W, e)) return NULL;
    int hybrid = cfg->strategy == FC_STRATEGY_HYBRID_SHARD || cfg->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
    fc_fsdp *f = callocCheck(1, sizeof *f);
    f->cfg = *cfg;
    f->W = W;
    f->rank = rank;
    f->sharded = cfg->strategy != FC_STRATEGY_NO_SHARD;
    f->hybrid = hybrid;
    f->F = hybrid && cfg->shard_group ? cfg->shard_group : W;
    if (!f->sharded) f->F = 1;
    f->R = f->sharded ? W / f->F : W;
    mpiCheck(MPI_Comm_dup(comm, &f->world));
    // shard groups are consecutive ranks; replicas are the same position in each group
    int F = f->sharded ? f->F : W;
    mpiCheck(MPI_Comm_split(comm, rank / F, rank, &f->shard));
    mpiCheck(MPI_Comm_split(comm, rank % F, rank, &f->replica));
    mpiCheck(MPI_Comm_rank(f->shard, &f->shard_rank));
    // divide factors over the whole data-parallel world (as FSDP does for HSDP too)
    switch (cfg->divide) {
    case FC_DIVIDE_PREPOST:
        f->pre = (float)fc_predivide_factor(W);
        f->post = (float)((double)W / fc_predivide_factor(W));
        break;
    case FC_DIVIDE_AVG:  // each rank divides by W, then the sum
        f->pre = (float)W, f->post = 1.0f;
        break;
    case FC_DIVIDE_SUM_THEN_DIVIDE:
        f->pre = 1.0f, f->post = (float)W;
        break;
    }
    if (cfg->inject == FC_FAULT_NO_DIVIDE) f->pre = f->post = 1.0f;  // summed, not averaged
    if (cfg->inject == FC_FAULT_DIVIDE_TWICE) f->post *= f->pre;   // pre applied again at the end
    fc_model_build(&f->m, &cfg->model);
    const fc_model *m = &f->m;
    f->n_state = fc_optim_state_names(&cfg->optim, f->state_names);
    float *from_file = NULL;
    if (cfg->init_path[0]) {
        from_file = mallocCheck(m->numel * sizeof(float));
        if (fc_weights_load(m, cfg->init_path, from_file, e)) {
            free(from_file);
            fc_fsdp_destroy(f);
            return NULL;
        }
    }
    f->u = callocCheck((size_t)m->n_units, sizeof(unit_state));
    fc_mem_loc loc = shard_loc(f);
    for (int u = 0; u < m->n_units; u++) {
        unit_state *U = &f->u[u];
        int G = f->sharded ? f->F : W;   // the reduction layout's group
        int idx = f->sharded ? f->shard_rank : rank;
        U->numel = m->units[u].numel;
        U->shard = (U->numel + (size_t)G - 1) / (size_t)G;
        U->padded = U->shard * (size_t)G;
        U->own_off = (size_t)idx * U->shard;
        U->own_valid = U->own_off >= U->numel ? 0 : (U->numel - U->own_off < U->shard ? U->numel - U->own_off : U->shard);
        U->store = f->sharded ? U->shard : U->numel;
        size_t bytes = U->store * sizeof(float);
        U->param = mem_alloc(f, loc, FC_MEM_PARAM_SHARD, bytes, bytes);
        U->grad = mem_alloc(f, loc, FC_MEM_GRAD_SHARD, bytes, bytes);
        for (int i = 0; i < f->n_state; i++) U->state[i] = mem_alloc(f, loc, FC_MEM_OPTIM_STATE, bytes, bytes);
        U->first_fwd = U->first_bwd = -1;
        for (int s = 0; s < m->n_stages; s++) {
            if (m->stages[s].unit != u) continue;
            if (U->first_fwd < 0) U->first_fwd = s;
            U->last_fwd = s;
            U->first_bwd = s;
        }
        U->last_bwd = U->first_fwd;
        // FULL_SHARD frees after forward, except the root, whose parameters
        // are used again at once by backward (FSDP1 keeps the root gathered).
        U->reshard_after_forward = (cfg->strategy == FC_STRATEGY_FULL_SHARD ||
                                    cfg->strategy == FC_STRATEGY_HYBRID_SHARD) && u != m->root_unit;
        init_unit(f, u, from_file);
    }
    free(from_file);
    f->rs_unit = -1;
    int local = cfg->global_batch / W;
    f->micro = local / cfg->grad_accum;
    int T = cfg->model.kind == FC_MODEL_GPT2 ? cfg->seq_len : 0;
    fc_batch_alloc(&f->batch, &cfg->model, local, T);
    size_t an = fc_acts_numel(m, f->micro, T);
    f->act_mem = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, an * sizeof(float), an * sizeof(float));
    fc_acts_init(&f->acts, m, f->micro, T, f->act_mem);
    f->up = callocCheck((size_t)m->n_units, sizeof *f->up);
    f->ug = callocCheck((size_t)m->n_units, sizeof *f->ug);
    fc_log_init(&f->log);
    return f;
}

int fc_fsdp_export(fc_fsdp *f, fc_export what, float *dst, int root, fc_error *e) {
    int si = what == FC_EXPORT_STATE0 ? 0 : what == FC_EXPORT_STATE1 ? 1 : -1;
    if (si >= f->n_state) return fc_fail(e, "export: the optimizer keeps no state %d", si);
    if (root != 0) return fc_fail(e, "export: root must be rank 0");
    for (int u = 0; u < f->m.n_units; u++) {
        unit_state *U = &f->u[u];
        const float *src = what == FC_EXPORT_PARAMS ? U->param : what == FC_EXPORT_GRADS ? U->grad : U->state[si];
        float *out = dst ? dst + f->m.units[u].offset : NULL;
        if (!f->sharded) {
            if (f->rank == 0) memcpy(out, src, U->numel * sizeof(float));
            continue;
        }
        // shard-group rank 0 of every group gathers its group's shards; world
        // rank 0 is shard rank 0 of group 0, and replicas hold the same values
        float *full = f->shard_rank == 0 ? mallocCheck(U->padded * sizeof(float)) : NULL;
        mpiCheck(MPI_Gather(src, (int)U->shard, MPI_FLOAT, full, (int)U->shard, MPI_FLOAT, 0, f->shard));
        if (f->rank == 0) memcpy(out, full, U->numel * sizeof(float));
        free(full);
    }
    return 0;
}

void fc_fsdp_unit(fc_fsdp *f, int u, fc_fsdp_unit_view *v) {
    unit_state *U = &f->u[u];
    int replica_rank;
    mpiCheck(MPI_Comm_rank(f->replica, &replica_rank));
    v->numel = U->numel;
    v->shard = U->shard;
    v->padded = U->padded;
    v->own_off = U->own_off;
    v->own_valid = U->own_valid;
    v->sharded = f->sharded;
    v->writer = f->sharded ? replica_rank == 0 : 1;
    v->param = U->param;
    v->state[0] = U->state[0];
    v->state[1] = U->state[1];
}

const fc_model *fc_fsdp_model(const fc_fsdp *f) { return &f->m; }
MPI_Comm fc_fsdp_comm(const fc_fsdp *f) { return f->world; }
long fc_fsdp_steps(const fc_fsdp *f) { return f->step; }
void fc_fsdp_set_steps(fc_fsdp *f, long steps) { f->step = steps; }

const fc_comm_log *fc_fsdp_log(const fc_fsdp *f) { return &f->log; }
void fc_fsdp_memory(const fc_fsdp *f, fc_mem_stats *out) { *out = f->mem; }

void fc_fsdp_destroy(fc_fsdp *f) {
    if (!f) return;
    if (f->u) {
        for (int u = 0; u < f->m.n_units; u++) {
            unit_state *U = &f->u[u];
            if (U->ag_pending) mpiCheck(MPI_Wait(&U->ag_req, MPI_STATUS_IGNORE));
            if (U->ag_recv && U->ag_recv != (void *)U->gathered) free(U->ag_recv);
            free(U->ag_send);
            if (U->gathered_owned) free(U->gathered);
            free(U->full_grad);
            free(U->stale);
            free(U->param);
            free(U->grad);
            free(U->state[0]);
            free(U->state[1]);
        }
    }
    free(f->u);
    free(f->rs_send);
    free(f->rs_recv);
    free(f->act_mem);
    free(f->up);
    free(f->ug);
    fc_batch_free(&f->batch);
    fc_log_free(&f->log);
    fc_model_free(&f->m);
    if (f->world != MPI_COMM_NULL && f->world) {
        MPI_Comm_free(&f->shard);
        MPI_Comm_free(&f->replica);
        MPI_Comm_free(&f->world);
    }
    free(f);
}
