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
// Layout (docs/contract.md §5, core/layout.h): FSDP1's FlatParameter or FSDP2's
// per-parameter rows, one interface. Unit u's N elements travel as G chunks
// of S (padding included), P = S * G, G the shard-group size (the world for
// no_shard's reductions); rank r of the group holds chunk r, whose real
// elements are a few pieces of the unit. FSDP1's wire order is the unit's
// own, so a gathered buffer is the parameters as they are; FSDP2's is
// rank-major, so an all-gather is copied out into the unit's order and a
// gradient copied in before its reduce-scatter, as fully_shard does. Padding
// is never read into a gradient, a norm or the optimizer.
//
// Seams: a handful of calls named seam_* mark the points where the fault
// catalogue (reference/faults/, docs/contract.md §9) substitutes a known bug when this
// file is compiled a second time for it. In the plain build, the one the
// oracle trusts, each seam is the identity (reference/plain/seams.h).
//
// Numerics: every gradient reduction is the canonical rank-ordered sum
// (chunks exchanged with an all-to-all, then summed in rank order 0..G-1), and
// no_shard's all-reduce is that same reduce-scatter followed by an all-gather,
// so no_shard, full_shard and shard_grad_op are bitwise identical at one W.
// Mixed precision is emulated by round-to-nearest-even at the points PyTorch
// casts: parameters when gathered (param_dtype), gradients after each unit's
// backward (param_dtype), and every step of the reduction (reduce_dtype);
// 16-bit collectives really send 16-bit data.
#include "seams.h"  // first: the fault build renames this file's exported symbols
#include "arith_seams.h"

#include "fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_collective.h"
#include "clip.h"
#include "fsdp_engine.h"
#include "init.h"
#include "layout.h"
#include "mpicheck.h"
#include "mpiwait.h"
#include "optim.h"
#include "weights.h"

// ---------------------------------------------------------------------------
// tagged memory: every engine allocation is counted under a category

static fc_mem_loc shard_loc(const fc_fsdp *f) {
    return f->cfg.cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE;
}

// Allocates `bytes` (zeroed) and counts `counted` bytes under (loc, cat).
// The two differ only where fp32 storage emulates a 16-bit tensor.
static void *mem_alloc(fc_fsdp *f, fc_mem_loc loc, fc_mem_cat cat, size_t bytes, size_t counted) {
    fc_mem_add(&f->mem, loc, cat, counted);
    return arith_calloc(bytes ? bytes : 1);
}

static void mem_free(fc_fsdp *f, void *p, fc_mem_loc loc, fc_mem_cat cat, size_t counted) {
    fc_mem_sub(&f->mem, loc, cat, counted);
    free(p);
}

// ---------------------------------------------------------------------------
// emulated precisions on the wire

static float round_p(const fc_fsdp *f, fc_prec p, float x) {
    if (p == FC_PREC_BF16) return fc_bf16_to_f32(seam_to_bf16(f, x));
    return fc_round(p, x);
}

// dst[i] = src[i] rounded to p, in p's storage format
static void pack(const fc_fsdp *f, fc_prec p, const float *src, void *dst, size_t n) {
    if (p == FC_PREC_FP32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = p == FC_PREC_BF16 ? seam_to_bf16(f, src[i]) : fc_f32_to_f16(src[i]);
}

// acc[0..S) = the chunks recv[j * S ..] of j = 0..G-1 summed in rank order,
// each partial rounded to rd: the reference's canonical reduction.
static void sum_rank_order(const fc_fsdp *f, float *acc, const void *recv, size_t S, int G, fc_prec rd,
                           float (*rnd)(const fc_fsdp *, fc_prec, float)) {
    for (size_t i = 0; i < S; i++) acc[i] = fc_prec_load(rd, recv, i);
    for (int j = 1; j < G; j++)
        for (size_t i = 0; i < S; i++) acc[i] = rnd(f, rd, acc[i] + fc_prec_load(rd, recv, (size_t)j * S + i));
}

// ---------------------------------------------------------------------------
// the comm log

static void log_ev(fc_fsdp *f, fc_op op, fc_op of, int unit, int stage, fc_group g, size_t bytes,
                   fc_prec dt, fc_phase ph, int prefetch) {
    fc_log_event(&f->log, op, of, unit, stage, g, bytes, dt, ph, prefetch);
}

// ---------------------------------------------------------------------------
// all-gather, free, prefetch

// The pieces of unit u's chunk j (core/layout.h), computed once at create.
static const fc_piece *unit_pieces(const fc_fsdp *f, int u, int j) {
    return f->u[u].pieces + (size_t)j * (size_t)fc_layout_max_pieces(&f->m, u);
}

// The group unit u's next all-gather runs over: the shard group, or, for a
// unit holding its post-forward slice, that slice's group of PF ranks.
static fc_group gather_group(const unit_state *U) {
    return U->pf_slice || U->ag_from_slice ? FC_GROUP_POST_FORWARD : FC_GROUP_SHARD;
}

static void issue_all_gather(fc_fsdp *f, int u, fc_phase ph, int prefetch) {
    unit_state *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    size_t pb = fc_prec_size(pd);
    fc_group grp = gather_group(U);
    if (f->cfg.cpu_offload)  // the fp32 shard comes to the device first
        log_ev(f, FC_OP_H2D, FC_OP_H2D, u, -1, FC_GROUP_NONE, U->shard * sizeof(float), FC_PREC_FP32, ph, 0);
    size_t gn = U->gathered_numel;
    U->gathered = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, gn * sizeof(float), gn * pb);
    U->gathered_owned = 1;
    // fp32 in the unit's own order gathers straight into the compute buffer;
    // 16-bit or FSDP2's rank-major order into a wire buffer, copied out
    U->ag_recv = pd == FC_PREC_FP32 && f->lay->wire_is_natural ? (void *)U->gathered : mallocCheck(U->padded * pb);
    if (U->pf_slice) {  // the PF slices kept after forward are the wire order's consecutive blocks
        U->ag_send = U->pf_slice;
        U->pf_slice = NULL;
        U->ag_from_slice = 1;
        int n = (int)(U->padded / (size_t)f->g.PF);
        mpiCheck(MPI_Iallgather(U->ag_send, n, fc_prec_mpi_type(pd), U->ag_recv, n, fc_prec_mpi_type(pd), f->post_fwd, &U->ag_req));
    } else {
        U->ag_send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->shard * pb, U->shard * pb);
        pack(f, pd, U->param, U->ag_send, U->shard);
        mpiCheck(MPI_Iallgather(U->ag_send, (int)U->shard, fc_prec_mpi_type(pd), U->ag_recv, (int)U->shard, fc_prec_mpi_type(pd),
                                f->shard, &U->ag_req));
    }
    U->ag_pending = 1;
    U->ag_prefetched = prefetch;
    f->alive++;
    log_ev(f, FC_OP_ALL_GATHER, FC_OP_ALL_GATHER, u, -1, grp, U->padded * pb, pd, ph, prefetch);
}

static void wait_all_gather(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    fc_mpi_wait(&U->ag_req);
    if (U->ag_recv != (void *)U->gathered) {  // copy-out: each chunk's pieces to their place in the unit
        for (int j = 0; j < f->g.G; j++) {
            const fc_piece *pc = unit_pieces(f, u, j);
            for (int k = 0; k < U->n_pieces[j]; k++)
                for (size_t i = 0; i < pc[k].count; i++)
                    U->gathered[pc[k].unit_off + i] = fc_prec_load(pd, U->ag_recv, (size_t)j * U->shard + pc[k].chunk_off + i);
        }
        free(U->ag_recv);
    }
    U->ag_recv = NULL;
    seam_gathered(f, u);
    fc_group grp = gather_group(U);
    if (U->ag_from_slice)  // the post-forward slice is used up
        mem_free(f, U->ag_send, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->padded / (size_t)f->g.PF * fc_prec_size(pd));
    else
        mem_free(f, U->ag_send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->shard * fc_prec_size(pd));
    U->ag_send = NULL;
    U->ag_from_slice = 0;
    U->ag_pending = 0;
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_GATHER, u, -1, grp, 0, pd, ph, 0);
}

// Makes unit u's compute parameters available, waiting for them if needed.
static void ensure_gathered(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    if (!f->g.sharded) {
        if (U->gathered) return;
        if (f->cfg.param_dtype == FC_PREC_FP32) {
            U->gathered = U->param;  // DDP computes on its own full copy
            U->gathered_owned = 0;
        } else {  // a low-precision compute copy, like DDP under mixed precision
            size_t pb = fc_prec_size(f->cfg.param_dtype);
            U->gathered = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->numel * sizeof(float), U->numel * pb);
            U->gathered_owned = 1;
            for (size_t i = 0; i < U->numel; i++) U->gathered[i] = round_p(f, f->cfg.param_dtype, U->param[i]);
        }
        return;
    }
    if (!U->gathered) issue_all_gather(f, u, ph, 0);
    if (U->ag_pending) wait_all_gather(f, u, ph);
}

// FSDP2's integer reshard_after_forward: before unit u's gathered parameters
// are freed after forward, this rank keeps block pf_rank of PF of the wire
// order (torch's to_sharded_post_forward narrows each parameter's all-gather
// output the same way), in param_dtype, so that backward's all-gather over
// the PF ranks rebuilds the unit with the same bits.
static void keep_post_forward_slice(fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    size_t n = U->padded / (size_t)f->g.PF, pb = fc_prec_size(pd);
    float *wire = mallocCheck(U->padded * sizeof(float));  // [P] the unit in wire order, padding zero
    fc_layout_to_wire(f->lay, &f->m, u, f->g.G, U->gathered, wire);
    U->pf_slice = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, n * pb, n * pb);
    pack(f, pd, wire + (size_t)f->g.pf_rank * n, U->pf_slice, n);
    free(wire);
}

static void free_gathered(fc_fsdp *f, int u, fc_phase ph) {
    unit_state *U = &f->u[u];
    if (!U->gathered) return;
    if (f->g.PF && ph == FC_PHASE_FORWARD) keep_post_forward_slice(f, u);
    if (U->gathered_owned) {
        size_t n = f->g.sharded ? U->gathered_numel : U->numel;
        mem_free(f, U->gathered, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, n * fc_prec_size(f->cfg.param_dtype));
    }
    if (f->g.sharded) {
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
    if (v < 0 || !f->g.sharded || f->u[v].gathered) return;
    if (!fc_limiter_allows_prefetch(&f->cfg, f->alive)) return;
    issue_all_gather(f, v, ph, 1);
}

// The prefetches stage s makes (core/layout.h): FSDP1's next unit, or FSDP2's
// list of the next n units of the pass; a unit already gathered is skipped.
static void prefetch_from(fc_fsdp *f, int s, int forward, int n) {
    int *v = f->prefetch_list;
    int k = fc_prefetch_units(&f->m, f->st, s, forward, n, v);
    for (int i = 0; i < k; i++) prefetch(f, v[i], forward ? FC_PHASE_FORWARD : FC_PHASE_BACKWARD);
}

// ---------------------------------------------------------------------------
// gradient reduction

// Canonical all-reduce of x[n] over comm, blocking: the rank-ordered
// reduce-scatter of the module comment, then an all-gather.
static void all_reduce_canonical(fc_fsdp *f, MPI_Comm comm, float *x, size_t n, fc_prec rd) {
    int G;
    mpiCheck(MPI_Comm_size(comm, &G));
    size_t S = fc_chunk_size(n, G), P = S * (size_t)G, rb = fc_prec_size(rd);
    float *padded = callocCheck(P, sizeof(float));
    memcpy(padded, x, n * sizeof(float));
    void *send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    void *recv = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    pack(f, rd, padded, send, P);
    fc_mpi_alltoall(send, (int)S, fc_prec_mpi_type(rd), recv, comm);
    float *acc = callocCheck(S, sizeof(float));
    arith_sum_chunks(f, acc, recv, S, G, rd, comm, 1, round_p);
    pack(f, rd, acc, send, S);
    fc_mpi_allgather(send, (int)S, fc_prec_mpi_type(rd), recv, comm);
    for (size_t i = 0; i < n; i++) x[i] = fc_prec_load(rd, recv, i);
    free(acc);
    free(padded);
    mem_free(f, send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    mem_free(f, recv, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
}

// The precision gradients are reduced in.
static fc_prec reduce_prec(const fc_fsdp *f) { return seam_reduce_dtype(f, f->cfg.reduce_dtype); }

// Finishes the reduction in flight: rank-ordered sum of the exchanged chunks,
// the replica all-reduce (hybrid), the all-gather half of DDP's all-reduce,
// the post-divide, and accumulation into the fp32 gradient.
static void complete_reduce(fc_fsdp *f) {
    int u = f->rs_unit;
    if (u < 0) return;
    unit_state *U = &f->u[u];
    fc_prec rd = reduce_prec(f);
    size_t rb = fc_prec_size(rd), S = U->shard, P = U->padded;
    int G = f->g.G;
    fc_mpi_wait(&f->rs_req);
    float *acc = callocCheck(S, sizeof(float));  // this rank's chunk, summed in rank order
    arith_sum_chunks(f, acc, f->rs_recv, S, G, rd, f->g.sharded ? f->shard : f->world, !f->g.sharded, round_p);
    if (f->g.sharded) {
        log_ev(f, FC_OP_WAIT, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, 0, rd, FC_PHASE_BACKWARD, 0);
        if (f->g.hybrid && f->g.R > 1 && seam_replicate(f)) {
            seam_pre_replicate(f, u, acc, U->own_valid);
            log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, S * rb, rd, FC_PHASE_BACKWARD, 0);
            all_reduce_canonical(f, f->replica, acc, S, rd);
            log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, 0, rd, FC_PHASE_BACKWARD, 0);
        }
        size_t n = 0;  // padding never reaches the gradient: only the chunk's pieces
        for (int k = 0; k < U->n_own; k++) {
            size_t a = U->own[k].chunk_off;
            n = a + seam_valid(f, U->own[k].count, S - a);
            for (size_t i = a; i < n; i++) U->grad[i] += round_p(f, rd, arith_div(f, acc[i], f->post));
        }
        seam_divided(f, U->grad, acc, n, rd);
    } else {
        // DDP: all-gather the summed chunks back into the whole gradient
        pack(f, rd, acc, f->rs_send, S);
        fc_mpi_allgather(f->rs_send, (int)S, fc_prec_mpi_type(rd), f->rs_recv, f->world);
        log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, 0, rd, FC_PHASE_BACKWARD, 0);
        float *sum = mallocCheck(U->numel * sizeof(float));  // [N] the summed gradient
        for (size_t i = 0; i < U->numel; i++) sum[i] = fc_prec_load(rd, f->rs_recv, i);
        for (size_t i = 0; i < U->numel; i++) U->grad[i] += round_p(f, rd, arith_div(f, sum[i], f->post));
        seam_divided(f, U->grad, sum, U->numel, rd);
        free(sum);
    }
    if (f->cfg.cpu_offload)  // the reduced fp32 gradient shard goes to the host
        log_ev(f, FC_OP_D2H, FC_OP_D2H, u, -1, FC_GROUP_NONE, U->own_valid * sizeof(float), FC_PREC_FP32,
               FC_PHASE_BACKWARD, 0);
    free(acc);
    mem_free(f, f->rs_send, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    mem_free(f, f->rs_recv, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb);
    f->rs_send = f->rs_recv = NULL;
    f->rs_unit = -1;
}

// Starts reducing unit u's unsharded gradient: pre-divide in reduce_dtype,
// exchange chunks. The unsharded gradient is freed once packed.
static void issue_reduce(fc_fsdp *f, int u) {
    complete_reduce(f);  // one reduction in flight at a time
    unit_state *U = &f->u[u];
    fc_prec rd = reduce_prec(f);
    size_t rb = fc_prec_size(rd), S = U->shard, P = U->padded;
    // copy-in: FSDP2's gradient goes to the rank-major wire order, padding zeroed
    float *wire = U->full_grad;
    if (!f->lay->wire_is_natural) {
        wire = mallocCheck(P * sizeof(float));
        fc_layout_to_wire(f->lay, &f->m, u, f->g.G, U->full_grad, wire);
    }
    seam_padding(f, u, wire, U->numel, P);
    f->rs_send = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    f->rs_recv = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, P * rb);
    float *scaled = mallocCheck(P * sizeof(float));
    for (size_t i = 0; i < P; i++) scaled[i] = round_p(f, rd, arith_div(f, round_p(f, rd, wire[i]), f->pre));
    pack(f, rd, scaled, f->rs_send, P);
    free(scaled);
    if (wire != U->full_grad) free(wire);
    mem_free(f, U->full_grad, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, U->gathered_numel * fc_prec_size(f->cfg.param_dtype));
    U->full_grad = NULL;
    MPI_Comm comm = f->g.sharded ? f->shard : f->world;
    mpiCheck(MPI_Ialltoall(f->rs_send, (int)S, fc_prec_mpi_type(rd), f->rs_recv, (int)S, fc_prec_mpi_type(rd), comm, &f->rs_req));
    f->rs_unit = u;
    if (f->g.sharded)
        log_ev(f, FC_OP_REDUCE_SCATTER, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, P * rb, rd, FC_PHASE_BACKWARD, 0);
    else
        log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, P * rb, rd, FC_PHASE_BACKWARD, 0);
}

// ---------------------------------------------------------------------------
// activations and their checkpointing

// Activation memory: the gradient half is counted for the whole run; of the
// activation half, each stage's region from `from` to its end, as what a
// framework holds: all of it from the stage's forward until its backward has
// run, only the output (the next stage's input) of a checkpointed unit
// between its forward and its recompute. The block itself stays allocated
// (the views are fixed offsets), so a dropped region is overwritten with NaN:
// a backward that ran without its recompute cannot go unnoticed.
static void acts_hold(fc_fsdp *f, int s, size_t from) {
    size_t want = f->act_region[s].hi - from, *held = &f->act_held[s];
    if (want > *held) fc_mem_add(&f->mem, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, (want - *held) * sizeof(float));
    if (want < *held) fc_mem_sub(&f->mem, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, (*held - want) * sizeof(float));
    *held = want;
}

// After a checkpointed unit's forward: it keeps its input (the previous
// stage's output) and its own output, and drops the rest.
static void drop_acts(fc_fsdp *f, int u) {
    for (int t = f->st[u].first_fwd; t <= f->st[u].last_fwd; t++) {
        if (f->m.stages[t].unit != u) continue;
        const fc_stage_region *r = &f->act_region[t];
        for (size_t i = r->lo; i < r->out; i++) f->acts.acts[i] = NAN;
        acts_hold(f, t, r->out);
    }
}

// Unit u's forward again, in backward, with the same micro-batch and the
// same compute parameters (so its activations are bitwise the forward's).
// FSDP1 with the checkpoint outside the unit runs the unit's own forward:
// all-gather, compute, reshard; otherwise it computes on backward's gather.
static void recompute(fc_fsdp *f, int u, const fc_batch *mb) {
    int own = fc_recompute_gathers(&f->cfg, &f->m, u);
    if (own) ensure_gathered(f, u, FC_PHASE_RECOMPUTE);
    const float *p = seam_recompute_params(f, u);
    for (int t = f->st[u].first_fwd; t <= f->st[u].last_fwd; t++) {
        if (f->m.stages[t].unit != u) continue;
        log_ev(f, FC_OP_FORWARD, FC_OP_FORWARD, u, t, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_RECOMPUTE, 0);
        f->up[u] = p;
        fc_stage_forward(&f->m, t, f->up, mb, &f->acts);
        f->up[u] = NULL;
        acts_hold(f, t, f->act_region[t].lo);
    }
    seam_recompute_done(f, u, p);
    if (own) free_gathered(f, u, FC_PHASE_RECOMPUTE);
}

// ---------------------------------------------------------------------------
// one micro-batch

static void forward(fc_fsdp *f, const fc_batch *mb) {
    const fc_model *m = &f->m;
    for (int s = 0; s < m->n_stages; s++) {
        int u = m->stages[s].unit;
        unit_state *U = &f->u[u];
        if (s == f->st[u].first_fwd) {
            ensure_gathered(f, u, FC_PHASE_FORWARD);
            // FSDP's forward prefetch: the next units' all-gathers go out before this compute
            prefetch_from(f, s, 1, fc_forward_prefetch_count(&f->cfg));
        }
        log_ev(f, FC_OP_FORWARD, FC_OP_FORWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_FORWARD, 0);
        f->up[u] = U->gathered;
        fc_stage_forward(m, s, f->up, mb, &f->acts);
        f->up[u] = NULL;
        acts_hold(f, s, f->act_region[s].lo);
        if (s == f->st[u].last_fwd && U->reshard_after_forward) free_gathered(f, u, FC_PHASE_FORWARD);
        if (s == f->st[u].last_fwd && U->ckpt) drop_acts(f, u);
    }
}

static void backward(fc_fsdp *f, const fc_batch *mb, int sync) {
    const fc_model *m = &f->m;
    float scale = arith_loss_scale(f) / (float)f->acts.NT / (float)f->cfg.grad_accum;
    size_t pb = fc_prec_size(f->cfg.param_dtype);
    for (int s = m->n_stages - 1; s >= 0; s--) {
        int u = m->stages[s].unit;
        unit_state *U = &f->u[u];
        int own_recompute = U->ckpt && fc_recompute_gathers(&f->cfg, m, u);
        if (s == f->st[u].first_bwd) {
            if (own_recompute) recompute(f, u, mb);  // checkpoint(FSDP(unit)): before the unit's pre-backward
            ensure_gathered(f, u, FC_PHASE_BACKWARD);
            seam_backward_begin(f, u);
            // survives across micro-batches under no_sync; a unit that does not
            // train computes into it only as scratch (no framework holds it)
            if (!U->full_grad)
                U->full_grad = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, U->gathered_numel * sizeof(float),
                                         U->trains ? U->gathered_numel * pb : 0);
            else
                arith_scale_grads(f, U->full_grad, U->numel, arith_loss_scale(f));  // the micro-batches before
            // BACKWARD_PRE: the next unit's all-gather goes out before this gradient compute
            if (fc_backward_prefetch_of(&f->cfg) == FC_PREFETCH_PRE)
                prefetch_from(f, s, 0, fc_backward_prefetch_count(&f->cfg));
            if (U->ckpt && !own_recompute) recompute(f, u, mb);  // inside the unit: after its pre-backward
        }
        log_ev(f, FC_OP_BACKWARD, FC_OP_BACKWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_BACKWARD, 0);
        f->up[u] = U->gathered;
        f->ug[u] = U->full_grad;
        seam_stage_backward(f, s, mb, scale);  // fc_stage_backward(m, s, f->up, mb, &f->acts, f->ug, scale)
        f->up[u] = NULL;
        f->ug[u] = NULL;
        acts_hold(f, s, f->act_region[s].hi);  // backward has used the stage's activations
        if (s == f->st[u].last_bwd) {
            arith_scale_grads(f, U->full_grad, U->numel, 1.0f / arith_loss_scale(f));
            // gradients are produced in param_dtype
            if (f->cfg.param_dtype != FC_PREC_FP32)
                for (size_t i = 0; i < U->numel; i++) U->full_grad[i] = round_p(f, f->cfg.param_dtype, U->full_grad[i]);
            // BACKWARD_POST: after this gradient compute, before its reduction
            if (fc_backward_prefetch_of(&f->cfg) == FC_PREFETCH_POST)
                prefetch_from(f, s, 0, fc_backward_prefetch_count(&f->cfg));
            free_gathered(f, u, FC_PHASE_BACKWARD);
            if (!U->trains) {  // no gradient to reduce: FSDP skips the unit's reduction
                mem_free(f, U->full_grad, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, 0);
                U->full_grad = NULL;
            } else if (sync && !seam_skip_reduce(f, u)) {
                issue_reduce(f, u);
            }
        }
    }
    complete_reduce(f);
}

// ---------------------------------------------------------------------------
// clip_grad_norm and the optimizer

// Total gradient norm. Each rank adds its own chunk of every unit to an exact
// partial (for no_shard the chunk it would own if sharded over W), the
// partials are all-gathered and combined (core/clip.h): exact until the one
// final rounding, so every layout, strategy and W gives the same bits.
static double grad_norm(fc_fsdp *f) {
    fc_norm_type t = f->cfg.norm_type;
    fc_norm_part part;
    memset(&part, 0, sizeof part);
    for (int u = 0; u < f->m.n_units; u++) {
        const unit_state *U = &f->u[u];
        for (int k = 0; k < U->n_own; k++) {  // padding is never normed
            const float *g = f->g.sharded ? U->grad + U->own[k].chunk_off : U->grad + U->own_off;
            size_t n = f->g.sharded ? U->own[k].count : U->own_valid;
            seam_norm_piece(f, u, &g, &n);
            fc_norm_part_add(&part, g, n, t);
        }
    }
    MPI_Comm comm = f->g.sharded ? f->shard : f->world;
    int G = f->g.G;
    seam_norm_group(f, &comm, &G);
    fc_norm_part *parts = mallocCheck((size_t)G * sizeof *parts);
    log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, -1, -1, f->g.sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD,
           sizeof part, FC_PREC_FP32, FC_PHASE_CLIP, 0);
    fc_mpi_allgather(&part, (int)sizeof part, MPI_BYTE, parts, comm);
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, -1, -1, f->g.sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD, 0,
           FC_PREC_FP32, FC_PHASE_CLIP, 0);
    seam_norm_parts(f, parts, &G, &part);
    double total = fc_grad_norm_combine(parts, G, t);
    seam_norm_total(f, &total, G);
    free(parts);
    return total;
}

// A frozen parameter has no gradient (docs/contract.md §2): what its unit's backward
// computed for it is dropped once reduced (FSDP1 reduces the whole
// FlatParameter), before the clip norm, so none is normed or stepped.
static void drop_frozen_grads(fc_fsdp *f) {
    for (int u = 0; u < f->m.n_units && f->m.n_frozen; u++) {
        unit_state *U = &f->u[u];
        for (int p = 0; p < U->n_own; p++) {
            const fc_piece *pc = &U->own[p];
            for (size_t i = 0, r; i < pc->count; i += r) {
                int frozen;
                r = fc_model_run_at(&f->m, u, pc->unit_off + i, pc->count - i, &frozen);
                if (frozen) memset(U->grad + pc->chunk_off + i, 0, r * sizeof(float));
            }
        }
    }
}

// The optimizer over this rank's own elements, with the clip coefficient
// applied on the way in (the stored gradient stays unclipped for export).
// Frozen parameters are not the optimizer's: they are skipped, elements and
// decay alike, and the log counts what was stepped.
static void optimizer_step(fc_fsdp *f, float coef) {
    enum { CHUNK = 1024 };
    float g[CHUNK];
    int clip = fc_clip_applies(f->cfg.clip_grad_norm, coef);
    for (int u = 0; u < f->m.n_units; u++) {
        unit_state *U = &f->u[u];
        size_t stepped = 0;
        for (int p = 0; p < U->n_own; p++) {  // the chunk's pieces (no_shard: all of it, one piece)
            const fc_piece *pc = &U->own[p];
            for (size_t j = 0, r; j < pc->count; j += r) {  // runs of one parameter each
                int frozen;
                r = fc_model_run_at(&f->m, u, pc->unit_off + j, pc->count - j, &frozen);
                size_t a = pc->chunk_off + j, b = a + r;
                if (frozen && !seam_step_frozen(f, U->param + a, r)) continue;
                stepped += r;
                for (size_t i = a; i < b; i += CHUNK) {
                    size_t c = b - i < CHUNK ? b - i : CHUNK;
                    for (size_t k = 0; k < c; k++) g[k] = clip ? U->grad[i + k] * coef : U->grad[i + k];
                    fc_optim_update(&f->cfg.optim, f->step, U->param + i, g, U->state[0] ? U->state[0] + i : NULL,
                                    U->state[1] ? U->state[1] + i : NULL, c);
                }
            }
        }
        log_ev(f, FC_OP_OPTIM, FC_OP_OPTIM, u, -1, FC_GROUP_NONE, stepped * sizeof(float), FC_PREC_FP32, FC_PHASE_OPTIM, 0);
    }
}

int fc_fsdp_step(fc_fsdp *f, fc_step_info *out, fc_error *e) {
    (void)e;
    const fc_run_config *c = &f->cfg;
    fc_log_begin_step(&f->log, f->step);
    for (int u = 0; u < f->m.n_units; u++) memset(f->u[u].grad, 0, f->u[u].store * sizeof(float));
    // this rank's samples of the global batch: [r B/W, (r+1) B/W)
    int first, count;
    fc_rank_samples(c, f->g.W, seam_data_rank(f, f->g.rank), &first, &count);
    fc_data_fill(&f->batch, &c->model, c->seed, f->step, (int64_t)first);
    double loss = 0;
    for (int k = 0; k < c->grad_accum; k++) {
        f->log.micro = k;
        fc_batch mb = fc_batch_slice(&f->batch, k * f->micro, f->micro);
        forward(f, &mb);
        loss += f->acts.loss_sum / (float)f->acts.NT;
        // with no_sync, only the last micro-batch communicates gradients
        backward(f, &mb, !c->no_sync || k == c->grad_accum - 1);
    }
    if (!seam_keep_frozen_grads(f, FC_PHASE_CLIP)) drop_frozen_grads(f);
    double norm = grad_norm(f);
    if (!seam_keep_frozen_grads(f, FC_PHASE_OPTIM)) drop_frozen_grads(f);
    float coef = c->clip_grad_norm > 0 ? fc_clip_coef(c->clip_grad_norm, norm) : 1.0f;
    f->step++;
    optimizer_step(f, coef);
    // the reported loss is a metric, not part of FSDP: kept out of the comm log
    double global_loss = fc_mpi_sum_double(loss / c->grad_accum, f->world);
    out->loss = (float)(global_loss / f->g.W);
    out->grad_norm = norm;
    return 0;
}

// ---------------------------------------------------------------------------
// create / export / destroy

// Initial weights of this rank's stored elements of unit u: counter-based
// init is a pure function of (seed, name, index), so each rank makes only its
// own shard; from a file, the rank reads the whole model and keeps its range.
static void init_unit(fc_fsdp *f, int u, const float *from_file) {
    unit_state *U = &f->u[u];
    for (int q = 0; q < U->n_own; q++) {  // each piece: unit elements [lo, hi) at param + chunk_off
        size_t lo = f->g.sharded ? U->own[q].unit_off : 0, hi = lo + (f->g.sharded ? U->own[q].count : U->numel);
        fc_init_unit_range(&f->m, u, f->cfg.seed, from_file, lo, hi, U->param + U->own[q].chunk_off);
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
    fc_fsdp *f = callocCheck(1, sizeof *f);
    f->cfg = *cfg;
    f->g = fc_groups_of(cfg, W, rank);
    f->lay = seam_layout(f, fc_layout_of(fc_layout_kind_of(cfg)));
    fc_mpi_layout_comms(comm, f->g.G, &f->world, &f->shard, &f->replica);
    f->post_fwd = MPI_COMM_NULL;
    if (f->g.PF) fc_mpi_comm_split(comm, seam_post_forward_group(f, rank / f->g.PF), rank, &f->post_fwd);
    // divide factors over the whole data-parallel world (as FSDP does for HSDP
    // too), or FSDP2's set_gradient_divide_factor
    double pre, post;
    fc_divide_factors(cfg->divide, fc_divide_by(cfg, W), &pre, &post);
    f->pre = (float)pre;
    f->post = (float)post;
    seam_divide(f);
    fc_model_build_run(&f->m, cfg);
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
    f->st = callocCheck((size_t)m->n_units, sizeof(fc_unit_stages));
    f->prefetch_list = callocCheck((size_t)m->n_units, sizeof(int));
    fc_mem_loc loc = shard_loc(f);
    for (int u = 0; u < m->n_units; u++) {
        unit_state *U = &f->u[u];
        fc_unit_layout l = fc_unit_layout_in(f->lay, m, u, &f->g);
        U->numel = l.numel;
        U->shard = l.shard;
        U->padded = l.padded;
        U->own_off = l.own_off;
        U->own_valid = l.own_valid;
        U->store = l.store;
        U->gathered_numel = f->lay->wire_is_natural ? U->padded : U->numel;
        int mp = fc_layout_max_pieces(m, u);
        U->pieces = callocCheck((size_t)f->g.G * (size_t)mp, sizeof *U->pieces);
        U->n_pieces = callocCheck((size_t)f->g.G, sizeof *U->n_pieces);
        for (int j = 0; j < f->g.G; j++) U->n_pieces[j] = f->lay->pieces(m, u, f->g.G, j, U->pieces + (size_t)j * mp);
        U->own = U->pieces + (size_t)f->g.idx * mp;
        U->n_own = U->n_pieces[f->g.idx];
        // no_shard stores the whole unit: one piece; an empty flat chunk is one
        // empty piece at its offset, so the seams still see where it is
        if (!f->g.sharded) U->own[0] = (fc_piece){0, 0, U->numel}, U->n_own = 1;
        if (!U->n_own && f->lay->wire_is_natural) U->own[0] = (fc_piece){U->own_off, 0, 0}, U->n_own = 1;
        // A frozen parameter has no optimizer state; under FSDP2 no gradient
        // either (FSDP1's FlatParameter keeps its whole gradient shard). The
        // arrays stay whole, so every index is the layout's; only what a
        // framework would hold is counted.
        U->trains = fc_unit_trains(m, u);
        size_t bytes = U->store * sizeof(float);
        size_t trained = (U->store - fc_unit_frozen_store(f->lay, m, u, &f->g)) * sizeof(float);
        U->param = mem_alloc(f, loc, FC_MEM_PARAM_SHARD, bytes, bytes);
        U->grad = mem_alloc(f, loc, FC_MEM_GRAD_SHARD, bytes,
                            !f->lay->wire_is_natural ? trained : U->trains ? bytes : 0);
        for (int i = 0; i < f->n_state; i++) U->state[i] = mem_alloc(f, loc, FC_MEM_OPTIM_STATE, bytes, trained);
        f->st[u] = fc_unit_stages_of(m, u);
        U->reshard_after_forward = fc_reshard_after_forward(cfg->strategy, m, u);
        U->ckpt = fc_unit_checkpointed(cfg, m, u);
        init_unit(f, u, from_file);
    }
    free(from_file);
    f->rs_unit = -1;
    int first, local;
    fc_rank_samples(cfg, W, rank, &first, &local);
    f->micro = local / cfg->grad_accum;
    int T = fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 0;
    fc_batch_alloc(&f->batch, &cfg->model, local, T);
    size_t an = fc_acts_numel(m, f->micro, T);  // both halves; the activation half is counted stage by stage
    f->act_mem = mem_alloc(f, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, an * sizeof(float), an / 2 * sizeof(float));
    fc_acts_init(&f->acts, m, f->micro, T, f->act_mem);
    f->act_region = mallocCheck((size_t)m->n_stages * sizeof *f->act_region);
    f->act_held = callocCheck((size_t)m->n_stages, sizeof *f->act_held);
    for (int s = 0; s < m->n_stages; s++) f->act_region[s] = fc_stage_acts_region(m, s, f->micro, T);
    f->up = callocCheck((size_t)m->n_units, sizeof *f->up);
    f->ug = callocCheck((size_t)m->n_units, sizeof *f->ug);
    fc_log_init(&f->log);
    seam_created(f);
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
        if (!f->g.sharded) {
            if (f->g.rank == 0) memcpy(out, src, U->numel * sizeof(float));
            continue;
        }
        // shard-group rank 0 of every group gathers its group's shards; world
        // rank 0 is shard rank 0 of group 0, and replicas hold the same values
        float *full = f->g.shard_rank == 0 ? mallocCheck(U->padded * sizeof(float)) : NULL;
        fc_mpi_gather(src, (int)U->shard, MPI_FLOAT, full, 0, f->shard);
        if (f->g.rank == 0) fc_layout_to_natural(f->lay, &f->m, u, f->g.G, full, out);
        free(full);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// checkpoints: this rank's shards as the views of the core protocol
// (core/ckpt_collective.h), which writes, verifies and reads the files

static void ckpt_view(fc_fsdp *f, fc_ckpt_unit_view *units, fc_ckpt_rank_view *v) {
    for (int u = 0; u < f->m.n_units; u++) {
        unit_state *U = &f->u[u];
        units[u] = (fc_ckpt_unit_view){U->numel, U->own_off, U->own_valid, U->store, !f->g.sharded,
                                       U->param, {U->state[0], U->state[1]}, NULL, 0, 0};
        if (!f->lay->wire_is_natural)  // FSDP2's rows: the chunk is pieces
            units[u].pieces = U->own, units[u].n_pieces = U->n_own, units[u].max_pieces = fc_layout_max_pieces(&f->m, u);
    }
    // the chunks of replica 0 of every shard group tile each unit once (for
    // no_shard, every rank's W-way chunk of its full copy)
    *v = (fc_ckpt_rank_view){f->world, &f->cfg, &f->m, f->cfg.strategy, f->step,
                             f->g.sharded ? f->g.replica == 0 : 1, units, seam_saved_offsets(f)};
}

int fc_fsdp_save(fc_fsdp *f, const char *dir, fc_state_dict kind, fc_error *e) {
    fc_ckpt_unit_view *units = callocCheck((size_t)f->m.n_units, sizeof *units);
    fc_ckpt_rank_view v;
    ckpt_view(f, units, &v);
    int rc = fc_ckpt_save_collective(&v, dir, kind, e);
    free(units);
    return rc;
}

int fc_fsdp_load(fc_fsdp *f, const char *dir, fc_error *e) {
    fc_ckpt_unit_view *units = callocCheck((size_t)f->m.n_units, sizeof *units);
    fc_ckpt_rank_view v;
    ckpt_view(f, units, &v);
    long step = 0;
    int rc = fc_ckpt_load_collective(&v, dir, seam_ckpt_source(f), f, &step, e);
    free(units);
    if (rc) return -1;
    // the step count drives AdamW's bias correction, SGD's first momentum step
    // and the data position
    f->step = seam_loaded(f, step);
    return 0;
}

long fc_fsdp_steps(const fc_fsdp *f) { return f->step; }

const fc_comm_log *fc_fsdp_log(const fc_fsdp *f) { return &f->log; }
void fc_fsdp_memory(const fc_fsdp *f, fc_mem_stats *out) { *out = f->mem; }

void fc_fsdp_destroy(fc_fsdp *f) {
    if (!f) return;
    seam_destroy(f);
    if (f->u) {
        for (int u = 0; u < f->m.n_units; u++) {
            unit_state *U = &f->u[u];
            if (U->ag_pending) fc_mpi_wait(&U->ag_req);
            if (U->ag_recv && U->ag_recv != (void *)U->gathered) free(U->ag_recv);
            free(U->ag_send);
            if (U->gathered_owned) free(U->gathered);
            free(U->pf_slice);
            free(U->full_grad);
            free(U->pieces);
            free(U->n_pieces);
            free(U->param);
            free(U->grad);
            free(U->state[0]);
            free(U->state[1]);
        }
    }
    free(f->u);
    free(f->st);
    free(f->prefetch_list);
    free(f->rs_send);
    free(f->rs_recv);
    free(f->act_mem);
    free(f->act_region);
    free(f->act_held);
    free(f->up);
    free(f->ug);
    fc_batch_free(&f->batch);
    fc_log_free(&f->log);
    fc_model_free(&f->m);
    if (f->world != MPI_COMM_NULL && f->world) {
        MPI_Comm_free(&f->shard);
        MPI_Comm_free(&f->replica);
        MPI_Comm_free(&f->world);
        if (f->post_fwd != MPI_COMM_NULL) MPI_Comm_free(&f->post_fwd);
    }
    free(f);
}
